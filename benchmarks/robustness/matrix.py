"""Benchmark: the robustness matrix, every rule under every attack at several attacker
fractions, over seeds, with 95 % confidence intervals.

    python -m benchmarks.robustness.matrix --dataset breastmnist [--seeds N]
        [--attacks label_flip sign_flip ...] [--fractions 0.2 0.4 0.1 0.3]
        [--methods fedavg median ...] [--regime dirichlet-0.1] [--workers 2]
        [--summarise-only]

``--regime`` runs a subset in another setting into ``robustness-<dataset>-<regime>.*``:
``dirichlet-<alpha>`` label-skewed clients (twelve methods, no attack and four attacks, a
fifth of attackers, 10 seeds); ``filters`` the history-aware filters, each configuration
by its own name (PID-MADE as the paper writes it, our thresholds of its score, the
distance CUSUM, each alone and with the round cut), under every attack at 0.2 and 0.4,
10 seeds; ``cnn`` the small CNN on the same clients (eight rules, the four core attacks
and opt-IPM, min-max, min-sum, 10 seeds); ``alie-paper`` ALIE where its authors ran it
(51 clients, 12 attacking, a CNN, z = 1.5, 10 seeds); ``dirichlet-0.5-cnn`` the small
CNN on label-skewed clients (four rules, no attack, sign flipping and ALIE, 10 seeds), whose
claims were pre-registered (benchmarks/preregistered.yaml); ``cnn3d`` (with ``--dataset
adrenalmnist3d``) the small 3-D CNN on AdrenalMNIST3D-64's volumes (FedAvg, the median,
PID-MADE, FedLag; label and sign flipping; a seeded 120 of the training volumes, 3
rounds), pre-registered too. ``--seeds`` defaults to the regime's count (5 for the matrix).

Each cell is a comparison-grid cell (:func:`tasks.grid.grid_cells` builds and validates
its params; the same engine calls as ``fedsieve compare``, whose cells are tested to give
the pipeline's numbers) run without tracking, ``--workers`` cells at once in separate
processes of one torch thread each. A rule that takes the number of Byzantine clients
``f`` is told the true number of attackers in the cell (capped where the rule itself
cannot go further, Bulyan's ``n >= 4f + 3``). Cells run scenario by scenario (fraction,
then attack, all methods and seeds), so an interrupted run leaves whole scenarios.

Every finished cell is appended to ``benchmarks/results/robustness-<dataset>-cells.jsonl``;
a rerun of the same command skips the cells already there, so the matrix can be completed
over several sessions; that file stays local (git-ignored), the summary is what is
kept. A cell that raises (a rule refusing its configuration) is recorded with its
error, never silently dropped. The summary over seeds (mean, standard deviation,
95 % t-interval: :func:`tasks.comparison.aggregate_over_seeds`) goes to
``robustness-<dataset>.{json,md}`` with a heatmap per attacker fraction beside them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from fedsieve.arguments import positive_int

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
PARAMS = REPO / "benchmarks" / "params"

ATTACKS: dict[str, dict[str, Any]] = {
    "none": {},
    "label_flip": {"rate": 1.0, "mapping": "reverse"},
    "sign_flip": {},
    "gaussian": {},
    "scaling": {},
    "alie": {},
    "ipm": {},
    "opt_alie": {},
    "opt_ipm": {},
    "mimic": {},
    "inf": {},
    "min_max": {},
    "min_sum": {},
    "backdoor": {},
}
BINARY = {"breastmnist", "adrenalmnist3d"}  # accuracy sits near the majority share there: AUC
EVERY_ATTACK = [attack for attack in ATTACKS if attack != "none"]
FRACTIONS = [0.2, 0.4, 0.1, 0.3]  # in run order: the most telling first

# method -> (aggregate, filters); "f" is filled in per cell. (FedLag costs about 3 s a cell
# with the logistic model; with the small CNN, 320 s: benchmarks/results/grid-throughput.)
TAKES_F = {"krum", "multi_krum", "bulyan", "trimmed_mean", "mda", "meamed", "monna", "dnc"}
RULES = [
    "fedavg", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "geometric_median",
    "centered_clipping", "ema", "zeno", "mda", "monna", "meamed", "dnc", "fltrust",
    "foolsgold", "weighted_median", "weighted_trimmed_mean", "norm_bounded_mean", "fedlag",
]  # fmt: skip
# ByzFL's pre-aggregators in front of a rule, told f where they take it
PREAGGREGATED = {
    "nnm_median": ("median", {"name": "nnm"}),
    "arc_fedavg": ("fedavg", {"name": "arc"}),
    "bucketing_median": ("median", {"name": "bucketing", "s": 2}),
}
ROUND_CUT = 11.0  # the round cut's z: the distance CUSUM's drift + h (3 + 8)
# History-aware filters in front of FedAvg, each with its exact configuration. Only
# pid_made_fedavg and pid_made_chebyshev_fedavg are the paper's PID-MADE (Algorithm 1,
# Theorems 6 and 5), with its centroid over "all submitted models", a banned client's
# included (banned_updates: counted). pid_made_left_out_fedavg leaves a banned client's
# later updates out of the centroid and the threshold's statistics: the reading these
# records were first made with, a variant of our own (so are our thresholds of the
# score). Chebyshev's threshold bans nobody among 20 clients (Samuelson's bound), so no
# update is ever left out and both readings run the same arithmetic: its records, made
# under left_out, are the counted ones (a test runs one cell both ways).
# distance_cusum_cut_fedavg is what pid_made ran by default before. The round cut is a
# screen of its own, not part of the paper's method.
_COUNTED = {"banned_updates": "counted"}
_LEFT_OUT = {"banned_updates": "left_out"}
_FILTERS: dict[str, dict[str, Any]] = {
    "pid_made": {"name": "pid_made"} | _COUNTED,
    "pid_made_chebyshev": {"name": "pid_made", "threshold": "chebyshev"} | _COUNTED,
    "pid_made_left_out": {"name": "pid_made"} | _LEFT_OUT,
    "pid_robust": {"name": "pid_made", "threshold": "robust"} | _LEFT_OUT,
    "pid_cusum": {"name": "pid_made", "threshold": "cusum"} | _LEFT_OUT,
    "distance_cusum": {"name": "distance_cusum"},
}
_CUT = ("pid_made_chebyshev", "pid_made_left_out", "pid_robust", "pid_cusum", "distance_cusum")
FILTERED: dict[str, dict[str, Any]] = {
    **{f"{name}_fedavg": spec for name, spec in _FILTERS.items()},
    **{f"{name}_cut_fedavg": _FILTERS[name] | {"round_cut": ROUND_CUT} for name in _CUT},
}
METHODS = [*RULES, *FILTERED, *PREAGGREGATED]
# the matrix: every rule, the distance CUSUM with the round cut as the one history-aware
# filter (the others by name in the "filters" regime), the pre-aggregated rules
MATRIX_METHODS = [*RULES, "distance_cusum_cut_fedavg", *PREAGGREGATED]
REGIME_METHODS = [
    "fedavg", "median", "trimmed_mean", "krum", "geometric_median", "centered_clipping",
    "ema", "distance_cusum_cut_fedavg", "nnm_median", "arc_fedavg", "bucketing_median",
    "fedlag",
]  # fmt: skip
REGIME_ATTACKS = ["none", "label_flip", "sign_flip", "alie", "ipm"]


@dataclass(frozen=True)
class Regime:
    """A setting beside the IID logistic one: its changes to the params file (section ->
    keys) and the subset of the matrix it runs."""

    changes: dict[str, dict[str, Any]]
    methods: list[str]
    attacks: list[str]
    fractions: list[float]
    attack_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    seeds: int = 5
    # a seeded class-stratified subset of the training split (the same for every cell), where
    # the full split does not fit the regime's time: None trains on every image
    train_volumes: int | None = None


REGIMES: dict[str, Regime] = {
    "iid": Regime({}, MATRIX_METHODS, ["none", *EVERY_ATTACK], FRACTIONS),
    # Heterogeneous clients (label skew, Dirichlet over classes): the regimes NNM,
    # bucketing and ARC were designed for
    **{
        f"dirichlet-{alpha:g}": Regime(
            {"partition": {"scheme": "dirichlet", "alpha": alpha}},
            REGIME_METHODS,
            REGIME_ATTACKS,
            [0.2],
            seeds=10,  # each method against FedAvg over 11 tests: 5 seeds cannot support one
        )
        for alpha in (0.1, 0.5, 1.0)
    },
    # The history-aware filters, each configuration named (issue 44), on seeds 0-9 of the
    # matrix's own setting: seeds 0-4 are the ones the round cut was added on, 5-9 held out
    "filters": Regime({}, list(FILTERED), [*EVERY_ATTACK, "none"], [0.2, 0.4], seeds=10),
    # A non-convex model: the small CNN (0.42M parameters) on the same 20 IID clients
    "cnn": Regime(
        {"model": {"name": "small_cnn"}},
        [
            "fedavg",
            "median",
            "trimmed_mean",
            "krum",
            "geometric_median",
            "centered_clipping",
            "distance_cusum_cut_fedavg",
            "nnm_median",
        ],
        [*REGIME_ATTACKS, "opt_ipm", "min_max", "min_sum"],
        [0.2],
        seeds=10,
    ),
    # The small CNN on label-skewed clients (Dirichlet α = 0.5), at 10 seeds: four rules
    # (FedAvg; the median and NNM before it, the IID CNN's finding and the rule made for
    # skew; the geometric median, the one rule above FedAvg at every α of the logistic
    # records), no attack and two attacks, 120 cells (35-57 s each on one core). Its claims
    # were written before it ran: benchmarks/preregistered.yaml
    "dirichlet-0.5-cnn": Regime(
        {"model": {"name": "small_cnn"}, "partition": {"scheme": "dirichlet", "alpha": 0.5}},
        ["fedavg", "median", "nnm_median", "geometric_median"],
        ["none", "sign_flip", "alie"],
        [0.2],
        seeds=10,
    ),
    # ALIE where its authors ran it: 51 clients of which 12 (0.24) attack, a CNN, z = 1.5
    # (their code's default, github.com/moranant/attacking_distributed_learning), against
    # no defence and the defences they broke (Krum, Bulyan, the trimmed mean) and the median
    "alie-paper": Regime(
        {"model": {"name": "small_cnn"}, "partition": {"num_clients": 51}},
        ["fedavg", "trimmed_mean", "krum", "bulyan", "median"],
        ["none", "alie"],
        [0.24],
        attack_options={"alie": {"z": 1.5}},
        seeds=10,
    ),
    # AdrenalMNIST3D at 64 voxels (issue 80): the small 3-D CNN on 10 IID clients, FedAvg,
    # the median, the paper's PID-MADE in front of FedAvg and FedLag under label and sign
    # flipping by a fifth, 10 seeds (80 cells); sized from two timed cells to fit a shared
    # CPU (benchmarks/preregistered.yaml, P60-P62, and P63-P65 for seeds 0-6, `--seeds 7`):
    # 120 training volumes (12 a client), 3 rounds of one local epoch of batch 12, scored
    # on the whole test split
    "cnn3d": Regime(
        {"model": {"name": "small_cnn3d"}},
        ["fedavg", "median", "pid_made_fedavg", "fedlag"],
        ["label_flip", "sign_flip"],
        [0.2],
        seeds=10,
        train_volumes=120,
    ),
}


def method_spec(method: str, attackers: int, clients: int) -> dict[str, Any]:
    """The compare-grid entry of ``method`` told ``attackers`` Byzantine clients."""
    if method in FILTERED:
        return {"aggregate": {"name": "fedavg"}, "filters": [FILTERED[method]]}
    if method in PREAGGREGATED:
        rule, pre = PREAGGREGATED[method]
        if pre["name"] in ("nnm", "arc"):
            pre = {**pre, "f": min(attackers, (clients - 1) // 2)}
        return {"aggregate": {"name": rule}, "preaggregators": [pre]}
    aggregate: dict[str, Any] = {"name": method}
    if method in TAKES_F:
        bound = (clients - 3) // 4 if method == "bulyan" else (clients - 1) // 2
        aggregate["f"] = min(attackers, bound)
    elif method == "zeno":
        aggregate["b"] = attackers
    elif method == "weighted_trimmed_mean":  # the weight the f heaviest hold, not f/n
        aggregate["f"] = attackers
    return {"aggregate": aggregate}


def cells_for(
    base: dict[str, Any], methods: list[str], attacks: list[str], fractions: list[float],
    seeds: int, attack_options: dict[str, dict[str, Any]] | None = None,
) -> list[Any]:  # fmt: skip
    """The matrix's cells, scenario by scenario, as validated grid cells."""
    from config.params import Params
    from tasks.grid import grid_cells

    clients = base["partition"]["num_clients"]
    cells: list[Any] = []
    for fraction in fractions:
        attackers = round(fraction * clients)
        for attack in attacks:
            grid = {
                "methods": {m: method_spec(m, attackers, clients) for m in methods},
                "attacks": [
                    {"name": attack, **ATTACKS[attack], **(attack_options or {}).get(attack, {})}
                ],
                "fractions": [fraction],
                "seeds": list(range(seeds)),
            }
            cells += grid_cells(Params.model_validate({**base, "compare": grid}), REPO)
    unique: dict[str, Any] = {}  # no attack is one scenario whatever the fraction
    for cell in cells:  # (its rule told the first fraction's f)
        unique.setdefault(cell.name, cell)
    return list(unique.values())


