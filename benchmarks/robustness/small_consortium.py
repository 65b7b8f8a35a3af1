"""Benchmark: which defence takes one attacking site out of a small consortium, and when.

Most hospital consortia are 3 to 10 sites. At 3, 4, 5 and 10 sites, one of them attacking
(a label flipper, a sign flipper, ALIE or a pixel-trigger backdoor), each defence of
:data:`DEFENCES` runs in front of the coordinate-wise median on BreastMNIST, RetinaMNIST
and digits, with the robustness matrix's settings (the logistic model, two local epochs)
for :data:`ROUNDS` rounds, over seeds 0-9. Per run: the round by which the attacker is out
(none if it never is), the honest client-rounds excluded and the honest sites ever
banned, and the final test accuracy. The sites of a real federation train as these
simulated clients do (within 1e-6, tests/flower), so what a filter does here it does at
the sites.

The recommendation per size follows a rule fixed before the runs (pre-registered in
benchmarks/preregistered.yaml, :func:`recommended`): a defence *holds* against an attack
on a dataset at a size when the attacker is out by round :data:`BY_ROUND` in at least
:data:`CAUGHT_AT_LEAST` of 10 seeds and an honest site is banned in at most
:data:`HONEST_BANNED_AT_MOST` of them. Per size the recommended defence is the one that
holds against the label flipper on the most datasets, then against the other attacks on
the most (dataset, attack) pairs, then excludes the fewest honest client-rounds, then by
name; where none holds against the label flipper on any dataset, the median alone, and
the docs say that no measured filter protects a consortium of that size.

    python -m benchmarks.robustness.small_consortium [--model logreg|small_cnn] [--seeds 10]
        [--workers 1] [--defences D ...] [--summarise-only]

``--model small_cnn`` runs the family of its own (:data:`FAMILIES`, pre-registered apart as
small-consortium-cnn): params.yaml's model, the small CNN, with params.yaml's local
settings (two local epochs of batch 32, ``lr: 0.05``, ``momentum: 0.9``), at 3 and 5 sites,
against the label and the sign flipper, with the defences a 3-site consortium would
choose among, 3 sites first. A
recommendation holds for the model it was measured with: a run reads the record of its
own model (tasks/measured_defence.py).

Records (``<stem>``: ``small-consortium`` for the logistic model, ``small-consortium-cnn``
for the small CNN): ``benchmarks/results/<stem>-cells.jsonl`` (local; a rerun skips
finished runs), ``<stem>-seeds.csv`` (committed: one row per run) and ``<stem>-cpu.json``
(committed: a row per dataset, size, attack and defence, and the recommendation per size
with the datasets behind it).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import cpu_environment, write_summary
from benchmarks.robustness.filters import VARIANTS
from benchmarks.robustness.matrix import (
    ATTACKS,
    PARAMS,
    REPO,
    RESULTS,
    finished,
    run_matrix,
    trained,
)
from fedsieve.arguments import positive_int

DATASETS = ("breastmnist", "retinamnist", "digits")
SIZES = (3, 4, 5, 10)  # sites, one of them attacking
ATTACKED = ("label_flip", "sign_flip", "alie", "backdoor")
# defence -> the filters in front of the median. pid_made is the paper's (its defaults:
# the Gaussian threshold, a banned client's updates counted); pid_robust_fixed is the
# docs' former 3-site row; distance_cusum has no PID. Two PID-MADE variants only, so that
# the grid (five rounds, about a second a run) fits an hour of one core: pid_cusum and
# the other variants of benchmarks/pid_made_ablation.py are left out for time.
DEFENCES: dict[str, list[dict[str, Any]]] = {
    "median": [],
    "pid_made": [{"name": "pid_made"}],
    "pid_robust_fixed": [VARIANTS["pid_robust_fixed"]],
    "distance_cusum": [{"name": "distance_cusum", "exclusion": "permanent"}],
    "site_validation": [{"name": "site_validation"}],
}
# validation at the sites scores candidates on each site's own held-out split: a fifth of
# its images (the pipeline's default partition.local_test), which it then does not train
# on; the other defences train on every image
HELD_OUT = {"site_validation": 0.2}
ROUNDS = 5
BY_ROUND = 3  # the attacker out by this round ...
CAUGHT_AT_LEAST = 9  # ... in at least this many of 10 seeds
HONEST_BANNED_AT_MOST = 1  # and an honest site banned in at most this many
STEM = RESULTS / "small-consortium"
SEEDS_CSV = RESULTS / "small-consortium-seeds.csv"
DEFAULTS = REPO / "params.yaml"  # the pipeline's defaults: what a user runs
LOCAL_SETTINGS = ("local_epochs", "lr", "momentum", "weight_decay", "batch_size")


@dataclass(frozen=True)
class Family:
    """One pre-registered grid: the model it trains, where its records go, and its cells.
    ``local`` names the settings the model trains with: ``robustness`` (the robustness
    matrix's, batch 16) or ``params`` (params.yaml's model section and local settings)."""

    model: str
    stem: Path
    datasets: tuple[str, ...]
    sizes: tuple[int, ...]
    attacks: tuple[str, ...]
    defences: tuple[str, ...]
    local: str

    @property
    def seeds_csv(self) -> Path:
        return self.stem.with_name(self.stem.name + "-seeds.csv")

    @property
    def record(self) -> Path:
        return self.stem.with_name(self.stem.name + "-cpu.json")


FAMILIES = {
    # family small-consortium (P5-P7): the logistic model, every size, attack and defence
    "logreg": Family("logreg", STEM, DATASETS, SIZES, ATTACKED, tuple(DEFENCES), "robustness"),
    # family small-consortium-cnn (P37-P40): params.yaml's small CNN, 3 and 5 sites (4 and
    # 10 left out for time), the label and the sign flipper, the median alone and the
    # three filters a 3-site consortium chooses among
    "small_cnn": Family(
        "small_cnn", RESULTS / "small-consortium-cnn", DATASETS, (3, 5), ATTACKED[:2],
        ("median", "pid_robust_fixed", "distance_cusum", "site_validation"), "params",
    ),
}  # fmt: skip
SEED_COLUMNS = ("dataset", "sites", "attack", "defence", "seed", "attacker_out_round",
                "honest_client_rounds_excluded", "honest_banned", "test_acc", "seconds",
                "error")  # fmt: skip


def base_params(dataset: str, sites: int, family: Family = FAMILIES["logreg"]) -> dict[str, Any]:
    """The robustness matrix's settings on ``dataset`` at ``sites`` sites, no root slice;
    for a family trained as params.yaml says, its model and local settings."""
    base = yaml.safe_load((PARAMS / "robustness-breastmnist.yaml").read_text())
    if family.local == "params":
        defaults = yaml.safe_load(DEFAULTS.read_text())
        base["model"] = defaults["model"]
        base["train"] |= {key: defaults["train"][key] for key in LOCAL_SETTINGS}
    if base["model"]["name"] != family.model:
        raise ValueError(
            f"family {family.stem.name} trains {family.model}, its settings give "
            f"{base['model']['name']}"
        )
    base["data"]["dataset"] = dataset
    base["partition"] |= {"num_clients": sites, "root_size": 0}
    base["train"]["rounds"] = ROUNDS
    return base


def cells_for(
    seeds: range,
    defences: tuple[str, ...] = tuple(DEFENCES),
    datasets: tuple[str, ...] = DATASETS,
    sizes: tuple[int, ...] = SIZES,
    family: Family = FAMILIES["logreg"],
) -> list[Any]:
    """One cell per dataset, size, attack, defence and seed of ``family``; one attacking
    site each. A cell's method is ``<dataset>.sites<N>.<defence>``."""
    from config.params import Params
    from tasks.grid import grid_cells

    cells = []
    for dataset in datasets:
        for sites in sizes:
            for held_out in dict.fromkeys(HELD_OUT.get(name, 0.0) for name in defences):
                grid = {
                    "methods": {
                        f"{dataset}.sites{sites}.{name}": {
                            "aggregate": {"name": "median"}, "filters": DEFENCES[name]
                        }
                        for name in defences
                        if HELD_OUT.get(name, 0.0) == held_out
                    },
                    "attacks": [{"name": a, **ATTACKS[a]} for a in family.attacks],
                    "fractions": [1 / sites],
                    "seeds": list(seeds),
                }  # fmt: skip
                base = base_params(dataset, sites, family)
                if held_out:  # the sites' own scores of the model: the last round's only
                    base["partition"]["local_test"] = held_out
                    base["eval"] |= {"every": ROUNDS}
                params = Params.model_validate({**base, "compare": grid})
                cells += grid_cells(params, REPO)
    return cells


