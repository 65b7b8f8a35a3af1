"""Smoke test of the optional Pre-Testing figure (shell helper in fedsieve)."""

from __future__ import annotations

import numpy as np

from federated.stats import pretest_normality, qq_data, representative_coords
from tasks.plots_stats import pretest_figure


def test_pretest_figure_has_histograms_and_qq_panels() -> None:
    values = np.random.default_rng(0).normal(size=(20, 200))
    values[:, :5] = 1.0
    res = pretest_normality(values)
    qq = qq_data(values, representative_coords(res, k=3))

    fig = pretest_figure(res, qq)

    assert len(fig.axes) == 5
    fig.canvas.draw()  # renders without a display
