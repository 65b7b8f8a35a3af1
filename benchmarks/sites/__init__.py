"""Sites and serving: real sites on 127.0.0.1, a hospital's files, the served model (README.md)."""
