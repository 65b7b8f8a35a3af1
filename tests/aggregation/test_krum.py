"""Krum and Multi-Krum: docstring examples and an independent numpy reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from aggregation import build_aggregator

EXAMPLE = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [4.0, 0.0], [10.0, 0.0]])


def reference_scores(points: np.ndarray, f: int) -> np.ndarray:
    """Blanchard et al.'s scores by plain loops: sum of the n - f - 2 smallest squared
    distances from each point to the others."""
    n = len(points)
    scores = []
    for i in range(n):
        dists = sorted(float(np.sum((points[i] - points[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(dists[: n - f - 2]))
    return np.array(scores)


def test_docstring_example_krum() -> None:
    out, _, diagnostics = build_aggregator("krum", f=1).step({}, EXAMPLE)

    assert out.tolist() == [1.0, 0.0]
    assert diagnostics["selected"].tolist() == [1]
    torch.testing.assert_close(
        diagnostics["columns"]["krum_score"],
        torch.tensor([5.0, 2.0, 5.0, 13.0, 100.0], dtype=torch.float64),
        rtol=1e-5,  # distances from a float32 Gram matrix
        atol=0.0,
    )


def test_docstring_example_multi_krum() -> None:
    out, _, diagnostics = build_aggregator("multi_krum", f=1).step({}, EXAMPLE)

    assert out.tolist() == [1.75, 0.0]
    assert diagnostics["selected"].dtype == torch.long
    assert diagnostics["selected"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(("n", "f", "seed"), [(5, 1, 0), (12, 3, 1), (30, 5, 2), (9, 0, 3)])
def test_krum_matches_loops_on_random_inputs(n: int, f: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n, 40)) + 5.0  # a common offset, as real updates have
    scores = reference_scores(points, f)

    out, _, diagnostics = build_aggregator("krum", f=f).step({}, torch.from_numpy(points))

    np.testing.assert_allclose(diagnostics["columns"]["krum_score"].numpy(), scores, rtol=1e-9)
    np.testing.assert_array_equal(out.numpy(), points[np.argmin(scores)])


@pytest.mark.parametrize(("n", "f", "m"), [(12, 3, None), (12, 3, 4), (20, 4, 1)])
def test_multi_krum_matches_loops_on_random_inputs(n: int, f: int, m: int | None) -> None:
    points = np.random.default_rng(n + f).standard_normal((n, 24))
    chosen = np.sort(
        np.argsort(reference_scores(points, f), kind="stable")[: (n - f) if m is None else m]
    )

    out, _, diagnostics = build_aggregator("multi_krum", f=f, m=m).step(
        {}, torch.from_numpy(points)
    )

    assert diagnostics["selected"].tolist() == chosen.tolist()
    np.testing.assert_allclose(out.numpy(), points[chosen].mean(axis=0), rtol=1e-12)


def test_equal_scores_do_not_depend_on_client_order() -> None:
    # f = 0, n = 3: one neighbour each; rows 0 and 1 are each other's nearest (a tie).
    points = torch.tensor([[0.0, 0.0], [1.0, 0.0], [5.0, 0.0]])
    outputs = {
        tuple(build_aggregator("krum", f=0)(points[list(order)]).tolist())
        for order in itertools.permutations(range(3))
    }

    assert outputs == {(1.0, 0.0)}


def test_too_few_clients_names_f() -> None:
    with pytest.raises(ValueError, match=r"krum with f=2 needs n_clients > 2f \+ 2 = 6, got 6"):
        build_aggregator("krum", f=2)(torch.zeros(6, 3))
