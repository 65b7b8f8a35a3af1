"""Train stage: federated rounds with a checkpoint after each, tracked in one MLflow run.

With ``resume=True`` a checkpoint written under the same params hash is picked up where
it stopped (the DVC stage always passes it, so ``dvc repro`` after a kill continues);
otherwise training starts from round 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from fedsieve.config import Params, params_hash
from tasks.data import load_verified_dataset
from tasks.reports import ProjectPaths, read_local_tests, read_partition, read_root
from tasks.stopping import stop_if_requested
from tasks.tracking import open_training_run
from tasks.training import (
    RoundProgress,
    build_federation,
    halt_if_bound_exceeded,
    load_checkpoint,
    record_budget_spent,
    record_round,
    resumed_state,
    train_round,
    trained_model_noniid,
    write_run_info,
    write_training_reports,
)

__all__ = ["train_flow"]


@flow(name="train")
def train_flow(
    params: Params,
    workdir: Path,
    resume: bool = False,
    parent_run_id: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """``parent_run_id``/``run_name`` make the MLflow run a named child (a grid's cell)."""
    paths = ProjectPaths(workdir)
    digest = params_hash(params)
    checkpoint = load_checkpoint(paths.checkpoint, digest) if resume else None
    tracker = open_training_run(
        params,
        paths,
        resume_run_id=checkpoint["run_id"] if checkpoint else None,
        parent_run_id=parent_run_id,
        run_name=run_name,
    )
    with tracker.ended_on_failure():
        data = load_verified_dataset(params.data, workdir)
        split = paths.partition
        federation = build_federation(
            params, data, read_partition(split), read_root(split), read_local_tests(split)
        )
        state = resumed_state(federation, checkpoint)
        rounds = params.train.rounds
        with RoundProgress(rounds, state.round, federation.clients_per_round) as progress:
            while state.round < rounds and state.halted is None:
                if federation.budget_spent(state):  # fail closed: the run ends cleanly here
                    break
                stop_if_requested()  # a cancelled comparison stops its cells between rounds
                state, report = train_round(federation, state, on_client=progress.client_done)
                record_round(tracker, report, state, paths.checkpoint, digest)
                progress.round_done(report)
        record_budget_spent(
            tracker, federation.budget_spent(state) if state.round < rounds else None
        )
        model = federation.selected_model(state)
        trained_noniid = trained_model_noniid(federation, model, params)
        write_training_reports(paths, model, state, params, tracker, trained_noniid)
        halt_if_bound_exceeded(state)  # fail closed: reports written, the run closed FAILED
    return write_run_info(paths, tracker, state, digest)
