"""Benchmark: which defence takes a label flipper out of a small consortium, and when.

Most hospital consortia are 3 to 10 sites. At 3, 4 and 5 sites with one site flipping
every label, and at 20 with four, each filter of :data:`benchmarks.papers.pid_made_ablation.VARIANTS`
(and none) runs in front of the coordinate-wise median, on digits with the robustness
matrix's settings (the logistic model, two local epochs) for :data:`ROUNDS` rounds, over
seeds 0-9. Per run: the round by which every flipper is out (none if one never is), the
honest client-rounds excluded and the honest clients ever banned, and the final test
accuracy. The sites of a real federation train as these simulated clients do (within
1e-6, tests/flower), so what a filter does here it does at the sites.

The recommendation per size is chosen by a rule fixed before the runs: among the filters
that take every flipper out in at least :data:`CAUGHT_IN` of the seeds, the one that
excludes the fewest honest client-rounds (then the earliest); where none does, the
median alone, and the docs say that no filter protects a consortium of that size.

    python -m benchmarks.robustness.small_consortium [--seeds 10] [--workers 2]

Records: ``benchmarks/results/small-consortium-cells.jsonl`` (local; a rerun skips
finished runs) and ``small-consortium-cpu.json`` (committed: the table per size and
filter, and the recommendation); the four-site figures are also written into
``federation-loopback.json`` (``four_sites_flipper_out_by_round``,
``four_sites_false_exclusions``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
from typing import Any

import yaml

from benchmarks.common import cpu_environment, write_summary
from benchmarks.papers.pid_made_ablation import VARIANTS
from benchmarks.robustness.matrix import PARAMS, REPO, RESULTS, finished, run_matrix, trained
from fedsieve.arguments import positive_int

SIZES = {3: 0.25, 4: 0.25, 5: 0.25, 20: 0.2}  # sites -> flipper share (1, 1, 1 and 4)
FILTERS: dict[str, list[dict[str, Any]]] = {"none": []} | {
    name: [spec] for name, spec in VARIANTS.items() if name != "paper_chebyshev"
}  # Chebyshev's k excludes nobody at 20 or fewer (Samuelson): nothing to measure
ROUNDS = 10
CAUGHT_IN = 0.8  # the share of seeds in which a recommended filter takes every flipper out
STEM = RESULTS / "small-consortium"
LOOPBACK = RESULTS / "federation-loopback.json"


def cells_for(seeds: range) -> list[Any]:
    """One cell per size, filter and seed: the median with that filter, one flipping share."""
    from config.params import Params
    from tasks.grid import grid_cells

    cells = []
    for sites, share in SIZES.items():
        base = yaml.safe_load((PARAMS / "robustness-digits.yaml").read_text())
        base["partition"] |= {"num_clients": sites, "root_size": 0}
        base["train"]["rounds"] = ROUNDS
        grid = {
            "methods": {
                f"sites{sites}.{name}": {"aggregate": {"name": "median"}, "filters": spec}
                for name, spec in FILTERS.items()
            },
            "attacks": [{"name": "label_flip", "rate": 1.0, "mapping": "reverse"}],
            "fractions": [share],
            "seeds": list(seeds),
        }
        cells += grid_cells(Params.model_validate({**base, "compare": grid}), REPO)
    return cells


def exclusions(trail: list[dict[str, Any]]) -> dict[str, Any]:
    """When every flipper was out, and what the honest clients lost, from the trail."""
    malicious = {int(r["client"]): bool(r["malicious"]) for r in trail}
    first_out: dict[int, int] = {}
    for row in trail:
        if row["excluded"]:
            first_out.setdefault(int(row["client"]), int(row["round"]))
    flippers = [c for c, bad in malicious.items() if bad]
    caught = [first_out[c] for c in flippers if c in first_out]
    return {
        "flippers": len(flippers),
        "flippers_out_by_round": max(caught) if len(caught) == len(flippers) else None,
        "honest_client_rounds_excluded": sum(
            1 for r in trail if r["excluded"] and not malicious[int(r["client"])]
        ),
        "honest_banned": sum(1 for c in first_out if not malicious[c]),
    }


def run_small_cell(cell: Any) -> dict[str, Any]:
    """One run: its test accuracy and what its filter did."""
    sites, _, name = cell.method.partition(".")
    record: dict[str, Any] = {
        "name": cell.name, "sites": int(sites.removeprefix("sites")), "filter": name,
        "seed": cell.seed,
    }  # fmt: skip
    started = time.perf_counter()
    try:
        federation, state, _ = trained(cell)
        record["metrics"] = {"test_acc": federation.scorer.evaluate(state.selected_vector)["acc"]}
        record |= exclusions(state.trail)
    except Exception as error:  # recorded, never dropped
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc(limit=3)
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def summary(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per size and filter: the seeds, in how many every flipper was out and by which round
    (median over those), the honest client-rounds excluded (mean), the seeds with an honest
    client banned, and the mean test accuracy."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for sites in SIZES:
        for name in FILTERS:
            runs = [r for r in records if r["sites"] == sites and r["filter"] == name]
            ok = [r for r in runs if "error" not in r]
            out = [r["flippers_out_by_round"] for r in ok if r["flippers_out_by_round"]]
            table.setdefault(str(sites), {})[name] = {
                "seeds": len(runs), "errors": len(runs) - len(ok),
                "flippers_out_in_seeds": len(out),
                "flippers_out_by_round_median": statistics.median(out) if out else None,
                "honest_client_rounds_excluded_mean": _mean(
                    [r["honest_client_rounds_excluded"] for r in ok]
                ),
                "seeds_with_honest_banned": sum(1 for r in ok if r["honest_banned"]),
                "test_acc_mean": _mean([r["metrics"]["test_acc"] for r in ok]),
            }  # fmt: skip
    return table


def recommended(rows: dict[str, dict[str, Any]]) -> str:
    """The rule fixed before the runs (module docstring)."""
    working = [
        (row["honest_client_rounds_excluded_mean"], row["flippers_out_by_round_median"], name)
        for name, row in rows.items()
        if name != "none"
        and row["seeds"]
        and row["flippers_out_in_seeds"] >= CAUGHT_IN * row["seeds"]
    ]
    return min(working)[2] if working else "none"


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=10)
    parser.add_argument("--workers", type=positive_int, default=2)
    args = parser.parse_args()
    cells_file = STEM.with_name(STEM.name + "-cells.jsonl")
    run_matrix(cells_for(range(args.seeds)), cells_file, args.workers, runner=run_small_cell)
    records = list(finished(cells_file).values())
    table = summary(records)
    choice = {sites: recommended(rows) for sites, rows in table.items()}
    four = table["4"][choice["4"]]
    settings = {
        "data": "digits", "rule": "median", "rounds": ROUNDS, "seeds": args.seeds,
        "flippers": {str(s): round(f * s) for s, f in SIZES.items()}, "caught_in": CAUGHT_IN,
    }  # fmt: skip
    payload = {"settings": settings, "by_size": table, "recommended": choice}
    payload |= cpu_environment()
    lines = [
        "| sites | filter | flippers out (seeds) | by round (median) | honest client-rounds "
        "excluded (mean) | seeds with an honest site banned | test acc (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for sites, rows in table.items():
        for name, row in rows.items():
            mark = " (recommended)" if name == choice[sites] else ""
            lines.append(
                f"| {sites} | {name}{mark} | {row['flippers_out_in_seeds']}/{row['seeds']} | "
                f"{row['flippers_out_by_round_median'] or '-'} | "
                f"{row['honest_client_rounds_excluded_mean']} | "
                f"{row['seeds_with_honest_banned']} | {row['test_acc_mean']} |"
            )
    write_summary(STEM.with_name(STEM.name + "-cpu"), payload, lines)
    loopback = json.loads(LOOPBACK.read_text()) if LOOPBACK.exists() else {}
    loopback |= {
        "four_sites_filter": choice["4"],
        "four_sites_flipper_out_by_round": four["flippers_out_by_round_median"],
        "four_sites_false_exclusions": four["honest_client_rounds_excluded_mean"],
        "four_sites_source": "python -m benchmarks.robustness.small_consortium (simulated sites, seeds "
        f"0-{args.seeds - 1}: median of the round every flipper is out, mean honest "
        "client-rounds excluded)",
    }
    LOOPBACK.write_text(json.dumps(loopback, indent=2) + "\n")
    print(json.dumps({"recommended": choice}, indent=2))


if __name__ == "__main__":
    main()
