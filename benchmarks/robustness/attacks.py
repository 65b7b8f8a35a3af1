"""How much each model attack moves robust aggregates, and what a backdoor plants.

Two measurements on the engine alone (no Prefect, no MLflow), means with 95% confidence
intervals (Student's t) over seeds:

- ``damage``: ``‖rule(attacked round) − mean of the honest rows‖₂`` for every model attack
  against fedavg, median, trimmed mean (f = 4), Krum (f = 4), geometric median and centered
  clipping, on two kinds of round of ``n = 20`` clients of which the first 4 are malicious:
  ``synthetic`` (``1 + N(0, 1)`` per coordinate, ``d = 1000``) and ``breastmnist`` (the real
  first-round updates of 20 IID BreastMNIST clients, small CNN width 8, one local epoch).
  ``none`` is the unattacked round. Optimised attacks get the rule itself as ``aggregate``;
  every attack runs from a fresh state (mimic copies the first benign row, as while learning).
- ``backdoor``: 10 rounds of 5 IID BreastMNIST clients (client 0 backdoored: target 0,
  poison_fraction 0.5, 3x3 square), FedAvg and median, without and with model replacement
  (boost n/η = 5), against no attack: clean test accuracy and attack success rate, per round
  and at the end.

Writes ``benchmarks/results/attacks-cpu.json``. Run from the repository root:

    MEDMNIST_ROOT=../shared/data/medmnist OMP_NUM_THREADS=1 python -m benchmarks.robustness.attacks
    python -m benchmarks.robustness.attacks --seeds 5 --parts backdoor
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
from scipy import stats
from torch import Tensor

from aggregation import build_aggregator
from benchmarks.common import cpu_environment
from federated.attacks import Backdoor, ModelAttack, build_attack, client_seed
from federated.backdoor_eval import attack_success_rate, triggered_test_set
from federated.client import ClientData, LocalTraining, train_client
from federated.data import load_medmnist, to_tensors
from federated.loop import train
from federated.metrics import loss_function
from federated.partition import build_partitioner
from federated.seeding import SHUFFLE, derive_seed, seeded_init, torch_generator
from federated.server import (
    Defence,
    EvaluationSets,
    Federation,
    FederationConfig,
    RoundReport,
    ServerState,
    ThreatModel,
)
from federated.vectors import model_to_vector
from fedsieve.arguments import positive_int
from models import build_model

RESULTS = Path(__file__).parents[1] / "results"
RULES = {
    "fedavg": {},
    "median": {},
    "trimmed_mean": {"f": 4},
    "krum": {"f": 4},
    "geometric_median": {},
    "centered_clipping": {},
}
ATTACKS = ["none", "alie", "opt_alie", "ipm", "opt_ipm", "min_max", "min_sum", "mimic",
           "sign_flip"]  # fmt: skip
CLIENTS, MALICIOUS = 20, 4


def mean_ci(values: list[float]) -> dict[str, float]:
    """Mean and the half-width of its 95% Student-t confidence interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci95": math.nan, "n": len(values)}
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "ci95": float(half), "n": len(values)}


def small_cnn(seed: int) -> torch.nn.Module:
    return seeded_init(
        seed, lambda: build_model("small_cnn", in_channels=1, num_classes=2, width=8, hidden=32)
    )


