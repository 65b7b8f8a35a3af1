"""Benchmark: the registered model served by ``mlflow models serve`` on CPU (not a test).

    python -m benchmarks.sites.serving [--requests 200] [--batch 32] [--batches 20]

Registers the default model (params.yaml's ``small_cnn`` at 28 px, BreastMNIST's schema,
trained briefly) as a run registers it, serves ``models:/fedsieve-breastmnist@champion``
with ``--env-manager local`` on 127.0.0.1, and measures over real HTTP with CT-like DICOM
files (512x512, signed 16-bit, no window):

- ``p50_ms``, ``p95_ms``: one DICOM a request (JSON, base64), ``requests`` requests one
  after another;
- ``images_per_s``: ``batches`` requests of ``batch`` DICOMs each, as an uncompressed
  Parquet table of the files' bytes (``images_per_s_json``: as JSON, the bytes in base64);
  every request body is built before the clock starts;
- ``reader_images_per_s``: the training reader's own rate on the same files in one
  process (the server runs one), and ``batch_to_reader``: the served rate over it;
- ``same_as_in_process``: every REST answer equals the in-process model's within 1e-6;
- ``diverged_run_registered``: whether a pipeline run made to diverge (central DP with a
  noise multiplier of 50: finite weights, a test loss of about 1e13) registered a model
  (it must not).

Goals: p50 <= 50 ms, and batches at >= 0.8 of the reader's images per second. Writes
``benchmarks/results/serving-cpu.json``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from federated.data import MedMNISTData

NAME = "fedsieve-breastmnist"
GOAL_P50_MS = 50.0
GOAL_BATCH_RATIO = 0.8
# central DP with far too much noise: finite weights, a test loss of about 1e13, AUC 0.5
DIVERGE = ["train.rounds=2", "partition.num_clients=3", "privacy.mode=central",
           "privacy.noise_multiplier=50", "privacy.clip=10"]  # fmt: skip


def register_champion(
    root: Path, data: MedMNISTData, *, experiment: str, run_name: str, rows: int | None = None
) -> tuple[str, Path]:
    """A tracking store in ``root`` whose champion is the small CNN trained 20 full-batch
    steps on ``data``'s first ``rows`` training images (all by default), registered as a
    run registers it: its URI and the classifier folder. Raises when the store refused
    the model."""
    import torch
    from mlflow import MlflowClient

    from federated.inference import save_classifier
    from models import build_model
    from tasks.tracking import Tracker

    torch.manual_seed(0)
    model = build_model("small_cnn", in_channels=1, num_classes=2, image_size=28)
    images = torch.from_numpy(data.train.images[:rows]).float().unsqueeze(1) / 127.5 - 1
    targets = torch.from_numpy(data.train.targets[:rows]).long()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(20):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(images), targets).backward()
        optimiser.step()
    uri = f"sqlite:///{root / 'mlflow.db'}"
    tracker = Tracker(experiment, uri)
    tracker.start(run_id=None, run_name=run_name, tags={})
    classifier = save_classifier(root / "classifier", model, "small_cnn", data.info)
    version = tracker.log_model(classifier, data.info, registered_name=NAME)
    tracker.end()
    if version is None:
        raise RuntimeError(f"the model was not registered: {tracker.failed}")
    MlflowClient(uri).set_registered_model_alias(NAME, "champion", version)
    return uri, classifier


def _dicoms(folder: Path, count: int) -> list[Path]:
    from benchmarks.sites.own_images import ct_slice, write_ct

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for index in range(count):
        path = folder / f"{index:04d}.dcm"
        write_ct(path, ct_slice(np.random.default_rng([7, index])), bits_stored=12)
        files.append(path)
    return files


def _serve(uri: str, root: Path, port: int) -> subprocess.Popen[bytes]:
    import httpx

    env = os.environ | {"MLFLOW_TRACKING_URI": uri}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log = (root / "serve.log").open("wb")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m",
         f"models:/{NAME}@champion", "--env-manager", "local", "--host", "127.0.0.1",
         "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.5)
    _stop(server)
    raise SystemExit(f"the model server did not answer: {(root / 'serve.log').read_text()[-2000:]}")


def _stop(server: subprocess.Popen[bytes]) -> None:
    """The server and its uvicorn worker: its whole session, by the leader's PID."""
    import signal

    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _body(files: list[bytes], kind: str = "json") -> tuple[bytes, str]:
    """A request carrying ``files``: a JSON table of base64 text, or (``parquet``) an
    uncompressed Parquet table of the bytes themselves (MLflow's two table formats)."""
    if kind == "parquet":
        out = io.BytesIO()
        pd.DataFrame({"image": files}).to_parquet(out, compression=None)
        return out.getvalue(), "application/vnd.apache.parquet"
    rows = [[base64.b64encode(raw).decode()] for raw in files]
    table = {"dataframe_split": {"columns": ["image"], "data": rows}}
    return json.dumps(table).encode(), "application/json"


def _post(client: Any, port: int, body: tuple[bytes, str]) -> list[dict[str, Any]]:
    content, kind = body
    reply = client.post(
        f"http://127.0.0.1:{port}/invocations", content=content,
        headers={"Content-Type": kind}, timeout=120,
    )  # fmt: skip
    reply.raise_for_status()
    return reply.json()["predictions"]


