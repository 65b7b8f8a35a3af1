"""Server optimizers: Algorithm 2 of Reddi et al. 2021 and Hsu et al.'s FedAvgM written
out coordinate by coordinate as references; Flower's own FedAdam, FedYogi, FedAdagrad
and FedAvgM (run in ``.venv-flower``) as the oracle of the ``flower_*`` variants."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from aggregation import build_server_optimizer, list_server_optimizers
from registry import RegistryError
from tests.limits import limit

FLOWER_PYTHON = Path(__file__).resolve().parents[2] / ".venv-flower" / "bin" / "python"
STEPS_SCRIPT = Path(__file__).with_name("flower_server_steps.py")

START = [0.5, -1.0, 2.0, 0.0]
AGGREGATES = [  # five rounds of a rule's aggregate: signs flip, one coordinate stays 0
    [0.1, -0.2, 0.3, 0.0],
    [-0.05, -0.1, 0.25, 0.0],
    [0.2, 0.05, -0.4, 0.0],
    [0.0, -0.3, 0.1, 0.0],
    [0.15, 0.2, 0.0, 0.0],
]


def run_optimizer(name: str, **params: float) -> list[list[float]]:
    """The global weights after each of :data:`AGGREGATES` through our optimizer."""
    optimizer = build_server_optimizer(name, **params)
    weights = torch.tensor(START, dtype=torch.float64)
    trajectory = []
    for aggregate in AGGREGATES:
        weights = optimizer.step(weights, torch.tensor(aggregate, dtype=torch.float64))
        trajectory.append(weights.tolist())
    return trajectory


def algorithm_2(
    rule: str, *, lr: float, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3
) -> list[list[float]]:
    """Reddi et al. 2021, Algorithm 2, one coordinate at a time: m_{-1} = 0,
    v_{-1} = τ², m_t = β₁m + (1-β₁)Δ, v_t by ``rule``, x += η m_t / (√v_t + τ)."""
    x, m, v = list(START), [0.0] * len(START), [tau**2] * len(START)
    trajectory = []
    for aggregate in AGGREGATES:
        for i, delta in enumerate(aggregate):
            m[i] = beta1 * m[i] + (1 - beta1) * delta
            if rule == "adagrad":
                v[i] = v[i] + delta**2
            elif rule == "yogi":
                v[i] = v[i] - (1 - beta2) * delta**2 * sign(v[i] - delta**2)
            else:
                v[i] = beta2 * v[i] + (1 - beta2) * delta**2
            x[i] = x[i] + lr * m[i] / (math.sqrt(v[i]) + tau)
        trajectory.append(list(x))
    return trajectory


def sign(value: float) -> float:
    return (value > 0) - (value < 0)


def fedavgm(*, lr: float, momentum: float) -> list[list[float]]:
    """Hsu et al. 2019: v ← βv + Δw (Δw = the round's move), w ← w + lr·v."""
    x, velocity = list(START), [0.0] * len(START)
    trajectory = []
    for aggregate in AGGREGATES:
        velocity = [momentum * u + d for u, d in zip(velocity, aggregate, strict=True)]
        x = [w + lr * u for w, u in zip(x, velocity, strict=True)]
        trajectory.append(list(x))
    return trajectory


def flower(strategy: str, **params: float) -> list[list[float]]:
    """The same aggregates through Flower's own strategy, in Flower's environment."""
    spec = {"strategy": strategy, "params": params, "start": START, "aggregates": AGGREGATES}
    done = subprocess.run(
        [str(FLOWER_PYTHON), str(STEPS_SCRIPT)], input=json.dumps(spec), capture_output=True,
        text=True, timeout=limit(120), check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.parametrize(("rule", "lr"), [("adam", 0.1), ("yogi", 0.01), ("adagrad", 0.1)])
def test_the_paper_variants_follow_algorithm_2_with_its_defaults(rule: str, lr: float) -> None:
    ours = run_optimizer(rule)  # defaults: β₁ 0.9, β₂ 0.99, τ 1e-3, lr as documented

    np.testing.assert_allclose(ours, algorithm_2(rule, lr=lr), rtol=1e-12, atol=1e-12)


def test_the_paper_variants_take_their_hyperparameters() -> None:
    ours = run_optimizer("adam", lr=0.03, beta1=0.5, beta2=0.9, tau=1e-2)

    reference = algorithm_2("adam", lr=0.03, beta1=0.5, beta2=0.9, tau=1e-2)
    np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=1e-12)


def test_sgd_at_lr_one_is_fedavg_and_momentum_is_fedavgm() -> None:
    sgd = run_optimizer("sgd")
    momentum = run_optimizer("momentum", lr=0.5, momentum=0.9)

    plain = [list(START)]
    for aggregate in AGGREGATES:
        plain.append([w + d for w, d in zip(plain[-1], aggregate, strict=True)])
    np.testing.assert_allclose(sgd, plain[1:], rtol=0, atol=1e-15)
    np.testing.assert_allclose(momentum, fedavgm(lr=0.5, momentum=0.9), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("ours", "strategy", "params"),
    [
        ("flower_adam", "FedAdam", {}),
        ("flower_yogi", "FedYogi", {}),
        ("flower_adagrad", "FedAdagrad", {}),
        ("momentum", "FedAvgM", {"server_momentum": 0.9}),
        ("sgd", "FedAvgM", {"server_learning_rate": 0.7}),
    ],
)
def test_flowers_strategies_give_the_same_weights(
    ours: str, strategy: str, params: dict[str, float]
) -> None:
    """Flower's hyperparameters: its defaults, and FedAvgM's named ones as ours."""
    ours_params = {
        "server_momentum": {"momentum": 0.9},
        "server_learning_rate": {"lr": 0.7},
    }.get(next(iter(params), ""), {})

    reference = flower(strategy, **params)

    np.testing.assert_allclose(
        run_optimizer(ours, **ours_params), reference, rtol=1e-12, atol=1e-12
    )


def test_the_paper_and_flower_differ_where_flower_departs() -> None:
    paper, flowers = run_optimizer("adam"), run_optimizer("flower_adam")

    # bias correction and v_{-1} = 0: the first step differs by more than rounding
    assert not np.allclose(paper[0], flowers[0], rtol=1e-3)


def test_a_resumed_optimizer_continues_exactly() -> None:
    weights = torch.tensor(START, dtype=torch.float64)
    through = build_server_optimizer("yogi")
    for aggregate in AGGREGATES[:2]:
        weights = through.step(weights, torch.tensor(aggregate, dtype=torch.float64))
    saved = through.state_dict()
    expected = through.step(weights, torch.tensor(AGGREGATES[2], dtype=torch.float64))

    resumed = build_server_optimizer("yogi")
    resumed.load_state_dict(saved)
    after = resumed.step(weights, torch.tensor(AGGREGATES[2], dtype=torch.float64))

    assert saved["step"] == 2 and set(saved) == {"step", "m", "v"}
    assert torch.equal(after, expected)
    assert through.state_dict()["step"] == 3 and saved["step"] == 2  # saved dict unchanged


@pytest.mark.parametrize(
    ("name", "params", "says"),
    [
        (
            "adam",
            {"beta1": 1.0},
            "server optimizer 'adam': beta1 must be a number in [0, 1), got 1.0",
        ),
        ("momentum", {"momentum": -0.1}, "momentum must be a number in [0, 1)"),
        ("sgd", {"lr": 0.0}, "lr must be a finite number > 0"),
        ("yogi", {"eps": 1e-3}, "has no parameter eps; accepted: lr, beta1, beta2, tau"),
        ("flower_adagrad", {"beta1": 0.5}, "has no parameter beta1; accepted: lr, tau"),
        ("nadam", {}, "unknown server optimizer 'nadam'; available: adagrad, adam"),
    ],
)
def test_bad_parameters_are_refused_in_one_line(name: str, params: dict, says: str) -> None:
    with pytest.raises(RegistryError) as error:
        build_server_optimizer(name, **params)

    assert says in str(error.value) and "\n" not in str(error.value)


def test_every_optimizer_keeps_dtype_device_and_its_state_in_the_open() -> None:
    for name in list_server_optimizers():
        optimizer = build_server_optimizer(name)
        weights = torch.zeros(3, dtype=torch.float32)

        out = optimizer.step(weights, torch.ones(3, dtype=torch.float32))

        assert out.dtype == torch.float32 and out.shape == (3,)
        assert bool((out > 0).all()), name  # a step goes the aggregate's way
        assert optimizer.state_dict()["step"] == 1
