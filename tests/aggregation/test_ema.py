"""EMA (estimated-mean aggregation): the docstring example and a numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation import build_aggregator


def reference_ema(values: np.ndarray, k: float) -> np.ndarray:
    """Per column with np.quantile (linear): the median of all values, the quartiles of the
    values inside the IQR fences, Luo et al.'s estimator."""
    out = []
    for column in values.T:
        q1, q3 = np.quantile(column, [0.25, 0.75])
        kept = column[(column >= q1 - k * (q3 - q1)) & (column <= q3 + k * (q3 - q1))]
        if kept.size == 0:
            kept = column
        m = np.median(column)  # of all values, before the fences
        k1, k3 = np.quantile(kept, [0.25, 0.75])
        w = 0.70 + 0.39 / kept.size
        out.append(w * (k1 + k3) / 2 + (1 - w) * m)
    return np.array(out)


def test_docstring_example() -> None:
    first = [0, 1, 2, 3, 4, 5, 6, 7, 8, 100]
    second = [0, 0, 0, 0, 0, 0, 1, 1, 2, 4]
    updates = torch.tensor([first, second], dtype=torch.float64).T

    out = build_aggregator("ema")(updates)

    w = 0.70 + 0.39 / 9
    expected = torch.tensor([4.5 + w * (4.0 - 4.5), w / 2], dtype=torch.float64)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    ("n", "k", "seed"), [(10, 1.5, 0), (50, 1.5, 1), (7, 0.0, 2), (23, 3.0, 3), (4, 0.5, 4)]
)
def test_matches_numpy_quantiles(n: int, k: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.standard_t(df=2, size=(n, 300))  # heavy tails: the fences bite

    out = build_aggregator("ema", k=k)(torch.from_numpy(values))

    np.testing.assert_allclose(out.numpy(), reference_ema(values, k), rtol=1e-12, atol=1e-12)


def test_two_clients_with_narrow_fences_keep_both() -> None:
    updates = torch.tensor([[0.0], [1.0]], dtype=torch.float64)

    out = build_aggregator("ema", k=0.1)(updates)

    assert out.tolist() == [0.5]
