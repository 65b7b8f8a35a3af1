"""Benchmark: EMA's own experiments, as close as the data here allows, over seeds.

On scikit-learn's digits (the stand-in for the paper's MNIST; the paper's Table 2 is on
OrganCMNIST, which cannot be downloaded here), 50 IID clients, the paper's lr 0.01 and
batch 128 (a client holds about 25 images: one batch an epoch), 20 rounds of two local
epochs (``benchmarks/params/robustness-digits.yaml`` otherwise), the logistic model:

- ``table2``: no attack: median, trimmed mean, Krum, Zeno, EMA and FedAvg (Table 2);
- ``figures``: the attacker share swept over 0.1 to 0.4 under Gaussian noise and sign
  flipping (the paper's Figures 1-2 name no attack), the same rules told the true number
  of attackers;
- ``pretest``: the Pre-Testing rate exactly as written: 50 clients, every coordinate of
  the small CNN, one-epoch updates at the initial model, Shapiro-Wilk and
  Anderson-Darling at α = 0.05, per seed.

Cells run through :func:`benchmarks.robustness.matrix.run_cell` and append to
``benchmarks/results/ema-paper-cells.jsonl``; the summary (mean ± 95 % t-interval over
seeds) goes to ``ema-paper.{json,md}``.

    python -m benchmarks.papers.ema_paper [--seeds 5] [--experiments table2 figures pretest]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import yaml

from benchmarks.common import write_summary
from benchmarks.robustness.matrix import PARAMS, REPO, RESULTS, finished, run_matrix
from fedsieve.arguments import positive_int

CLIENTS = 50
RULES = ["median", "trimmed_mean", "krum", "zeno", "ema", "fedavg"]
FRACTIONS = [0.1, 0.2, 0.3, 0.4]
ATTACKS = ["gaussian", "sign_flip"]


def base_params() -> dict[str, Any]:
    base = yaml.safe_load((PARAMS / "robustness-digits.yaml").read_text())
    base["partition"].update(num_clients=CLIENTS, min_samples=8, root_size=40)
    base["train"].update(lr=0.01, batch_size=128)
    return base


def method(rule: str, attackers: int) -> dict[str, Any]:
    aggregate: dict[str, Any] = {"name": rule}
    if rule in ("trimmed_mean", "krum"):
        aggregate["f"] = max(attackers, 1)  # the rules' f must be >= 1 without an attack
    elif rule == "zeno":
        aggregate["b"] = attackers
    return {"aggregate": aggregate}


def cells_for(experiment: str, seeds: int) -> list[Any]:
    from config.params import Params
    from tasks.grid import grid_cells

    scenarios = (
        [("none", 0.0)] if experiment == "table2" else [(a, f) for f in FRACTIONS for a in ATTACKS]
    )
    cells = []
    for attack, fraction in scenarios:
        attackers = round(fraction * CLIENTS)
        grid = {
            "methods": {f"{experiment}.{r}": method(r, attackers) for r in RULES},
            "attacks": [{"name": attack}],
            "fractions": [fraction] if attack != "none" else [0.2],
            "seeds": list(range(seeds)),
        }
        cells += grid_cells(Params.model_validate({**base_params(), "compare": grid}), REPO)
    return cells


def pretest(seeds: int) -> list[dict[str, Any]]:
    """The Pre-Testing rate as the paper runs it, one row per seed."""
    from config.params import Params
    from federated.data import load_digits
    from tasks.partition import split_partition
    from tasks.stats import collect_client_updates, test_normality
    from tasks.training import build_federation

    data = load_digits()
    rows = []
    for seed in range(seeds):
        config = base_params() | {"seed": seed, "model": {"name": "small_cnn"}}
        config["partition"]["root_size"] = 0
        params = Params.model_validate(config)
        parts = split_partition(data.train.targets, "iid", CLIENTS, seed, {}, 0).clients
        federation = build_federation.fn(params, data, parts)
        updates = collect_client_updates.fn(federation, federation.initial_state(), "delta")
        result = test_normality.fn(federation.model, updates, alpha=0.05, max_tests=None, seed=seed)
        rows.append({"seed": seed, "n_tests": result.n_tests, "shapiro_rate": result.shapiro_rate,
                     "anderson_rate": result.anderson_rate})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def summarise(pretest_rows: list[dict[str, Any]] | None) -> None:
    from tasks.comparison import shown_over_seeds as shown

    stem = RESULTS / "ema-paper"
    previous = (
        json.loads(stem.with_suffix(".json").read_text())
        if stem.with_suffix(".json").exists()
        else {}
    )
    pretest_rows = pretest_rows or previous.get("pretest", [])

    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for record in finished(RESULTS / "ema-paper-cells.jsonl").values():
        if "error" not in record:
            key = (record["method"], record["attack"], record["fraction"])
            groups.setdefault(key, []).append(record)
    rows, lines = (
        [],
        [
            "| experiment | rule | attack | attackers | seeds | test ACC | test AUC |",
            "|---|---|---|---|---|---|---|",
        ],
    )
    for (name, attack, fraction), records in sorted(groups.items()):
        experiment, _, rule = name.partition(".")
        acc = [r["metrics"]["test_acc"] for r in records]
        auc = [r["metrics"]["test_auc"] for r in records]
        rows.append({"experiment": experiment, "rule": rule, "attack": attack,
                     "fraction": fraction, "acc": acc, "auc": auc})  # fmt: skip
        lines.append(f"| {experiment} | {rule} | {attack} | {fraction:g} | {len(records)} "
                     f"| {shown(acc)} | {shown(auc)} |")  # fmt: skip
    if pretest_rows:
        lines += [
            "", "| Pre-Testing (50 clients, every coordinate, one-epoch updates) | seeds "
            "| coordinates tested | Shapiro-Wilk normal | Anderson-Darling normal |",
            "|---|---|---|---|---|",
            f"| small CNN on digits | {len(pretest_rows)} | {pretest_rows[0]['n_tests']} "
            f"| {shown([r['shapiro_rate'] for r in pretest_rows])} "
            f"| {shown([r['anderson_rate'] for r in pretest_rows])} |",
        ]  # fmt: skip
    payload = {
        "command": "python -m benchmarks.papers.ema_paper",
        "rows": rows,
        "pretest": pretest_rows,
    }
    write_summary(stem, payload, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=5)
    parser.add_argument("--experiments", nargs="+", default=["table2", "figures", "pretest"],
                        choices=["table2", "figures", "pretest"])  # fmt: skip
    parser.add_argument("--workers", type=positive_int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    cells = [c for e in args.experiments if e != "pretest" for c in cells_for(e, args.seeds)]
    if cells:
        run_matrix(cells, RESULTS / "ema-paper-cells.jsonl", args.workers)
    summarise(pretest(args.seeds) if "pretest" in args.experiments else None)


if __name__ == "__main__":
    main()
