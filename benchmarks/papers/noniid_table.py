"""Evidence for the EMA statistics stages: CV non-IID verdicts and Pre-Testing rates on
real MedMNIST partitions (README table).

For BreastMNIST and RetinaMNIST, partitioned IID and Dirichlet alpha in {1, 0.5, 0.1}
across 10 and 50 clients: the CV of the clients' losses after a few FedAvg rounds with its
verdict at the paper's threshold (0.25), and the Shapiro-Wilk / Anderson-Darling rates of
the clients' gradients at the initial model. Runs the engine directly (no Prefect) and
logs the table to MLflow as an artifact of one run.

    python -m benchmarks.papers.noniid_table [--rounds 3] [--max-tests 20000]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from config.params import load_params
from federated.data import load_medmnist
from federated.loop import train
from federated.partition import PartitionError, build_partitioner
from federated.stats import noniid_verdict
from federated.stats.noniid import client_losses
from tasks.data import data_root
from tasks.stats import collect_client_updates, test_normality
from tasks.tracking import Tracker
from tasks.training import build_federation

RESULTS = Path(__file__).parents[1] / "results"
REPO = Path(__file__).resolve().parents[2]


def measure(
    dataset: str, scheme: str, alpha: float | None, clients: int, rounds: int, max_tests: int
) -> dict:
    overrides = [
        f"data.dataset={dataset}",
        f"partition.scheme={scheme}",
        f"partition.num_clients={clients}",
        "partition.min_samples=2",
        f"train.rounds={rounds}",
        "train.local_epochs=1",
        "train.device=cpu",
        "noniid.every=0",
    ]
    if alpha is not None:
        overrides.append(f"partition.alpha={alpha}")
    params = load_params(REPO / "params.yaml", overrides)
    data = load_medmnist(dataset, data_root(params.data.root, REPO))
    row = {
        "dataset": dataset,
        "partition": scheme if alpha is None else f"dirichlet a={alpha:g}",
        "clients": clients,
    }
    try:
        parts = build_partitioner(scheme, **params.partition.partitioner_params())(
            data.train.targets, clients, seed=params.seed
        )
    except PartitionError as error:
        return row | {"refused": str(error)}
    federation = build_federation.fn(params, data, parts)
    state = federation.initial_state()
    pretest = test_normality.fn(
        federation.model,
        collect_client_updates.fn(federation, state, "gradient"),
        alpha=0.05,
        max_tests=max_tests,
        seed=0,
    )
    state = train(federation, state, rounds)
    model = federation.global_model(state)
    losses = client_losses(model, [(c.images, c.targets) for c in federation.clients], loss="mse")
    verdict = noniid_verdict(losses, threshold=0.25)
    return row | {
        "cv": verdict.cv,
        "verdict": verdict.verdict,
        "shapiro_rate": pretest.shapiro_rate,
        "anderson_rate": pretest.anderson_rate,
        "n_tests": pretest.n_tests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tests", type=int, default=20_000)
    args = parser.parse_args()
    torch.set_num_threads(2)
    started = time.perf_counter()
    rows = []
    for dataset in ("breastmnist", "retinamnist"):
        for scheme, alpha in (
            ("iid", None),
            ("dirichlet", 1.0),
            ("dirichlet", 0.5),
            ("dirichlet", 0.1),
        ):
            for clients in (10, 50):
                row = measure(dataset, scheme, alpha, clients, args.rounds, args.max_tests)
                print(json.dumps(row), flush=True)
                rows.append(row)
    lines = [
        f"| dataset | partition | clients | CV after {args.rounds} rounds | verdict (CV > 0.25) | Shapiro-Wilk normal | Anderson-Darling normal |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "refused" in r:
            lines.append(
                f"| {r['dataset']} | {r['partition']} | {r['clients']} | refused: partition leaves a client < 2 samples | | | |"
            )
        else:
            lines.append(
                f"| {r['dataset']} | {r['partition']} | {r['clients']} | {r['cv']:.3f} | {r['verdict']} | "
                f"{100 * r['shapiro_rate']:.1f}% | {100 * r['anderson_rate']:.1f}% |"
            )
    table = "\n".join(lines) + "\n"
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "noniid-table.md").write_text(table)
    payload = {
        "command": "python -m benchmarks.papers.noniid_table",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": "cpu",
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "seconds": round(time.perf_counter() - started, 1),
        "rounds": args.rounds,
        "max_tests": args.max_tests,
        "rows": rows,
    }
    (RESULTS / "noniid-table.json").write_text(json.dumps(payload, indent=2) + "\n")
    tracker = Tracker("fedsieve-evidence")
    tracker.start(run_id=None, run_name="noniid-pretest-table", tags={"kind": "evidence"})
    tracker.log_artifact(RESULTS / "noniid-table.md", "evidence")
    tracker.log_artifact(RESULTS / "noniid-table.json", "evidence")
    tracker.end()


if __name__ == "__main__":
    main()
