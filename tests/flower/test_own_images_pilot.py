"""The three-hospital pilot of docs/federation.md on loopback, on the hospitals' own image
folders: three sites of PNG files and one of DICOM files (written from digits' simulated
partition), a hub that holds no images (its MedMNIST root does not exist), scored at the
sites. ``fedsieve run`` trains there, logs the sites' pooled scores, registers a model,
and ends where the same federation simulated from the same folders ends (each folder's
test rows scored as a site scores them); the hub's MLflow run logs each site's data by
its digest (the lineage the sites report) and no data file of its own. A second run
names a site whose data changed mid-run and scores the champion at the sites."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from mlflow import MlflowClient

from config.dataset import dataset_info_of
from config.params import Params, params_hash
from federated.checkpoint import read_checkpoint
from federated.data import load_digits
from federated.loop import train
from federated.own_data import load_own_images
from federated.server import ServerState
from flowerapp.hub import simulated_federation, site_task
from flowerapp.plan import write_plan
from flowerapp.site_data import write_site_files
from tasks.partition import split_partition
from tests.flower.conftest import FLOWER_BIN, Hub
from tests.limits import limit

pytestmark = pytest.mark.e2e  # real processes and servers: minutes

HOSPITALS = {"hospital-a": "png", "hospital-b": "png", "hospital-c": "png", "hospital-d": "dcm"}
TOLERANCE = 1e-6


def hospital_folders(out: Path) -> dict[str, Path]:
    """Each hospital's folder of images with its labels.csv (a fifth held out as ``test``
    rows), PNG or DICOM, from digits' seeded IID partition."""
    data = load_digits()
    split = split_partition(data.train.targets, "iid", len(HOSPITALS), 1, {}, 0, 0.2)
    folders = {}
    for k, (name, image_format) in enumerate(HOSPITALS.items()):
        write_site_files(
            data, split.clients[k : k + 1], split.local_tests[k : k + 1], [name], out, image_format
        )
        folders[name] = out / name
    return folders


def pilot_params(hub: Hub, names: list[str]) -> dict:
    """The hub's params: the images' schema without a path (the hub holds none), scored at
    the sites, with EMA's non-IID check as params.yaml sets it (every round, and on the
    trained model), as in docs/federation.md's pilot.yaml."""
    raw = hub.flower_params(names, eval={"every": 1, "where": "sites"})
    raw.pop("noniid")
    raw["data"] = {"dataset": "digits-folders", "own": {
        "task": "multi-class", "classes": [str(d) for d in range(10)], "channels": 1}}  # fmt: skip
    return raw