_DATA: dict[str, Any] = {}


def dataset_root(data: Any) -> Path:
    """The folder holding the verified file of ``data`` (a params' data section), fetched
    where it is missing and downloads are allowed: what a cell loads and what
    :func:`data_ready` checks before any cell runs."""
    from federated.data import ensure_medmnist
    from tasks.data import data_root

    root = data_root(data.root, REPO)
    ensure_medmnist(data.dataset, root, size=data.size, download=data.download, progress=False)
    return root


def stratified_subset(data: Any, count: int) -> Any:
    """``data`` with ``count`` training images drawn class by class in proportion (seed 0,
    so every cell trains on the same images); validation and test kept whole."""
    import dataclasses

    import numpy as np

    from federated.data import Split

    targets = data.train.targets
    if count >= len(targets):
        return data
    rng = np.random.default_rng(0)
    classes, counts = np.unique(targets, return_counts=True)
    shares = np.maximum(1, np.round(counts / counts.sum() * count).astype(int))
    rows = np.sort(np.concatenate([
        rng.choice(np.flatnonzero(targets == c), k, replace=False)
        for c, k in zip(classes, shares, strict=True)
    ]))  # fmt: skip
    subset = Split(images=data.train.images[rows], labels=data.train.labels[rows])
    return dataclasses.replace(data, train=subset)


