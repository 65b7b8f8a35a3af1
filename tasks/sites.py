"""Training at real sites: the hub's side of ``federation.runtime: flower``.

The train stage hands the run to fedsieve's Flower ServerApp (:mod:`flowerapp.server_app`)
with ``flwr run`` against the SuperLink connection ``federation.superlink``, follows the
rounds it journals into the stage's MLflow run as they end (through the train stage's
driver, :func:`tasks.training.run_driver`: the record and the line a simulated round
gets), and returns the server state from the checkpoint the ServerApp kept (the same file
a simulated run writes, so ``--resume`` continues either). Flower runs in its own environment (``make
setup-flower``): its CLI is ``$FEDSIEVE_FLOWER_BIN/flwr``, by default the project's
``.venv-flower/bin/flwr``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from config.assembly import build_global_model, dataset_info_of
from config.errors import ConfigError
from config.params import Params
from federated.checkpoint import read_checkpoint
from federated.data import DatasetInfo
from federated.driver import RunDriver
from federated.server import ServerState
from federated.vectors import vector_to_model_
from flowerapp.flwr_config import config_pairs
from flowerapp.hub import HubFiles, round_report, write_params
from flowerapp.lineage import SiteLineage, describe_rounds
from tasks.champion import champion_to_score, write_champion_scores
from tasks.reports import ProjectPaths, write_json
from tasks.stopping import stop_if_requested
from tasks.tracking import Tracker
from tasks.training import record_budget_spent, run_driver

__all__ = [
    "APP_DIR",
    "flower_cli",
    "pretest_updates_at_sites",
    "record_site_data",
    "selected_model",
    "train_at_sites",
]

APP_DIR = Path(__file__).resolve().parent.parent / "flowerapp" / "app"  # the FAB's source
POLL_S = 0.5


def flower_cli() -> Path:
    """The ``flwr`` CLI of the Flower environment; a missing one is a one-line error."""
    default = Path(__file__).resolve().parent.parent / ".venv-flower" / "bin"
    cli = Path(os.environ.get("FEDSIEVE_FLOWER_BIN") or default) / "flwr"
    if not cli.exists():
        raise ConfigError(
            f"federation.runtime = flower needs Flower's CLI, not found at {cli}: run "
            "`make setup-flower` or set FEDSIEVE_FLOWER_BIN to the folder holding flwr"
        )
    return cli


def _run_config(values: dict[str, str | bool]) -> list[str]:
    """Flower's ``--run-config`` options, one TOML ``key=value`` pair each."""
    return [option for pair in config_pairs(values) for option in ("--run-config", pair)]


@task(name="train-at-sites", cache_policy=NO_CACHE)
def train_at_sites(
    params: Params, paths: ProjectPaths, tracker: Tracker, digest: str, *, data_root: Path,
    resume: bool,
) -> tuple[ServerState, dict[str, Any] | None]:  # fmt: skip
    """The run's rounds at the sites (the ServerApp on the SuperLink), each logged to
    MLflow as it ends; the final server state and the trained model's non-IID check (as
    :func:`tasks.training.trained_model_noniid` gives it; the sites' losses of it). The
    run starts clean: an earlier run's ServerApp still running from this folder is
    stopped, its journal and outcome are removed, and this run's token marks what its own
    ServerApp writes."""
    files = HubFiles(paths.artifacts / "hub")
    saved = read_checkpoint(paths.checkpoint, digest) if resume else None
    config = {
        "checkpoint": str(paths.checkpoint.resolve()), "run-id": tracker.run_id or "",
        "resume": saved is not None,
    }  # fmt: skip
    get_run_logger().info(
        "training at %d sites through SuperLink connection %r",
        len(params.federation.sites),
        params.federation.superlink,
    )
    driver = run_driver(params.train.rounds, tracker, checkpoint=None)
    after = saved["state"]["round"] if saved is not None else 0

    say_site = _site_line(params)

    def follow(process: subprocess.Popen[bytes], token: str) -> None:
        _follow(process, files, token, driver, after=after, say_site=say_site)

    champion = None
    paths.champion_at_sites.unlink(missing_ok=True)
    if params.eval.where == "sites" and params.tracking.register_model:
        champion = champion_to_score(tracker, params)
    outcome = _run_at_hub(
        params, files, config, data_root=data_root, follow=follow, champion=champion
    )
    if outcome.get("champion") is not None:
        write_champion_scores(paths, tracker, outcome["champion"])
    record_site_data(
        params, paths, tracker, outcome.get("site_data") or {}, resumed=saved is not None
    )
    record_budget_spent(tracker, outcome.get("stopped_early"))
    checkpoint = read_checkpoint(paths.checkpoint, digest)
    if checkpoint is None:
        raise RuntimeError(f"the ServerApp finished but left no checkpoint at {paths.checkpoint}")
    return ServerState.from_dict(checkpoint["state"]), outcome.get("trained_noniid")


