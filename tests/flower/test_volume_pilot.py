"""The three-hospital pilot of docs/federation.md on volumes, on loopback: real
AdrenalMNIST3D volumes written as each hospital stores them (hospital-a NIfTI files,
hospital-b a DICOM series folder a volume, hospital-c enhanced multi-frame DICOM files),
each site started as its operator starts it (``fedsieve-site``, its own cache), a hub that
holds no volume (no data path, no MedMNIST root, an image cache left empty, no volume file
in its folder or its MLflow store). ``fedsieve run`` trains at the sites, scores at the
sites, ends where the same federation simulated from the same folders ends, records each
site's data by the digest of every slice file, and registers the model; ``fedsieve
predict`` and the served (pyfunc) model answer for a new series.

Lean: its own SuperLink (not the session's hub, so it stays off the serial ``flower-hub``
group), 14 volumes a site at 32³ (every second voxel of the official 64³), read at 16³,
two rounds of the small 3-D CNN."""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from benchmarks.sites.loopback import CONNECTION, Loopback
from config.dataset import dataset_info_of
from config.params import Params, params_hash
from federated.checkpoint import read_checkpoint
from federated.data import Split, load_medmnist
from federated.loop import train
from federated.own_data import load_own_images
from federated.server import ServerState
from federated.volume_writers import write_series, write_volume_folder
from fedsieve.cli import main
from flowerapp.certs import make_site_key
from flowerapp.hub import simulated_federation
from flowerapp.site import main as site_main
from tasks.tracking import fluent_tracking_at
from tests.flower.conftest import FLOWER_BIN
from tests.limits import limit

pytestmark = pytest.mark.e2e  # real processes and servers

HOSPITALS = {"hospital-a": "nifti", "hospital-b": "series", "hospital-c": "multiframe"}
PER_CLASS = {"train": 5, "test": 2}  # volumes of each class a hospital holds, per split
SIZE = 16  # voxels per axis the schema reads every volume at
TOLERANCE = 1e-6
VOLUME_SUFFIXES = (".nii", ".nii.gz", ".dcm")


def hospital_volumes(adrenal_root: Path, out: Path) -> tuple[dict[str, Path], Path, tuple]:
    """Each hospital's folder with its labels.csv, its volumes in its own form (a seeded,
    class-balanced share of AdrenalMNIST3D's training split at 32³), and a new series
    (a test-split volume, as a folder of slices) for the model to answer."""
    official = load_medmnist("adrenalmnist3d", adrenal_root, 64)
    rng = np.random.default_rng(0)
    by_class = [rng.permutation(np.flatnonzero(official.train.targets == c)) for c in (0, 1)]
    per_site = sum(PER_CLASS.values())
    folders = {}
    for k, (name, form) in enumerate(HOSPITALS.items()):
        splits, start = {}, k * per_site
        for split, count in PER_CLASS.items():
            rows = np.sort(np.concatenate([r[start : start + count] for r in by_class]))
            start += count
            images = np.ascontiguousarray(official.train.images[rows][:, ::2, ::2, ::2])
            splits[split] = Split(images=images, labels=official.train.labels[rows])
        folders[name] = out / name
        write_volume_folder(folders[name], splits, official.info.labels, forms=(form,))
    new = official.test.images[0][::2, ::2, ::2]
    series = write_series(out / "new-patient", np.ascontiguousarray(new), (1.0, 1.0, 1.0))
    return folders, series, official.info.labels


def pilot_yaml(classes: tuple, sites: list[dict]) -> dict:
    """docs/federation.md's pilot.yaml for volumes: the schema without a path (the hub
    holds none), scored at the sites."""
    own = {"task": "binary-class", "classes": list(classes), "channels": 1, "spatial_dims": 3}
    return {
        "seed": 0,
        "data": {"dataset": "adrenal-ct", "size": SIZE, "own": own},
        "model": {"name": "small_cnn3d"},
        "train": {
            "rounds": 2,
            "local_epochs": 2,
            "lr": 0.05,
            "momentum": 0.9,
            "batch_size": 8,
            "device": "cpu",
            "backend": "sequential",
        },
        "noniid": {"every": 0, "final": False},
        "eval": {"every": 1, "where": "sites"},
        "federation": {
            "runtime": "flower",
            "superlink": CONNECTION,
            "sites": sites,
            "round_timeout": round(limit(300)),
        },
    }