@pytest.fixture
def hospitals(hub: Hub, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """The hospitals' folders, each a site of the session's hub that approved the pilot's
    plan; stopped at the end, with their warm trainers."""
    folders = hospital_folders(tmp_path / "hospitals")
    plan = tmp_path / "plan.json"
    own = Params.model_validate(pilot_params(hub, []))  # a plan names no site
    write_plan(plan, site_task(own, dataset_info_of(own.data)))
    for name, folder in folders.items():
        hub.add_site(name, folder, dataset_info_of(own.data), **{"approved-plan": str(plan)})
    yield folders
    for name in folders:
        hub.remove(name)


def test_the_pilot_trains_on_own_folders_with_a_hub_that_holds_no_images(
    hub: Hub, hospitals: dict[str, Path], tmp_path: Path, prefect_server: str
) -> None:
    folders = hospitals
    names = list(folders)
    raw = pilot_params(hub, names)
    project = tmp_path / "hub"
    project.mkdir()
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    tracking = f"sqlite:///{project / 'mlflow.db'}"
    env = hub.fed.flwr_env() | {
        "PREFECT_API_URL": prefect_server,
        "FEDSIEVE_FLOWER_BIN": str(FLOWER_BIN),
        "MLFLOW_TRACKING_URI": tracking,
        "MEDMNIST_ROOT": str(tmp_path / "no-data-here"),
    }

    done = subprocess.run(
        [sys.executable, "-m", "fedsieve.cli", "run", "--params", "params.yaml"],
        cwd=project, env=env, capture_output=True, text=True, timeout=limit(900),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    [final] = [line for line in (done.stdout + done.stderr).splitlines() if "final model:" in line]
    assert "test acc" in final and "nan" not in final, final  # the sites hold no validation split
    assert not (tmp_path / "no-data-here").exists()
    params = Params.model_validate(raw)
    saved = read_checkpoint(project / "artifacts" / "checkpoints" / "train.pt", params_hash(params))
    remote = ServerState.from_dict(saved["state"])
    federation = simulated_federation(params, None, list(folders.values()))
    local = train(federation, federation.initial_state(), params.train.rounds)
    diff = (remote.global_vector - local.global_vector).abs().max().item()
    assert diff <= TOLERANCE, f"max abs difference {diff:.2e} from the simulation"
    for at_sites, simulated_row in zip(remote.history, local.history, strict=True):
        scores = {k for k in at_sites if k.startswith(("test_", "val_"))}
        assert scores == {f"test_{k}" for k in ("loss", "acc", "auc", "ece", "brier")}
        for key in scores:  # pooled from the sites' held-out rows, as simulated
            assert abs(at_sites[key] - simulated_row[key]) <= TOLERANCE, key
        assert at_sites["sites_scored"] == simulated_row["sites_scored"] == len(names)
        assert abs(at_sites["noniid_cv"] - simulated_row["noniid_cv"]) <= TOLERANCE
    # the operator's own check of the same (docs/federation.md)
    checked = subprocess.run(
        [sys.executable, "-m", "fedsieve.cli", "check-simulation", "--params", "params.yaml",
         "--data", str(tmp_path / "hospitals")],
        cwd=project, env=env, capture_output=True, text=True, timeout=limit(600),
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "the run at the sites equals its simulation within 1e-06" in checked.stdout
    assert checked.stdout.count("s at the sites, ") == params.train.rounds
    rounds = params.train.rounds
    assert {(r["round"], r["site"]) for r in remote.sites} == {
        (t, s) for t in range(1, rounds + 1) for s in range(len(names))
    }

    client = MlflowClient(tracking)
    [run] = client.search_runs([client.get_experiment_by_name("fedsieve").experiment_id])
    assert run.info.status == "FINISHED"
    assert client.search_model_versions("name = 'fedsieve-digits-folders'")
    lineage_recorded(project, dataset_info_of(params.data), folders, run)
    with (project / "reports" / "rounds.csv").open() as table:
        last = list(csv.DictReader(table))[-1]
    metrics = json.loads((project / "reports" / "metrics.json").read_text())
    for key in ("test_loss", "test_acc", "test_auc", "test_ece", "test_brier"):
        assert metrics[key] == pytest.approx(float(last[key])), key
        assert run.data.metrics[f"final_{key}"] == pytest.approx(metrics[key])
    assert not (project / "reports" / "calibration.png").exists()  # needs per-example values
    verdict = json.loads((project / "reports" / "noniid.json").read_text())
    assert verdict["verdict"] in {"iid", "non_iid"} and len(verdict["client_losses"]) == len(names)
    assert len(verdict["trained_model"]["client_losses"]) == len(names)  # noniid.final

    changed_mid_run_and_champion_scored_at_sites(project, env, folders, client, run)


def lineage_recorded(project: Path, info, folders: dict[str, Path], run) -> None:
    """The hub used no data file: the run's inputs are the sites' data by their digests,
    each site's classes are its training rows', and the gate read the sites' majority."""
    names = list(folders)
    # the hub used no data file: the run's inputs are the sites' data, by their digests
    digests = {name: load_own_images(folder, info).sha256 for name, folder in folders.items()}
    inputs = {i.dataset.name: i.dataset.digest for i in run.inputs.dataset_inputs}
    assert inputs == {f"site {name}": digest[:32] for name, digest in digests.items()}
    assert {name: run.data.tags[f"site_data.{name}"] for name in names} == digests
    lineage = json.loads((project / "reports" / "site_data.json").read_text())
    for site in lineage["sites"]:
        trained = load_own_images(folders[site["site"]], info).split("train")
        counts = np.bincount(trained.labels[:, 0], minlength=10).tolist()
        assert site["sha256"] == digests[site["site"]] and not site["changed"]
        assert list(site["classes"].values()) == counts
    assert run.data.tags["gate.registration"] == "passed"  # above the sites' majority class
    held_out = np.concatenate(
        [load_own_images(f, info).split("test").labels for f in folders.values()]
    )
    majority = np.bincount(held_out[:, 0]).max() / len(held_out)
    assert run.data.metrics["gate_majority_acc"] == pytest.approx(majority)


def changed_mid_run_and_champion_scored_at_sites(
    project: Path, env: dict[str, str], folders: dict[str, Path], client: MlflowClient, first
) -> None:
    """A second run: hospital-a relabels one training image once round 1 is journaled,
    which the run names; the first run's version, now the champion, is scored beside the
    new model in the same evaluation at the sites."""
    journal = project / "artifacts" / "hub" / "rounds.jsonl"
    journal.unlink()
    log = (project / "second-run.log").open("w")
    second = subprocess.Popen(
        [sys.executable, "-m", "fedsieve.cli", "run", "--params", "params.yaml"],
        cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        while not (journal.exists() and '"round": 1,' in journal.read_text()):
            assert second.poll() is None, (project / "second-run.log").read_text()[-3000:]
            time.sleep(0.2)
        table = folders["hospital-a"] / "labels.csv"
        rows = table.read_text().splitlines()
        file, label, split = rows[1].split(",")
        rows[1] = ",".join([file, str((int(label) + 1) % 10), split])
        table.write_text("\n".join(rows) + "\n")
        assert second.wait(timeout=limit(900)) == 0, (project / "second-run.log").read_text()[
            -4000:
        ]
    finally:
        if second.poll() is None:
            second.kill()
        log.close()
    output = (project / "second-run.log").read_text()
    assert "site hospital-a's data changed during the run:" in output
    lineage = json.loads((project / "reports" / "site_data.json").read_text())
    changed = [site for site in lineage["sites"] if site["changed"]]
    assert [site["site"] for site in changed] == ["hospital-a"]
    [before, after] = changed[0]["history"]
    assert before["sha256"] == first.data.tags["site_data.hospital-a"] != after["sha256"]
    # round 1 is journaled once round 2's training came back (one exchange a round): the
    # old data trained both rounds (and scored the initial model for the non-IID screen),
    # the new one scored the final model
    assert (before["trained"], before["scored"]) == ([1, 2], [0, 1])
    assert (after["trained"], after["scored"]) == ([], [2])
    together = json.loads((project / "reports" / "champion_at_sites.json").read_text())
    [version_one] = client.search_model_versions(f"run_id = '{first.info.run_id}'")
    assert together["version"] == str(version_one.version)
    assert together["sites"] == [0, 1, 2, 3]
    runs = client.search_runs([first.info.experiment_id], order_by=["start_time DESC"])
    latest = runs[0]
    assert latest.data.tags["site_data.changed"] == "hospital-a"
    champion = latest.data.metrics["gate_champion_test_auc"]
    assert champion == pytest.approx(together["champion"]["auc"])
    assert latest.data.metrics["gate_candidate_test_auc"] == pytest.approx(
        together["candidate"]["auc"]
    )
    [card] = client.search_model_versions(f"run_id = '{latest.info.run_id}'")
    assert "(changed mid-run)" in card.description

    # simulated from the sites' data as it is now, the run cannot be reproduced: said
    hospitals = folders["hospital-a"].parent
    command = [sys.executable, "-m", "fedsieve.cli", "check-simulation", "--params", "params.yaml"]
    differs = subprocess.run(
        [*command, "--data", str(hospitals)], cwd=project, env=env, capture_output=True,
        text=True, timeout=limit(600),
    )  # fmt: skip
    assert differs.returncode == 1, differs.stdout + differs.stderr
    assert "fedsieve: the run at the sites is not its simulation: final weights differ" in (
        differs.stdout
    )
    assert differs.stdout.splitlines()[-1] == (
        "  cause: site hospital-a's data changed during the run (site_data.json): the "
        "simulation reads the data as they are now"
    )
    missing = subprocess.run(
        [*command, "--data", str(project)], cwd=project, env=env, capture_output=True, text=True,
        timeout=limit(600),
    )  # fmt: skip
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"fedsieve: error: --data {project}: no data of site ")