@task(name="pretest-updates-at-sites", cache_policy=NO_CACHE)
def pretest_updates_at_sites(
    params: Params, paths: ProjectPaths, *, data_root: Path
) -> tuple[torch.Tensor, list[int]]:
    """The pre-test stage at the sites: ``pretest.round`` rounds trained there as training
    would train them, then each site's gradient or one-epoch update (``pretest.mode``),
    stacked ``(n_sites, d)``, with the client ids of the sites that answered."""
    files = HubFiles(paths.artifacts / "hub-pretest")
    get_run_logger().info(
        "pre-test at %d sites through SuperLink connection %r",
        len(params.federation.sites),
        params.federation.superlink,
    )

    def wait(process: subprocess.Popen[bytes], token: str) -> None:
        while process.poll() is None:
            stop_if_requested()
            time.sleep(POLL_S)

    outcome = _run_at_hub(params, files, {"stage": "pretest"}, data_root=data_root, follow=wait)
    say_site = _site_line(params)
    for client, history in (outcome.get("site_data") or {}).items():
        get_run_logger().info("%s", say_site(client, history[0]))
    saved = torch.load(files.pretest_updates, map_location="cpu", weights_only=True)
    if outcome["missing"]:
        names = [params.federation.sites[i].name for i in outcome["missing"]]
        get_run_logger().warning("pre-test: no update from %s", ", ".join(names))
    return saved["updates"], list(saved["client_ids"])


def record_site_data(
    params: Params, paths: ProjectPaths, tracker: Tracker, said: dict[str, Any], *,
    resumed: bool,
) -> dict[str, Any]:  # fmt: skip
    """Each site's data lineage on the run (:mod:`flowerapp.lineage`): the SHA-256 and
    training images per class it answered from, as ``reports/site_data.json`` (an
    artifact), a tag ``site_data.<site>`` and a dataset input per site; a site whose data
    changed during the run (or between the run's parts, when resumed) is said and tagged
    (``site_data.changed``), and a site that never answered is named."""
    lineage = SiteLineage.from_json(said)
    if resumed and paths.site_data.exists():
        earlier = json.loads(paths.site_data.read_text())
        if earlier.get("run_id") == tracker.run_id:
            merged = SiteLineage.from_json(earlier["lineage"])
            merged.extend(lineage)
            lineage = merged
    names = [site.name for site in params.federation.sites]
    info = dataset_info_of(params.data)
    labels, histories = info.labels, lineage.to_json()
    sites = [
        {"site": names[int(client)], "client": int(client), "sha256": history[-1]["sha256"],
         "classes": dict(zip(labels, history[-1]["train"], strict=False)),
         "changed": len(history) > 1, "history": history}
        for client, history in histories.items()
    ]  # fmt: skip
    answered = {site["client"] for site in sites}
    report = {
        "run_id": tracker.run_id, "sites": sites, "lineage": histories,
        "silent": [name for client, name in enumerate(names) if client not in answered],
        "test_majority_share": None if info.multi_label else lineage.test_majority_share(),
    }  # fmt: skip
    write_json(paths.site_data, report)
    tracker.log_artifact(paths.site_data, "sites")
    tracker.set_tags({f"site_data.{site['site']}": site["sha256"] for site in sites})
    for site in sites:  # MLflow keeps a dataset digest of at most 36 characters
        tracker.log_dataset(
            f"site {site['site']}", site["sha256"][:32], f"fedsieve-site {site['site']}", "train"
        )
    logger = get_run_logger()
    for site in (site for site in sites if site["changed"]):
        steps = " then ".join(
            f"{seen['sha256'][:12]} ({describe_rounds(seen)})" for seen in site["history"]
        )
        logger.warning("site %s's data changed during the run: %s", site["site"], steps)
    if changed := [site["site"] for site in sites if site["changed"]]:
        tracker.set_tags({"site_data.changed": ", ".join(changed)})
    if report["silent"]:
        logger.warning("no data lineage from %s: they never answered", ", ".join(report["silent"]))
    return report


