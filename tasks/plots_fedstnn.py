"""FedStNN figures (the paper's Sec. 5): drawn from an experiment's plain results.

Builds bare ``matplotlib.figure.Figure`` objects (no pyplot state); :func:`fedstnn_figures`
returns them by name and :func:`save_fedstnn_figures` writes them as PNGs, so the caller
decides where they go (a report folder, MLflow, a benchmark's results).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from federated.fedstnn.experiments import (
    ExperimentData,
    ExperimentResult,
    Function1DConfig,
    Function2DConfig,
    ImageConfig,
    Prediction,
    top_k_binary,
)

__all__ = [
    "fedstnn_figures",
    "figures_1d",
    "figures_2d",
    "figures_image",
    "save_fedstnn_figures",
]


def fedstnn_figures(result: ExperimentResult) -> dict[str, Figure]:
    """The experiment's figures by name (1-D: data, fit; 2-D: surfaces, slices; image:
    reconstruction, data)."""
    config = result.config
    if isinstance(config, Function1DConfig):
        return figures_1d(config, result.data, result.predictions)
    if isinstance(config, Function2DConfig):
        return figures_2d(config, result.data, result.predictions["global"])
    if isinstance(config, ImageConfig):
        return figures_image(config, result.data, result.predictions)
    raise TypeError(f"no FedStNN figures for {type(config).__name__}")


def save_fedstnn_figures(
    result: ExperimentResult, directory: Path, prefix: str, *, dpi: int = 110
) -> list[Path]:
    """Write each figure to ``directory/<prefix>-<figure>.png``; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, figure in fedstnn_figures(result).items():
        path = directory / f"{prefix}-{key}.png"
        figure.savefig(path, dpi=dpi)
        paths.append(path)
    return paths


def figures_1d(
    config: Function1DConfig, data: ExperimentData, predictions: Mapping[str, Prediction]
) -> dict[str, Figure]:
    """The data (two clients' points marked) and each model's mean ± 2σ̂ beside the truth."""
    x, f, y = data.inputs[:, 0], data.truth, data.observed
    indices, groups = data.indices, data.groups
    fig = Figure(figsize=(10, 3.5), layout="constrained")
    ax = fig.subplots()
    ax.scatter(x, y, s=1, color="0.6", alpha=0.3, label="observations")
    ax.plot(x, f, color="tab:red", lw=1.5, label="true f")
    shown = [0, config.n_clients // 4] if config.n_clients > 1 else [0]
    for c in shown:
        ax.scatter(x[indices[c]], y[indices[c]], s=8, label=f"client {c} (group {groups[c]})")
    ax.set(xlabel="x", ylabel="y", title=f"data ({config.partition})")
    ax.legend(loc="upper right", fontsize=8, markerscale=2)

    fit = Figure(figsize=(12, 4), layout="constrained")
    axes = fit.subplots(1, 2, sharey=True)
    local_title = f"local model (client {config.local_client}, alone)"
    for ax, (key, p) in zip(axes, predictions.items(), strict=True):
        m, s = p.mean, p.std
        ax.scatter(x, y, s=1, color="tab:purple", alpha=0.15, label="observations")
        ax.plot(x, f, color="tab:red", lw=1.2, label="true f")
        ax.plot(x, m, color="tab:blue", lw=1.2, label="predicted mean")
        ax.fill_between(x, m - 2 * s, m + 2 * s, color="tab:blue", alpha=0.25, label="mean ± 2σ̂")
        if key != "global":
            own = indices[config.local_client]
            ax.scatter(x[own], y[own], s=6, color="black", label="its data")
        ax.set(xlabel="x", title="global model" if key == "global" else local_title)
        ax.legend(loc="upper right", fontsize=8)
    axes[0].set_ylabel("y")
    return {"data": fig, "fit": fit}


def figures_2d(
    config: Function2DConfig, data: ExperimentData, prediction: Prediction
) -> dict[str, Figure]:
    """The global model's surfaces (truth, observations, mean, error, σ̂) and two slices
    through the grid (at ``slice_y`` and ``slice_x``) with one sampled path."""
    g = config.grid
    inputs, f, y = data.inputs, data.truth, data.observed
    mean, std, sample = prediction.mean, prediction.std, prediction.sample
    surfaces = Figure(figsize=(14, 3.6), layout="constrained")
    panels = {
        "true f": f,
        "observations": y,
        "global mean": mean,
        "|mean - f|": np.abs(mean - f),
        "global σ̂": std,
    }
    for ax, (title, values) in zip(surfaces.subplots(1, len(panels)), panels.items(), strict=True):
        image = ax.imshow(
            values.reshape(g, g), origin="lower", extent=(-1, 1, -1, 1), cmap="viridis"
        )
        ax.set_title(title)
        surfaces.colorbar(image, ax=ax, shrink=0.8)

    slices = Figure(figsize=(12, 4), layout="constrained")
    axis = np.linspace(-1.0, 1.0, g)
    row = int(np.argmin(np.abs(axis - config.slice_y)))
    col = int(np.argmin(np.abs(axis - config.slice_x)))
    cuts = {
        f"y = {axis[row]:.2f}": (np.arange(g) + row * g, inputs[:, 0], "x"),
        f"x = {axis[col]:.2f}": (np.arange(g) * g + col, inputs[:, 1], "y"),
    }
    sigma = config.noise_sigma
    for ax, (title, (idx, coord, label)) in zip(slices.subplots(1, 2), cuts.items(), strict=True):
        t = coord[idx]
        ax.plot(t, f[idx], color="tab:green", lw=1.5, label="true f")
        ax.fill_between(
            t, f[idx] - 2 * sigma, f[idx] + 2 * sigma, color="tab:green", alpha=0.2, label="f ± 2σ"
        )
        ax.scatter(t, y[idx], s=8, color="tab:red", label="observations")
        ax.scatter(t, sample[idx], s=8, color="black", label="global model samples")
        ax.plot(t, mean[idx], color="tab:blue", lw=1, label="global mean")
        ax.set(xlabel=label, title=title)
        ax.legend(fontsize=8)
    return {"surfaces": surfaces, "slices": slices}


def figures_image(
    config: ImageConfig, data: ExperimentData, predictions: Mapping[str, Prediction]
) -> dict[str, Figure]:
    """The true image beside each model's top-K reconstruction, and the pixels held by
    the first client of each group."""
    shape = (config.height, config.width)
    truth = data.truth.reshape(shape)
    n_white = int(data.truth.sum())
    panels = {"true image": truth}
    for key, p in predictions.items():
        panels[key] = top_k_binary(p.mean, n_white).reshape(shape)
    recon = Figure(figsize=(3.2 * len(panels), 2.0), layout="constrained")
    for ax, (title, image) in zip(recon.subplots(1, len(panels)), panels.items(), strict=True):
        ax.imshow(image, cmap="gray", vmin=0, vmax=1)
        ax.set_title(title, fontsize=9)
        ax.set_axis_off()

    fig = Figure(figsize=(8, 3), layout="constrained")
    ax = fig.subplots()
    ax.imshow(truth, cmap="gray", vmin=0, vmax=1, alpha=0.4)
    per_group = config.n_clients // len(config.text)
    for g in range(len(config.text)):
        own = data.indices[g * per_group]
        cols = (data.inputs[own, 0] + 1) / 2 * (config.width - 1)
        rows = (data.inputs[own, 1] + 1) / 2 * (config.height - 1)
        ax.scatter(cols, rows, s=4, label=f"client {g * per_group} ({config.text[g]})")
    ax.set_title("pixels held by the first client of each group")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_axis_off()
    return {"reconstruction": recon, "data": fig}
