"""Train stage: federated rounds with a checkpoint after each, tracked in MLflow.

With ``resume=True`` a checkpoint written under the same params hash is picked up where
it stopped (the DVC stage always passes it, so ``dvc repro`` after a kill continues);
otherwise training starts from round 0.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from prefect import flow, get_run_logger
from tqdm import tqdm

from federated.server import ServerState
from fedsieve.config import Params, params_hash
from fedsieve.plots import plot_curves, plot_exclusion_heatmap
from fedsieve.reports import ProjectPaths, read_partition, write_csv, write_json
from fedsieve.tracking import Tracker, flatten_params
from flows.common import run_tags, stage_main, stop_if_requested
from tasks.data import load_verified_dataset
from tasks.training import build_federation, train_round

__all__ = ["load_checkpoint", "train_flow"]


def save_checkpoint(path: Path, *, state: ServerState, digest: str, run_id: str | None) -> None:
    """Atomic: a kill during the write leaves the previous round's checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "params_hash": digest,
            "run_id": run_id,
            "state": state.to_dict(),
            "torch_rng": torch.get_rng_state(),
        },
        tmp,
    )
    tmp.replace(path)


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


TRAIL_COLUMNS = (
    "round", "client", "num_samples", "malicious", "excluded", "reason", "score", "threshold",
    "distance", "p_term", "i_term", "d_term", "noniid_loss", "train_loss", "selected", "message",
)  # fmt: skip


def trail_columns(trail: list[dict[str, Any]]) -> list[str]:
    """The trail's columns: the documented ones first, any others a filter adds after."""
    extra = [k for k in dict.fromkeys(k for row in trail for k in row) if k not in TRAIL_COLUMNS]
    return [*TRAIL_COLUMNS, *extra]


def write_noniid_report(paths: ProjectPaths, state: ServerState, params: Params) -> None:
    """reports/noniid.json: the last non-IID evaluation (CV, threshold, verdict, losses)."""
    checked = [row for row in state.history if "noniid_cv" in row]
    if not checked:
        payload: dict[str, Any] = {
            "cv": None,
            "threshold": params.noniid.threshold,
            "verdict": "not_evaluated",
        }
    else:
        last = checked[-1]
        losses = {
            str(row["client"]): row["noniid_loss"]
            for row in state.trail
            if row["round"] == int(last["round"]) and "noniid_loss" in row
        }
        payload = {
            "cv": last["noniid_cv"],
            "threshold": params.noniid.threshold,
            "verdict": "non_iid" if last["noniid_non_iid"] else "iid",
            "round": int(last["round"]),
            "loss": params.noniid.loss,
            "client_losses": losses,
            "cv_per_round": {int(row["round"]): row["noniid_cv"] for row in checked},
        }
    write_json(paths.noniid, payload)


@flow(name="train")
def train_flow(
    params: Params,
    workdir: Path,
    resume: bool = False,
    parent_run_id: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    logger = get_run_logger()
    paths = ProjectPaths(workdir)
    digest = params_hash(params)
    checkpoint = load_checkpoint(paths.checkpoint) if resume else None
    resumable = checkpoint is not None and checkpoint["params_hash"] == digest
    if checkpoint is not None and not resumable:
        logger.info(
            "checkpoint is for other params (hash %s); starting afresh", checkpoint["params_hash"]
        )

    # The tracker works in the background: MLflow starts while the data loads and round 1 runs.
    tracker = Tracker(params.tracking.experiment)
    tags = run_tags(params, workdir)
    if parent_run_id is not None:
        tags["mlflow.parentRunId"] = parent_run_id
    resumed_run_id = checkpoint["run_id"] if resumable else None
    tracker.start(
        run_id=resumed_run_id,
        run_name=run_name or f"{params.data.dataset}-{params.aggregate.name}",
        tags=tags,
    )
    if resumed_run_id is None:
        tracker.log_params(flatten_params(params.model_dump(mode="json")))
    for path in (paths.partition_report, paths.partition_plot):
        tracker.log_artifact(path, "partition")

    with tracker.ended_on_failure():
        data = load_verified_dataset(params.data, workdir)
        federation = build_federation(params, data, read_partition(paths.partition))
        state = federation.initial_state()
        if resumable:
            state = ServerState.from_dict(checkpoint["state"], device=federation.device)
            torch.set_rng_state(checkpoint["torch_rng"])
            logger.info("resuming from the checkpoint after round %d", state.round)

        rounds = params.train.rounds
        on_terminal = sys.stderr.isatty()
        with (
            tqdm(
                total=rounds,
                initial=state.round,
                desc="rounds",
                unit="round",
                disable=not on_terminal,
            ) as bar,
            tqdm(
                total=federation.clients_per_round,
                desc="clients",
                unit="client",
                leave=False,
                disable=not on_terminal,
            ) as client_bar,
        ):
            while state.round < rounds:
                stop_if_requested()  # a cancelled comparison stops its cells between rounds
                client_bar.reset()
                state, report = train_round(
                    federation, state, on_client=lambda _client_id: client_bar.update(1)
                )
                client_losses = {
                    f"client_loss/{row['client']}": row["train_loss"]
                    for row in report.clients
                    if "train_loss" in row
                } | {
                    f"noniid_loss/{row['client']}": row["noniid_loss"]
                    for row in report.clients
                    if "noniid_loss" in row
                }
                # Logged before the checkpoint (reading run_id waits for the tracker): a kill in
                # between re-runs (and re-logs) this round identically on resume, so no round's
                # metrics can go missing.
                tracker.log_metrics({**report.metrics, **client_losses}, step=report.round)
                save_checkpoint(paths.checkpoint, state=state, digest=digest, run_id=tracker.run_id)
                bar.update(1)
                bar.set_postfix(
                    acc=f"{report.metrics['test_acc']:.3f}", auc=f"{report.metrics['test_auc']:.3f}"
                )
                logger.info(
                    "round %d/%d: test loss %.4f acc %.4f auc %.4f",
                    report.round,
                    rounds,
                    report.metrics["test_loss"],
                    report.metrics["test_acc"],
                    report.metrics["test_auc"],
                )

        model = federation.selected_model(state)
        if params.eval.select == "best_val":
            logger.info(
                "final model: round %d (best validation AUC %.4f)",
                state.selected_round,
                state.best_val_auc,
            )
        paths.model.parent.mkdir(parents=True, exist_ok=True)
        # contiguous: the file does not depend on the layout training used (federated.layout)
        torch.save(
            {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, paths.model
        )
        write_csv(paths.rounds, state.history)
        write_csv(paths.exclusions, state.trail, columns=trail_columns(state.trail))
        write_noniid_report(paths, state, params)
        plot_exclusion_heatmap(state.trail, paths.exclusion_heatmap)
        tracker.log_table(state.trail, "exclusions.json")
        plot_curves(state.history, paths.curves)
        for path in (
            paths.rounds,
            paths.exclusions,
            paths.curves,
            paths.exclusion_heatmap,
            paths.noniid,
        ):
            tracker.log_artifact(path, "reports")
    info = {
        "run_id": tracker.run_id,
        "params_hash": digest,
        "rounds": state.round,
        "selected_round": state.selected_round,
        "tags": tags,
        "tracking_failed": tracker.failed,
    }
    write_json(paths.run_info, info)
    if tracker.failed:  # already stated as a warning when it happened
        logger.info("tracking was off for this run (%s); reports/ holds everything", tracker.failed)
    return info


main = stage_main("train")

if __name__ == "__main__":
    main()
