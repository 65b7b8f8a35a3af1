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
reason when it ended early) and what data each site said it answered from
(:mod:`flowerapp.lineage`).
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from config.dataset import dataset_info_of, read_dataset
from config.params import Params, params_hash
from federated.checkpoint import read_checkpoint, save_checkpoint
from federated.driver import RunDriver
from federated.loop import train
from federated.server import Federation, RoundReport, ServerState
from flowerapp.hub import (
    SERVERAPP_EXIT_GRACE_S,
    HubFiles,
    hub_federation,
    shuffle_seed,
    site_nodes,
    site_task,
)
from flowerapp.plan import plan_digest
from flowerapp.remote import RemoteExecutor

__all__ = [
    "app",
    "end_if_exit_hangs",
    "run_hub",
    "run_pretest",
    "stacks_on_sigusr1",
]

log = logging.getLogger("flwr")
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    files = HubFiles(Path(str(config["hub-folder"])))
    token = str(config.get("run-token", ""))
    stacks_on_sigusr1(files.stacks)
    try:
        files.write_outcome(token, _stage_outcome(grid, config, files, token))
    finally:
        end_if_exit_hangs(files.stacks)


def _stage_outcome(grid: Grid, config: Any, files: HubFiles, token: str) -> dict[str, Any]:
    """The run config's stage (the pre-test or the rounds) run to its outcome; a failure is
    written as the outcome for the hub's pipeline, then raised."""
    data_root = Path(str(config["data-root"]))
    try:
        if config.get("stage", "train") == "pretest":
            return run_pretest(grid, files, data_root=data_root, token=token)
        return run_hub(
            grid, files, data_root=data_root, checkpoint=Path(str(config["checkpoint"])),
            run_id=str(config.get("run-id", "")) or None,
            resume=bool(config.get("resume", False)), token=token,
        )  # fmt: skip
    except Exception as error:
        log.error("hub failed: %s", traceback.format_exc())
        files.write_outcome(
            token, {"status": "failed", "error": f"{type(error).__name__}: {error}"}
        )
        raise


def stacks_on_sigusr1(path: Path) -> None:
    """``kill -USR1 <pid>`` appends every thread's stack to ``path``, also after ``main``
    returns (faulthandler keeps the file open): where a process that outlived its run
    waits. Not stderr: Flower sends a ServerApp's output to /dev/null."""
    faulthandler.register(signal.SIGUSR1, file=path.open("a"), all_threads=True)


def end_if_exit_hangs(stacks: Path, grace: float = SERVERAPP_EXIT_GRACE_S) -> None:
    """If the process is still alive ``grace`` seconds from now, append every thread's stack
    to ``stacks`` and end it (exit code 1), whatever holds it.

    Called as ``main`` returns, once the run's outcome is written. Flower 1.32.1 can
    deadlock on its way out: a call refused after its token was revoked sends the process
    SIGINT, whose handler waits for the exit-handler lock that the exiting thread holds
    (flwrlabs/flower#7919), and a hub would gather such processes. faulthandler's watchdog
    is a C thread, so it fires even if the stuck thread holds the interpreter; a process
    that exits in time cancels it on the way out."""
    faulthandler.dump_traceback_later(grace, exit=True, file=stacks.open("a"))


