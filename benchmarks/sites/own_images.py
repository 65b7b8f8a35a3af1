"""Benchmark: reading a consortium's own image folder on CPU (not a test).

    python -m benchmarks.sites.own_images [--count 20000] [--png-count 20000] [--workdir DIR]
        [--keep] [--out benchmarks/results/own-images-cpu.json]

Writes ``count`` CT-like DICOM files (512x512, signed 16-bit, 12 or 16 bits stored,
Rescale Slope 1 / Intercept -1024, no window, explicit VR little endian) and ``png_count``
8-bit grey PNG files (512x512) with a ``labels.csv`` each into a temporary folder, then
measures on every core the process may use, with the files in the page cache (one
untimed pass reads them first):

- the floor: the library's own decode of every file in a process pool (pydicom's
  ``dcmread(path).pixel_array``, Pillow's ``Image.open(path).load()``), pool start included;
- the least work any reader of ours must do: read each file once, hash it (SHA-256),
  decode it with the library and resize it to 64 px (Pillow, values cast unscaled);
- the first read: ``load_own_images`` into an empty cache (decode, hash, scale to 64 px);
- the cached read: the same call again, which must hit the cache and give equal arrays.

Goals: the first read at >= 0.8 of the floor's images per second, and the cached read of
20,000 images in <= 5 s. Writes ``benchmarks/results/own-images-cpu.json``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from federated.data import DatasetInfo

# Heavy modules (torch, via benchmarks.common and federated.data) are imported inside the
# functions: spawned workers import this module again, and must start as the reader's do.

SOURCE_SIZE = 512
SIZE = 64
CLASSES = ("normal", "abnormal")
SPLITS = ("train", "val", "test")
SPLIT_SHARES = (0.7, 0.1, 0.2)
CHUNK = 32  # files a worker takes per message, as the reader's pool
FLOORS = {
    "dcm": "pydicom dcmread(path).pixel_array per file, spawn process pool, pool start included",
    "png": "Pillow Image.open(path).load() per file, spawn process pool, pool start included",
}
GOAL_RATIO = 0.8
GOAL_CACHED_S = 5.0


def ct_slice(rng: np.random.Generator) -> np.ndarray:
    """A CT-like slice in Hounsfield units: air, an elliptic body of soft tissue, a few
    Gaussian blobs (fat, organs, bone) and noise; float32 ``(512, 512)``."""
    axis = np.linspace(-1.0, 1.0, SOURCE_SIZE, dtype=np.float32)
    y, x = axis[:, None], axis[None, :]
    a, b = rng.uniform(0.6, 0.9, size=2)
    hu = np.where((x / a) ** 2 + (y / b) ** 2 <= 1.0, np.float32(40), np.float32(-1000))
    for _ in range(rng.integers(3, 9)):
        cy, cx = rng.uniform(-0.5, 0.5, size=2)
        sigma = rng.uniform(0.03, 0.2)
        gauss_y = np.exp(-((y - cy) ** 2) / (2 * sigma**2))
        gauss_x = np.exp(-((x - cx) ** 2) / (2 * sigma**2))
        hu = hu + np.float32(rng.uniform(-150, 900)) * gauss_y * gauss_x
    return hu + rng.normal(0.0, 15.0, hu.shape).astype(np.float32)


def write_ct(path: Path, hu: np.ndarray, bits_stored: int) -> None:
    """A CT slice as DICOM: stored = HU + 1024 (int16, within ``bits_stored`` signed
    bits), Rescale Slope 1 and Intercept -1024, no window, explicit VR little endian."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    top = 2 ** (bits_stored - 1) - 1
    stored = np.clip(np.round(hu + 1024), 0, top).astype(np.int16)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset = Dataset()
    dataset.file_meta = meta
    dataset.SOPClassUID = CTImageStorage
    dataset.Modality = "CT"
    dataset.set_pixel_data(stored, "MONOCHROME2", bits_stored)
    meta.MediaStorageSOPInstanceUID = dataset.SOPInstanceUID
    dataset.RescaleSlope, dataset.RescaleIntercept, dataset.RescaleType = 1, -1024, "HU"
    dataset.save_as(path, enforce_file_format=True)


def _write_png(path: Path, hu: np.ndarray) -> None:
    """A slice as an 8-bit grey PNG (soft-tissue window -160..240 HU)."""
    from PIL import Image

    grey = np.clip(np.round((hu + 160.0) * (255.0 / 400.0)), 0, 255).astype(np.uint8)
    Image.fromarray(grey).save(path)


