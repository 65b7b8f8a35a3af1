"""The site operator's side before any Flower process starts: ``fedsieve-site`` refuses a
data file, a plan or a key it cannot use in one line (exit 2); the training plan the hub
writes (``fedsieve plan``) is what its tasks carry, and a departure from it is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from config.params import load_params
from federated.data import dataset_info
from flowerapp.hub import site_task
from flowerapp.plan import PlanError, plan_differences, plan_digest, read_plan, write_plan
from flowerapp.site import main as site_main
from flowerapp.site_data import SiteDataError, load_site_data

REPO = Path(__file__).resolve().parents[2]


def site_file(path: Path, **arrays: np.ndarray | None) -> Path:
    """A site file of four 8x8 images (three to train on), with ``arrays`` replacing any
    (``None``: left out)."""
    images = np.zeros((4, 8, 8), np.uint8)
    labels = np.array([[0], [1], [0], [1]])
    default = {"train_images": images[:3], "train_labels": labels[:3], "test_images": images[3:],
               "test_labels": labels[3:]}  # fmt: skip
    np.savez(path, **{k: v for k, v in (default | arrays).items() if v is not None})
    return path


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"train_images": np.zeros((3, 8, 8), np.float32)}, "train_images is float32"),
        ({"train_labels": np.array([[0], [1]])}, "train_labels (int64, 2 rows) does not match"),
        ({"train_images": np.zeros((0, 8, 8), np.uint8), "train_labels": np.zeros((0, 1), int)},
         "train_images is empty"),
        ({"test_images": np.zeros((1, 9, 9), np.uint8)}, "test_images and train_images differ"),
    ],
)  # fmt: skip
def test_a_data_file_that_cannot_be_trained_on_is_named_with_why(
    tmp_path: Path, arrays: dict[str, np.ndarray], message: str
) -> None:
    path = site_file(tmp_path / "site.npz", **arrays)
    with pytest.raises(SiteDataError, match="^" + str(path)) as error:
        load_site_data(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_site_command_stops_in_one_line_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = site_file(tmp_path / "site.npz")
    (tmp_path / "not.npz").write_text("images")
    plan = tmp_path / "plan.json"
    write_plan(plan, {"model": "logreg", "lr": 0.05})
    (tmp_path / "ca.crt").write_text("")
    (tmp_path / "site.key").write_text("")
    common = ["--superlink", "hub:9092", "--ca", str(tmp_path / "ca.crt")]
    cases = {
        "not a readable .npz data file": ["--data", str(tmp_path / "not.npz"), "--plan", str(plan)],
        "missing train_labels": [
            "--data", str(site_file(tmp_path / "bad.npz", train_labels=None)), "--plan", str(plan)
        ],
        "not JSON": ["--data", str(good), "--plan", str(tmp_path / "site.key")],
        "No such file or directory": ["--data", str(good), "--plan", str(tmp_path / "none.json")],
        "--key": ["--data", str(good), "--plan", str(plan), "--key", str(tmp_path / "none.key")],
    }  # fmt: skip
    for message, argv in cases.items():
        key = [] if "--key" in argv else ["--key", str(tmp_path / "site.key")]
        assert site_main([*argv, *common, *key]) == 2, message
        error = capsys.readouterr().err
        assert error.startswith("fedsieve-site: error: ") and error.count("\n") == 1, error
        assert message in error


def test_the_hubs_plan_is_what_its_tasks_carry_and_a_departure_is_named(
    tmp_path: Path, medmnist_root: Path
) -> None:
    written = subprocess.run(
        [str(Path(sys.executable).parent / "fedsieve"), "plan", "--set", "train.lr=0.02",
         "--out", str(tmp_path / "plan.json")],
        cwd=REPO, env=os.environ | {"MEDMNIST_ROOT": str(medmnist_root)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    params = load_params(REPO / "params.yaml", ["train.lr=0.02"])
    task = site_task(params, dataset_info(params.data.dataset, params.data.size))
    plan = read_plan(tmp_path / "plan.json")
    assert plan == task.plan() and plan["lr"] == 0.02
    assert written.stdout.strip().endswith(f"sha256 {plan_digest(task)}")

    sent = replace(task, round=3, client=1, shuffle_seed=12345)  # per message: not the plan
    assert plan_differences(plan, sent) == []
    assert plan_digest(sent) == plan_digest(plan)
    bolder = replace(sent, lr=0.5, epochs=task.epochs + 1)
    assert plan_differences(plan, bolder) == [
        f"epochs={task.epochs + 1} (approved {task.epochs})",
        "lr=0.5 (approved 0.02)",
    ]

    (tmp_path / "list.json").write_text(json.dumps([1, 2]))
    with pytest.raises(PlanError, match="must be a JSON object of settings"):
        read_plan(tmp_path / "list.json")
