"""The hub's Flower ServerApp: the engine's round loop over the registered sites.

``flwr run`` starts it on the hub with a run config naming the hub's folder
(:class:`flowerapp.hub.HubFiles`: the run's params in, each round's report out), the
MedMNIST folder holding the hub's validation and test splits (never opened under
``eval.where: sites``: the sites score the model, the hub holds no data), the checkpoint path, the
MLflow run id kept in the checkpoint, and whether to resume. Every round is checkpointed
(the file the simulated train stage writes) and appended to ``rounds.jsonl``, which the
hub's Prefect task follows into MLflow; ``outcome.json`` says how the run ended.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from config.dataset import dataset_info_of, read_dataset
from config.params import Params, params_hash
from federated.checkpoint import read_checkpoint, save_checkpoint
from federated.loop import train
from federated.server import RoundReport, ServerState
from flowerapp.hub import HubFiles, hub_federation, shuffle_seed, site_nodes, site_task
from flowerapp.plan import plan_digest
from flowerapp.remote import RemoteExecutor

__all__ = ["app", "run_hub"]

log = logging.getLogger("flwr")
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    files = HubFiles(Path(str(config["hub-folder"])))
    try:
        outcome = run_hub(
            grid, files, data_root=Path(str(config["data-root"])),
            checkpoint=Path(str(config["checkpoint"])), run_id=str(config.get("run-id", "")) or None,
            resume=bool(config.get("resume", False)),
        )  # fmt: skip
    except Exception as error:  # said in outcome.json for the hub's pipeline, then raised
        outcome = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
        log.error("hub failed: %s", traceback.format_exc())
        _write_outcome(files, outcome)
        raise
    _write_outcome(files, outcome)


def run_hub(
    grid: Grid, files: HubFiles, *, data_root: Path, checkpoint: Path, run_id: str | None,
    resume: bool,
) -> dict[str, Any]:  # fmt: skip
    """The run's rounds at the sites, from the checkpoint when ``resume`` finds one."""
    started = time.monotonic()
    params = files.read_params()
    digest = params_hash(params)
    data = None  # eval.where: sites: the hub holds no images
    if params.eval.where == "hub":
        data = read_dataset(params.data, medmnist_root=data_root, workdir=Path.cwd())
    task = site_task(params, dataset_info_of(params.data))
    log.info("training plan sha256 %s (what `fedsieve plan` writes)", plan_digest(task))
    executor = RemoteExecutor(
        grid, site_nodes(params), task,
        seed_of=lambda round_number, client: shuffle_seed(params, round_number, client),
        round_timeout=params.federation.round_timeout,
    )  # fmt: skip
    federation = hub_federation(params, data, executor, executor)
    saved = read_checkpoint(checkpoint, digest) if resume else None
    state = federation.initial_state()
    if saved is not None:
        state = ServerState.from_dict(saved["state"], device=federation.device)
        log.info("resuming after round %d", state.round)
    elif files.rounds.exists():
        files.rounds.unlink()  # a fresh run's rounds only

    def on_round(report: RoundReport, new_state: ServerState) -> None:
        save_checkpoint(checkpoint, state=new_state, digest=digest, run_id=run_id)
        with files.rounds.open("a") as out:  # after the checkpoint: a resumed run re-reads it
            record = _report_record(report) | {"elapsed_s": time.monotonic() - started}
            out.write(json.dumps(record, default=float) + "\n")
        metrics = report.metrics
        log.info(
            "round %d/%d: test acc %.4f auc %.4f, %d of %d sites left out",
            report.round, params.train.rounds, metrics["test_acc"], metrics["test_auc"],
            sum(bool(row["excluded"]) for row in report.clients), len(report.clients),
        )  # fmt: skip
        if spent := _site_epsilons(params, report):
            log.info(
                "round %d: local DP, ε of each site that sent an update: %s", report.round, spent
            )

    state = train(federation, state, params.train.rounds, on_round=on_round)
    return {"status": "finished", "rounds": state.round, "bytes_sent": executor.bytes_sent}


def _site_epsilons(params: Params, report: RoundReport) -> str:
    """``name ε`` of each site that sent an update in the round (local DP), or ''."""
    return ", ".join(
        f"{params.federation.sites[int(row['client'])].name} {row['privacy_epsilon']:.4f}"
        for row in report.clients
        if "privacy_epsilon" in row
    )


def _report_record(report: RoundReport) -> dict[str, Any]:
    return {"round": report.round, "metrics": report.metrics, "clients": report.clients,
            "sites": report.sites}  # fmt: skip


def _write_outcome(files: HubFiles, outcome: dict[str, Any]) -> None:
    files.outcome.write_text(json.dumps(outcome) + "\n")