def run_hub(
    grid: Grid, files: HubFiles, *, data_root: Path, checkpoint: Path, run_id: str | None,
    resume: bool, token: str = "",
) -> dict[str, Any]:  # fmt: skip
    """The run's rounds at the sites, from the checkpoint when ``resume`` finds one, each
    journaled under the run's ``token`` for the hub's pipeline."""
    started = time.monotonic()
    params = files.read_params()
    digest = params_hash(params)
    executor, federation = _at_sites(grid, files, params, data_root=data_root, token=token)
    saved = read_checkpoint(checkpoint, digest) if resume else None
    state = federation.initial_state()
    if saved is not None:
        state = ServerState.from_dict(saved["state"], device=federation.device)
        log.info("resuming after round %d", state.round)

    heard: set[str] = set()  # the sites whose data the journal has named

    def journal(report: RoundReport) -> None:
        first = {c: h[0] for c, h in executor.lineage.to_json().items() if c not in heard}
        heard.update(first)
        files.journal(report, token, first_heard=first, elapsed_s=time.monotonic() - started)
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
    champion = _score_champion(files, federation, end.state, token)
    return {
        "status": "finished", "rounds": end.state.round, "stopped_early": end.stopped_early,
        "bytes_sent": executor.bytes_sent,
        "trained_noniid": _trained_noniid(params, federation, end.state),
        "site_data": executor.lineage.to_json(), "champion": champion,
    }  # fmt: skip


def run_pretest(grid: Grid, files: HubFiles, *, data_root: Path, token: str) -> dict[str, Any]:
    """The pre-test stage at the sites, as the simulated stage runs it: ``pretest.round``
    rounds trained as training would train them, then every site's gradient or one-epoch
    update at that model (``pretest.mode``), saved for the hub's pipeline to test
    (:attr:`HubFiles.pretest_updates`; the sites that did not answer are named)."""
    params = files.read_params()
    executor, federation = _at_sites(grid, files, params, data_root=data_root, token=token)
    state = train(federation, federation.initial_state(), params.pretest.round)
    ids = [client.client_id for client in federation.clients]
    updates = executor.pretest_updates(
        state.global_vector, state.round + 1, ids, params.pretest.mode
    )
    answered = list(updates)
    stacked = torch.stack([updates[i].cpu() for i in answered]) if answered else torch.empty(0)
    torch.save({"client_ids": answered, "updates": stacked, "token": token}, files.pretest_updates)
    return {"status": "finished", "rounds": state.round, "answered": answered,
            "missing": [i for i in ids if i not in updates],
            "site_data": executor.lineage.to_json()}  # fmt: skip


def _at_sites(
    grid: Grid, files: HubFiles, params: Params, *, data_root: Path, token: str
) -> tuple[RemoteExecutor, Federation]:
    """The remote executor over the registered sites and the federation the hub runs
    with it (the hub's splits read under ``eval.where: hub``; none under ``sites``)."""
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
    return executor, hub_federation(params, data, executor, executor)


def _score_champion(
    files: HubFiles, federation: Federation, state: ServerState, token: str
) -> dict[str, Any] | None:
    """The run's model and the champion the hub's pipeline left for this run, scored in
    the same federated evaluation: one exchange each, on every site's held-out split,
    pooled over the sites that answered both (None when no champion was left)."""
    if not files.champion.exists():
        return None
    saved = torch.load(files.champion, map_location="cpu", weights_only=True)
    if saved.get("token") != token:
        return None
    scores = {"version": saved["version"], **federation.scored_beside(state, saved["vector"])}
    log.info(
        "the champion (version %s) scored beside this run's model: %s", saved["version"], scores
    )
    return scores


def _trained_noniid(
    params: Params, federation: Federation, state: ServerState
) -> dict[str, Any] | None:
    """EMA's check of the trained model (``noniid.final``): each site's loss of it on its
    own training data, one number each, and the CV verdict (None when not asked, or when
    fewer than two sites answered)."""
    if not params.noniid.final or federation.defence.noniid is None:
        return None
    noniid = params.noniid
    result = federation.scorer.trained_model_noniid(
        federation.selected_model(state), noniid.loss, noniid.threshold
    )
    return None if result is None else result.trained_report(noniid.loss)


def _site_epsilons(params: Params, report: RoundReport) -> str:
    """``name ε`` of each site that sent an update in the round (local DP), or ''."""
    return ", ".join(
        f"{params.federation.sites[int(row['client'])].name} {row['privacy_epsilon']:.4f}"
        for row in report.clients
        if "privacy_epsilon" in row
    )