def site_env(home: Path, cache: Path) -> dict[str, str]:
    """A site operator's shell: no virtual environment on PATH, the site's own cache."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "FEDSIEVE_CACHE": str(cache)}  # fmt: skip
    if "PYTHONPATH" in os.environ:  # the checkout under test, for an editable install
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def volume_files_in(folder: Path) -> list[Path]:
    """Every file under ``folder`` that is a volume: by its name, or by NIfTI's or
    DICOM's magic bytes (a file renamed or stored by MLflow under another name)."""
    found = []
    for path in (p for p in folder.rglob("*") if p.is_file()):
        with path.open("rb") as handle:
            head = handle.read(352)
        if head[:2] == b"\x1f\x8b":  # a gzip: a .nii.gz under another name?
            with gzip.open(path) as unzipped, contextlib.suppress(OSError, EOFError):
                head = unzipped.read(352)
        if (
            path.name.endswith(VOLUME_SUFFIXES)
            or head[344:348] in (b"n+1\0", b"ni1\0")  # NIfTI-1
            or head[128:132] == b"DICM"
        ):
            found.append(path)
    return found


@pytest.fixture
def loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loopback]:
    """A SuperLink of this test's own (TLS, SuperNode authentication), stopped by PID; it
    and the ServerApps it starts cache images in the hub's cache, ``tmp_path/hub-cache``."""
    if not (FLOWER_BIN / "flwr").exists():
        pytest.fail(f"no Flower environment at {FLOWER_BIN}: run `make setup-flower`")
    with Loopback(tmp_path / "loopback", bin_dir=FLOWER_BIN) as fed:
        monkeypatch.setenv("FEDSIEVE_CACHE", str(tmp_path / "hub-cache"))
        fed.start_superlink()
        yield fed


