"""FedNova (Wang et al. 2020): the docstring example, ‖a_i‖₁ against the paper's closed
forms, equal work equal to FedAvg, and Eq. (6)-(7) written out as the reference."""

from __future__ import annotations

import pytest
import torch

from aggregation import build_aggregator
from aggregation.fednova import local_norm


def test_docstring_example() -> None:
    fednova = build_aggregator("fednova")

    same = fednova(torch.tensor([[2.0], [8.0]]), local_norms=torch.tensor([1.0, 4.0]))
    skewed = fednova(torch.tensor([[2.0], [4.0]]), local_norms=torch.tensor([1.0, 4.0]))

    assert same.tolist() == [5.0] and skewed.tolist() == [3.75]


@pytest.mark.parametrize("steps", [1, 2, 7, 40])
def test_local_norm_is_the_papers_closed_form(steps: int) -> None:
    rho, lr_mu = 0.9, 0.01

    plain = local_norm(steps)
    momentum = local_norm(steps, momentum=rho)
    proximal = local_norm(steps, lr_mu=lr_mu)

    assert plain == steps
    expected = (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)
    assert momentum == pytest.approx(expected, rel=1e-12)
    assert proximal == pytest.approx((1 - (1 - lr_mu) ** steps) / lr_mu, rel=1e-12)


def test_equal_local_work_is_fedavg() -> None:
    generator = torch.Generator().manual_seed(3)
    updates = torch.randn(6, 20, generator=generator, dtype=torch.float64)
    sizes = torch.tensor([5.0, 40.0, 12.0, 7.0, 30.0, 9.0], dtype=torch.float64)
    norms = torch.full((6,), local_norm(4, momentum=0.9), dtype=torch.float64)

    fednova = build_aggregator("fednova")(updates, sizes, local_norms=norms)

    torch.testing.assert_close(fednova, build_aggregator("fedavg")(updates, sizes), rtol=1e-14, atol=1e-14)  # fmt: skip


def test_unequal_work_follows_equations_6_and_7() -> None:
    generator = torch.Generator().manual_seed(4)
    updates = torch.randn(4, 9, generator=generator, dtype=torch.float64)
    sizes = [10.0, 20.0, 30.0, 40.0]
    steps = [2, 5, 9, 1]
    norms = [local_norm(t, momentum=0.9) for t in steps]
    p = [n / sum(sizes) for n in sizes]
    tau_eff = sum(pi * a for pi, a in zip(p, norms, strict=True))
    reference = sum(
        tau_eff * pi * updates[i] / a for i, (pi, a) in enumerate(zip(p, norms, strict=True))
    )

    out, _, diagnostics = build_aggregator("fednova").step(
        {}, updates, torch.tensor(sizes, dtype=torch.float64),
        local_norms=torch.tensor(norms, dtype=torch.float64),
    )  # fmt: skip

    torch.testing.assert_close(out, reference, rtol=1e-13, atol=1e-13)
    assert diagnostics["columns"]["local_norm"].tolist() == pytest.approx(norms)
    assert not torch.allclose(out, build_aggregator("fedavg")(updates, torch.tensor(sizes, dtype=torch.float64)))  # fmt: skip


def test_tiny_clients_beside_a_huge_one_get_their_sample_share_of_every_step() -> None:
    """Very uneven work, as Dirichlet α = 0.1 on BreastMNIST makes it (a client of 163
    images doing 22 steps beside clients of 4-12 doing 2): one client of 960 samples, 60
    steps, moving +0.05 a step; four of 10 samples, one step each, moving −1. Wang et al.'s
    FedNova (and NIID-Bench's: ``global − coeff · Σ n_i/n · (global − local_i)/a_i``,
    ``coeff = Σ a_i n_i/n``) takes τ_eff = Σ p_i τ_i = 57.64 steps of the sample-weighted
    per-step direction 0.96·0.05 − 0.04·1 = 0.008: 0.46112, where FedAvg follows the big
    client's 60 steps (2.84). So each tiny client's update weighs τ_eff·p_i = 0.5764, its
    one step stretched to 57.64 steps, and the weights sum to 3.23, not 1: where a tiny
    client's few steps are steep (the start of its local descent, one class only), FedNova
    carries that slope τ_eff steps. That is the paper's update, not a defect of this one."""
    sizes = torch.tensor([960.0, 10.0, 10.0, 10.0, 10.0], dtype=torch.float64)
    steps = [60, 1, 1, 1, 1]
    updates = torch.tensor([[3.0], [-1.0], [-1.0], [-1.0], [-1.0]], dtype=torch.float64)
    norms = torch.tensor([float(local_norm(t)) for t in steps], dtype=torch.float64)

    out, _, diagnostics = build_aggregator("fednova").step({}, updates, sizes, local_norms=norms)

    # NIID-Bench's form, from a global model at 0 (local_i = Δ_i): d_i = (0 − Δ_i)/a_i
    share = sizes / sizes.sum()
    coeff = float(share @ norms)
    niid_bench = 0.0 - coeff * sum(share[i] * (0.0 - updates[i]) / norms[i] for i in range(5))
    assert coeff == pytest.approx(57.64)
    torch.testing.assert_close(out, torch.tensor([0.46112], dtype=torch.float64))
    torch.testing.assert_close(out, niid_bench)
    assert diagnostics["effective_weight"].tolist() == pytest.approx([0.92224, *[0.5764] * 4])
    assert float(diagnostics["effective_weight"].sum()) == pytest.approx(3.22784)
    assert build_aggregator("fedavg")(updates, sizes).tolist() == pytest.approx([2.84])
