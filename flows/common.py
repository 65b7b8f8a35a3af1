"""What every stage's flow shares: run metadata and the stage entry point."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fedsieve.config import Params, params_hash

__all__ = ["git_commit", "run_tags", "stage_main"]


def git_commit(workdir: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def run_tags(params: Params, workdir: Path) -> dict[str, str]:
    return {
        "dataset": params.data.dataset,
        "model": params.model.name,
        "aggregator": params.aggregate.name,
        "filters": ",".join(f.name for f in params.filters) or "none",
        "partition": params.partition.scheme,
        "attack": params.attack.name,
        "malicious_fraction": "0"
        if params.attack.name == "none"
        else str(
            params.attack.fraction
            if params.attack.ids is None
            else len(params.attack.ids) / params.partition.num_clients
        ),
        "seed": str(params.seed),
        "params_hash": params_hash(params),
        "git_commit": git_commit(workdir),
    }


def stage_main(stage: str) -> Callable[[], None]:
    """``python -m flows.<stage>`` == ``fedsieve <stage>``."""

    def main() -> None:
        from fedsieve.cli import console

        console([stage, *sys.argv[1:]])

    return main
