"""Portable numerics (``config.environment``): with the pin on, a short federated training
gives the same bits under two machines' worth of CPU settings; with it off, different
bits, so the pin is what makes them equal.

This machine cannot turn into an AVX-512 one, so the two machines are two ambient settings
on it: its own (each library's kernels for the CPU it detects, its core count as threads),
and a lower one (ATen's default kernels, oneDNN at SSE4.1, MKL's reproducibility branch
AUTO, one thread), as a site's environment would hand them to ``fedsieve``. Each run is a
fresh process that configures its environment the CLI's way before torch is imported, then
trains with the engine on real BreastMNIST images: 2 clients, 1 round, FedAvg.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from config.environment import (
    PORTABLE_NUMERICS,
    PORTABLE_NUMERICS_SWITCH,
    configure_numerics,
    has_avx2_and_fma,
)
from tests.limits import limit

REPO = Path(__file__).resolve().parents[2]
avx2 = pytest.mark.skipif(
    not has_avx2_and_fma(), reason="the pin is AVX2: an x86-64 CPU with AVX2 and FMA"
)

TRAIN = r"""
import hashlib, sys
from pathlib import Path

from config.environment import configure_environment

configure_environment()  # as fedsieve.cli.main: before torch is imported

import torch

from federated.client import ClientData, LocalTraining, train_client
from federated.data import load_medmnist, to_tensors
from federated.layout import use_fast_layout_
from federated.seeding import derive_seed, seeded_init
from federated.vectors import model_to_vector
from models import build_model

data = load_medmnist("breastmnist", Path(sys.argv[1]))
images, targets = to_tensors(data.train, data.info)
model = seeded_init(0, lambda: build_model("small_cnn", in_channels=1, num_classes=2))
use_fast_layout_(model, "cpu")
clients = [ClientData(i, images[64 * i : 64 * (i + 1)], targets[64 * i : 64 * (i + 1)]) for i in range(2)]
local = LocalTraining(epochs=1, lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=32)
start = model_to_vector(model)
updates = [
    train_client(model, start, c, local, torch.nn.CrossEntropyLoss(), seed=derive_seed(0, 1, c.client_id))
    for c in clients
]
weights = torch.tensor([u.num_samples for u in updates], dtype=torch.float32)
result = start + (torch.stack([u.delta for u in updates]) * (weights / weights.sum())[:, None]).sum(0)
print(torch.backends.cpu.get_cpu_capability(), hashlib.sha256(result.numpy().tobytes()).hexdigest())
"""

NATIVE: dict[str, str] = {}
LOWER = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_CBWR": "AUTO",
    "OMP_NUM_THREADS": "1",
}


def train(medmnist_root, machine: dict[str, str], *, pinned: bool) -> tuple[str, str]:
    """(ATen's capability, sha256 of the trained weights) in a fresh process."""
    ambient = {k: v for k, v in os.environ.items() if k not in PORTABLE_NUMERICS}
    env = ambient | machine | {PORTABLE_NUMERICS_SWITCH: "1" if pinned else "0"}
    result = subprocess.run(
        [sys.executable, "-c", TRAIN, str(medmnist_root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(300),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    capability, digest = result.stdout.split()
    return capability, digest


@avx2
def test_pinned_numerics_give_the_same_bits_where_the_machines_differ(medmnist_root):
    native = train(medmnist_root, NATIVE, pinned=True)
    lower = train(medmnist_root, LOWER, pinned=True)

    assert native == lower
    assert native[0] == "AVX2"


@avx2
def test_unpinned_the_same_training_differs_between_the_two(medmnist_root):
    native = train(medmnist_root, NATIVE, pinned=False)
    lower = train(medmnist_root, LOWER, pinned=False)

    assert lower[0] == "DEFAULT"  # the lower setting took
    assert native[1] != lower[1]


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The pinned variables as a site had them (restored after the test)."""
    site = {"ATEN_CPU_CAPABILITY": "avx512", "OMP_NUM_THREADS": "64"}
    for key in PORTABLE_NUMERICS:
        monkeypatch.delenv(key, raising=False)
    for key, value in site.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(PORTABLE_NUMERICS_SWITCH, raising=False)
    return os.environ  # type: ignore[return-value]


@avx2
def test_the_pin_is_on_by_default_and_overrides_the_sites_settings(environ):
    configure_numerics()

    assert {key: environ.get(key) for key in PORTABLE_NUMERICS} == PORTABLE_NUMERICS


def test_switched_off_the_pin_is_cleared_and_the_users_own_values_kept(environ, monkeypatch):
    monkeypatch.setenv("MKL_CBWR", PORTABLE_NUMERICS["MKL_CBWR"])  # from the image's ENV
    monkeypatch.setenv(PORTABLE_NUMERICS_SWITCH, "0")

    configure_numerics()

    assert "MKL_CBWR" not in environ
    assert environ["ATEN_CPU_CAPABILITY"] == "avx512" and environ["OMP_NUM_THREADS"] == "64"


def test_the_image_and_the_workers_deployment_carry_the_same_pin():
    image = DockerfileParser(path=str(REPO / "Dockerfile")).envs
    [deployment] = [  # the pipeline's (the other closes crashed runs: no training)
        d
        for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
        if d["entrypoint"] == "flows/deployment.py:pipeline_from_file"
    ]
    worker = deployment["work_pool"]["job_variables"]["env"]

    for key, value in PORTABLE_NUMERICS.items():
        assert image[key] == value, key
        assert worker[key] == value, key
