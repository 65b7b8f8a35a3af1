"""Pre-Testing figure: p-value histograms and a few normal QQ plots.

Builds a bare ``matplotlib.figure.Figure`` (Agg canvas, no pyplot state, no file written),
so the caller decides where it goes (``fig.savefig``, ``mlflow.log_figure``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from federated.stats import PretestResult, QQData

__all__ = ["pretest_figure"]


def pretest_figure(result: PretestResult, qq: Sequence[QQData] = (), *, bins: int = 20) -> Figure:
    """Histogram of Shapiro–Wilk and Anderson–Darling p-values (non-constant coordinates,
    ``alpha`` marked), then one QQ panel per item of ``qq``."""
    ncols = 2 + len(qq)
    fig = Figure(figsize=(3.6 * ncols, 3.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    edges = np.linspace(0.0, 1.0, bins + 1)
    for ax, name, p, rate in (
        (axes[0], "Shapiro–Wilk", result.shapiro_pvalues, result.shapiro_rate),
        (axes[1], "Anderson–Darling (Stephens p)", result.anderson_pvalues, result.anderson_rate),
    ):
        ax.hist(p, bins=edges, color="tab:blue", alpha=0.8)
        ax.axvline(result.alpha, color="tab:red", ls="--", lw=1, label=f"alpha = {result.alpha}")
        ax.set_title(f"{name}\nrate {rate:.3f} of {p.size:,}", fontsize=9)
        ax.set_xlabel("p-value")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("coordinates")
    for ax, item in zip(axes[2:], qq, strict=True):
        ax.scatter(item.theoretical, item.sample, s=10)
        line = item.intercept + item.slope * item.theoretical
        ax.plot(item.theoretical, line, color="tab:red", lw=1)
        ax.set_title(f"QQ, coordinate {item.coord}", fontsize=9)
        ax.set_xlabel("normal quantile")
        ax.set_ylabel("client value")
    fig.suptitle(
        f"Pre-Testing: {result.n_tests:,} coordinates, {result.n_clients} clients, "
        f"{result.n_constant:,} constant",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