def trained(cell: Any, train_volumes: int | None = None) -> tuple[Any, Any, Any]:
    """``cell`` trained through the engine (in a worker process; the dataset loaded once
    per worker), on ``train_volumes`` training images where given
    (:func:`stratified_subset`): its federation, final state and dataset."""

    from federated.data import load_medmnist
    from federated.loop import train
    from tasks.grid import partition_key, partitions_for
    from tasks.training import federation_from_params

    params = cell.params
    key = f"{params.data.dataset}@{params.data.size}:{train_volumes}"
    if key not in _DATA:
        full = load_medmnist(params.data.dataset, dataset_root(params.data), params.data.size)
        _DATA[key] = full if train_volumes is None else stratified_subset(full, train_volumes)
    data = _DATA[key]
    clients, root, local_tests = partitions_for.fn([cell], data)[partition_key(params)]
    federation = federation_from_params(
        params, data, clients, root, local_tests, validation_every_round=False
    )  # each client's local test split, where partition.local_test holds one out
    return federation, train(federation, federation.initial_state(), params.train.rounds), data


def run_cell(cell: Any, train_volumes: int | None = None) -> dict[str, Any]:
    """One cell (on ``train_volumes`` training images where given): its final metrics,
    its test accuracy and loss per round, or its error."""
    from tasks.evaluation import trained_results

    record: dict[str, Any] = {
        "name": cell.name, "method": cell.method, "attack": cell.attack,
        "fraction": cell.fraction, "seed": cell.seed,
    }  # fmt: skip
    started = time.perf_counter()
    try:
        federation, state, data = trained(cell, train_volumes)
        record["metrics"] = trained_results(federation, state, cell.params, data)
        if cell.attack == "none":  # the trigger's hit rate on a model that never saw it
            record["metrics"]["backdoor_asr"] = clean_trigger_rate(federation, state, data)
        record["accuracy"] = [row["test_acc"] for row in state.history]
        record["loss"] = [row["test_loss"] for row in state.history]
        record["excluded"] = excluded_clients(state.trail)
        record["exposure"] = exposure(cell, data)
    except Exception as error:  # recorded, never dropped: the summary says which cells failed
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc(limit=3)
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def clean_trigger_rate(federation: Any, state: Any, data: Any) -> float:
    """The default backdoor trigger's success rate on a model trained without attack: the
    baseline a backdoor's success rate is read against (with two classes a model calls
    many triggered images "target" without ever seeing the trigger)."""
    from federated.attacks.backdoor import Backdoor
    from federated.backdoor_eval import attack_success_rate, triggered_test_set
    from federated.data import to_tensors

    trigger = Backdoor()
    images, labels = to_tensors(data.test, data.info)
    model = federation.selected_model(state).cpu()
    return attack_success_rate(model, triggered_test_set(images, labels, trigger), 0)