def synthetic_round(seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 1.0 + torch.randn(CLIENTS, 1000, generator=generator, dtype=torch.float64)


def breastmnist_round(seed: int, root: Path) -> Tensor:
    """The first-round updates ``(20, d)`` of 20 IID BreastMNIST clients."""
    data = load_medmnist("breastmnist", root)
    images, targets = to_tensors(data.train, data.info)
    parts = build_partitioner("iid")(data.train.targets, CLIENTS, seed=seed)
    model = small_cnn(seed)
    start = model_to_vector(model)
    local = LocalTraining(lr=0.05, batch_size=16)
    deltas = [
        train_client(
            model, start, ClientData(i, images[p], targets[p]), local, loss_function(False),
            seed=derive_seed(seed, 1, i, SHUFFLE),
        ).delta
        for i, p in enumerate(parts)
    ]  # fmt: skip
    return torch.stack(deltas).double()


def damage(updates: Tensor, attack: str, rule_name: str, seed: int) -> float:
    mask = torch.zeros(CLIENTS, dtype=torch.bool)
    mask[:MALICIOUS] = True
    rule = build_aggregator(rule_name, **RULES[rule_name])
    attacked = updates
    if attack != "none":
        model_attack = build_attack(attack)
        assert isinstance(model_attack, ModelAttack)
        attacked = model_attack.apply(updates, mask, torch_generator(seed), aggregate=rule)
    return float(torch.linalg.vector_norm(rule(attacked) - updates[~mask].mean(dim=0)))


def damage_table(rounds: Callable[[int], Tensor], seeds: int) -> dict:
    samples: dict[str, dict[str, list[float]]] = {r: {a: [] for a in ATTACKS} for r in RULES}
    for seed in range(seeds):
        updates = rounds(seed)
        for rule_name in RULES:
            for attack in ATTACKS:
                samples[rule_name][attack].append(damage(updates, attack, rule_name, seed))
    return {r: {a: mean_ci(v) for a, v in row.items()} for r, row in samples.items()}


def backdoor_run(root: Path, seed: int, rule: str, attack: Backdoor | None) -> dict[str, list]:
    """Clean accuracy and ASR per round of one 10-round federation, 5 clients, client 0 bad
    (the ASR of an unattacked run uses the default trigger)."""
    data = load_medmnist("breastmnist", root)
    images, targets = to_tensors(data.train, data.info)
    test = to_tensors(data.test, data.info)
    clients = []
    for client_id, part in enumerate(build_partitioner("iid")(data.train.targets, 5, seed=seed)):
        x, y = images[part], targets[part]
        if attack is not None and client_id == 0:
            x, y = attack.poison(x, y, num_classes=2, seed=client_seed(seed, client_id))
        clients.append(ClientData(client_id, x, y))
    federation = Federation(
        model=small_cnn(seed),
        clients=clients,
        local=LocalTraining(lr=0.05, batch_size=16, epochs=2),
        config=FederationConfig(rounds=10, seed=seed),
        defence=Defence(rule=build_aggregator(rule)),
        evaluation=EvaluationSets(test=test),
        threat=ThreatModel(
            malicious=frozenset() if attack is None else frozenset({0}), model_attack=attack
        ),
    )
    triggered = triggered_test_set(*test, attack or Backdoor(target_label=0))
    accuracy, asr = [], []

    def on_round(report: RoundReport, state: ServerState) -> None:
        accuracy.append(report.metrics["test_acc"])
        asr.append(attack_success_rate(federation.global_model(state), triggered, 0))

    train(federation, federation.initial_state(), 10, on_round=on_round)
    return {"test_acc": accuracy, "asr": asr}


def backdoor_table(root: Path, seeds: int) -> dict:
    settings = {
        "none": None,
        "backdoor": Backdoor(target_label=0),
        "backdoor_replacement": Backdoor(target_label=0, model_replacement=True),
    }
    table: dict[str, dict] = {}
    for rule in ("fedavg", "median"):
        for name, attack in settings.items():
            runs = [backdoor_run(root, seed, rule, attack) for seed in range(seeds)]
            table[f"{rule}/{name}"] = {
                "final_test_acc": mean_ci([r["test_acc"][-1] for r in runs]),
                "final_asr": mean_ci([r["asr"][-1] for r in runs]),
                "asr_per_round": [
                    mean_ci(list(v)) for v in zip(*[r["asr"] for r in runs], strict=True)
                ],
                "runs": runs,
            }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=10)
    parser.add_argument("--parts", nargs="+", default=["damage", "backdoor"])
    parser.add_argument("--out", type=Path, default=RESULTS / "attacks-cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(
        os.environ.get(
            "MEDMNIST_ROOT", Path(__file__).resolve().parents[3] / "shared/data/medmnist"
        )
    )
    result: dict[str, object] = {
        "benchmark": "attacks",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "seeds": args.seeds,
        "command": f"python -m benchmarks.robustness.attacks --seeds {args.seeds} --parts {' '.join(args.parts)}",
        **cpu_environment(),
    }
    if "damage" in args.parts:
        result["damage"] = {
            "synthetic": damage_table(synthetic_round, args.seeds),
            "breastmnist": damage_table(lambda seed: breastmnist_round(seed, root), args.seeds),
        }
    if "backdoor" in args.parts:
        result["backdoor"] = backdoor_table(root, args.seeds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
