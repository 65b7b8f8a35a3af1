"""A site's SCAFFOLD control variate c_i, kept on the site's own disk between rounds
(Karimireddy et al. 2020, Algorithm 1: the client keeps c_i; the hub is sent Δc_i only).

The variate lives in the site's state folder (``fedsieve-site --state DIR``, node config
``state-dir``), one file per run (``scaffold/<run key>.npz``, the run key the hub's
params hash), so it survives a restart of the site. The file holds c_i as it was after
each of the last :data:`KEPT` rounds the site trained: training round r starts from the
variate of the latest kept round before r (zero when the site has not trained before r in
this run), so a round asked again (a hub resumed from its checkpoint, a retried message)
trains from the same c_i, and a run started afresh starts from zero. A round whose
starting variate was dropped to keep the file small is refused in one line. Written
atomically (a temporary file, then a rename).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["KEPT", "ControlStore", "ControlStoreError"]

KEPT = 3  # rounds of c_i kept: a hub resumed one round back still finds its start
RUN_KEY = re.compile(r"[0-9a-f]{8,64}")


class ControlStoreError(ValueError):
    """A variate this site cannot give: why, in one line."""


@dataclass(frozen=True)
class ControlStore:
    """The site's variates of one run, under ``folder`` (the site's state folder)."""

    folder: Path
    run_key: str

    def __post_init__(self) -> None:
        if not RUN_KEY.fullmatch(self.run_key):
            raise ControlStoreError(
                f"run key {self.run_key!r} is not the hub's params hash (8-64 hex digits)"
            )

    @property
    def path(self) -> Path:
        return self.folder / "scaffold" / f"{self.run_key}.npz"

    def _read(self) -> tuple[list[int], list[np.ndarray], int]:
        """The kept rounds, their variates and the first round this site trained (0:
        none)."""
        if not self.path.exists():
            return [], [], 0
        try:
            with np.load(self.path) as saved:
                rounds = [int(r) for r in saved["rounds"]]
                controls = list(saved["controls"])
                first = int(saved["first_trained"])
        except (OSError, KeyError, ValueError) as error:
            raise ControlStoreError(f"SCAFFOLD variate file {self.path}: {error}") from None
        return rounds, controls, first

    def before(self, round_number: int, size: int) -> np.ndarray:
        """c_i as training ``round_number`` starts (float32, ``size`` values)."""
        rounds, controls, first = self._read()
        earlier = [k for k, r in enumerate(rounds) if r < round_number]
        if earlier:
            control = controls[earlier[-1]]
        elif first and first < round_number:
            raise ControlStoreError(
                f"round {round_number} starts from this site's SCAFFOLD variate of a round "
                f"before {rounds[0]}, which it no longer keeps (it keeps the last {KEPT})"
            )
        else:
            control = np.zeros(size, dtype=np.float32)
        if control.shape != (size,):
            raise ControlStoreError(
                f"this site's SCAFFOLD variate has {control.size} values; the model has {size}"
            )
        return control

    def save(self, round_number: int, control: np.ndarray) -> None:
        """Keep c_i after ``round_number``: later rounds' variates (of a run asked again
        from an earlier round) are dropped, and all but the last :data:`KEPT`."""
        rounds, controls, first = self._read()
        kept = [(r, c) for r, c in zip(rounds, controls, strict=True) if r < round_number]
        kept = [*kept, (round_number, control.astype(np.float32))][-KEPT:]
        first = first if first and first < round_number else round_number
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(
            partial,
            rounds=np.array([r for r, _ in kept], dtype=np.int64),
            controls=np.stack([c for _, c in kept]),
            first_trained=np.int64(first),
        )
        partial.replace(self.path)
