"""Real sites on one machine: fedsieve's hub and sites over Flower's Deployment Runtime on
127.0.0.1 (TLS and SuperNode authentication on), beside Flower's stock FedAvg on the same
SuperNodes and the same federation simulated in this process.

    .venv/bin/python -m benchmarks.sites.federation_loopback            # 10 sites x 20 rounds
    .venv/bin/python -m benchmarks.sites.federation_loopback --baseline-rounds 5   # FedAvg: 5

Writes ``benchmarks/results/federation-loopback.json`` (and ``.md``):
- ``max_abs_diff_vs_simulation``: the sites' final global model against the simulation's
  (the same site files, sequential local training);
- ``round_s``: seconds per round, fedsieve's ServerApp (the robust rule named by
  ``--rule`` and PID-MADE) and Flower's FedAvg ServerApp (``flower_fedavg_round_s``);
  ``round_time_over_flower_fedavg`` their ratio;
- ``round_overhead_s``: a round at the sites minus the same round simulated here (local
  training, aggregation, scoring): what the transport adds. Flower's own polling sets most
  of it: an idle SuperNode asks for work every 3 s and ``Grid.send_and_receive`` looks for
  replies every 3 s, and each message starts a ClientApp process (which hands the task to
  the site's warm trainer); a round is one exchange (the last round's model scored and
  this round trained: ``flowerapp.remote``);
- ``mb_per_site_round``: what the hub sends a site per round (the global vector), and
  what comes back (the update);
- ``unregistered_refused``: a SuperNode with an unregistered key was refused;
- ``own_data``: a pilot on the sites' own image folders (three of PNG files, one of DICOM
  files, written from ``--dataset``'s simulated partition) with a hub that holds no data
  (``eval.where: sites``; ``--own-data-only`` runs it alone and keeps the rest of the
  record): ``hub_data_files_opened`` (files the hub's processes opened under its data
  root, which holds the dataset's files: every Python process of the SuperLink and its
  ServerApps counts ``open`` audit events there, ``sys.addaudithook``),
  ``max_abs_diff_vs_simulation`` (the same folders simulated here), ``pooled_auc_error``
  (the run's final test AUC, pooled from the sites' histograms, against the AUC of the
  final model's predictions on the sites' test rows pooled here), ``second_run_ok`` (the
  same run again in the same hub folder finished and journaled only its own rounds) and
  ``site_restart_rejoined_s`` (a site killed with SIGKILL and started again 5 s later:
  seconds from its restart until it rejoined, Flower's heartbeat window included);
- ``by_phase``: a round at 3 and at 10 sites timed by phase (``--phases-only``, ``--rounds``
  each): each site's own phases per message (:mod:`flowerapp.timing`: the process's start
  through Flower's runtime, the app's imports, Flower's loading of the app and message,
  the hand-off to the warm trainer, the task's checks and the site's data, the training
  or scoring; whether a warm trainer answered) and the hub's wall time
  of each exchange, with what no site process accounts for (polls, spawn, transfer);
  beside ``round_s``, ``simulated_round_s``, ``flower_fedavg_round_s`` for the same sites.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import cpu_environment, write_summary
from benchmarks.sites.loopback import CONNECTION, Loopback
from config.assembly import build_global_model
from config.params import Params, params_hash
from federated.checkpoint import read_checkpoint
from federated.data import load_medmnist, to_tensors
from federated.loop import train
from federated.server import ServerState
from federated.vectors import model_to_vector
from flowerapp.certs import make_site_key
from flowerapp.hub import HubFiles, simulated_federation, write_params
from flowerapp.site_data import load_site_data, write_site_files
from tasks.partition import split_partition
from tasks.sites import APP_DIR

REPO = Path(__file__).resolve().parents[2]
FLOWER_BIN = REPO / ".venv-flower" / "bin"
BASELINE_APP = REPO / "benchmarks" / "flower" / "deploy_fedavg"
TRANSPORT_APP = REPO / "benchmarks" / "flower" / "transport_app"
FLOOR_APP = REPO / "benchmarks" / "flower" / "floor_app"
RESULTS = REPO / "benchmarks" / "results" / "federation-loopback"


def site_files(out: Path, dataset: str, root: Path, sites: int) -> dict[str, Path]:
    data = load_medmnist(dataset, root)
    split = split_partition(data.train.targets, "iid", sites, 0, {}, 0, 0.2)
    names = [f"site-{k}" for k in range(sites)]
    write_site_files(data, split.clients, split.local_tests, names, out)
    return {name: out / f"{name}.npz" for name in names}


def hub_params(args: argparse.Namespace, sites: list[dict[str, Any]], root: Path) -> Params:
    return Params.model_validate({
        "data": {"dataset": args.dataset, "root": str(root)},
        "model": {"name": "small_cnn"},
        "train": {"rounds": args.rounds, "device": "cpu", "backend": "sequential"},
        "aggregate": {"name": args.rule},
        # as measured (the banned left out of the statistics, as the record was made)
        "filters": [{"name": "pid_made", "threshold": "robust", "banned_updates": "left_out"}],
        "noniid": {"every": 0, "final": False},
        "federation": {"runtime": "flower", "superlink": CONNECTION, "sites": sites,
                       "round_timeout": 600},
    })  # fmt: skip


def simulate(params: Params, files: dict[str, Path], root: Path) -> tuple[ServerState, float]:
    """The same federation in this process; its final state and seconds per round."""
    data = load_medmnist(params.data.dataset, root)
    federation = simulated_federation(params, data, list(files.values()))
    started = time.perf_counter()
    state = train(federation, federation.initial_state(), params.train.rounds)
    return state, (time.perf_counter() - started) / params.train.rounds


def per_round(records: list[dict[str, Any]]) -> float:
    """Seconds per round from the first round's end to the last's (start-up left out)."""
    times = [r["elapsed_s"] for r in records]
    return (times[-1] - times[0]) / max(1, len(times) - 1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dataset", default="breastmnist")
    parser.add_argument("--rule", default="median")
    parser.add_argument(
        "--own-data-only",
        action="store_true",
        help="run only the own-data pilot and update its part of the record",
    )
    parser.add_argument(
        "--phases-only",
        action="store_true",
        help="time a round at 3 and 10 sites by phase (--rounds each) and update that part",
    )
    parser.add_argument(
        "--restart-only",
        action="store_true",
        help="kill a site of 4 after round 2 and start it again 5 s later (--rounds): "
        "update that part",
    )
    parser.add_argument(
        "--baseline-rounds", type=int, default=None,
        help="rounds of Flower's FedAvg beside it (default: --rounds); the ratio is per round",
    )  # fmt: skip
    args = parser.parse_args()
    args.baseline_rounds = args.baseline_rounds or args.rounds
    return args


AUDIT_HOOK = """import os, sys
_root = os.environ.get("FEDSIEVE_AUDIT_ROOT")
if _root:
    def _audit(event, args, _root=_root, _log=os.environ["FEDSIEVE_AUDIT_LOG"]):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(args[0]))
            if path.startswith(_root):
                with open(_log, "a") as log:
                    log.write(path + "\\n")
    sys.addaudithook(_audit)
