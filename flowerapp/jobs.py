"""A site's task and its outcome as plain values: what the ClientApp hands the site's
work (:mod:`flowerapp.site_work`), whether it runs there or in the warm trainer
(:mod:`flowerapp.trainer`, which carries them pickled over its socket).

This module imports no torch, so the ClientApp (Flower and numpy only) can build a
:class:`Job` and read an :class:`Answer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Answer", "ConfigValue", "Job"]

ConfigValue = str | int | float | bool


@dataclass(frozen=True)
class Job:
    """One message's task as plain values: what the ClientApp received and knows."""

    kind: str  # "train", "evaluate", "pretest" or "validate"
    task: dict[str, ConfigValue]  # the task record (flowerapp.task.SiteTask's fields)
    vector: np.ndarray  # the global model
    node: dict[str, ConfigValue]  # the SuperNode's node config (data file, approved plan)
    updates_sent: int = 0  # local DP: the noised updates this site sent in the run
    request: dict[str, ConfigValue] | None = None  # evaluate: which splits; pretest: mode
    candidates: np.ndarray | None = None  # validate: the candidate models (k, d)
    control: np.ndarray | None = None  # train under SCAFFOLD: the hub's control variate c


@dataclass
class Answer:
    """The task's outcome as plain values: arrays and metric records to send, or why not."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, dict[str, float | int | list[float]]] = field(default_factory=dict)
    refused: bool = False  # the task does not fit this site (one line in ``reason``)
    reason: str = ""  # a refusal or a failure; empty when the task ran
    train_refused: str = ""  # scored, but the training part refused (local DP's budget)
    updates_sent: int | None = None  # local DP: the run's count after this answer
    log_lines: list[str] = field(default_factory=list)  # what the site logs about it
    data_sha256: str = ""  # lineage: the SHA-256 of the data the site answered from
    train_counts: list[int] = field(default_factory=list)  # lineage: training images per class
    test_counts: list[int] = field(default_factory=list)  # lineage: held-out images per class
    data_s: float = 0.0  # the task checked, the site's data at hand
    work_s: float = 0.0  # training or scoring

    @property
    def failed(self) -> bool:
        return bool(self.reason)
