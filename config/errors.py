"""Error types shared by the shell's layers (CLI, flows, tasks, ops).

Each carries a one-line message for the user. The CLI ends a command with exit code 2 on
a :class:`UsageError` (the input is the user's to fix) and 1 on a :class:`ServiceError`
(a tracking store or Prefect server that cannot be used), a :class:`RunHalted` (a run
that failed closed) or a :class:`ModelRefused` (a trained model the gate did not register).
"""

from __future__ import annotations

__all__ = ["ConfigError", "ModelRefused", "OpsError", "RunHalted", "ServiceError", "UsageError"]


class UsageError(ValueError):
    """Input the user must fix; nothing has run when it is raised."""


class ConfigError(UsageError):
    """A params value, or a setting it implies, that is not allowed."""


class OpsError(UsageError):
    """Bad input to an operations command (runs, promote, serve)."""


class ServiceError(RuntimeError):
    """The tracking store or the Prefect server cannot be used."""


class RunHalted(RuntimeError):
    """A run stopped on purpose: a round left out more clients than ``train.max_excluded``
    allows (fail closed, not aggregated from a minority)."""


class ModelRefused(RuntimeError):
    """A trained model that did not pass the registration gate (federated/gate.py): it is
    logged on its run, not registered."""