def _batches_per_s(
    client: Any, port: int, raws: list[bytes], args: argparse.Namespace, kind: str
) -> float:
    """Images per second over ``args.batches`` requests of ``args.batch`` files, their
    bodies built before the clock starts (a client's encoding is not the server's work)."""
    bodies = [
        _body([raws[(index * args.batch + k) % len(raws)] for k in range(args.batch)], kind)
        for index in range(args.batches)
    ]
    start = time.perf_counter()
    for body in bodies:
        _post(client, port, body)
    return args.batches * args.batch / (time.perf_counter() - start)


def _measure(port: int, files: list[Path], args: argparse.Namespace, classifier: Path):
    import httpx

    from federated.inference import load_classifier

    raws = [f.read_bytes() for f in files]
    local = load_classifier(classifier)
    labels = local.info.labels
    start = time.perf_counter()
    expected = local.predict_files(files).probabilities
    reader_s = time.perf_counter() - start
    latencies, answers = [], []
    with httpx.Client() as client:
        _post(client, port, _body(raws[:1]))  # warm
        singles = [_body([raws[index % len(raws)]]) for index in range(args.requests)]
        for body in singles:
            start = time.perf_counter()
            answers += _post(client, port, body)
            latencies.append((time.perf_counter() - start) * 1000)
        json_per_s = _batches_per_s(client, port, raws, args, "json")
        parquet_per_s = _batches_per_s(client, port, raws, args, "parquet")
        batch_answers = _post(client, port, _body(raws, "parquet"))
        json_answers = _post(client, port, _body(raws))
    got = np.array([[row[f"p({label})"] for label in labels] for row in batch_answers])
    by_json = np.array([[row[f"p({label})"] for label in labels] for row in json_answers])
    single = np.array([[row[f"p({label})"] for label in labels] for row in answers])
    singles_expected = expected[[i % len(raws) for i in range(args.requests)]]
    difference = max(
        np.abs(got - expected).max(), np.abs(by_json - expected).max(),
        np.abs(single - singles_expected).max(),
    )  # fmt: skip
    images_per_s = parquet_per_s
    reader = len(files) / reader_s
    return {
        "p50_ms": round(float(np.percentile(latencies, 50)), 2),
        "p95_ms": round(float(np.percentile(latencies, 95)), 2),
        "images_per_s": round(images_per_s, 1),
        "images_per_s_json": round(json_per_s, 1),
        "reader_images_per_s": round(reader, 1),
        "batch_to_reader": round(images_per_s / reader, 3),
        "max_difference_to_in_process": float(difference),
        "same_as_in_process": bool(difference <= 1e-6),
    }


def _diverged_run_registered(root: Path, medmnist_root: Path) -> dict[str, Any]:
    """A pipeline run made to diverge, in a project of its own: its exit code, its last
    line, and whether any model version was registered."""
    from mlflow import MlflowClient

    project = root / "diverged"
    project.mkdir()
    repo = Path(__file__).resolve().parents[2]
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(repo / name, project / name)
    uri = f"sqlite:///{project / 'mlflow.db'}"
    env = os.environ | {"MLFLOW_TRACKING_URI": uri, "MEDMNIST_ROOT": str(medmnist_root)}
    command = [str(Path(sys.executable).parent / "fedsieve"), "run"]
    for override in DIVERGE:
        command += ["--set", override]
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    versions = MlflowClient(uri).search_model_versions(f"name='{NAME}'")
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    return {"command": " ".join(command[1:]), "exit_code": done.returncode,
            "last_line": last, "registered": bool(versions)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serving-cpu.json"))
    args = parser.parse_args(argv)

    import mlflow

    from benchmarks.common import cpu_device, free_port, versions

    repo = Path(__file__).resolve().parents[2]
    medmnist_root = Path(os.environ.get("MEDMNIST_ROOT") or repo.parent / "shared/data/medmnist")
    root = Path(tempfile.mkdtemp(prefix="serving-"))
    port = free_port()
    try:
        from federated.data import load_medmnist

        data = load_medmnist("breastmnist", medmnist_root)
        uri, classifier = register_champion(
            root, data, experiment="serving-benchmark", run_name="served"
        )
        files = _dicoms(root / "dicom", max(args.batch, 64))
        server = _serve(uri, root, port)
        try:
            served = _measure(port, files, args, classifier)
        finally:
            _stop(server)
        diverged = _diverged_run_registered(root, medmnist_root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {
        "benchmark": "serving",
        "command": " ".join(["python -m benchmarks.sites.serving", *(argv or sys.argv[1:])]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": cpu_device(),
        "versions": versions(mlflow=mlflow.__version__),
        "model": "small_cnn, 28 px grey, BreastMNIST's two classes",
        "images": "CT-like DICOM, 512x512, signed 16-bit (12 stored), no window",
        "requests": args.requests, "batch": args.batch, "batches": args.batches,
        **served,
        "goal_p50_ms": GOAL_P50_MS, "meets_p50": served["p50_ms"] <= GOAL_P50_MS,
        "goal_batch_to_reader": GOAL_BATCH_RATIO,
        "meets_batch": served["batch_to_reader"] >= GOAL_BATCH_RATIO,
        "diverged_run": diverged,
        "diverged_run_registered": diverged["registered"],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"p50 {served['p50_ms']} ms, p95 {served['p95_ms']} ms, batches "
        f"{served['images_per_s']} images/s ({served['batch_to_reader']} of the reader's), "
        f"same as in process: {served['same_as_in_process']}; diverged run registered: "
        f"{diverged['registered']} (exit {diverged['exit_code']}: {diverged['last_line']})"
    )
    return report


if __name__ == "__main__":
    main()
