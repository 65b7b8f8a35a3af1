"""The compose stack's ``model`` service over HTTP (run by scripts/container_smoke.sh
inside the image, on the host's network, once a run has made a champion): the champion
answers a BreastMNIST test image as PNG and pydicom's CT_small.dcm (128x128, resized) in
a JSON table, the same files as a Parquet table with the same answers, and a row that
names a file on the server gets a 400 whose reason is one line. Needs MODEL_URL (default
http://127.0.0.1:5002) and the MedMNIST file where the pipeline read it (MEDMNIST_ROOT,
else data/)."""

from __future__ import annotations

import base64
import io
import os
import sys
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
from PIL import Image
from pydicom.data import get_testdata_file

MODEL_URL = os.environ.get("MODEL_URL", "http://127.0.0.1:5002")
CLASSES = ("malignant", "normal, benign")  # BreastMNIST's, the stack's default dataset
TIMEOUT_S = 120


def files() -> list[bytes]:
    """A PNG of BreastMNIST's first test image and a CT slice from pydicom's test files."""
    root = Path(os.environ.get("MEDMNIST_ROOT", "data"))
    with np.load(root / "breastmnist.npz") as data:
        image = data["test_images"][0]
    png = io.BytesIO()
    Image.fromarray(image).save(png, format="PNG")
    return [png.getvalue(), Path(get_testdata_file("CT_small.dcm")).read_bytes()]


def answers(reply: httpx.Response, what: str) -> np.ndarray:
    """The probabilities of a 200 reply, one row per file (exit naming ``what`` if not)."""
    if reply.status_code != 200:
        sys.exit(f"model: {what}: HTTP {reply.status_code}: {reply.text[-500:]}")
    rows = reply.json()["predictions"]
    if len(rows) != 2 or any(row["class"] not in CLASSES for row in rows):
        sys.exit(f"model: {what}: not one known class per file: {rows}")
    probabilities = np.array([[row[f"p({label})"] for label in CLASSES] for row in rows])
    if not np.allclose(probabilities.sum(axis=1), 1, atol=1e-5):
        sys.exit(f"model: {what}: probabilities do not sum to 1: {probabilities}")
    return probabilities


def main() -> None:
    batch = files()
    encoded = [[base64.b64encode(raw).decode()] for raw in batch]
    by_json = answers(
        httpx.post(f"{MODEL_URL}/invocations", timeout=TIMEOUT_S,
                   json={"dataframe_split": {"columns": ["image"], "data": encoded}}),
        "a PNG and a DICOM file, base64 in JSON",
    )  # fmt: skip
    table = io.BytesIO()
    pd.DataFrame({"image": batch}).to_parquet(table)
    by_parquet = answers(
        httpx.post(f"{MODEL_URL}/invocations", content=table.getvalue(), timeout=TIMEOUT_S,
                   headers={"Content-Type": "application/vnd.apache.parquet"}),
        "the same files as a Parquet table",
    )  # fmt: skip
    if not np.allclose(by_parquet, by_json, atol=1e-6):
        sys.exit(f"model: Parquet answers {by_parquet} differ from JSON's {by_json}")
    probe = httpx.post(
        f"{MODEL_URL}/invocations", timeout=TIMEOUT_S,
        json={"dataframe_split": {"columns": ["path"], "data": [["/etc/passwd"]]}},
    )  # fmt: skip
    reason = probe.json().get("message", "").splitlines()[-1:] if probe.content else []
    if probe.status_code != 400 or not reason or "no paths" not in reason[0]:
        sys.exit(f"model: a path on the server was not refused: HTTP {probe.status_code}: "
                 f"{probe.text[-500:]}")  # fmt: skip
    print(f"   model: PNG and DICOM answered alike in JSON and Parquet "
          f"(p(malignant) {by_json[0, 0]:.3f}, {by_json[1, 0]:.3f}); a path refused: "
          f"{reason[0]}")  # fmt: skip


if __name__ == "__main__":
    main()
