"""Preflight at real sites: the rule is probed with the clients a round samples from the
registered sites (``federation.sites``), not from the simulated partition's clients. A
device the machine lacks is refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from config.errors import ConfigError
from config.params import validate_params
from tasks.preflight import check_params, sampled_per_round

SITES = [{"name": f"site-{k}", "node_id": k + 1, "samples": 100} for k in range(3)]


def test_a_rule_that_needs_more_clients_than_the_sites_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    raw = {
        "data": {"dataset": "digits"},
        "noniid": {"every": 0, "final": False},
        "aggregate": {"name": "krum", "f": 1},  # n > 2f + 2: four clients at least
        "federation": {"runtime": "flower", "sites": SITES},
    }
    params = validate_params(raw, "params")

    assert sampled_per_round(params) == 3  # partition.num_clients (10) plays no part
    with pytest.raises(ConfigError) as error:
        check_params(params, tmp_path)
    assert str(error.value).startswith("params: aggregate (krum) with 3 clients per round: ")
    assert "\n" not in str(error.value)


def test_cuda_on_a_machine_without_one_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU machine
    params = validate_params({"data": {"dataset": "digits"}, "train": {"device": "cuda"}}, "p.yaml")
    with pytest.raises(ConfigError) as error:
        check_params(params, tmp_path, source="p.yaml")
    assert str(error.value) == (
        "p.yaml: train.device is 'cuda' but no CUDA device is available; use auto or cpu"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_validation_at_three_sites_passes_the_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs' 3-site defence (site_validation in front of the median) runs: the probe
    answers for the sites that would validate (it refused the filter, which needs their
    held-out losses, so `fedsieve run` refused the docs' recommendation)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    raw = {
        "data": {"dataset": "digits"},
        "noniid": {"every": 0, "final": False},
        "aggregate": {"name": "median"},
        "filters": [{"name": "site_validation"}],
        "federation": {"runtime": "flower", "sites": SITES},
    }
    check_params(validate_params(raw, "params"), tmp_path)  # no refusal