def _run_at_hub(
    params: Params, files: HubFiles, config: dict[str, str | bool], *, data_root: Path,
    follow: Callable[[subprocess.Popen[bytes], str], None],
    champion: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``flwr run`` of the hub's ServerApp with ``config`` (the hub's folder, data root and
    a new run token added), ``follow`` called until it ends; its finished outcome. An
    earlier run's ServerApp still running from this folder is stopped first and its files
    removed; on failure or cancellation here, the run there is stopped too. ``champion``
    (its ``version`` and ``vector``) is left for the ServerApp to score at the sites."""
    log_path = files.folder / "flwr-run.log"
    if log_path.exists() and not files.outcome.exists():  # killed before it could stop it
        _stop_run(log_path, params.federation.superlink)
    files.clear()
    write_params(files.params, params)
    token = uuid.uuid4().hex
    if champion is not None:
        torch.save({**champion, "token": token}, files.champion)
    config = {
        "hub-folder": str(files.folder.resolve()), "data-root": str(data_root.resolve()),
        "run-token": token, **config,
    }  # fmt: skip
    command = [str(flower_cli()), "run", str(APP_DIR), params.federation.superlink,
               *_run_config(config), "--stream"]  # fmt: skip
    with log_path.open("w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            follow(process, token)
        finally:
            if process.poll() is None:  # cancelled or failed here: stop the run there too
                _stop_run(log_path, params.federation.superlink)
                process.terminate()
                process.wait(timeout=30)
    outcome = files.read_outcome(token)
    if outcome is None or outcome["status"] != "finished":
        why = outcome["error"] if outcome else _last_line(log_path)
        raise RuntimeError(f"the hub's ServerApp did not finish: {why} (log: {log_path})")
    return outcome


def _site_line(params: Params) -> Callable[[str, dict[str, Any]], str]:
    """The run log's line on what a site (by client id) read, from the lineage it
    answered with: images (or volumes) per class and the data's digest."""
    names = [site.name for site in params.federation.sites]
    info = dataset_info_of(params.data)
    labels, unit = info.labels, "volumes" if info.is_volume else "images"

    def line(client: str, seen: dict[str, Any]) -> str:
        classes = "; ".join(
            f"{label}: {count}" for label, count in zip(labels, seen["train"], strict=False)
        )
        return (
            f"site {names[int(client)]} read {sum(seen['train'])} training {unit} ({classes}) "
            f"and {sum(seen['test'])} held out; data sha256 {seen['sha256'][:12]}"
        )

    return line


def _follow(
    process: subprocess.Popen[bytes], files: HubFiles, token: str, driver: RunDriver, *,
    after: int, say_site: Callable[[str, dict[str, Any]], str],
) -> None:  # fmt: skip
    """Each round this run's ServerApp journals after round ``after`` (its checkpoint's,
    when resumed), recorded by the run's driver until the run ends; before a round, a
    line for each site first heard from in it: what it read (from round 1: every site
    that answered)."""
    offset = 0
    logger = get_run_logger()
    while True:
        done = process.poll() is not None
        stop_if_requested()
        records, offset = files.run_records(token, offset)
        for record in records:
            for client, seen in record.get("first_heard", {}).items():
                logger.info("%s", say_site(client, seen))
            if record["round"] > after:
                driver.journaled(round_report(record))
        if done:
            return
        time.sleep(POLL_S)


def _stop_run(log_path: Path, superlink: str) -> None:
    """``flwr stop`` for the run whose id ``flwr run`` printed into ``log_path`` (this
    task's run, or an earlier one that was killed before it could stop it)."""
    match = re.search(r"Successfully started run (\d+)", log_path.read_text())
    if match is not None:
        subprocess.run(
            [str(flower_cli()), "stop", match.group(1), superlink],
            check=False,
            capture_output=True,
            timeout=60,
        )


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return lines[-1] if lines else "flwr run printed nothing"


def selected_model(params: Params, info: DatasetInfo, state: ServerState) -> torch.nn.Module:
    """The model the run ends with (the last round's, or the best validation round's)."""
    model = build_global_model(params, info)
    best = state.best_vector
    vector_to_model_(model, best if best is not None else state.global_vector)
    return model.eval()