def exclusions(trail: list[dict[str, Any]]) -> dict[str, Any]:
    """When every attacker was out, and what the honest clients lost, from the trail."""
    malicious = {int(r["client"]): bool(r["malicious"]) for r in trail}
    first_out: dict[int, int] = {}
    for row in trail:
        if row["excluded"]:
            first_out.setdefault(int(row["client"]), int(row["round"]))
    attackers = [c for c, bad in malicious.items() if bad]
    caught = [first_out[c] for c in attackers if c in first_out]
    return {
        "attackers": len(attackers),
        "attacker_out_round": max(caught) if caught and len(caught) == len(attackers) else None,
        "honest_client_rounds_excluded": sum(
            1 for r in trail if r["excluded"] and not malicious[int(r["client"])]
        ),
        "honest_banned": sum(1 for c in first_out if not malicious[c]),
    }


def run_small_cell(cell: Any) -> dict[str, Any]:
    """One run: its test accuracy and what its defence did."""
    dataset, sites, defence = cell.method.split(".")
    record: dict[str, Any] = {
        "name": cell.name, "dataset": dataset, "sites": int(sites.removeprefix("sites")),
        "attack": cell.attack, "defence": defence, "seed": cell.seed,
    }  # fmt: skip
    started = time.perf_counter()
    try:
        federation, state, _ = trained(cell)
        test_acc = federation.scorer.evaluate(state.selected_vector)["acc"]
        record |= {"metrics": {"test_acc": test_acc}, "test_acc": test_acc}
        record |= exclusions(state.trail)
    except Exception as error:  # recorded, never dropped
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc(limit=3)
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def rows_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per dataset, size, attack and defence that ran: the issue's fields
    (``caught_seeds``: seeds with the attacker out by the last round; ``median_round``: the
    round it was out, median over those; ``false_exclusions``: honest client-rounds
    excluded, mean over seeds) and the rule's (``caught_by_round_seeds``,
    ``honest_banned_seeds``), with the errors and the mean test accuracy."""
    groups: dict[tuple[str, int, str, str], list[dict[str, Any]]] = {}
    for record in records:
        key = (record["dataset"], int(record["sites"]), record["attack"], record["defence"])
        groups.setdefault(key, []).append(record)
    order = {name: i for i, name in enumerate(DEFENCES)}
    rows = []
    for key in sorted(groups, key=lambda k: (DATASETS.index(k[0]), k[1], ATTACKED.index(k[2]),
                                             order.get(k[3], len(order)), k[3])):  # fmt: skip
        runs = groups[key]
        ok = [r for r in runs if not r.get("error")]
        out = [int(r["attacker_out_round"]) for r in ok if r.get("attacker_out_round")]
        dataset, sites, attack, defence = key
        rows.append({
            "dataset": dataset, "sites": sites, "attack": attack, "defence": defence,
            "seeds": len(runs), "caught_seeds": len(out),
            "median_round": statistics.median(out) if out else None,
            "false_exclusions": _mean([float(r["honest_client_rounds_excluded"]) for r in ok]),
            "caught_by_round_seeds": sum(1 for r in out if r <= BY_ROUND),
            "honest_banned_seeds": sum(1 for r in ok if int(r["honest_banned"])),
            "errors": len(runs) - len(ok),
            "test_acc_mean": _mean([float(r["test_acc"]) for r in ok]),
        })  # fmt: skip
    return rows


def holds(row: dict[str, Any]) -> bool:
    """The pre-registered standard: the attacker out by round :data:`BY_ROUND` in at
    least :data:`CAUGHT_AT_LEAST` of 10 seeds, an honest site banned in at most
    :data:`HONEST_BANNED_AT_MOST` (counts scaled to the row's seeds, no errors)."""
    seeds = row["seeds"]
    return (
        seeds > 0
        and not row.get("errors")
        and row["caught_by_round_seeds"] >= CAUGHT_AT_LEAST * seeds / 10
        and row["honest_banned_seeds"] <= HONEST_BANNED_AT_MOST * seeds / 10
    )


def recommended(rows: list[dict[str, Any]], sites: int) -> dict[str, Any]:
    """The pre-registered rule (module docstring) at ``sites``: the defence, the datasets
    where it holds against the label flipper and those where it does not."""
    at_size = [r for r in rows if r["sites"] == sites and r["defence"] != "median"]
    datasets = sorted({r["dataset"] for r in rows if r["sites"] == sites}, key=DATASETS.index)
    scored = []
    for defence in sorted({r["defence"] for r in at_size}):
        own = [r for r in at_size if r["defence"] == defence]
        flipper = [r["dataset"] for r in own if r["attack"] == "label_flip" and holds(r)]
        others = sum(1 for r in own if r["attack"] != "label_flip" and holds(r))
        excluded = _mean([r["false_exclusions"] for r in own if r["false_exclusions"] is not None])
        scored.append((-len(flipper), -others, excluded or 0.0, defence, flipper))
    best = min(scored) if scored else None
    if best is None or not best[4]:
        return {"defence": "median", "holds_on": [], "fails_on": datasets}
    holding = sorted(best[4], key=DATASETS.index)
    return {
        "defence": best[3],
        "holds_on": holding,
        "fails_on": [d for d in datasets if d not in holding],
    }


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def write_seed_rows(records: list[dict[str, Any]], path: Path = SEEDS_CSV) -> None:
    """Every run, one row, in grid order."""
    order = {name: i for i, name in enumerate(DEFENCES)}
    ordered = sorted(records, key=lambda r: (DATASETS.index(r["dataset"]), int(r["sites"]),
                                             ATTACKED.index(r["attack"]),
                                             order.get(r["defence"], len(order)), int(r["seed"])))  # fmt: skip
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=SEED_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for record in ordered:
            row = {k: record.get(k) for k in SEED_COLUMNS}
            row["error"] = record.get("error", "")
            writer.writerow(row)


def read_seed_rows(path: Path = SEEDS_CSV) -> list[dict[str, Any]]:
    """The committed per-run rows, typed as :func:`rows_of` reads them."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row["sites"], row["seed"] = int(row["sites"]), int(row["seed"])
        row["attacker_out_round"] = int(row["attacker_out_round"] or 0) or None
    return rows


def whole_rows(records: list[dict[str, Any]], seeds: int) -> list[dict[str, Any]]:
    """The runs of the rows that ran all ``seeds`` seeds: a grid stopped at its registered
    time keeps only whole rows (family small-consortium-cnn's registration)."""
    counts: dict[tuple[str, int, str, str], int] = {}
    for r in records:
        key = (r["dataset"], int(r["sites"]), r["attack"], r["defence"])
        counts[key] = counts.get(key, 0) + 1
    return [r for r in records
            if counts[(r["dataset"], int(r["sites"]), r["attack"], r["defence"])] >= seeds]  # fmt: skip


def not_run(rows: list[dict[str, Any]], family: Family) -> list[str]:
    """The family's rows the record lacks, as ``dataset/sites/attack/defence``."""
    ran = {(r["dataset"], r["sites"], r["attack"], r["defence"]) for r in rows}
    return [f"{d}/{n}/{a}/{x}" for d in family.datasets for n in family.sizes
            for a in family.attacks for x in family.defences if (d, n, a, x) not in ran]  # fmt: skip


def summarise(
    records: list[dict[str, Any]], seeds: int, family: Family = FAMILIES["logreg"]
) -> dict[str, Any]:
    """The committed record: settings, the rows, the recommendation per size and the
    family's rows not run."""
    rows = rows_of(records)
    sizes = family.sizes
    choice = {str(s): recommended(rows, s) for s in sizes if any(r["sites"] == s for r in rows)}
    local = base_params(family.datasets[0], sizes[0], family)["train"]
    settings = {
        "datasets": list(family.datasets), "sizes": list(sizes), "attacks": list(family.attacks),
        "attackers": 1, "rule": "median", "model": family.model,
        "local": {key: local[key] for key in LOCAL_SETTINGS}, "rounds": ROUNDS, "seeds": seeds,
        "defences": {name: DEFENCES[name] for name in family.defences},
        "held_out": {k: v for k, v in HELD_OUT.items() if k in family.defences},
        "by_round": BY_ROUND, "caught_at_least": CAUGHT_AT_LEAST,
        "honest_banned_at_most": HONEST_BANNED_AT_MOST,
    }  # fmt: skip
    missing = {"not_run": not_run(rows, family)} if family.model != "logreg" else {}
    return (
        {"settings": settings, "rows": rows, "recommended": choice} | missing | (cpu_environment())
    )


def summary_lines(payload: dict[str, Any]) -> list[str]:
    """The record's rows as a Markdown table (``small-consortium-cpu.md``, the console)."""
    lines = ["| dataset | sites | attack | defence | caught (seeds) | by round 3 (seeds) | "
             "median round | honest client-rounds excluded (mean) | honest banned (seeds) |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in payload["rows"]:
        lines.append(
            f"| {row['dataset']} | {row['sites']} | {row['attack']} | {row['defence']} | "
            f"{row['caught_seeds']}/{row['seeds']} | {row['caught_by_round_seeds']} | "
            f"{row['median_round'] or '-'} | {row['false_exclusions']} | "
            f"{row['honest_banned_seeds']} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", choices=list(FAMILIES), default="logreg",
        help="the family's model: logreg (P5-P7's grid) or small_cnn (params.yaml's, P37-)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=positive_int, default=10)
    parser.add_argument("--workers", type=positive_int, default=1)
    parser.add_argument(
        "--defences", nargs="+", choices=list(DEFENCES), default=None,
        help="run these defences' cells (the record keeps every defence already run)",
    )  # fmt: skip
    parser.add_argument(
        "--summarise-only", action="store_true",
        help="write the records from the runs already finished, running none",
    )  # fmt: skip
    args = parser.parse_args()
    family = FAMILIES[args.model]
    defences = tuple(args.defences or family.defences)
    outside = [name for name in defences if name not in family.defences]
    if outside:
        parser.error(
            f"--defences {' '.join(outside)}: not in the {args.model} family; allowed: "
            f"{', '.join(family.defences)}"
        )
    cells_file = family.stem.with_name(family.stem.name + "-cells.jsonl")
    cells = cells_for(range(args.seeds), defences, family.datasets, family.sizes, family)
    # the label flipper's runs first: the recommendation rests on them (then by attack);
    # a family of few sizes runs its smallest size whole first
    by_size = len(family.sizes) < len(SIZES)
    cells.sort(key=lambda cell: (cell.params.partition.num_clients if by_size else 0,
                                 ATTACKED.index(cell.attack)))  # fmt: skip
    if not args.summarise_only:
        run_matrix(cells, cells_file, args.workers, runner=run_small_cell)
    records = list(finished(cells_file).values())
    if family.model != "logreg":  # its registration: only whole rows enter the record
        records = whole_rows(records, args.seeds)
    write_seed_rows(records, family.seeds_csv)
    payload = summarise(read_seed_rows(family.seeds_csv), args.seeds, family)
    write_summary(family.stem.with_name(family.stem.name + "-cpu"), payload,
                  summary_lines(payload))  # fmt: skip
    print(payload["recommended"])


if __name__ == "__main__":
    main()
