"""Train stage: federated rounds with a checkpoint after each, tracked in one MLflow run.

With ``resume=True`` a checkpoint written under the same params hash is picked up where
it stopped (the DVC stage always passes it, so ``dvc repro`` after a kill continues);
otherwise training starts from round 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from config.assembly import dataset_info_of
from config.params import Params, params_hash
from tasks.champion import score_champion_at_sites
from tasks.data import data_root, load_verified_dataset
from tasks.measured_defence import no_exclusion_sentence, start_line
from tasks.reports import (
    ProjectPaths,
    check_partitioned_images,
    read_local_tests,
    read_partition,
    read_root,
)
from tasks.sites import selected_model, train_at_sites
from tasks.tracking import Tracker, open_training_run
from tasks.training import (
    RunOutputs,
    build_federation,
    filters_that_cannot_exclude,
    halt_if_bound_exceeded,
    halt_if_tracking_lost,
    load_checkpoint,
    resumed_state,
    train_federation,
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
    get_run_logger().info("%s", start_line(params))
    for line in filters_that_cannot_exclude(params):
        get_run_logger().warning("%s", line)
    checkpoint = load_checkpoint(paths.checkpoint, digest) if resume else None
    tracker = open_training_run(
        params,
        paths,
        resume_run_id=checkpoint["run_id"] if checkpoint else None,
        parent_run_id=parent_run_id,
        run_name=run_name,
        history=checkpoint["state"]["history"] if checkpoint else (),
    )
    with tracker.ended_on_failure():
        if params.federation.runtime == "flower":  # the sites train; the hub aggregates
            if params.eval.where == "hub":  # the hub scores on its own splits
                load_verified_dataset(params.data, workdir)
            state, trained_noniid = train_at_sites(
                params, paths, tracker, digest, data_root=data_root(params.data.root, workdir),
                resume=checkpoint is not None,
            )  # fmt: skip
            model = selected_model(params, dataset_info_of(params.data), state)
            write_training_reports(paths, model, state, params, tracker, trained_noniid)
            say_when_nobody_was_excluded(params, state.trail, tracker)
            halt_if_bound_exceeded(state)
            halt_if_tracking_lost(tracker, state)
            return write_run_info(paths, tracker, state, digest)
        data = load_verified_dataset(params.data, workdir)
        check_partitioned_images(paths, data)
        split = paths.partition
        federation = build_federation(
            params, data, read_partition(split), read_root(split), read_local_tests(split)
        )
        state = train_federation(
            federation, resumed_state(federation, checkpoint), params, tracker,
            (paths.checkpoint, digest), RunOutputs(),
        )  # fmt: skip
        model = federation.selected_model(state)
        trained_noniid = trained_model_noniid(federation, model, params)
        write_training_reports(paths, model, state, params, tracker, trained_noniid)
        say_when_nobody_was_excluded(params, state.trail, tracker)
        if params.eval.where == "sites":  # the gate's champion, scored where the model was
            score_champion_at_sites(tracker, params, paths, federation, state)
        halt_if_bound_exceeded(state)  # fail closed: reports written, the run closed FAILED
        halt_if_tracking_lost(tracker, state)
    return write_run_info(paths, tracker, state, digest)


def say_when_nobody_was_excluded(
    params: Params, trail: list[dict[str, Any]], tracker: Tracker
) -> None:
    """With no site excluded, the run's log and its MLflow run (tag ``exclusions``, which
    the model card reads) say what this defence caught where it was measured: "no site
    excluded" alone would read as "every site honest"."""
    if any(row["excluded"] for row in trail):
        return
    sentence = no_exclusion_sentence(params)
    get_run_logger().info("%s", sentence)
    tracker.tags["exclusions"] = sentence  # kept in the run's tracking.json, for the card
    tracker.set_tags({"exclusions": sentence})