def _write_one(job: tuple[str, str, int, int]) -> int:
    """Write file ``index`` of a folder (``kind``: dcm or png), seeded by ``(seed, index)``;
    its size in bytes."""
    folder, kind, seed, index = job
    rng = np.random.default_rng([seed, index])
    path = Path(folder) / f"{index:05d}.{kind}"
    if kind == "dcm":
        write_ct(path, ct_slice(rng), bits_stored=16 if index % 2 else 12)
    else:
        _write_png(path, ct_slice(rng))
    return path.stat().st_size


def _pool(workers: int) -> ProcessPoolExecutor:
    """Processes started by spawn, as the reader's."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def _generate(folder: Path, kind: str, count: int, seed: int, workers: int) -> list[Path]:
    """Write ``count`` files and ``labels.csv`` (random class, split) into ``folder``;
    the files' paths."""
    images = folder / "images"
    images.mkdir(parents=True)
    jobs = [(str(images), kind, seed, index) for index in range(count)]
    with _pool(workers) as pool:
        list(pool.map(_write_one, jobs, chunksize=CHUNK))
    rng = np.random.default_rng([seed, count])
    labels = rng.choice(CLASSES, size=count)
    splits = rng.choice(SPLITS, size=count, p=SPLIT_SHARES)
    files = [f"images/{index:05d}.{kind}" for index in range(count)]
    with (folder / "labels.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "label", "split"])
        writer.writerows(zip(files, labels, splits, strict=True))
    return [folder / file for file in files]


def _warm(files: list[Path]) -> int:
    """Read every file once (untimed), so the timed passes find them in the page cache;
    their total size in bytes."""
    return sum(len(file.read_bytes()) for file in files)


def _pydicom_decode(path: str) -> tuple[int, ...]:
    """pydicom's own decode of one file; only its shape goes back."""
    from pydicom import dcmread

    return tuple(dcmread(path).pixel_array.shape)


def _pillow_decode(path: str) -> tuple[int, ...]:
    """Pillow's own decode of one file; only its size goes back."""
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        return tuple(image.size)


def _hashed_and_resized(path: str) -> tuple[int, ...]:
    """The least any reader of ours must do with one file: read it once, take its SHA-256,
    decode it with the library, and resize it to the schema's size (Pillow, bilinear; its
    values cast to 8 bits unscaled); only the size goes back."""
    import hashlib
    import io

    from PIL import Image
    from pydicom import dcmread

    raw = Path(path).read_bytes()
    hashlib.sha256(raw).hexdigest()
    if path.endswith(".dcm"):
        image = Image.fromarray(dcmread(io.BytesIO(raw)).pixel_array.astype(np.uint8))
    else:
        image = Image.open(io.BytesIO(raw))
    return tuple(image.resize((SIZE, SIZE), Image.Resampling.BILINEAR).size)


def _floor_s(files: list[Path], decode: Callable[[str], tuple[int, ...]], workers: int) -> float:
    """Seconds for the library's own decode of every file on ``workers`` processes (the
    pool's start included, as the reader's is)."""
    start = time.perf_counter()
    with _pool(workers) as pool:
        shapes = set(pool.map(decode, map(str, files), chunksize=CHUNK))
    seconds = time.perf_counter() - start
    assert len(shapes) == 1, shapes
    return seconds


def _dataset_info() -> DatasetInfo:
    """The DatasetInfo params give for an own grey binary-class dataset at 64 px."""
    from config.dataset import dataset_info_of
    from config.params import validate_params

    own = {"path": "x", "task": "binary-class", "classes": list(CLASSES), "channels": 1}
    params = validate_params({"data": {"dataset": "own", "own": own, "size": SIZE}}, "bench")
    return dataset_info_of(params.data)


def _reads(folder: Path, cache: Path, info: DatasetInfo) -> dict[str, Any]:
    """Seconds for a first read into the empty ``cache`` and a second one from it, and
    whether the second gave the first's arrays."""
    from federated.own_data import Reading, load_own_images

    reading = Reading(cache=cache, workers=None, progress=False)
    start = time.perf_counter()
    first = load_own_images(folder, info, reading)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    cached = load_own_images(folder, info, reading)
    cached_s = time.perf_counter() - start
    equal = np.array_equal(first.images, cached.images) and first.sha256 == cached.sha256
    assert equal, "the cached read differs from the first read"
    assert first.images.shape[1:] == (SIZE, SIZE), first.images.shape
    return {"first_s": first_s, "cached_s": cached_s, "equal": equal}


def _measure(root: Path, kind: str, count: int, seed: int, workers: int) -> dict[str, Any]:
    """Generate a folder of ``count`` ``kind`` files, then time the floor, the first read
    and the cached read; the result's entries for that format."""
    start = time.perf_counter()
    files = _generate(root / kind, kind, count, seed, workers)
    generation_s = time.perf_counter() - start
    file_bytes = _warm(files)
    decode = _pydicom_decode if kind == "dcm" else _pillow_decode
    floor_s = _floor_s(files, decode, workers)
    work_floor_s = _floor_s(files, _hashed_and_resized, workers)
    reads = _reads(root / kind, root / f"cache-{kind}", _dataset_info())
    floor, first = count / floor_s, count / reads["first_s"]
    return {
        "count": count,
        "file_bytes": file_bytes,
        "generation_s": round(generation_s, 2),
        "page_cache": "warm",
        "floor": FLOORS[kind],
        "decode_floor_s": round(floor_s, 3),
        "decode_floor_images_per_s": round(floor, 1),
        "hash_decode_resize_floor_images_per_s": round(count / work_floor_s, 1),
        "ratio_first_read_to_hash_decode_resize_floor": round(first * work_floor_s / count, 3),
        "first_read_s": round(reads["first_s"], 3),
        "first_read_images_per_s": round(first, 1),
        "cached_read_s": round(reads["cached_s"], 3),
        "cached_equal_first": reads["equal"],
        "ratio_first_read_to_floor": round(first / floor, 3),
        "goal_ratio": GOAL_RATIO,
        "goal_cached_read_s": GOAL_CACHED_S,
        "meets_ratio": first / floor >= GOAL_RATIO,
        "meets_cached": reads["cached_s"] <= GOAL_CACHED_S,
    }


def _environment() -> dict[str, Any]:
    """The date, machine and library versions a result records."""
    import PIL
    import pydicom

    from benchmarks.common import cpu_device, versions

    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": cpu_device(),
        "versions": versions(pydicom=pydicom.__version__, pillow=PIL.__version__),
    }


