"""ByzFL's bounded line search: the probes it makes and the factor it keeps."""

from __future__ import annotations

import pytest

from federated.attacks import line_maximize


def probes(objective, **search) -> tuple[list[float], float, float]:
    seen: list[float] = []

    def recorded(x: float) -> float:
        seen.append(x)
        return objective(x)

    best, value = line_maximize(recorded, **search)
    return seen, best, value


def test_expansion_doubles_the_step_while_the_objective_improves() -> None:
    seen, best, value = probes(lambda x: min(x, 25.0), evals=4, start=0.0, delta=10.0, ratio=0.8)

    assert seen == [0.0, 10.0, 30.0, 70.0]
    assert (best, value) == (30.0, 25.0)


def test_contraction_probes_above_the_best_with_a_shrinking_step() -> None:
    seen, best, _ = probes(lambda x: min(x, 25.0), evals=6, start=0.0, delta=10.0, ratio=0.8)

    # 70 fails: step 40 * 0.8 = 32 -> 62; then 25.6 -> 55.6
    assert seen == pytest.approx([0.0, 10.0, 30.0, 70.0, 62.0, 55.6])
    assert best == 30.0


def test_ties_keep_the_earlier_factor_and_one_evaluation_is_the_start() -> None:
    assert line_maximize(lambda x: 1.0, evals=20, start=2.0, delta=10.0, ratio=0.8) == (2.0, 1.0)
    assert line_maximize(lambda x: x, evals=1, start=3.0, delta=10.0, ratio=0.8) == (3.0, 3.0)


def test_a_negative_delta_searches_downwards() -> None:
    seen, best, _ = probes(lambda x: -x, evals=3, start=0.0, delta=-1.0, ratio=0.8)

    assert seen == [0.0, -1.0, -3.0]
    assert best == -3.0
