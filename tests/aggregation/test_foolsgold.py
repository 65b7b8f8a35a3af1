"""FoolsGold: the docstring example, the authors' algorithm as the reference, and the
per-client history keyed by client id."""

from __future__ import annotations

import io

import numpy as np
import sklearn.metrics.pairwise as smp
import torch

from aggregation import build_aggregator


def reference_weights(histories: np.ndarray, kappa: float = 1.0) -> np.ndarray:
    """The authors' foolsgold() (github.com/DistributedML/FoolsGold) by loops."""
    n = len(histories)
    cs = smp.cosine_similarity(histories) - np.eye(n)
    maxcs = cs.max(axis=1)
    for i in range(n):
        for j in range(n):
            if i != j and maxcs[i] < maxcs[j]:
                cs[i][j] = cs[i][j] * maxcs[i] / maxcs[j]
    wv = np.clip(1 - cs.max(axis=1), 0, 1)
    wv = wv / wv.max()
    wv[wv == 1] = 0.99
    with np.errstate(divide="ignore"):
        wv = kappa * (np.log(wv / (1 - wv)) + 0.5)
    return np.clip(np.nan_to_num(wv, neginf=0.0), 0, 1)


def test_docstring_example() -> None:
    rule = build_aggregator("foolsgold")
    updates = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)

    out, _, diagnostics = rule.step(rule.init_state(), updates, client_ids=[0, 1, 2])

    assert out.tolist() == [0.0, 1.0]
    assert diagnostics["columns"]["foolsgold_weight"].tolist() == [0.0, 0.0, 1.0]
    assert diagnostics["columns"]["max_similarity"].tolist() == [1.0, 1.0, 0.0]


def test_histories_follow_client_ids_across_rounds_and_match_the_reference() -> None:
    rng = np.random.default_rng(0)
    sybil = rng.standard_normal(12)
    rounds = [
        ([3, 7, 1, 9, 4], rng.standard_normal((5, 12))),
        ([9, 3, 5, 7], rng.standard_normal((4, 12))),  # 1 and 4 not sampled; 5 new
        ([4, 1, 3, 9, 7, 5], rng.standard_normal((6, 12))),
    ]
    for ids, points in rounds:  # clients 3 and 9 push the same direction
        for row, client in enumerate(ids):
            if client in (3, 9):
                points[row] = sybil + 0.05 * rng.standard_normal(12)
    rule = build_aggregator("foolsgold", kappa=1.0)
    state, history = rule.init_state(), {}

    for ids, points in rounds:
        out, state, diagnostics = rule.step(state, torch.from_numpy(points), client_ids=ids)
        for row, client in enumerate(ids):
            history[client] = history.get(client, 0) + points[row]
        expected = reference_weights(np.stack([history[c] for c in ids]))

        np.testing.assert_allclose(
            diagnostics["columns"]["foolsgold_weight"].numpy(), expected, atol=1e-12
        )
        np.testing.assert_allclose(out.numpy(), expected @ points / expected.sum(), rtol=1e-10)
    sybils = [ids.index(3), ids.index(9)]
    assert float(diagnostics["effective_weight"][sybils].max()) < 0.05


def test_the_state_survives_a_checkpoint_and_is_not_mutated() -> None:
    rule = build_aggregator("foolsgold")
    updates = torch.randn(4, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _, state, _ = rule.step(rule.init_state(), updates, client_ids=[0, 1, 2, 3])
    before = {k: v.clone() for k, v in state["history"].items()}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)

    restored = torch.load(buffer, weights_only=True)
    again = rule.step(restored, updates, client_ids=[0, 1, 2, 3])

    torch.testing.assert_close(again[0], rule.step(state, updates, client_ids=[0, 1, 2, 3])[0])
    for client, vector in before.items():
        torch.testing.assert_close(state["history"][client], vector)