"""
OWN_FORMATS = ("png", "png", "png", "dcm")  # three PNG sites and one DICOM site
RESTART_AFTER_S = 5.0


def own_folders(out: Path, data: Any) -> dict[str, Path]:
    split = split_partition(data.train.targets, "iid", len(OWN_FORMATS), 0, {}, 0, 0.2)
    folders = {}
    for k, image_format in enumerate(OWN_FORMATS):
        name = f"hospital-{'abcd'[k]}"
        write_site_files(
            data, split.clients[k : k + 1], split.local_tests[k : k + 1], [name], out, image_format
        )
        folders[name] = out / name
    return folders


def own_params(dataset_labels: tuple[str, ...], rounds: int, sites: list[dict[str, Any]]) -> Params:
    return Params.model_validate({
        "data": {"dataset": "own-pilot", "own": {"task": "binary-class" if len(dataset_labels) == 2
                 else "multi-class", "classes": list(dataset_labels), "channels": 1}},
        "model": {"name": "small_cnn"},
        "train": {"rounds": rounds, "device": "cpu", "backend": "sequential"},
        "eval": {"where": "sites"},
        "noniid": {"every": 0, "final": False},
        "federation": {"runtime": "flower", "superlink": CONNECTION, "sites": sites,
                       "round_timeout": 600},
    })  # fmt: skip


def pooled_auc_error(params: Params, state: ServerState, folders: list[Path]) -> float:
    """The run's final pooled test AUC against the AUC of its final model's predictions
    on every site's test rows, pooled here."""
    import torch

    from config.dataset import dataset_info_of
    from federated.metrics import evaluate
    from federated.vectors import vector_to_model_

    info = dataset_info_of(params.data)
    tests = [to_tensors(load_site_data(f, info).test, info) for f in folders]
    images = torch.cat([t[0] for t in tests])
    targets = torch.cat([t[1] for t in tests])
    model = build_global_model(params, info)
    vector_to_model_(model, state.global_vector)
    pooled = evaluate(model.eval(), images, targets, multi_label=info.multi_label)
    return abs(float(state.history[-1]["test_auc"]) - float(pooled["auc"]))