def exposure(cell: Any, data: Any) -> dict[str, Any]:
    """The denominators of the cell's counts: honest and attacker client-rounds judged,
    the triggered test images a success rate is over, the number of attackers a rule
    that takes ``f`` was told (below the true number where the rule caps it) and the
    test set's majority share (what a model that learnt nothing scores)."""
    import numpy as np

    from federated.attacks.backdoor import Backdoor

    params = cell.params
    clients = params.partition.num_clients
    attackers = round(cell.fraction * clients) if cell.attack != "none" else 0
    labels = np.asarray(data.test.labels).reshape(-1)
    aggregate = params.aggregate.model_dump()
    return {
        "honest_rounds": (clients - attackers) * params.train.rounds,
        "attacker_rounds": attackers * params.train.rounds,
        "attackers": attackers,
        "f_told": aggregate.get("f", aggregate.get("b")),
        "trigger_images": int((labels != Backdoor().target_label).sum()),
        "majority_share": float(np.bincount(labels).max() / len(labels)),
    }


def excluded_clients(trail: list[dict[str, Any]]) -> dict[str, Any]:
    """Which clients a screen or filter ever left out, honest and malicious, and the round
    each malicious one was first left out (a permanent ban's moment)."""
    out = [row for row in trail if row["excluded"]]
    first: dict[int, int] = {}
    for row in out:
        if row["malicious"]:
            first.setdefault(int(row["client"]), int(row["round"]))
    return {
        "honest": sorted({int(row["client"]) for row in out if not row["malicious"]}),
        "malicious_first_round": {str(k): v for k, v in sorted(first.items())},
    }


