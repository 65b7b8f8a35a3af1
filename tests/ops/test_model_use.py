"""The model a hospital uses: the registered champion takes image files (PNG or DICOM,
as paths or bytes) and answers class probabilities, loaded in a fresh process, applied
by ``fedsieve predict`` at the hub or from a folder copied to a site, and served over
REST by ``mlflow models serve``; its answers equal the in-process model's."""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import mlflow.artifacts
import mlflow.models
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from pydicom.data import get_testdata_file

from benchmarks.sites.serving import register_champion
from federated.data import Split, load_medmnist
from federated.inference import load_classifier
from federated.own_data import write_image_folder
from tasks.tracking import fluent_tracking_at
from tests.limits import limit

NAME = "fedsieve-breastmnist"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, medmnist_root: Path) -> dict[str, Any]:
    """A tracking store whose champion is a small CNN trained a few steps on BreastMNIST,
    registered as a run registers it; and a folder of test images (PNG and DICOM)."""
    root = tmp_path_factory.mktemp("model-use")
    data = load_medmnist("breastmnist", medmnist_root)
    said = Said()  # what MLflow says while the run logs the model (a run's console)
    logging.getLogger("mlflow").addHandler(said)
    try:
        uri, classifier = register_champion(
            root, data, experiment="model-use", run_name="trained", rows=256
        )
    finally:
        logging.getLogger("mlflow").removeHandler(said)
    assert MlflowClient(uri).get_model_version_by_alias(NAME, "champion").version == 1
    test = Split(data.test.images[:12], data.test.labels[:12])
    write_image_folder(root / "png", {"test": test}, data.info.labels)
    write_image_folder(root / "dcm", {"test": test}, data.info.labels, image_format="dcm")
    return {"uri": uri, "root": root, "classifier": classifier, "labels": data.info.labels,
            "logged": said.lines}  # fmt: skip


