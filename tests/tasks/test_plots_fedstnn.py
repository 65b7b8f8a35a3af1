"""FedStNN figures drawn from an experiment's plain results (one round of one epoch)."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from federated.fedstnn.experiments import run_experiment
from tasks.plots_fedstnn import fedstnn_figures, save_fedstnn_figures

UNTRAINED = {
    "federation": {"rounds": 1, "local": {"epochs": 1}},
    "eval_paths": 4,
    "track_rounds": False,
}
TINY = {
    "1d_iid": {"n_points": 200, "n_clients": 4, "main_points": 10},
    "2d": {"grid": 20, "n_clients": 4, "main_points": 5, "other_points": 2},
    "image": {"n_clients": 3, "main_points": 10, "other_points": 2, "height": 16, "width": 48},
}
FIGURES = {
    "1d_iid": {"data", "fit"},
    "2d": {"surfaces", "slices"},
    "image": {"reconstruction", "data"},
}


@pytest.mark.parametrize("name", list(TINY))
def test_each_experiment_has_its_figures(name):
    result = run_experiment(name, **TINY[name], **UNTRAINED)

    figures = fedstnn_figures(result)

    assert set(figures) == FIGURES[name]
    assert all(isinstance(figure, Figure) for figure in figures.values())


def test_the_figures_are_written_as_pngs(tmp_path):
    result = run_experiment("1d_iid", **TINY["1d_iid"], **UNTRAINED)

    paths = save_fedstnn_figures(result, tmp_path / "out", "1d_iid")

    assert sorted(p.name for p in paths) == ["1d_iid-data.png", "1d_iid-fit.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