def finished(cells_file: Path) -> dict[str, dict[str, Any]]:
    if not cells_file.exists():
        return {}
    rows = [json.loads(line) for line in cells_file.read_text().splitlines() if line.strip()]
    return {row["name"]: row for row in rows}


def one_torch_thread() -> None:
    """A worker process's setting: one torch thread, so that ``workers`` cells share the
    cores without oversubscribing them (set in the worker, never in a caller's process)."""
    import torch

    torch.set_num_threads(1)


def data_ready(cells: list[Any]) -> None:
    """Every dataset the cells train on is on disk (or downloads), checked once before any
    cell runs: a missing file stops the command in one line, instead of failing every cell
    and leaving their errors in the cells file (where a rerun would skip them)."""
    from federated.data import DataError

    sources = {cell.params.data.dataset: cell.params.data for cell in cells}
    for data in sources.values():
        try:
            dataset_root(data)
        except DataError as error:
            raise SystemExit(f"no cell was run: {error}") from None


def run_matrix(cells: list[Any], cells_file: Path, workers: int, runner: Any = run_cell) -> None:
    """Every cell not yet in ``cells_file`` through ``runner`` in ``workers`` processes,
    each record appended as it finishes."""
    done = finished(cells_file)
    todo = [cell for cell in cells if cell.name not in done]
    data_ready(todo)
    print(f"robustness: {len(cells)} cells, {len(done)} already done, {len(todo)} to run")
    with (
        ProcessPoolExecutor(max_workers=workers, initializer=one_torch_thread) as pool,
        cells_file.open("a") as out,
    ):
        futures = [pool.submit(runner, cell) for cell in todo]
        for count, future in enumerate(as_completed(futures), 1):
            record = future.result()
            out.write(json.dumps(record) + "\n")
            out.flush()
            status = record.get("error") or f"acc {record['metrics']['test_acc']:.3f}"
            print(f"[{count}/{len(todo)}] {record['name']} {record['seconds']} s: {status}")


