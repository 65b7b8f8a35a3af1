-- The second database of the compose stack's PostgreSQL (the first, mlflow, is POSTGRES_DB).
CREATE DATABASE prefect;
