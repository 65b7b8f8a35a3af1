"""Error types shared by the shell's layers (CLI, flows, tasks, ops).

Each is a :class:`Refusal`: raised on purpose, with a one-line message for the user that
is the whole story. The CLI ends a command with that line and exit code 2 on a
:class:`UsageError` (the input is the user's to fix) and 1 on a :class:`ServiceError`
(a tracking store or Prefect server that cannot be used), a :class:`RunHalted` (a run
that failed closed) or a :class:`ModelRefused` (a trained model the gate did not
register); and a run that ends in one logs no traceback (:func:`quiet_refusals`).
"""

from __future__ import annotations

import logging

__all__ = [
    "ConfigError",
    "ModelRefused",
    "OpsError",
    "Refusal",
    "RunHalted",
    "ServiceError",
    "UsageError",
    "exit_code",
    "quiet_refusals",
    "refusal_types",
]


class Refusal(Exception):
    """An error raised on purpose: its one-line message says what and why; a traceback
    would only hide it."""

    exit_code = 1


class UsageError(Refusal, ValueError):
    """Input the user must fix; nothing has run when it is raised."""

    exit_code = 2


class ConfigError(UsageError):
    """A params value, or a setting it implies, that is not allowed."""


class OpsError(UsageError):
    """Bad input to an operations command (runs, promote, serve)."""


class ServiceError(Refusal, RuntimeError):
    """The tracking store or the Prefect server cannot be used."""


class RunHalted(Refusal, RuntimeError):
    """A run stopped on purpose: a round left out more clients than ``train.max_excluded``
    allows (fail closed, not aggregated from a minority)."""


class ModelRefused(Refusal, RuntimeError):
    """A trained model that did not pass the registration gate (federated/gate.py): it is
    logged on its run, not registered."""


def refusal_types() -> tuple[type[Exception], ...]:
    """The refusals, with the engine's errors about the user's input (a data file, a
    partition, a registry name), which cannot derive from :class:`Refusal` (the engine
    imports nothing of the shell) and count as usage errors."""
    from federated.data import DataError
    from federated.partition import PartitionError
    from registry import RegistryError

    return (Refusal, DataError, PartitionError, RegistryError)


def exit_code(refusal: Exception) -> int:
    """The command's exit code for a refusal: 2 for the user's input, else 1."""
    return refusal.exit_code if isinstance(refusal, Refusal) else UsageError.exit_code


# Prefect's loggers of flow and task runs: where a run that raised logs its traceback
PREFECT_RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class _WithoutRefusals(logging.Filter):
    """Drops a run's record of an exception when the exception is a refusal: the run's
    state line ("Finished in state Failed(...)") and the command's one line say why."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or not isinstance(error, refusal_types())


def quiet_refusals() -> None:
    """Prefect logs no traceback for a flow or task run that ended in a refusal (it logs
    one for any other exception). Called where a process starts its flows: the CLI, and
    a deployment's flow on its worker; calling it again changes nothing."""
    for name in PREFECT_RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _WithoutRefusals) for f in logger.filters):
            logger.addFilter(_WithoutRefusals())