class Said(logging.Handler):
    """The lines of log records, as a console shows them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def in_process(store: dict[str, Any], files: list[Path]) -> np.ndarray:
    return load_classifier(store["classifier"]).predict_files(files).probabilities


def columns(store: dict[str, Any]) -> list[str]:
    return [f"p({label})" for label in store["labels"]]


def test_the_champion_loads_in_a_fresh_process_and_takes_png_and_dicom_files(
    store: dict[str, Any], ops: Any
) -> None:
    files = [*sorted((store["root"] / "png" / "test").glob("*.png"))[:3],
             *sorted((store["root"] / "dcm" / "test").glob("*.dcm"))[:3],
             Path(get_testdata_file("CT_small.dcm"))]  # fmt: skip
    code = (
        "import json, sys, pandas as pd, mlflow.pyfunc\n"
        f"model = mlflow.pyfunc.load_model('models:/{NAME}@champion')\n"
        "paths = json.loads(sys.argv[1])\n"
        "by_path = model.predict(pd.DataFrame({'path': paths}))\n"
        "by_bytes = model.predict(pd.DataFrame({'image': [open(p, 'rb').read() for p in paths]}))\n"
        "print(json.dumps([by_path.to_dict('list'), by_bytes.to_dict('list')]))\n"
    )
    done = subprocess.run(
        [str(ops.bin / "python"), "-c", code, json.dumps([str(f) for f in files])],
        env=ops.base_env(MLFLOW_TRACKING_URI=store["uri"], FEDSIEVE_MODEL_READS_PATHS="1",
                         MLFLOW_ALLOW_PICKLE_DESERIALIZATION="false"),  # logged from code
        capture_output=True, text=True, timeout=limit(300),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    by_path, by_bytes = json.loads(done.stdout.strip().splitlines()[-1])

    expected = in_process(store, files)
    for answer in (by_path, by_bytes):
        got = np.array([answer[column] for column in columns(store)]).T
        assert np.allclose(got, expected, atol=1e-6)
        assert answer["class"] == [store["labels"][i] for i in expected.argmax(1)]


def test_the_registered_model_has_a_signature_and_an_input_example(store: dict[str, Any]) -> None:
    client = MlflowClient(store["uri"])
    version = client.get_model_version_by_alias(NAME, "champion")
    with fluent_tracking_at(store["uri"]):  # the registry the models:/ URI is looked up in
        local = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{NAME}@champion", dst_path=str(store["root"] / "downloaded")
        ))  # fmt: skip
    model = mlflow.models.Model.load(str(local))

    assert str(version.version) == "1"
    assert [c["name"] for c in model.signature.inputs.to_dict()] == ["image", "path"]
    assert [c["name"] for c in model.signature.outputs.to_dict()] == ["class", *columns(store)]
    example = model.load_input_example(str(local))
    assert list(example.columns) == ["image"] and example["image"][0].startswith(b"\x89PNG")


def test_the_model_is_logged_from_code_and_holds_no_pickled_object(store: dict[str, Any]) -> None:
    local = store["root"] / "downloaded"  # the champion's folder, as the test above fetched it
    if not local.exists():
        with fluent_tracking_at(store["uri"]):
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{NAME}@champion", dst_path=str(local)
            )
    pyfunc = mlflow.models.Model.load(str(local)).flavors["python_function"]

    assert Path(pyfunc["model_code_path"]).name == "served_model_code.py"
    assert (local / "served_model_code.py").is_file() and "python_model" not in pyfunc
    pickled = [f for f in local.rglob("*") if f.suffix in (".pkl", ".pickle", ".cloudpickle")]
    assert pickled == []
    assert not [line for line in store["logged"] if "CloudPickle" in line], store["logged"]
    assert any("Validating input example" in line for line in store["logged"])  # heard MLflow


def run_predict(ops: Any, args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ops.bin / "fedsieve"), "predict", *args], cwd=cwd, env=ops.base_env(**env),
        capture_output=True, text=True, timeout=limit(300),
    )  # fmt: skip


def test_predict_lists_an_unreadable_file_predicts_the_others_and_scores_the_labels(
    store: dict[str, Any], ops: Any, tmp_path: Path
) -> None:
    folder = store["root"] / "png"
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n cut short")
    table = folder / "labels.csv"
    table.write_text(table.read_text().rstrip("\n") + "\nbroken.png,malignant,test\n")
    out = tmp_path / "predictions.csv"

    done = run_predict(
        ops, [str(folder), "--model", f"models:/{NAME}@champion", "--out", str(out)], tmp_path,
        MLFLOW_TRACKING_URI=store["uri"],
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 13 and [r["file"] for r in rows][-1] == "broken.png"
    broken = rows[-1]
    assert broken["class"] == "" and "not a readable image" in broken["error"]
    good = rows[:-1]
    assert all(r["class"] in store["labels"] and not r["error"] for r in good)
    assert {(r["model"], r["version"]) for r in rows} == {(NAME, "1")}
    files = [folder / r["file"] for r in good]
    got = np.array([[float(r[c]) for c in columns(store)] for r in good])
    assert np.allclose(got, in_process(store, files), atol=1e-6)
    assert "12 images predicted by fedsieve-breastmnist version 1, 1 refused" in done.stdout
    assert "scored against 12 labels: accuracy" in done.stdout
    assert "resized" not in done.stdout  # every image at the model's size
    assert done.stderr.strip().splitlines() == [f"fedsieve predict: broken.png: {broken['error']}"]


def test_predict_at_a_site_from_a_model_folder_copied_there(
    store: dict[str, Any], ops: Any, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    with fluent_tracking_at(store["uri"]):  # as `mlflow artifacts download -u ...` at the hub
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{NAME}@champion", dst_path=str(site / "model")
        )
    images = store["root"] / "dcm" / "test"
    ct_scan = get_testdata_file("CT_small.dcm")  # 128x128: not the model's 28x28

    done = run_predict(
        ops, [str(images), ct_scan, "--model", str(site / "model"), "--out", str(site / "p.csv")],
        site, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'nowhere' / 'x.db'}",  # no hub here
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    with (site / "p.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 13 and {(r["model"], r["version"]) for r in rows} == {(NAME, "1")}
    assert "scored against" not in done.stdout  # a folder of files without a table
    assert (
        "1 of 13 images resized to 28x28 (1 from 128x128); warning: the images have mixed "
        "sizes" in done.stdout
    )


@pytest.mark.parametrize(
    ("model", "problem"),
    [("models:/fedsieve-nothing@champion", "not a fedsieve model"), ("no-model", "no such folder")],
)
def test_a_model_that_is_not_there_is_one_line(
    store: dict[str, Any], ops: Any, tmp_path: Path, model: str, problem: str
) -> None:
    done = run_predict(
        ops, [str(store["root"] / "png"), "--model", model], tmp_path,
        MLFLOW_TRACKING_URI=store["uri"],
    )  # fmt: skip
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"fedsieve: error: --model {model}: {problem}"), line


def documented_serve_command(ops: Any) -> str:
    """The serve command of docs/operations.md, as a user copies it."""
    text = (ops.repo / "docs" / "operations.md").read_text()
    [command] = [line for line in text.splitlines() if "mlflow models serve -m" in line]
    assert "--port 5002" in command, command
    return command


def without_the_virtualenv(env: dict[str, str], venv_bin: Path) -> dict[str, str]:
    """A shell's environment where the virtualenv is not activated: its bin not on PATH."""
    env = {k: v for k, v in env.items() if k != "VIRTUAL_ENV"}
    folders = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(f for f in folders if f and Path(f).resolve() != venv_bin)
    return env


@pytest.fixture(scope="module")
def served(store: dict[str, Any], ops: Any, processes: Any) -> str:
    """The champion on loopback, started by the docs' serve command in a shell whose PATH
    lacks the virtualenv (as after a fresh clone and ``make setup``), from the checkout."""
    port = ops.free_port()
    command = documented_serve_command(ops).replace("--port 5002", f"--port {port}")
    env = without_the_virtualenv(ops.base_env(MLFLOW_TRACKING_URI=store["uri"]), ops.bin.resolve())
    env.pop("FEDSIEVE_MODEL_READS_PATHS", None)  # the default: paths refused
    assert shutil.which("uvicorn", path=env["PATH"]) is None  # else this proves nothing
    server = processes.start(["bash", "-c", command], name="model-serve", env=env, cwd=ops.repo)
    url = f"http://127.0.0.1:{port}"
    ops.wait_http(f"{url}/ping", timeout=limit(600), process=server)
    return url


