"""The hub's Flower ServerApp: the engine's round loop over the registered sites.

``flwr run`` starts it on the hub with a run config naming the hub's folder
(:class:`flowerapp.hub.HubFiles`: the run's params in, each round's report out), the
MedMNIST folder holding the hub's validation and test splits (never opened under
``eval.where: sites``: the sites score the model, the hub holds no data), the checkpoint
path, the MLflow run id kept in the checkpoint, whether to resume, and the run's token. The
rounds run through the same driver as a simulated run (:class:`federated.driver.RunDriver`):
each is journaled to ``rounds.jsonl`` under the run's token (the hub's Prefect task
follows it into MLflow), then checkpointed (the file the simulated train stage writes),
then said in one line; ``outcome.json`` says how the run ended (the privacy budget's
reason when it ended early).
"""

from __future__ import annotations

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
from federated.driver import RunDriver
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
    token = str(config.get("run-token", ""))
    try:
        outcome = run_hub(
            grid, files, data_root=Path(str(config["data-root"])),
            checkpoint=Path(str(config["checkpoint"])), run_id=str(config.get("run-id", "")) or None,
            resume=bool(config.get("resume", False)), token=token,
        )  # fmt: skip
    except Exception as error:  # said in outcome.json for the hub's pipeline, then raised
        outcome = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
        log.error("hub failed: %s", traceback.format_exc())
        files.write_outcome(token, outcome)
        raise
    files.write_outcome(token, outcome)


def run_hub(
    grid: Grid, files: HubFiles, *, data_root: Path, checkpoint: Path, run_id: str | None,
    resume: bool, token: str = "",
) -> dict[str, Any]:  # fmt: skip
    """The run's rounds at the sites, from the checkpoint when ``resume`` finds one, each
    journaled under the run's ``token`` for the hub's pipeline."""
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
        on_exchange=lambda exchange: files.record_exchange(exchange, token),
    )  # fmt: skip
    federation = hub_federation(params, data, executor, executor)
    saved = read_checkpoint(checkpoint, digest) if resume else None
    state = federation.initial_state()
    if saved is not None:
        state = ServerState.from_dict(saved["state"], device=federation.device)
        log.info("resuming after round %d", state.round)

    def journal(report: RoundReport) -> None:
        files.journal(report, token, elapsed_s=time.monotonic() - started)
        if spent := _site_epsilons(params, report):
            log.info(
                "round %d: local DP, ε of each site that sent an update: %s", report.round, spent
            )

    def save(new_state: ServerState) -> None:
        save_checkpoint(checkpoint, state=new_state, digest=digest, run_id=run_id)

    driver = RunDriver(
        rounds=params.train.rounds, record=journal, checkpoint=save, say=log.info,
        warn=log.warning,
    )  # fmt: skip
    end = driver.run(federation, state)
    return {
        "status": "finished", "rounds": end.state.round, "stopped_early": end.stopped_early,
        "bytes_sent": executor.bytes_sent,
    }  # fmt: skip


def _site_epsilons(params: Params, report: RoundReport) -> str:
    """``name ε`` of each site that sent an update in the round (local DP), or ''."""
    return ", ".join(
        f"{params.federation.sites[int(row['client'])].name} {row['privacy_epsilon']:.4f}"
        for row in report.clients
        if "privacy_epsilon" in row
    )
