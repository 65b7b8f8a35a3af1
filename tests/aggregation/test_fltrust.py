"""FLTrust: the docstring example and a numpy loop reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation import build_aggregator


def reference_fltrust(points: np.ndarray, server: np.ndarray) -> np.ndarray:
    """Cao et al. Eq. (2)-(4) by loops."""
    total, out = 0.0, np.zeros_like(server)
    for x in points:
        trust = max(0.0, float(x @ server) / (np.linalg.norm(x) * np.linalg.norm(server)))
        total += trust
        out += trust * np.linalg.norm(server) / np.linalg.norm(x) * x
    return out / total


def test_docstring_example() -> None:
    updates = torch.tensor([[2.0, 0.0], [1.0, 1.0], [-3.0, 0.0]], dtype=torch.float64)

    out, _, diagnostics = build_aggregator("fltrust").step(
        {}, updates, reference=torch.tensor([1.0, 0.0], dtype=torch.float64)
    )

    expected = torch.tensor([1.5, 0.5], dtype=torch.float64) / (1 + 0.5**0.5)  # [0.8787, 0.2929]
    torch.testing.assert_close(out, expected)
    np.testing.assert_allclose(diagnostics["columns"]["trust_score"].numpy(), [1, 0.5**0.5, 0])
    np.testing.assert_allclose(
        diagnostics["effective_weight"].numpy(), [0.2929, 0.2929, 0.0], atol=1e-4
    )


@pytest.mark.parametrize("seed", range(4))
def test_matches_loops(seed: int) -> None:
    rng = np.random.default_rng(seed)
    server = rng.standard_normal(20)
    points = server + rng.standard_normal((9, 20))
    points[:2] = -5.0 * server  # flipped: no trust

    out = build_aggregator("fltrust")(torch.from_numpy(points), reference=torch.from_numpy(server))

    np.testing.assert_allclose(out.numpy(), reference_fltrust(points, server), rtol=1e-12)


def test_no_trusted_client_gives_a_zero_update() -> None:
    updates = torch.tensor([[-1.0, 0.0], [0.0, 0.0]])

    out, _, diagnostics = build_aggregator("fltrust").step(
        {}, updates, reference=torch.tensor([1.0, 0.0])
    )

    assert out.tolist() == [0.0, 0.0]
    assert diagnostics["effective_weight"].tolist() == [0.0, 0.0]


def test_a_zero_reference_is_refused() -> None:
    with pytest.raises(ValueError, match=r"reference .* is zero"):
        build_aggregator("fltrust")(torch.ones(3, 2), reference=torch.zeros(2))
