"""Benchmark: what portable numerics cost in speed (not a test).

    python -m benchmarks.speed.portable_numerics [--rounds 5] [--repeats 5]

The default pipeline's training (params.yaml: BreastMNIST, 10 clients, small CNN, two
local epochs, FedAvg, every round scored), ``--rounds`` rounds after one warm-up round,
through the engine's round loop, with the pin (``config.environment.PORTABLE_NUMERICS``)
and without it (``FEDSIEVE_PORTABLE_NUMERICS=0``, the pinned variables removed). The
libraries read those variables once, when torch loads: every measurement is a fresh
process, pinned and unpinned alternating ``--repeats`` times so that a busy machine slows
both alike. Reported per setting: seconds per round (median and best over the processes'
rounds), ATen's capability, torch's threads, and the sha256 of the trained weights (equal
across the repeats of a setting: each is deterministic on one machine).

Writes ``benchmarks/results/portable-numerics.json`` with the machine, versions and the
command.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
REPO = Path(__file__).resolve().parents[2]


def child(rounds: int) -> dict[str, Any]:
    """One measurement, in this process: the environment configured the CLI's way first."""
    from config.environment import configure_environment

    configure_environment()  # before torch is imported: the pin, or (switched off) none

    import torch

    from config.params import load_params
    from federated.data import load_medmnist
    from federated.loop import train
    from tasks.data import data_root
    from tasks.partition import split_partition
    from tasks.training import federation_from_params

    params = load_params(REPO / "params.yaml")
    data = load_medmnist(params.data.dataset, data_root(params.data.root, REPO), params.data.size)
    scheme = params.partition
    split = split_partition(
        data.train.targets, scheme.scheme, scheme.num_clients, params.seed,
        scheme.partitioner_params(), scheme.root_size, scheme.local_test,
    )  # fmt: skip
    federation = federation_from_params(params, data, split.clients, split.root, split.local_tests)
    state = train(federation, federation.initial_state(), 1)  # warm-up round
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        state = train(federation, state, state.round + 1)
        seconds.append(time.perf_counter() - start)
    weights = federation.global_model(state).state_dict()
    digest = hashlib.sha256(
        b"".join(w.detach().cpu().contiguous().numpy().tobytes() for w in weights.values())
    ).hexdigest()
    return {
        "seconds_per_round": seconds,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "weights_sha256": digest,
        "test_acc": state.history[-1]["test_acc"],
    }


def measure(pinned: bool, rounds: int) -> dict[str, Any]:
    from config.environment import PORTABLE_NUMERICS, PORTABLE_NUMERICS_SWITCH

    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_NUMERICS}
    env[PORTABLE_NUMERICS_SWITCH] = "1" if pinned else "0"
    command = [sys.executable, "-m", "benchmarks.speed.portable_numerics", "--child"]
    result = subprocess.run(
        [*command, "--rounds", str(rounds)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [s for run in runs for s in run["seconds_per_round"]]
    return {
        "seconds_per_round_median": statistics.median(seconds),
        "seconds_per_round_best": min(seconds),
        "rounds_timed": len(seconds),
        "capability": runs[0]["capability"],
        "threads": runs[0]["threads"],
        "weights_sha256": sorted({run["weights_sha256"] for run in runs}),
        "test_acc": runs[0]["test_acc"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per process")
    parser.add_argument("--repeats", type=int, default=5, help="processes per setting")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.rounds)))
        return

    from benchmarks.common import cpu_environment, cpu_model
    from config.environment import PORTABLE_NUMERICS

    os.environ.setdefault("MEDMNIST_ROOT", str(REPO.parent / "shared" / "data" / "medmnist"))
    runs: dict[str, list[dict[str, Any]]] = {"pinned": [], "unpinned": []}
    for _ in range(args.repeats):
        for setting in runs:
            runs[setting].append(measure(setting == "pinned", args.rounds))
    results = {setting: summary(found) for setting, found in runs.items()}
    pinned, unpinned = results["pinned"], results["unpinned"]
    payload = {
        "benchmark": "portable_numerics",
        "command": "python -m benchmarks.speed.portable_numerics "
        f"--rounds {args.rounds} --repeats {args.repeats}",
        "workload": "params.yaml's training: BreastMNIST, 10 IID clients, small_cnn, "
        "2 local epochs, FedAvg; seconds per round after a warm-up round",
        "pin": PORTABLE_NUMERICS,
        "cpu": cpu_model(),
        **cpu_environment(),
        "results": results,
        "slowdown_median": pinned["seconds_per_round_median"]
        / unpinned["seconds_per_round_median"],
        "slowdown_best": pinned["seconds_per_round_best"] / unpinned["seconds_per_round_best"],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "portable-numerics.json").write_text(json.dumps(payload, indent=2) + "\n")
    for setting, result in results.items():
        print(
            f"{setting:>8}: {result['seconds_per_round_median']:.2f} s/round median, "
            f"{result['seconds_per_round_best']:.2f} best ({result['capability']}, "
            f"{result['threads']} threads, test acc {result['test_acc']:.4f})"
        )
    print(
        f"slowdown: {payload['slowdown_median']:.2f}x median, {payload['slowdown_best']:.2f}x best"
    )


if __name__ == "__main__":
    main()
