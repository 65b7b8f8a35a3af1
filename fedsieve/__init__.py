"""The command line, the top of the house: ``fedsieve`` (:mod:`fedsieve.cli`) and its
operations commands. Importing it changes nothing; :func:`fedsieve.cli.console` sets the
process environment (:func:`config.environment.configure_environment`) before anything
loads Prefect or MLflow."""

__all__: list[str] = []