def invoke(url: str, files: list[bytes]) -> httpx.Response:
    rows = [[base64.b64encode(raw).decode()] for raw in files]
    body = {"dataframe_split": {"columns": ["image"], "data": rows}}
    return httpx.post(f"{url}/invocations", json=body, timeout=limit(60))


def test_the_served_champion_answers_png_and_dicom_as_the_model_in_process(
    store: dict[str, Any], served: str
) -> None:
    files = [*sorted((store["root"] / "png" / "test").glob("*.png"))[:2],
             *sorted((store["root"] / "dcm" / "test").glob("*.dcm"))[:2],
             Path(get_testdata_file("MR_small_jpeg_ls_lossless.dcm"))]  # fmt: skip

    one = invoke(served, [files[-1].read_bytes()])
    batch = invoke(served, [f.read_bytes() for f in files])

    assert one.status_code == 200 and batch.status_code == 200, batch.text
    expected = in_process(store, files)
    answers = batch.json()["predictions"]
    got = np.array([[row[c] for c in columns(store)] for row in answers])
    assert np.allclose(got, expected, atol=1e-6)
    assert [row["class"] for row in answers] == [store["labels"][i] for i in expected.argmax(1)]
    single = np.array([one.json()["predictions"][0][c] for c in columns(store)])
    assert np.allclose(single, expected[-1], atol=1e-6)

    table = io.BytesIO()  # a batch without base64: a Parquet table of the files' bytes
    pd.DataFrame({"image": [f.read_bytes() for f in files]}).to_parquet(table)
    parquet = httpx.post(
        f"{served}/invocations", content=table.getvalue(),
        headers={"Content-Type": "application/vnd.apache.parquet"}, timeout=limit(60),
    )  # fmt: skip
    assert parquet.status_code == 200, parquet.text
    got = np.array([[row[c] for c in columns(store)] for row in parquet.json()["predictions"]])
    assert np.allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"dataframe_split": {"columns": ["image"], "data": [[base64.b64encode(b"x" * 300).decode()]]}},
         "Error: image 1 of 1: not a readable image"),
        ({"dataframe_records": [{"nothing": 1}]},
         "Error: the input is a table with a column image (a file's bytes) or path"),
        ({"dataframe_records": [{"path": "/etc/passwd"}]},  # paths are off unless switched on
         "Error: this model reads no paths: send the file's bytes (column image), "
         "or set FEDSIEVE_MODEL_READS_PATHS=1 where it runs"),
    ],
)  # fmt: skip
def test_bad_input_gets_a_400_whose_reason_is_one_line(served: str, body: dict, reason: str):
    reply = httpx.post(f"{served}/invocations", json=body, timeout=limit(60))

    assert reply.status_code == 400
    message = reply.json()["message"]
    assert message.splitlines()[-1].startswith(reason)  # MLflow puts the request's data first


@pytest.mark.parametrize("setting", [None, "0", "true"])
def test_the_model_reads_paths_only_where_switched_on(
    store: dict[str, Any], monkeypatch: pytest.MonkeyPatch, setting: str | None
) -> None:
    from mlflow.exceptions import MlflowException

    from tasks.served_model import ImageModel

    model = ImageModel()
    model.classifier = load_classifier(store["classifier"])
    file = sorted((store["root"] / "png" / "test").glob("*.png"))[0]
    if setting is None:
        monkeypatch.delenv("FEDSIEVE_MODEL_READS_PATHS", raising=False)
    else:
        monkeypatch.setenv("FEDSIEVE_MODEL_READS_PATHS", setting)

    with pytest.raises(MlflowException, match="this model reads no paths"):
        model.predict(None, pd.DataFrame({"path": [str(file)]}))
    by_bytes = model.predict(None, pd.DataFrame({"image": [file.read_bytes()]}))
    monkeypatch.setenv("FEDSIEVE_MODEL_READS_PATHS", "1")
    assert model.predict(None, pd.DataFrame({"path": [str(file)]})).equals(by_bytes)


def test_labels_that_are_not_classes_are_said_not_dropped(
    store: dict[str, Any], ops: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "scans"
    write_image_folder(folder, {"test": Split(np.zeros((2, 28, 28), np.uint8),
                                              np.array([[0], [1]]))}, store["labels"])  # fmt: skip
    (folder / "labels.csv").write_text("file,label\ntest/00000.png,normal\ntest/00001.png,1\n")

    done = run_predict(
        ops, [str(folder), "--model", f"models:/{NAME}@champion", "--out", str(tmp_path / "p.csv")],
        tmp_path, MLFLOW_TRACKING_URI=store["uri"],
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == [
        "not scored: label(s) 'normal' are not classes of the model; allowed: 'malignant', "
        "'normal, benign' (or 0..1)"
    ]