def start_sites(
    fed: Loopback,
    folders: dict[str, Path],
    plan: Path,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> list[dict]:
    """Each site as its operator starts it: its key, ``fedsieve-site --check`` (which
    prints the samples to register), the site itself with its own cache; the sites'
    entries for params."""
    sites = []
    for name, folder in folders.items():
        key = make_site_key(work / name, name)
        cache = work / name / "cache"
        monkeypatch.setenv("FEDSIEVE_CACHE", str(cache))
        assert site_main([*fed.site_command(key, folder, plan)[1:], "--check"]) == 0
        counted = capsys.readouterr().out
        assert f"volumes resampled to {SIZE}x{SIZE}x{SIZE}" in counted, counted
        assert f"{2 * PER_CLASS['train']} training, {2 * PER_CLASS['test']} test and 0 " in counted
        samples = int(counted.rsplit("register samples: ", 1)[1])
        sites.append({"name": name, "node_id": fed.register(key.public), "samples": samples})
        command = fed.site_command(key, folder, plan)
        fed.start_site_command(name, command, site_env(work / name, cache))
    for site in sites:  # started together, admitted each in its own time
        assert fed.wait_connected(site["name"], timeout=limit(120)) == site["node_id"]
    return sites


def ends_as_simulated(project: Path, params: Params, folders: dict[str, Path]) -> None:
    """The sites read their volumes as a simulation reads them: the same global model and
    the same pooled scores, round by round."""
    saved = read_checkpoint(project / "artifacts" / "checkpoints" / "train.pt", params_hash(params))
    remote = ServerState.from_dict(saved["state"])
    federation = simulated_federation(params, None, list(folders.values()))
    local = train(federation, federation.initial_state(), params.train.rounds)
    diff = (remote.global_vector - local.global_vector).abs().max().item()
    assert diff <= TOLERANCE, f"max abs difference {diff:.2e} from the simulation"
    for at_sites, simulated in zip(remote.history, local.history, strict=True):
        assert at_sites["sites_scored"] == len(folders)
        for key in ("test_loss", "test_acc", "test_auc"):
            assert abs(at_sites[key] - simulated[key]) <= TOLERANCE, key


def answered_for_a_new_series(
    tracking: str, series: Path, classes: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fedsieve predict`` on the series folder and the served champion on its zip's
    bytes give one answer; anything else gets a 400."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    assert main(["predict", str(series), "--out", "new.csv"]) == 0
    with Path("new.csv").open() as handle:
        [row] = list(csv.DictReader(handle))
    assert row["class"] in classes and not row["error"] and row["version"] == "1"
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        for file in sorted(series.iterdir()):
            archive.write(file, f"series/{file.name}")
    with fluent_tracking_at(tracking):
        served = mlflow.pyfunc.load_model("models:/fedsieve-adrenal-ct@champion")
    answered = served.predict(pd.DataFrame({"image": [zipped.getvalue()]}))
    assert list(answered["class"]) == [row["class"]]
    probability = f"p({classes[1]})"
    assert float(answered[probability][0]) == pytest.approx(float(row[probability]))
    with pytest.raises(MlflowException) as refused:
        served.predict(pd.DataFrame({"image": [b"\x89PNG\r\n\x1a\n" + bytes(400)]}))
    assert refused.value.get_http_status_code() == 400


def test_three_hospitals_train_on_their_own_volumes_with_a_hub_that_holds_none(
    loopback: Loopback,
    adrenal_root: Path,
    tmp_path: Path,
    prefect_server: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folders, new_series, classes = hospital_volumes(adrenal_root, tmp_path / "hospitals")
    project = tmp_path / "hub"
    project.mkdir()
    (project / "pilot.yaml").write_text(yaml.safe_dump(pilot_yaml(classes, [])))
    monkeypatch.chdir(project)
    assert main(["plan", "--params", "pilot.yaml", "--out", "plan.json"]) == 0
    sites = start_sites(loopback, folders, project / "plan.json", tmp_path, monkeypatch, capsys)
    monkeypatch.setenv("FEDSIEVE_CACHE", str(tmp_path / "test-cache"))  # this process's
    raw = pilot_yaml(classes, sites)
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    tracking = f"sqlite:///{project / 'mlflow.db'}"
    hub_cache = tmp_path / "hub-cache"
    env = loopback.flwr_env() | {
        "PREFECT_API_URL": prefect_server,
        "FEDSIEVE_FLOWER_BIN": str(FLOWER_BIN),
        "MLFLOW_TRACKING_URI": tracking,
        "MEDMNIST_ROOT": str(tmp_path / "no-data-here"),
        "FEDSIEVE_CACHE": str(hub_cache),
    }

    done = subprocess.run(
        [sys.executable, "-m", "fedsieve.cli", "run", "--params", "params.yaml"],
        cwd=project, env=env, capture_output=True, text=True, timeout=limit(900),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    [final] = [line for line in (done.stdout + done.stderr).splitlines() if "final model:" in line]
    assert "test acc" in final and "nan" not in final, final
    read = f"read {2 * PER_CLASS['train']} training volumes ({classes[0]}: {PER_CLASS['train']}; "
    assert all(f"site {name} {read}" in done.stdout + done.stderr for name in folders)
    # the hub (its pipeline and its ServerApps) held no volume: none read, none cached,
    # none written, none logged
    assert not (tmp_path / "no-data-here").exists() and not hub_cache.exists()
    assert volume_files_in(project) == []
    for name in folders:  # each site read its own volumes into its own cache
        assert list((tmp_path / name / "cache").glob("*.npz")), name
    pretest = json.loads((project / "reports" / "pretest.json").read_text())
    assert pretest["sites"] == list(folders) and pretest["n_tests"] > 0, pretest  # 3-D gradients
    params = Params.model_validate(raw)
    ends_as_simulated(project, params, folders)
    # each site's data by the digest of every slice file, as the site read it
    client = MlflowClient(tracking)
    [run] = client.search_runs([client.get_experiment_by_name("fedsieve").experiment_id])
    info = dataset_info_of(params.data)
    digests = {name: load_own_images(folder, info).sha256 for name, folder in folders.items()}
    assert {name: run.data.tags[f"site_data.{name}"] for name in folders} == digests
    # two short rounds leave the model near chance (its loss about ln 2, ACC the balanced
    # held-out volumes' majority share), its pooled AUC above 0.5: registered
    assert run.data.tags["gate.registration"] == "passed", run.data.tags["gate.registration.reason"]
    answered_for_a_new_series(tracking, new_series, classes, monkeypatch)
