"""What each federated method costs a round beside FedAvg (issue 79: at most 1.15×), on
the batched engine, in one run: FedProx, SCAFFOLD, FedNova, AFL, the server optimizers
(FedAvgM, FedAdam, FedYogi, FedAdagrad) and FedLag, each a federation of its own on the
same data, clients, model and seed.

The rounds are interleaved: round t of every method runs before round t + 1 of any, so a
busy spell slows the methods' round t alike; each method's ratio is the median over the
timed rounds of its round over FedAvg's same round (paired), by wall time and, on a CPU,
by the process's CPU time (torch on one thread: the work done, which other processes on
a shared machine move less). A warm-up round of every method is run first and not timed. What each method adds: FedProx a proximal term in every
local step, SCAFFOLD a correction in every local step and its variates' bookkeeping,
FedNova its normalised weights, AFL every sampled client's loss of the global model (a
pass over its data) and the λ step, the server optimizers an update of their moments,
FedLag its Gaussian fit per coordinate.

    nice -n 10 python -m benchmarks.speed.method_cost [--rounds 5] [--device cpu|cuda]

Record: ``benchmarks/results/method-cost-<device>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmarks.common import cpu_environment, write_summary
from fedsieve.arguments import positive_int

REPO = Path(__file__).resolve().parents[2]
BOUND = 1.15  # issue 79: each method costs at most this many FedAvg rounds
# name -> the params that make it (beside params.yaml's training, batched)
METHODS: dict[str, dict[str, Any]] = {
    "FedAvg": {},
    "FedProx": {"train": {"prox_mu": 0.01}},
    "SCAFFOLD": {"train": {"scaffold": True, "momentum": 0.0}},
    "FedNova": {"aggregate": {"name": "fednova"}},
    "AFL": {"aggregate": {"name": "afl"}},
    "FedAvgM": {"train": {"server_optimizer": {"name": "momentum", "lr": 1.0}}},
    "FedAdam": {"train": {"server_optimizer": {"name": "adam", "lr": 0.01}}},
    "FedYogi": {"train": {"server_optimizer": {"name": "yogi", "lr": 0.01}}},
    "FedAdagrad": {"train": {"server_optimizer": {"name": "adagrad", "lr": 0.01}}},
    "FedLag": {"aggregate": {"name": "fedlag"}},
}


def params_for(method: str, rounds: int, device: str) -> Any:
    """params.yaml's training (BreastMNIST, ten IID clients, the small CNN, two local
    epochs), batched, scored for accuracy only, with the method's settings."""
    from config.params import Params

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for key in ("compare", "federation", "tracking", "pretest"):
        raw.pop(key, None)
    raw["train"] |= {"rounds": rounds + 1, "device": device, "backend": "batched"}
    raw["noniid"] = {"every": 0, "final": False}
    raw["eval"] |= {"round_scores": "accuracy"}
    for section, values in METHODS[method].items():
        raw[section] = raw.get(section, {}) | values
    return Params.model_validate(raw)


def federations(rounds: int, device: str, data: Any) -> dict[str, Any]:
    """Each method's federation on the same partition."""
    from tasks.partition import split_partition
    from tasks.training import federation_from_params

    built = {}
    for method in METHODS:
        params = params_for(method, rounds, device)
        scheme = params.partition
        split = split_partition(data.train.targets, scheme.scheme, scheme.num_clients,
                                params.seed, scheme.partitioner_params(), 0, scheme.local_test)  # fmt: skip
        built[method] = federation_from_params(
            params, data, split.clients, None, split.local_tests, validation_every_round=False
        )
        assert built[method].batched, f"{method} is not on the batched engine"
    return built


def timed(federation: Any, state: Any, device: str) -> tuple[Any, float, float]:
    """One round of ``federation`` from ``state``; the new state, its wall time and the
    process's CPU time."""
    if device == "cuda":
        torch.cuda.synchronize()
    started, cpu = time.perf_counter(), time.process_time()
    state, _ = federation.run_round(state)
    if device == "cuda":
        torch.cuda.synchronize()
    return state, time.perf_counter() - started, time.process_time() - cpu


def paired(times: list[float], fedavg: list[float]) -> float:
    """The median of a method's rounds over FedAvg's same rounds."""
    return statistics.median(t / f for t, f in zip(times, fedavg, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed rounds")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    from config.environment import configure_environment
    from federated.data import load_medmnist
    from tasks.data import data_root

    configure_environment()
    if args.device == "cpu":
        torch.set_num_threads(1)
    probe = params_for("FedAvg", args.rounds, args.device)
    data = load_medmnist(probe.data.dataset, data_root(probe.data.root, REPO))
    built = federations(args.rounds, args.device, data)
    states = {method: fed.initial_state() for method, fed in built.items()}
    seconds: dict[str, list[float]] = {method: [] for method in built}
    cpu_seconds: dict[str, list[float]] = {method: [] for method in built}
    for round_number in range(args.rounds + 1):  # round 0 of the loop: the warm-up
        for method, federation in built.items():
            states[method], wall, cpu = timed(federation, states[method], args.device)
            if round_number:
                seconds[method].append(wall)
                cpu_seconds[method].append(cpu)
    summary = {
        method: {
            "round_s": statistics.median(times),
            "over_fedavg": paired(times, seconds["FedAvg"]),
            "round_cpu_s": statistics.median(cpu_seconds[method]),
            "cpu_over_fedavg": paired(cpu_seconds[method], cpu_seconds["FedAvg"]),
            "test_acc": states[method].history[-1]["test_acc"],
        }
        for method, times in seconds.items()
    }
    clients = len(built["FedAvg"].clients)
    setup = (
        f"BreastMNIST, {clients} IID clients, small CNN, params.yaml's training "
        f"({probe.train.local_epochs} local epochs, batch {probe.train.batch_size}), batched "
        f"engine, {args.device}" + (", torch 1 thread" if args.device == "cpu" else "")
    )
    payload = {
        "command": "nice -n 10 python -m benchmarks.speed.method_cost "
        f"--rounds {args.rounds} --device {args.device}",
        "setup": setup, "bound": BOUND, "rounds": args.rounds, "methods": METHODS,
        "seconds": seconds, "cpu_seconds": cpu_seconds, "summary": summary,
        **(cpu_environment() if args.device == "cpu" else _cuda_environment()),
    }  # fmt: skip
    lines = [f"{setup}; {args.rounds} timed rounds, interleaved"] + [
        f"{method}: {row['round_s']:.3f} s a round, {row['over_fedavg']:.3f}× FedAvg's "
        f"(CPU time {row['cpu_over_fedavg']:.3f}×)"
        for method, row in summary.items()
    ]
    write_summary(REPO / "benchmarks" / "results" / f"method-cost-{args.device}", payload, lines)


def _cuda_environment() -> dict[str, Any]:
    from benchmarks.common import versions

    return {
        "device": {"kind": "cuda", "name": torch.cuda.get_device_name()},
        "versions": versions(),
    }


if __name__ == "__main__":
    main()
