"""What validation at the sites costs a round: three BreastMNIST sites (the small CNN,
params.yaml's training), each round timed with the filter ``site_validation`` in front of
the median and without it, on the same seeds, in one process (the sites simulated: the
same code a real site runs for the validation, :func:`federated.execution.held_out_losses`).

Per round it records the round's wall time and, with the filter, the time spent scoring
the candidates (its ratio to the rest of the same round is the figure to read: the two
configurations' medians are runs apart, and a shared machine's load moves them) (``m + 1`` candidate models on every judged site's held-out split, timed
around the sites' validator). At real sites the validation adds one exchange a round,
whose message carries ``m + 1`` models to each judged site (the bytes are recorded); the
Flower exchange's own floor is measured in ``benchmarks/speed/flower_race.py`` and the
loopback records.

    nice -n 10 python -m benchmarks.speed.site_validation_cost [--seeds 2] [--rounds 3]

Record: ``benchmarks/results/site-validation-cost-cpu.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor

from benchmarks.common import cpu_environment, write_summary
from fedsieve.arguments import positive_int

REPO = Path(__file__).resolve().parents[2]
STEM = REPO / "benchmarks" / "results" / "site-validation-cost-cpu"
SITES = 3


class TimedValidator:
    """The sites' validator, its calls timed (seconds, summed per round by the caller)."""

    def __init__(self, validator: Any) -> None:
        self.validator, self.seconds, self.models = validator, 0.0, 0

    def validate(self, candidates: Tensor, client_ids: Sequence[int]) -> Any:
        started = time.perf_counter()
        answers = self.validator.validate(candidates, client_ids)
        self.seconds += time.perf_counter() - started
        self.models += len(candidates)
        return answers


def params_for(seed: int, rounds: int, validated: bool) -> Any:
    from config.params import Params

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for key in ("compare", "federation", "tracking", "pretest"):
        raw.pop(key, None)
    raw |= {"seed": seed, "aggregate": {"name": "median"},
            "filters": [{"name": "site_validation"}] if validated else []}  # fmt: skip
    raw["partition"] |= {"num_clients": SITES}
    raw["train"] |= {"rounds": rounds, "device": "cpu", "backend": "sequential"}
    raw["noniid"] = {"every": 0, "final": False}
    raw["eval"] |= {"round_scores": "accuracy"}
    return Params.model_validate(raw)


def timed_rounds(seed: int, rounds: int, validated: bool, data: Any) -> list[dict[str, float]]:
    """Each round's wall time (and, validated, the validation's share and size)."""
    from federated.vectors import model_to_vector
    from tasks.partition import split_partition
    from tasks.training import federation_from_params

    params = params_for(seed, rounds, validated)
    scheme = params.partition
    split = split_partition(data.train.targets, scheme.scheme, scheme.num_clients, seed,
                            scheme.partitioner_params(), 0, scheme.local_test)  # fmt: skip
    federation = federation_from_params(
        params, data, split.clients, None, split.local_tests, validation_every_round=False
    )
    timer = None
    if validated:
        timer = TimedValidator(federation.round_defence.validator)
        federation.round_defence = dataclasses.replace(federation.round_defence, validator=timer)
    parameters = model_to_vector(federation.model).numel()
    state, out = federation.initial_state(), []
    for _ in range(rounds):
        before = (timer.seconds, timer.models) if timer else (0.0, 0)
        started = time.perf_counter()
        state, _ = federation.run_round(state)
        row = {"round": state.round, "seconds": time.perf_counter() - started}
        if timer is not None:
            row |= {"validation_seconds": timer.seconds - before[0],
                    "candidate_models": timer.models - before[1],
                    "message_bytes_per_site": 4 * parameters * (timer.models - before[1])}  # fmt: skip
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=positive_int, default=2)
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args(argv)
    from config.environment import configure_environment
    from federated.data import load_medmnist
    from tasks.data import data_root

    configure_environment()
    torch.set_num_threads(1)
    data = load_medmnist("breastmnist", data_root(params_for(0, 1, False).data.root, REPO))
    runs = []
    for seed in range(args.seeds):  # alternating, so a busy spell hits both alike
        for validated in (False, True):
            runs.append({"seed": seed, "validated": validated,
                         "rounds": timed_rounds(seed, args.rounds, validated, data)})  # fmt: skip
    without = [r["seconds"] for run in runs if not run["validated"] for r in run["rounds"]]
    with_ = [r for run in runs if run["validated"] for r in run["rounds"]]
    summary = {
        "round_without_s": statistics.median(without),
        "round_with_s": statistics.median(r["seconds"] for r in with_),
        "validation_s": statistics.median(r["validation_seconds"] for r in with_),
        # within each round: the validation against the rest of that round (paired, so a
        # busy spell that slows the whole round does not change it much)
        "validation_over_rest": statistics.median(
            r["validation_seconds"] / (r["seconds"] - r["validation_seconds"]) for r in with_
        ),
        "candidate_models": statistics.median(r["candidate_models"] for r in with_),
        "message_bytes_per_site": statistics.median(r["message_bytes_per_site"] for r in with_),
    }
    payload = {
        "command": "nice -n 10 python -m benchmarks.speed.site_validation_cost "
        f"--seeds {args.seeds} --rounds {args.rounds}",
        "setup": f"{SITES} BreastMNIST sites, small CNN (params.yaml's training), median, "
        "torch 1 thread, sequential engine, clean",
        "seeds": args.seeds, "rounds": args.rounds, "runs": runs, "summary": summary,
        **cpu_environment(),
    }  # fmt: skip
    lines = [
        f"round without validation: {summary['round_without_s']:.3f} s (median)",
        f"round with validation: {summary['round_with_s']:.3f} s, of which validating "
        f"{summary['validation_s']:.3f} s ({summary['candidate_models']:.0f} candidate models)",
    ]
    write_summary(STEM, payload, lines)


if __name__ == "__main__":
    main()