def glance(rows: list[dict[str, Any]], metric: str, fraction: float) -> str:
    """A method × attack table of ``metric``'s mean ± 95 % interval at one fraction (the
    no-attack baseline first where it was run)."""
    share = [r for r in rows if r["fraction"] == fraction or r["attack"] == "none"]
    attacks = list(
        dict.fromkeys(r["attack"] for r in sorted(share, key=lambda r: r["attack"] != "none"))
    )
    methods = list(dict.fromkeys(r["method"] for r in share))
    cell = {(r["method"], r["attack"]): r for r in share}

    def text(row: dict[str, Any] | None) -> str:
        if row is None or row[f"{metric}_mean"] is None:
            return "–"
        ci = row[f"{metric}_ci95"]
        return f"{row[f'{metric}_mean']:.2f}" + (f" ± {ci:.2f}" if ci is not None else "")

    lines = [f"| method | {' | '.join(attacks)} |", "|---" * (len(attacks) + 1) + "|"]
    lines += [f"| {m} | {' | '.join(text(cell.get((m, a))) for a in attacks)} |" for m in methods]
    return "\n".join(lines) + "\n"


SEED_COLUMNS = [
    "method", "attack", "fraction", "seed", "test_acc", "test_auc", "rounds_to_target",
    "fp", "fn", "honest_rounds", "attacker_rounds", "attackers", "f_told", "asr",
    "trigger_images", "majority_share", "acc_curve", "error",
]  # fmt: skip
CURVE_EVERY = 5  # the accuracy curve kept per seed: round 1, then every fifth round


def seed_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One compact row per cell and seed (``robustness-<dataset>-seeds.csv``, committed):
    what every table of docs/results.md is recomputed from (benchmarks/evidence/report.py)."""
    rows = []
    for record in sorted(
        records, key=lambda r: (r["method"], r["attack"], r["fraction"], r["seed"])
    ):
        row: dict[str, Any] = {k: record[k] for k in ("method", "attack", "fraction", "seed")}
        if "error" in record:
            rows.append(row | {"error": record["error"].splitlines()[0]})
            continue
        metrics, exposure = record["metrics"], record["exposure"]
        curve = record["accuracy"][:1] + record["accuracy"][CURVE_EVERY - 1 :: CURVE_EVERY]
        rows.append(
            row
            | {
                "test_acc": round(metrics["test_acc"], 4),
                "test_auc": round(metrics["test_auc"], 4),
                "rounds_to_target": metrics["rounds_to_target"],
                "fp": int(metrics["total_false_positives"]),
                "fn": int(metrics["total_false_negatives"]),
                "asr": None
                if metrics.get("backdoor_asr") is None
                else round(metrics["backdoor_asr"], 4),
                "acc_curve": " ".join(f"{a:.4f}" for a in curve),
            }
            | {
                k: exposure[k]
                for k in (
                    "honest_rounds",
                    "attacker_rounds",
                    "attackers",
                    "f_told",
                    "trigger_images",
                )
            }
            | {"majority_share": round(exposure["majority_share"], 4)}
        )
    return rows


def write_seed_rows(
    records: list[dict[str, Any]], path: Path, kept: list[dict[str, str]] | None = None
) -> None:
    """The per-seed record: the cells' rows, and ``kept`` (committed rows of methods not
    rerun, as read) in the same order."""
    import csv

    def order(row: dict[str, Any]) -> tuple[str, str, float, int]:
        return row["method"], row["attack"], float(row["fraction"]), int(row["seed"])

    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, SEED_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(sorted([*seed_rows(records), *(kept or [])], key=order))


@dataclass(frozen=True)
class Kept:
    """What a rerun of some methods (``--keep-others``) keeps of the committed record: the
    other methods' per-seed rows (as read), summary rows and failed cells."""

    seed_rows: list[dict[str, str]] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def methods(self) -> list[str]:
        return list(dict.fromkeys(row["method"] for row in self.seed_rows))


