"""The committed baseline (dvc.lock and the reports/ it lists) is what the committed code
and params produce: ``dvc status`` of the pipeline (dvc.yaml's stages) finds no stage
whose code, params or command changed since the lock was written, and no committed report
that differs from the lock.

"Clean" leaves out one thing: the outputs under artifacts/ (the partition, the model, its
run.json) are DVC's cache, not git's. A fresh clone has none of them (``dvc status`` says
"deleted" or "not in cache"), and a working copy has whatever it last ran; neither says
anything about the baseline. Everything git holds is compared: each stage's code and
params deps, its command, and the committed outputs in reports/. Read-only: ``dvc status``
writes only DVC's own state under .dvc/tmp (ignored by git).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.limits import limit

REPO = Path(__file__).resolve().parents[1]
UNCOMMITTED = ("artifacts/",)  # DVC-cached outputs: absent from a clone


def unclean(status: dict[str, list[Any]]) -> list[str]:
    """What ``dvc status --json`` reports changed, outside :data:`UNCOMMITTED`."""
    found = []
    for stage, changes in status.items():
        for change in changes:
            if isinstance(change, str):  # "changed command", "always changed"
                found.append(f"{stage}: {change}")
                continue
            for kind, paths in change.items():  # "changed deps" / "changed outs"
                found += [
                    f"{stage}: {kind}: {path} {state}"
                    for path, state in paths.items()
                    if not path.startswith(UNCOMMITTED)
                ]
    return found


def test_unclean_reports_what_git_holds_and_leaves_out_the_dvc_cache():
    status = {
        "partition": [{"changed outs": {"artifacts/partition/clients.npz": "not in cache"}}],
        "train": [
            {"changed deps": {"artifacts/partition/clients.npz": "deleted"}},
            {"changed deps": {"params.yaml": {"train.rounds": "modified"}}},
            {"changed deps": {"tasks/training.py": "modified"}},
            "changed command",
        ],
        "evaluate": [{"changed outs": {"reports/metrics.json": "modified"}}],
    }

    found = unclean(status)

    assert found == [
        "train: changed deps: params.yaml {'train.rounds': 'modified'}",
        "train: changed deps: tasks/training.py modified",
        "train: changed command",
        "evaluate: changed outs: reports/metrics.json modified",
    ]


# the main pipeline, and the shipped 3-D example (its params, reports/metrics.json and lock
# in its own folder): a stage whose code or params changed since its lock, or a committed
# metric the lock does not hash, is named
PIPELINES = ("dvc.yaml", "experiments/adrenalmnist3d/dvc.yaml")


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_the_committed_baseline_is_what_the_committed_code_and_params_produce(pipeline):
    result = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json", pipeline],
        cwd=REPO,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
        capture_output=True,
        text=True,
        timeout=limit(300),
    )

    assert result.returncode == 0, result.stderr[-3000:]
    changed = unclean(json.loads(result.stdout or "{}"))
    assert not changed, (
        "dvc.lock and reports/ are not what HEAD's code and params give; regenerate the "
        f"baseline of {pipeline} (`make run`, or `dvc repro {pipeline}`, then commit its "
        "dvc.lock and reports/):\n" + "\n".join(changed)
    )
