"""The shell around the engine: params, CLI, tracking, reports."""

from fedsieve.env import configure_environment

configure_environment()

__all__ = ["configure_environment"]