def kept_of(stem: Path, rerun: set[str]) -> Kept:
    """The committed record under ``stem`` less the methods in ``rerun``."""
    import csv

    with stem.with_name(f"{stem.name}-seeds.csv").open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["method"] not in rerun]
    payload = json.loads(stem.with_name(f"{stem.name}.json").read_text())
    return Kept(
        rows,
        [r for r in payload["summary"] if r["method"] not in rerun],
        [f for f in payload["cells_failed"] if f.split(" under ")[0] not in rerun],
    )


def coverage(records: list[dict[str, Any]]) -> str:
    """Where the attacks did not all run at every fraction (the digits matrix: the core
    attacks at every fraction, the others at 0.2 and 0.4), which ran where."""
    ran_at: dict[str, set[float]] = {}
    for record in records:
        if record["attack"] != "none":
            ran_at.setdefault(record["attack"], set()).add(record["fraction"])
    every = set().union(*ran_at.values())
    by_fractions: dict[tuple[float, ...], list[str]] = {}
    for attack, where in ran_at.items():
        if where != every:
            by_fractions.setdefault(tuple(sorted(where)), []).append(attack)
    where_each = "; ".join(
        f"{' '.join(attacks)} at {' '.join(f'{f:g}' for f in where)} only"
        for where, attacks in by_fractions.items()
    )
    return f" ({where_each})" if where_each else ""