def audited_data_root(work: Path, root: Path, dataset: str) -> tuple[Path, Path]:
    """A data root holding the dataset's file, and the log every Python process started
    from here on writes each file it opens there to (``sitecustomize``'s audit hook)."""
    hub_data, audit, opened = work / "hub-data", work / "audit", work / "opened.log"
    hub_data.mkdir()
    shutil.copy(root / f"{dataset}.npz", hub_data)
    audit.mkdir()
    (audit / "sitecustomize.py").write_text(AUDIT_HOOK)
    opened.touch()
    os.environ |= {
        "FEDSIEVE_AUDIT_ROOT": str(hub_data.resolve()),
        "FEDSIEVE_AUDIT_LOG": str(opened),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(audit), os.environ.get("PYTHONPATH")])),
    }
    return hub_data, opened


def start_own_sites(
    fed: Loopback, folders: dict[str, Path], plan: Path, draft: Params
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Each folder's site registered and started as its operator would (``fedsieve-site``);
    the sites as params name them, and each site's command."""
    from config.dataset import dataset_info_of

    sites, commands = [], {}
    for name, folder in folders.items():
        key = make_site_key(fed.work / "keys", name)
        node = fed.register(key.public)
        commands[name] = fed.site_command(key, folder, plan)
        fed.start_site_command(name, commands[name])
        samples = len(load_site_data(folder, dataset_info_of(draft.data)).train)
        sites.append({"name": name, "node_id": node, "samples": samples})
    for name in folders:
        fed.wait_connected(name, timeout=300)
    return sites, commands


def twice_in_one_folder(fed: Loopback, hub: HubFiles, config: dict[str, str], rounds: int) -> bool:
    """The same run twice in one hub folder: each finished and journaled its own rounds."""
    runs_ok = []
    for token in ("first", "second"):
        fed.run_app(APP_DIR, config | {"run-token": token}, timeout=3600)
        outcome = hub.read_outcome(token) or {}
        own_rounds = [report.round for report in hub.journaled(token)[0]]
        runs_ok.append(
            outcome.get("status") == "finished" and own_rounds == list(range(1, rounds + 1))
        )
    return all(runs_ok)


def rejoin_s(fed: Loopback, name: str, command: list[str]) -> float:
    """A site killed with SIGKILL (all its processes) and started again 5 s later: seconds
    from its restart until it rejoined."""
    fed.kill_site(name)
    time.sleep(RESTART_AFTER_S)
    restarted = time.perf_counter()
    fed.start_site_command(name, command)
    fed.wait_connected(name, timeout=300)
    return time.perf_counter() - restarted


def own_data_pilot(root: Path, dataset: str, rounds: int) -> dict[str, Any]:
    """Four sites on their own image folders, a hub that holds no data: the measurements
    the module's docstring names under ``own_data``."""
    from config.dataset import dataset_info_of
    from flowerapp.hub import site_task
    from flowerapp.plan import write_plan

    data = load_medmnist(dataset, root)
    with Loopback(bin_dir=FLOWER_BIN) as fed:
        hub_data, opened = audited_data_root(fed.work, root, dataset)
        folders = own_folders(fed.work / "hospitals", data)
        fed.start_superlink()
        plan = fed.work / "plan.json"
        draft = own_params(data.info.labels, rounds, [])
        write_plan(plan, site_task(draft, dataset_info_of(draft.data)))
        sites, commands = start_own_sites(fed, folders, plan, draft)
        params = own_params(data.info.labels, rounds, sites)
        hub = HubFiles(fed.work / "hub")
        write_params(hub.params, params)
        checkpoint = hub.folder / "checkpoint.pt"
        config = {"hub-folder": str(hub.folder), "data-root": str(hub_data),
                  "checkpoint": str(checkpoint)}  # fmt: skip
        second_run_ok = twice_in_one_folder(fed, hub, config, rounds)
        final = ServerState.from_dict(read_checkpoint(checkpoint, params_hash(params))["state"])
        rejoined = rejoin_s(fed, "hospital-b", commands["hospital-b"])
        files_opened = len(opened.read_text().splitlines())
        # the hook's positive control: a process of the same environment that opens a file
        # of the data root is counted
        control = f"open({str(hub_data / f'{dataset}.npz')!r}, 'rb').close()"
        subprocess.run([str(FLOWER_BIN / "python"), "-c", control], check=True)
        hook_live = len(opened.read_text().splitlines()) == files_opened + 1
        simulation = simulated_federation(params, None, list(folders.values()))
        simulated = train(simulation, simulation.initial_state(), rounds)
        auc_error = pooled_auc_error(params, final, list(folders.values()))
    return {
        "sites": dict(zip(folders, OWN_FORMATS, strict=True)),
        "rounds": rounds,
        "dataset": dataset,
        "eval_where": "sites",
        "hub_data_files_opened": files_opened,
        "audit_hook_counted_a_control_open": hook_live,
        "max_abs_diff_vs_simulation": float(
            (final.global_vector - simulated.global_vector).abs().max()
        ),
        "pooled_auc_error": auc_error,
        "final_test_auc": float(final.history[-1]["test_auc"]),
        "second_run_ok": second_run_ok,
        "site_restart_after_s": RESTART_AFTER_S,
        "site_restart_rejoined_s": rejoined,
    }


SITE_PHASES = ("start_s", "imports_s", "flower_s", "handoff_s", "data_s", "work_s")
PHASE_SITES = (3, 10)


def start_sites(
    fed: Loopback, files: dict[str, Path], args: argparse.Namespace, root: Path
) -> list[dict[str, Any]]:
    """Each site's key registered and the site started as its operator starts it
    (``fedsieve-site``: its SuperNode and its warm trainer, the hub's plan approved) and
    connected; the sites as ``federation.sites`` lists them."""
    from config.dataset import dataset_info_of
    from flowerapp.hub import site_task
    from flowerapp.plan import write_plan

    draft = hub_params(args, [], root)
    plan = fed.work / "plan.json"
    write_plan(plan, site_task(draft, dataset_info_of(draft.data)))
    sites = []
    for name, path in files.items():
        key = make_site_key(fed.work / "keys", name)
        node = fed.register(key.public)
        fed.start_site_command(name, fed.site_command(key, path, plan))
        sites.append({"name": name, "node_id": node, "samples": len(load_site_data(path).train)})
    for name in files:
        fed.wait_connected(name, timeout=300)
        fed.wait_line(name, "warm trainer ready", timeout=300)  # its first start is not timed
    return sites


def phase_table(exchanges: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kind of exchange (train alone in the first round, a model scored and the next
    round trained in one exchange, the last model scored alone), medians over its
    exchanges: each site phase
    (over sites too), the hub's wall time from send to the last reply, and what no site
    process accounts for (``outside_s``: the wall time minus the slowest site's process,
    start to answer: the SuperNode's poll, the process spawn, TLS transfer, Flower's
    serialisation and the hub's poll)."""
    from statistics import median

    table = {}
    for kind in dict.fromkeys(e["kind"] for e in exchanges):  # train, evaluate+train, evaluate
        rows = [e for e in exchanges if e["kind"] == kind and e["sites"]]
        if not rows:
            continue
        phases = {
            key: median(s.get(key, 0.0) for e in rows for s in e["sites"].values())
            for key in SITE_PHASES
        }
        phases["wall_s"] = median(e["wall_s"] for e in rows)
        phases["outside_s"] = median(
            e["wall_s"] - max(sum(s.get(k, 0.0) for k in SITE_PHASES) for s in e["sites"].values())
            for e in rows
        )
        answers = [s.get("warm", 0.0) for e in rows for s in e["sites"].values()]
        phases["warm_share"] = sum(answers) / len(answers)
        table[kind] = phases
    return table


def timed_by_phase(root: Path, dataset: str, sites: int, rounds: int) -> dict[str, Any]:
    """One federation of ``sites`` sites on loopback: its round time by phase, beside the
    same federation simulated here and Flower's FedAvg app on the same SuperNodes."""
    options = argparse.Namespace(dataset=dataset, rounds=rounds, rule="median")
    with Loopback(bin_dir=FLOWER_BIN) as fed:
        files = site_files(fed.work / "sites", dataset, root, sites)
        fed.start_superlink()
        params = hub_params(options, start_sites(fed, files, options, root), root)
        hub = HubFiles(fed.work / "hub")
        write_params(hub.params, params)
        fed.run_app(APP_DIR, {"hub-folder": str(hub.folder), "data-root": str(root),
                              "checkpoint": str(hub.folder / "checkpoint.pt")}, timeout=3600)  # fmt: skip
        records = [json.loads(line) for line in hub.rounds.read_text().splitlines()]
        exchanges = [json.loads(line) for line in hub.exchanges.read_text().splitlines()]
        baseline_out = fed.work / "fedavg.json"
        fed.run_app(BASELINE_APP, {"rounds": rounds, "channels": 1, "classes": 2,
                                   "out": str(baseline_out), "data-root": str(root),
                                   "dataset": dataset}, timeout=3600)  # fmt: skip
        baseline = json.loads(baseline_out.read_text())
        floor = flower_floor_round_s(fed, model_size(params, root), rounds)
        _, simulated_round_s = simulate(params, files, root)
    round_s = per_round(records)
    flower_round_s = per_round(baseline["rounds"][1:])
    return {
        "sites": sites,
        "rounds": rounds,
        "round_s": round_s,
        "simulated_round_s": simulated_round_s,
        "round_overhead_s": round_s - simulated_round_s,
        "flower_fedavg_round_s": flower_round_s,
        "round_time_over_flower_fedavg": round_s / flower_round_s,
        "flower_floor_round_s": floor,
        "round_time_over_flower_floor": round_s / floor,
        "exchanges_per_round": len(exchanges) / max(1, len(records)),
        "phases": phase_table(exchanges),
    }


def watch_restart(
    fed: Loopback, hub: HubFiles, run: subprocess.Popen[bytes], victim: dict[str, Any],
    command: list[str],
) -> dict[str, Any]:  # fmt: skip
    """Kill ``victim`` (SIGKILL, all its processes) once round 2 is journaled, start it again
    ``RESTART_AFTER_S`` later, and watch until the run ends, on this process's clock: when
    each round was journaled, when the hub first counted the old node offline (the lapse;
    the rejoin if the status was never seen offline between two looks) and when the site
    said it rejoined."""
    journaled: dict[int, float] = {}
    seen: dict[str, float] = {}
    log, start = fed.site_log(victim["name"]), 0
    while run.poll() is None:
        now = time.monotonic()
        lines = hub.rounds.read_text().splitlines() if hub.rounds.exists() else []
        for number in range(len(journaled) + 1, len(lines) + 1):
            journaled[number] = now
        if "killed" not in seen and len(journaled) >= 2:
            fed.kill_site(victim["name"])
            seen["killed"] = time.monotonic()
            time.sleep(RESTART_AFTER_S)
            start = log.stat().st_size
            fed.start_site_command(victim["name"], command)
        elif "killed" in seen and "rejoined" not in seen:
            if "lapsed" not in seen and fed.node_status(victim["node_id"]) != "online":
                seen["lapsed"] = time.monotonic()
            if b"rejoined as node" in log.read_bytes()[start:]:
                seen["rejoined"] = time.monotonic()
                seen.setdefault("lapsed", seen["rejoined"])
        time.sleep(0.2)
    if "rejoined" not in seen:
        raise RuntimeError(f"the run ended before the site rejoined: {fed.app_log(run)}")
    return {"journaled": journaled, **seen}


def restart_mid_run(root: Path, dataset: str, sites: int, rounds: int) -> dict[str, Any]:
    """A site killed with SIGKILL once round 2 is journaled and started again 5 s later,
    as its operator starts it, while the run goes on: the round under way when the hub
    counted its old node offline, the rounds the trail says it missed and why, and the
    first round it trained again."""
    options = argparse.Namespace(dataset=dataset, rounds=rounds, rule="median")
    with Loopback(bin_dir=FLOWER_BIN) as fed:
        files = site_files(fed.work / "sites", dataset, root, sites)
        fed.start_superlink()
        listed = start_sites(fed, files, options, root)
        params = hub_params(options, listed, root)
        hub = HubFiles(fed.work / "hub")
        write_params(hub.params, params)
        checkpoint = hub.folder / "checkpoint.pt"
        run = fed.start_app(APP_DIR, {"hub-folder": str(hub.folder), "data-root": str(root),
                                      "checkpoint": str(checkpoint)})  # fmt: skip
        victim = listed[-1]
        command = [str(part) for part in fed.sites[victim["name"]].args]  # as it was started
        seen = watch_restart(fed, hub, run, victim, command)
        state = ServerState.from_dict(read_checkpoint(checkpoint, params_hash(params))["state"])
    client = len(listed) - 1
    rows = {row["round"]: row for row in state.trail if row["client"] == client}
    lapse_round = min(r for r, at in seen["journaled"].items() if at >= seen["lapsed"])
    missed = {r: row["reason"] for r, row in sorted(rows.items()) if row["excluded"]}
    back = min(r for r, row in rows.items() if r > min(missed, default=0) and not row["excluded"])
    return {
        "sites": sites,
        "rounds": rounds,
        "restart_after_s": RESTART_AFTER_S,
        "killed_after_round": 2,
        "lapse_after_kill_s": seen["lapsed"] - seen["killed"],
        "rejoined_after_lapse_s": seen["rejoined"] - seen["lapsed"],
        "lapsed_in_round": lapse_round,
        "rounds_missed": {str(r): reason for r, reason in missed.items()},
        "first_round_back": back,
        "rounds_missed_after_lapse_round": back - lapse_round - 1,
        "round_s": per_round([{"elapsed_s": at} for at in seen["journaled"].values()]),
    }


def model_size(params: Params, root: Path) -> int:
    """The number of floats in the run's global model: what a round carries each way."""
    info = load_medmnist(params.data.dataset, root).info
    return model_to_vector(build_global_model(params, info)).numel()


def flower_floor_round_s(fed: Loopback, floats: int, rounds: int) -> float:
    """Flower's own floor on the same SuperNodes: a round of messages of the model's size
    that a ClientApp answers at once (``benchmarks/flower/floor_app``), seconds per round
    from the first round's end to the last's, as :func:`per_round` times fedsieve's."""
    out = fed.work / "floor.json"
    fed.run_app(FLOOR_APP, {"rounds": rounds, "floats": floats, "out": str(out)}, timeout=3600)
    times = [r["seconds"] for r in json.loads(out.read_text())["rounds"]]
    return sum(times[1:]) / max(1, len(times) - 1)


def update_record(key: str, value: Any) -> None:
    """One part of the committed record rewritten by a run of its own; the rest kept."""
    path = RESULTS.with_suffix(".json")
    record = json.loads(path.read_text())
    record[key] = value
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(value, indent=2))


def main() -> None:
    args = parse_args()
    root = Path(os.environ.get("MEDMNIST_ROOT", REPO / "data" / "medmnist")).resolve()
    if args.phases_only:
        update_record("by_phase", {
            str(n): timed_by_phase(root, args.dataset, n, args.rounds) for n in PHASE_SITES
        })  # fmt: skip
        return
    if args.restart_only:
        update_record("restart", restart_mid_run(root, args.dataset, 4, args.rounds))
        return
    if args.own_data_only:
        update_record("own_data", own_data_pilot(root, args.dataset, rounds=3))
        return
    baseline_rounds = args.baseline_rounds
    with Loopback(bin_dir=FLOWER_BIN) as fed:
        files = site_files(fed.work / "sites", args.dataset, root, args.sites)
        fed.start_superlink()
        intruder = make_site_key(fed.work / "keys", "intruder")
        fed.start_site("intruder", intruder, {"data-file": str(files["site-0"])})
        try:
            fed.wait_connected("intruder", timeout=60)
            refused = False
        except RuntimeError:
            refused = True
        params = hub_params(args, start_sites(fed, files, args, root), root)
        hub = HubFiles(fed.work / "hub")
        write_params(hub.params, params)
        checkpoint = hub.folder / "checkpoint.pt"
        started = time.perf_counter()
        fed.run_app(APP_DIR, {"hub-folder": str(hub.folder), "data-root": str(root),
                              "checkpoint": str(checkpoint)}, timeout=3600)  # fmt: skip
        fedsieve_total = time.perf_counter() - started
        outcome = json.loads(hub.outcome.read_text())
        records = [json.loads(line) for line in hub.rounds.read_text().splitlines()]

        baseline_out = fed.work / "fedavg.json"
        started = time.perf_counter()
        fed.run_app(BASELINE_APP, {"rounds": baseline_rounds, "channels": 1, "classes": 2,
                                   "out": str(baseline_out), "data-root": str(root),
                                   "dataset": args.dataset}, timeout=3600)  # fmt: skip
        flower_total = time.perf_counter() - started
        baseline = json.loads(baseline_out.read_text())

        transport_out = fed.work / "transport.json"  # a ResNet-50's 94 MB, to two sites and back
        fed.run_app(TRANSPORT_APP, {"megabytes": 94, "out": str(transport_out)}, timeout=1800)
        transport = json.loads(transport_out.read_text())
        # read before the loopback's folder goes
        final = ServerState.from_dict(read_checkpoint(checkpoint, params_hash(params))["state"])
        simulated, simulated_round_s = simulate(params, files, root)
    diff = float((final.global_vector - simulated.global_vector).abs().max())
    round_s = per_round(records)
    flower_round_s = per_round(baseline["rounds"][1:])  # its round 0: the initial model
    size = model_size(params, root)
    payload = {
        **cpu_environment(),
        "flower": "1.32.1",
        "sites": args.sites,
        "rounds": args.rounds,
        "flower_fedavg_rounds": baseline_rounds,
        "dataset": args.dataset,
        "model": "small_cnn",
        "rule": f"{args.rule} + pid_made",
        "max_abs_diff_vs_simulation": diff,
        "round_s": round_s,
        "flower_fedavg_round_s": flower_round_s,
        "round_time_over_flower_fedavg": round_s / flower_round_s,
        "simulated_round_s": simulated_round_s,
        "round_overhead_s": round_s - simulated_round_s,
        "end_to_end_s": fedsieve_total,
        "flower_fedavg_end_to_end_s": flower_total,
        "simulated_end_to_end_s": simulated_round_s * args.rounds,
        "mb_per_site_round": {
            "to_site": outcome["bytes_sent"] / (args.sites * args.rounds) / 1e6,
            "from_site": size * 4 / 1e6,
        },
        "final_test_acc": records[-1]["metrics"]["test_acc"],
        "simulated_final_test_acc": simulated.history[-1]["test_acc"],
        "flower_fedavg_final_test_acc": baseline["rounds"][-1]["acc"],
        "unregistered_refused": refused,
        "transport_94mb": transport,
        "excluded_rows": sum(bool(r["excluded"]) for r in final.trail),
        "own_data": own_data_pilot(root, args.dataset, rounds=3),
    }
    previous = RESULTS.with_suffix(".json")
    if previous.exists():  # the phase table is its own run (--phases-only): kept
        payload["by_phase"] = json.loads(previous.read_text()).get("by_phase")
    lines = [
        f"# Real sites on loopback: {args.sites} sites x {args.rounds} rounds ({args.dataset}, small CNN)",
        "",
        f"- fedsieve ({args.rule} + PID-MADE): {round_s:.2f} s/round; Flower's FedAvg: "
        f"{flower_round_s:.2f} s/round (ratio {round_s / flower_round_s:.2f})",
        f"- the same federation simulated here: {simulated_round_s:.2f} s/round; overhead "
        f"{round_s - simulated_round_s:.2f} s/round",
        f"- max |sites - simulation| = {diff:.2e}; unregistered key refused: {refused}",
        f"- a 94 MB vector to {transport['sites']} sites and back: "
        f"{transport['round_trip_s']:.1f} s, intact: {transport['echoed_intact']}",
    ]
    write_summary(RESULTS, payload, lines)


if __name__ == "__main__":
    main()