def _summary(name: str, result: dict[str, Any]) -> str:
    """One line of a format's numbers for the console."""
    return (
        f"{name}: {result['count']} files, {result['file_bytes'] / 1e9:.2f} GB; floor "
        f"{result['decode_floor_images_per_s']:.0f}/s, first read "
        f"{result['first_read_images_per_s']:.0f}/s (ratio {result['ratio_first_read_to_floor']}"
        f" [{'met' if result['meets_ratio'] else 'MISSED'}]), cached {result['cached_read_s']} s "
        f"[{'met' if result['meets_cached'] else 'MISSED'}]"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="DICOM files")
    parser.add_argument("--png-count", type=int, default=20_000, help="PNG files")
    parser.add_argument("--workdir", type=Path, default=None, help="where the temp folder goes")
    parser.add_argument("--keep", action="store_true", help="keep the generated folders")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/own-images-cpu.json"))
    args = parser.parse_args(argv)

    cores = len(os.sched_getaffinity(0))
    root = Path(tempfile.mkdtemp(prefix="own-images-", dir=args.workdir))
    load_before = os.getloadavg()
    try:
        dicom = _measure(root, "dcm", args.count, args.seed, cores)
        png = _measure(root, "png", args.png_count, args.seed + 1, cores)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    from federated.own_data import Reading

    report = {
        "benchmark": "own_images",
        "command": " ".join(["python -m benchmarks.sites.own_images", *(argv or sys.argv[1:])]),
        **_environment(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "size": SIZE,
        "source_size": SOURCE_SIZE,
        "cores": cores,
        "workers": Reading().workers_for(args.count),
        "dicom": "CT, int16, bits stored 12 and 16 alternating, slope 1, intercept -1024, "
        "no window, explicit VR little endian, uncompressed",
        **dicom,
        "png": png,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(_summary("DICOM", dicom))
    print(_summary("PNG", png))
    print(f"{'kept' if args.keep else 'removed'} {root}; wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