def summarise(
    name: str, dataset: str, command: str, cells_file: Path, settings: dict[str, Any],
    keep_others: bool = False,
) -> None:  # fmt: skip
    """The summary over seeds (JSON, Markdown) and one heatmap per fraction, under
    ``robustness-<name>``; with ``keep_others``, the committed record's rows of the
    methods the cells file does not hold are kept (a rerun of some methods)."""
    from tasks.comparison import CellResult, aggregate_over_seeds, heat_table, summary_markdown
    from tasks.plots import plot_compare_heatmap

    records = list(finished(cells_file).values())
    ok = [r for r in records if "error" not in r]
    if not ok:
        first = records[0]["error"] if records else f"{cells_file.name} has no cells"
        raise SystemExit(
            f"robustness-{name}: no cell finished ({len(records)} failed; first: {first}); "
            "the summary is left as it was"
        )
    stem = RESULTS / f"robustness-{name}"
    kept = kept_of(stem, {r["method"] for r in records}) if keep_others else Kept()
    for key in ("method", "attack", "fraction"):
        settings[f"{key}s"] = list(dict.fromkeys(r[key] for r in records))
    settings["seeds"] = len({r["seed"] for r in records})
    settings["methods"] = [*kept.methods, *settings["methods"]]
    failed = sorted({f"{r['method']} under {r['attack']} @ {r['fraction']:g}: {r['error']}"
                     for r in records if "error" in r} | set(kept.failed))  # fmt: skip
    results = [
        CellResult(r["method"], r["attack"], r["fraction"], r["seed"], r["metrics"], r["accuracy"])
        for r in ok
    ]
    rows = aggregate_over_seeds(results) + [
        {k: math.nan if v is None else v for k, v in row.items()} for row in kept.summary
    ]
    methods = settings["methods"]
    figures = []
    for fraction in sorted({r["fraction"] for r in rows}):
        share = [r for r in rows if r["fraction"] == fraction]
        table, tied, scenarios = heat_table(share, methods)
        figure = stem.with_name(f"{stem.name}-f{fraction:g}.png")
        plot_compare_heatmap(table, tied, scenarios, methods, figure)
        figures.append(figure.name)
    clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
             for row in rows]  # fmt: skip
    payload = {
        "benchmark": "robustness",
        "command": command,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": settings,
        "cells_run": len(records) + len(kept.seed_rows),
        "cells_failed": failed,
        "cell_seconds_mean": round(sum(r["seconds"] for r in records) / max(len(records), 1), 2),
        **({"kept_from_the_committed_record": kept.methods} if keep_others else {}),
        "figures": figures,
        "summary": clean,
    }
    stem.with_name(f"{stem.name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    write_seed_rows(records, stem.with_name(f"{stem.name}-seeds.csv"), kept.seed_rows)
    note = "\n".join(f"- {line}" for line in failed) or "- none"
    metric = "auc" if dataset in BINARY else "acc"
    tables = "\n".join(
        f"Final test {metric.upper()} at attacker fraction {fraction:g}:\n\n"
        f"{glance(clean, metric, fraction)}"
        for fraction in sorted({r["fraction"] for r in rows if r["attack"] != "none"})
    )
    stem.with_name(f"{stem.name}.md").write_text(
        f"# Robustness matrix: {name}\n\n"
        f"Command: `{payload['command']}`{coverage(records)}. Mean ± 95 % "
        "t-interval over seeds of the final test accuracy and AUC; FP/FN are honest "
        "clients excluded and attacker-rounds missed, summed over rounds (filters and "
        "rules that select clients).\n\n"
        "The worst cases, paired comparisons and rates with their intervals are in "
        "docs/results.md, recomputed from the per-seed records beside this file "
        "(`python -m benchmarks.evidence.report`).\n\n"
        f"{tables}\n## Every cell\n\n"
        f"{summary_markdown(rows)}\nCells that failed:\n{note}\n"
    )
    print(f"wrote {stem}.json, {stem}.md and {len(figures)} heatmaps ({len(ok)} cells)")


def main() -> None:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="breastmnist")
    parser.add_argument(
        "--seeds", type=positive_int, help="default: the regime's (5 for the matrix)"
    )
    parser.add_argument("--attacks", nargs="+", choices=list(ATTACKS))
    parser.add_argument("--fractions", nargs="+", type=float)
    parser.add_argument("--methods", nargs="+", choices=METHODS)
    parser.add_argument("--workers", type=positive_int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--regime", default="iid", choices=list(REGIMES))
    parser.add_argument("--summarise-only", action="store_true")
    parser.add_argument(
        "--keep-others",
        action="store_true",
        help="keep the committed record's rows of the methods not run (a rerun of some)",
    )
    args = parser.parse_args()
    regime = REGIMES[args.regime]
    args.attacks = args.attacks or regime.attacks
    args.fractions = args.fractions or regime.fractions
    args.methods = args.methods or regime.methods
    args.seeds = regime.seeds if args.seeds is None else args.seeds

    base = yaml.safe_load((PARAMS / f"robustness-{args.dataset}.yaml").read_text())
    for section, changes in regime.changes.items():
        base[section] = {**base.get(section, {}), **changes}
    name = args.dataset if args.regime == "iid" else f"{args.dataset}-{args.regime}"
    cells_file = RESULTS / f"robustness-{name}-cells.jsonl"
    if not args.summarise_only:
        cells = cells_for(
            base, args.methods, args.attacks, args.fractions, args.seeds, regime.attack_options
        )
        runner = partial(run_cell, train_volumes=regime.train_volumes)
        run_matrix(cells, cells_file, args.workers, runner)
    settings = {
        "params": f"benchmarks/params/robustness-{args.dataset}.yaml",
        "changes": regime.changes or "none (IID clients, the params file's model)",
        "attack_options": regime.attack_options,
        "train_volumes": regime.train_volumes or "the whole training split",
        "f": "the true number of attackers (Bulyan capped at (n-3)/4; Zeno b = f; the weighted trimmed mean trims the weight share of the f heaviest clients)",
    }  # fmt: skip
    command = f"python -m benchmarks.robustness.matrix --dataset {args.dataset}" + (
        f" --regime {args.regime}" if args.regime != "iid" else ""
    )
    summarise(name, args.dataset, command, cells_file, settings, args.keep_others)


if __name__ == "__main__":
    main()
