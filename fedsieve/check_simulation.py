"""``fedsieve check-simulation``: a run at real sites against its simulation.

A federation of sites ends where the same federation simulated in one process from the
same site data ends (the sites train as simulated clients do, with the hub's batch-order
seeds). This command checks it for an operator who holds every site's data (a pilot on one
machine, or the files the sites agreed to share for the check): it reads the hub's records
of the last run of ``--params`` (the train stage's checkpoint and the ServerApp's round
journal), simulates the run here from ``--data``, and prints the largest difference of
the final weights, of each round's metrics, and each round's time at the sites beside its
time here. Exit 0 when the weights and every shared metric agree within ``--tolerance``;
1, naming what differs, when not, and its known causes: a site's outage (the rounds it did
not answer) or data changed during the run.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config.errors import ConfigError

if TYPE_CHECKING:
    from flowerapp.hub import HubFiles
    from tasks.reports import ProjectPaths

__all__ = ["add_check_arguments", "check_simulation", "site_data_paths"]


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    from fedsieve.arguments import add_params_arguments

    add_params_arguments(parser)
    parser.add_argument(
        "--data", type=Path, required=True,
        help="folder of the sites' data: <name>.npz or <name>/ per site (what `fedsieve "
        "sites` writes, with its sites.json)",
    )  # fmt: skip
    parser.add_argument(
        "--tolerance", type=float, default=1e-6,
        help="largest absolute difference allowed (default 1e-6)",
    )  # fmt: skip


def site_data_paths(folder: Path, names: list[str]) -> list[Path]:
    """Each named site's data in ``folder``: the file ``sites.json`` gives it, else
    ``<name>.npz`` or the folder ``<name>``; a missing one is a one-line error."""
    listed: dict[str, str] = {}
    if (folder / "sites.json").exists():
        listed = {s["name"]: s["file"] for s in json.loads((folder / "sites.json").read_text())}
    paths = []
    for name in names:
        candidates = [folder / listed[name]] if name in listed else []
        candidates += [folder / f"{name}.npz", folder / name]
        found = next((path for path in candidates if path.exists()), None)
        if found is None:
            raise ConfigError(
                f"--data {folder}: no data of site {name!r} (looked for "
                f"{', '.join(str(c) for c in candidates)})"
            )
        paths.append(found)
    return paths


def check_simulation(args: argparse.Namespace, workdir: Path) -> int:
    from config.params import params_hash
    from federated.checkpoint import read_checkpoint
    from federated.server import ServerState
    from fedsieve.arguments import checked_params
    from flowerapp.hub import HubFiles, simulated_federation
    from tasks.data import read_dataset
    from tasks.reports import ProjectPaths

    params = checked_params(args, workdir)
    if params.federation.runtime != "flower":
        raise ConfigError(f"{args.params}: federation.runtime is not flower: no run at sites")
    paths = ProjectPaths(workdir)
    saved = read_checkpoint(paths.checkpoint, params_hash(params))
    if saved is None:
        raise ConfigError(
            f"{paths.checkpoint}: no checkpoint of these params: run them at the sites first "
            "(fedsieve run)"
        )
    remote = ServerState.from_dict(saved["state"])
    files = site_data_paths(args.data, [site.name for site in params.federation.sites])
    data = None if params.eval.where == "sites" else read_dataset(params.data, workdir)
    federation = simulated_federation(params, data, files)
    state, simulated_s = federation.initial_state(), []
    while state.round < remote.round:
        started = time.perf_counter()
        state, _ = federation.run_round(state)
        simulated_s.append(time.perf_counter() - started)
    at_sites_s = _round_times(HubFiles(paths.artifacts / "hub"))
    weights = float((remote.global_vector - state.global_vector).abs().max())
    print(f"final weights: max abs difference {weights:.3g} over {remote.round} rounds")
    failures = [f"final weights differ by {weights:.3g}"] if not weights <= args.tolerance else []
    for at_sites, simulated in zip(remote.history, state.history, strict=True):
        round_number = int(at_sites["round"])
        worst, key = _worst_metric(at_sites, simulated)
        seconds = at_sites_s.get(round_number)
        took = f"{seconds:.2f} s at the sites" if seconds is not None else "time not journaled"
        print(
            f"round {round_number}: metrics max abs difference {worst:.3g} ({key}); {took}, "
            f"{simulated_s[round_number - 1]:.2f} s simulated here"
        )
        if not worst <= args.tolerance:
            failures.append(f"round {round_number}'s {key} differs by {worst:.3g}")
    if failures:
        print(f"fedsieve: the run at the sites is not its simulation: {'; '.join(failures)}")
        for cause in _known_causes(remote.trail, paths.site_data, _run_id(paths)):
            print(f"  cause: {cause}")
        return 1
    print(f"the run at the sites equals its simulation within {args.tolerance:g}")
    return 0


def _known_causes(trail: list[dict[str, Any]], lineage: Path, run_id: str | None) -> list[str]:
    """What the run at the sites did that a simulation from the sites' data cannot: a site
    that did not answer in a round (an outage: the simulation trains every site every
    round), or whose data changed during the run (it reads the data as they are now)."""
    from federated.trail import failed_to_answer
    from flowerapp.lineage import round_spans

    missed: dict[str, list[int]] = {}
    reasons: dict[str, set[str]] = {}
    for row in filter(failed_to_answer, trail):
        site = str(row.get("site") or f"client {row['client']}")
        missed.setdefault(site, []).append(int(row["round"]))
        reasons.setdefault(site, set()).add(str(row["reason"]))
    causes = [
        f"site {site} did not answer in round{'s' if len(rounds) > 1 else ''} "
        f"{round_spans(rounds)} ({', '.join(sorted(reasons[site]))}), "
        f"which the simulation cannot replay: it trains every site every round"
        for site, rounds in missed.items()
    ]
    report = json.loads(lineage.read_text()) if lineage.is_file() else {}
    sites = report.get("sites", []) if report.get("run_id") == run_id else []  # this run's
    causes += [
        f"site {site['site']}'s data changed during the run ({lineage.name}): the simulation "
        "reads the data as they are now"
        for site in sites
        if site.get("changed")
    ]
    return causes


def _run_id(paths: ProjectPaths) -> str | None:
    """The MLflow run of the last training (the one its reports describe), if recorded."""
    info = paths.tracking_info
    return json.loads(info.read_text()).get("run_id") if info.is_file() else None


def _worst_metric(at_sites: dict[str, float], simulated: dict[str, float]) -> tuple[float, str]:
    """The largest absolute difference over the metrics both rounds hold (NaN in both
    counts as equal), and its key."""
    worst, worst_key = 0.0, "none"
    for key in sorted(set(at_sites) & set(simulated)):
        a, b = at_sites[key], simulated[key]
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            continue
        if math.isnan(a) and math.isnan(b):
            continue
        difference = abs(a - b) if not (math.isnan(a) or math.isnan(b)) else math.inf
        if difference > worst or worst_key == "none":
            worst, worst_key = difference, key
    return worst, worst_key


def _round_times(files: HubFiles) -> dict[int, float]:
    """Each round's seconds at the sites, from the last run's round journal (its
    ServerApp's elapsed time after each round)."""
    outcome = json.loads(files.outcome.read_text()) if files.outcome.exists() else {}
    if "run" not in outcome:
        return {}
    records, _ = files.run_records(outcome["run"])
    elapsed = {int(r["round"]): float(r["elapsed_s"]) for r in records if "elapsed_s" in r}
    times, before = {}, 0.0
    for round_number in sorted(elapsed):
        times[round_number] = elapsed[round_number] - before
        before = elapsed[round_number]
    return times
