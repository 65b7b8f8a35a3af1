"""Benchmark: reading a folder of CT series on CPU (not a test).

    nice -n 10 python -m benchmarks.speed.volume_read [--count 500] [--slices 64]
        [--source-size 256] [--workers 2] [--repeats 2] [--workdir DIR] [--keep]
        [--data DIR] [--out benchmarks/results/volume-read-cpu.json]

Writes ``count`` CT series (``slices`` slices of ``source_size``² pixels each, unsigned
16-bit, Rescale Intercept -1024, no window; a CT-like phantom: air, an elliptic body,
Gaussian organs and bone, noise) with pydicom, one series a folder, the encodings an
archive exports taken in turn (:data:`ENCODINGS`), and a ``labels.csv`` naming the
folders; then, with the files in the page cache (one untimed pass reads them first) and
on ``workers`` processes:

- the floor: the cheapest honest pipeline doing the same work, a series a task in a
  spawn process pool (pool start included, as the reader's): read each file once, hash
  it (SHA-256), decode it (pydicom's ``pixel_array``, its plugins for the compressed
  ones), stack the slices, resample to the schema's shape (torch trilinear) and map the
  volume's own range to uint8;
- the first read: ``load_own_images`` into an empty cache, the code a training run reads
  a folder with (parallel decoding, the content-keyed cache, the progress bar, the
  geometry checks, the modality LUT and the intensity policy, RAS+ orientation);
- floor and first read interleaved ``repeats`` times (their order alternating), as the
  machine is shared: each pair's ratio is reported, and the figure is the least
  favourable pair's (a load that falls during a pair flatters the pass that ran second);
- the cached read: the same call again, which must hit the cache and give the first
  read's arrays.

Goals: the first read at >= 0.8 of the floor's volumes per second, the cached read in
<= 5 s. The folder is written under a temporary directory (``--workdir``) and deleted
after (``--data DIR``: written there, reused by a later run, and kept). Writes
``benchmarks/results/volume-read-cpu.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from federated.data import DatasetInfo

# Heavy modules (torch, pydicom, the reader) are imported inside the functions: spawned
# workers import this module again, and must start as the reader's do.

SIZE = 64
SPACING = (2.5, 0.8, 0.8)  # mm between slices, rows, columns: a usual abdominal CT
CLASSES = ("normal", "abnormal")
SPLITS = ("train", "val", "test")
SPLIT_SHARES = (0.7, 0.1, 0.2)
# What pydicom (with its installed plugins) encodes, in turn; the name a record gives each.
ENCODINGS = {
    "1.2.840.10008.1.2.1": "Explicit VR Little Endian",
    "1.2.840.10008.1.2": "Implicit VR Little Endian",
    "1.2.840.10008.1.2.1.99": "Deflated Explicit VR Little Endian",
    "1.2.840.10008.1.2.5": "RLE Lossless (pylibjpeg-rle)",
    "1.2.840.10008.1.2.4.90": "JPEG 2000 Lossless (pylibjpeg-openjpeg)",
}
# Archive encodings this machine cannot write, and why (they are read: docs/data.md).
NOT_WRITTEN = {
    "1.2.840.10008.1.2.4.70": "JPEG Lossless: neither pydicom nor an installed plugin encodes it",
    "1.2.840.10008.1.2.4.57": "JPEG Lossless (process 14): no encoder installed",
    "1.2.840.10008.1.2.4.80": "JPEG-LS Lossless: pydicom encodes it only with pyjpegls, not "
    "installed",
    "1.2.840.10008.1.2.4.50": "JPEG Baseline: 8-bit only, no encoder in pydicom for a 16-bit CT",
}
GOAL_RATIO = 0.8
GOAL_CACHED_S = 5.0
FLOOR = (
    "per series in a spawn pool (start included): read each file once, SHA-256, pydicom "
    "pixel_array, stack, torch trilinear to the schema's shape, own range to uint8"
)


def phantom(rng: np.random.Generator, slices: int, size: int) -> np.ndarray:
    """A CT-like volume's stored values ``(D, H, W)`` uint16 (Hounsfield units + 1024):
    air, an elliptic body of soft tissue, a few Gaussian organs or bones, noise."""
    z = np.linspace(-1.0, 1.0, slices, dtype=np.float32)[:, None, None]
    y = np.linspace(-1.0, 1.0, size, dtype=np.float32)[None, :, None]
    x = np.linspace(-1.0, 1.0, size, dtype=np.float32)[None, None, :]
    a, b = rng.uniform(0.6, 0.9, size=2)
    hu = np.where((x / a) ** 2 + (y / b) ** 2 <= 1.0, np.float32(40), np.float32(-1000))
    hu = np.broadcast_to(hu, (slices, size, size)).copy()
    for _ in range(int(rng.integers(3, 8))):
        cz, cy, cx = rng.uniform(-0.5, 0.5, size=3)
        sigma = np.float32(rng.uniform(0.05, 0.25))
        blob = (
            np.exp(-((z - cz) ** 2) / (2 * sigma**2))
            * np.exp(-((y - cy) ** 2) / (2 * sigma**2))
            * np.exp(-((x - cx) ** 2) / (2 * sigma**2))
        )
        hu += np.float32(rng.uniform(-150, 900)) * blob
    hu += rng.normal(0.0, 15.0, hu.shape).astype(np.float32)
    return np.clip(np.round(hu + 1024), 0, 4095).astype(np.uint16)


def _write_one(job: tuple[str, int, int, int, int, str]) -> int:
    """Write series ``index`` (seeded by ``(seed, index)``) in ``syntax``; its bytes."""
    from federated.volume_writers import write_series

    folder, seed, index, slices, size, syntax = job
    rng = np.random.default_rng([seed, index])
    path = write_series(Path(folder), phantom(rng, slices, size), SPACING, syntax=syntax)
    return sum(file.stat().st_size for file in path.iterdir())


def _pool(workers: int) -> ProcessPoolExecutor:
    """Processes started by spawn, as the reader's."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def _generate(folder: Path, count: int, slices: int, size: int, seed: int, workers: int) -> int:
    """Write ``count`` series (encodings in turn) and ``labels.csv``; their total bytes. A
    series folder already holding its ``slices`` files (a ``--data`` folder written by an
    interrupted run) is kept as it is."""
    syntaxes = list(ENCODINGS)
    names = [f"series/{index:05d}" for index in range(count)]
    kept = {name for name in names if len(list((folder / name).glob("*.dcm"))) == slices}
    total = sum(file.stat().st_size for name in kept for file in (folder / name).iterdir())
    jobs = [
        (str(folder / name), seed, index, slices, size, syntaxes[index % len(syntaxes)])
        for index, name in enumerate(names)
        if name not in kept
    ]
    with _pool(workers) as pool:
        total += sum(pool.map(_write_one, jobs))
    rng = np.random.default_rng([seed, count])
    labels = rng.choice(CLASSES, size=count)
    splits = rng.choice(SPLITS, size=count, p=SPLIT_SHARES)
    with (folder / "labels.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "label", "split"])
        writer.writerows(zip([f"{n}/" for n in names], labels, splits, strict=True))
    return total


def _warm(folder: Path) -> int:
    """Read every slice once (untimed), so the timed passes find them in the page cache;
    the number of files."""
    files = [file for file in (folder / "series").rglob("*.dcm")]
    for file in files:
        file.read_bytes()
    return len(files)


def _target_shape(slices: int, size: int) -> tuple[int, int, int]:
    """The shape the schema's isotropic spacing gives the series (longest side ``SIZE``)."""
    extent = np.array([slices, size, size], dtype=np.float64) * np.array(SPACING)
    lengths = np.clip(np.round(extent * SIZE / extent.max()), 1, SIZE).astype(int)
    return (int(lengths[0]), int(lengths[1]), int(lengths[2]))


def _floor_volume(job: tuple[str, tuple[int, int, int]]) -> np.ndarray:
    """The cheapest honest read of one series: every file read once, hashed and decoded,
    the slices stacked (in file order: the writer named them by position), resampled to
    ``target`` and mapped from the volume's range to uint8."""
    import hashlib
    import io

    import torch
    from pydicom import dcmread
    from torch.nn.functional import interpolate

    folder, target = job
    digest = hashlib.sha256()
    slices = []
    for file in sorted(Path(folder).iterdir()):
        raw = file.read_bytes()
        digest.update(hashlib.sha256(raw).digest())
        slices.append(dcmread(io.BytesIO(raw)).pixel_array)
    volume = torch.from_numpy(np.stack(slices).astype(np.float32))[None, None]
    resampled = interpolate(volume, size=target, mode="trilinear", align_corners=False)[0, 0]
    low, high = float(volume.min()), float(volume.max())
    scaled = (resampled - low) * (255.0 / max(high - low, 1e-6))
    return scaled.round_().clamp_(0, 255).to(torch.uint8).numpy()


def _floor_s(folder: Path, count: int, target: tuple[int, int, int], workers: int) -> float:
    """Seconds for the floor over every series on ``workers`` processes, into one array."""
    jobs = [(str(folder / f"series/{index:05d}"), target) for index in range(count)]
    out = np.zeros((count, SIZE, SIZE, SIZE), dtype=np.uint8)
    start = time.perf_counter()
    with _pool(workers) as pool:
        for index, volume in enumerate(pool.map(_floor_volume, jobs)):
            out[index, : target[0], : target[1], : target[2]] = volume
    return time.perf_counter() - start


def _dataset_info() -> DatasetInfo:
    """The DatasetInfo params give for own CT volumes at ``SIZE`` voxels (isotropic)."""
    from config.dataset import dataset_info_of
    from config.params import validate_params

    own = {
        "path": "x",
        "task": "binary-class",
        "classes": list(CLASSES),
        "channels": 1,
        "spatial_dims": 3,
    }
    params = validate_params(
        {"data": {"dataset": "ct", "own": own, "size": SIZE}, "model": {"name": "small_cnn3d"}},
        "bench",
    )
    return dataset_info_of(params.data)


def _read(folder: Path, cache: Path, info: DatasetInfo, workers: int) -> tuple[float, Any]:
    """Seconds for ``load_own_images`` with ``cache`` (a progress bar on stderr), and what
    it read."""
    from federated.own_data import Reading, load_own_images

    start = time.perf_counter()
    data = load_own_images(folder, info, Reading(cache=cache, workers=workers, progress=True))
    return time.perf_counter() - start, data


def measure(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Write the folder, then time floor and first read interleaved, then the cached read."""
    folder = args.data or root / "ct"
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    file_bytes = _generate(
        folder, args.count, args.slices, args.source_size, args.seed, args.workers
    )
    generation_s = time.perf_counter() - start
    files = _warm(folder)
    info = _dataset_info()
    target = _target_shape(args.slices, args.source_size)
    pairs = []
    first = None
    for repeat in range(args.repeats):
        cache = root / f"cache-{repeat}"
        order = ("floor", "read") if repeat % 2 == 0 else ("read", "floor")
        pair: dict[str, float] = {}
        for what in order:
            if what == "floor":
                pair["floor_s"] = _floor_s(folder, args.count, target, args.workers)
            else:
                pair["first_read_s"], first = _read(folder, cache, info, args.workers)
            print(f"repeat {repeat}: {what} done ({pair})", file=sys.stderr)
        pair["ratio"] = pair["floor_s"] / pair["first_read_s"]
        pairs.append(pair)
    assert first is not None
    cached_s, cached = _read(folder, root / f"cache-{args.repeats - 1}", info, args.workers)
    equal = np.array_equal(first.images, cached.images) and first.sha256 == cached.sha256
    assert equal, "the cached read differs from the first read"
    assert first.images.shape == (args.count, SIZE, SIZE, SIZE), first.images.shape
    floor_s = statistics.median(p["floor_s"] for p in pairs)
    first_s = statistics.median(p["first_read_s"] for p in pairs)
    ratio = min(p["ratio"] for p in pairs)  # the least favourable pair: load only drifts
    return {
        "count": args.count,
        "slices": args.slices,
        "source_size": args.source_size,
        "files": files,
        "file_bytes": file_bytes,
        "spacing_mm": list(SPACING),
        "resampled_shape": list(target),
        "generation_s": round(generation_s, 1),
        "page_cache": "warm",
        "floor": FLOOR,
        "pairs": [{k: round(v, 3) for k, v in pair.items()} for pair in pairs],
        "floor_s": round(floor_s, 2),
        "floor_volumes_per_s": round(args.count / floor_s, 2),
        "first_read_s": round(first_s, 2),
        "first_read_volumes_per_s": round(args.count / first_s, 2),
        "ratio_first_read_to_floor": round(ratio, 3),
        "cached_read_s": round(cached_s, 3),
        "cached_equal_first": equal,
        "goal_ratio": GOAL_RATIO,
        "goal_cached_read_s": GOAL_CACHED_S,
        "meets_ratio": ratio >= GOAL_RATIO,
        "meets_cached": cached_s <= GOAL_CACHED_S,
    }


def _environment() -> dict[str, Any]:
    """The date, machine and library versions a result records."""
    import nibabel
    import pydicom

    from benchmarks.common import cpu_device, versions

    plugins = {}
    for name in ("pylibjpeg", "libjpeg", "openjpeg", "rle"):
        try:
            plugins[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            plugins[name] = None
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": cpu_device(),
        "versions": versions(pydicom=pydicom.__version__, nibabel=nibabel.__version__, **plugins),
    }


def markdown(report: dict[str, Any]) -> str:
    """The record as a short Markdown table (written beside the JSON)."""
    lines = [
        f"# Reading {report['count']} CT series ({report['slices']} slices of "
        f"{report['source_size']}² each) to {SIZE}³",
        "",
        f"`{report['command']}` on {report['workers']} workers.",
        "",
        "| pass | floor (s) | first read (s) | ratio |",
        "|---|---|---|---|",
        *(
            f"| {i} | {p['floor_s']} | {p['first_read_s']} | {p['ratio']} |"
            for i, p in enumerate(report["pairs"])
        ),
        "",
        f"- floor: {report['floor_volumes_per_s']} volumes/s ({report['floor']})",
        f"- first read (`load_own_images`): {report['first_read_volumes_per_s']} volumes/s",
        f"- ratio (the least favourable pair): {report['ratio_first_read_to_floor']} "
        f"(goal >= {GOAL_RATIO})",
        f"- cached read: {report['cached_read_s']} s (goal <= {GOAL_CACHED_S} s), arrays equal: "
        f"{report['cached_equal_first']}",
        f"- encodings written in turn: {', '.join(report['encodings'].values())}",
        "- not written (no encoder here): " + "; ".join(report["not_written"].values()),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=500, help="series")
    parser.add_argument("--slices", type=int, default=64, help="slices a series")
    parser.add_argument("--source-size", type=int, default=256, help="pixels a side")
    parser.add_argument("--workers", type=int, default=2, help="processes decoding")
    parser.add_argument("--repeats", type=int, default=2, help="floor / first-read pairs")
    parser.add_argument("--workdir", type=Path, default=None, help="where the temp folder goes")
    parser.add_argument("--keep", action="store_true", help="keep the generated folder")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="write the series here instead, reusing complete ones (kept afterwards)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/volume-read-cpu.json"))
    args = parser.parse_args(argv)
    for name in ("count", "slices", "source_size", "workers", "repeats"):
        if getattr(args, name) < (2 if name == "slices" else 1):
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}; must be positive")

    root = Path(tempfile.mkdtemp(prefix="volume-read-", dir=args.workdir))
    load_before = os.getloadavg()
    try:
        measured = measure(root, args)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    report = {
        "benchmark": "volume_read",
        "command": " ".join(["python -m benchmarks.speed.volume_read", *(argv or sys.argv[1:])]),
        **_environment(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "size": SIZE,
        "workers": args.workers,
        "encodings": ENCODINGS,
        "not_written": NOT_WRITTEN,
        **measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(
        f"{report['count']} series: floor {report['floor_volumes_per_s']}/s, first read "
        f"{report['first_read_volumes_per_s']}/s, ratio {report['ratio_first_read_to_floor']} "
        f"[{'met' if report['meets_ratio'] else 'MISSED'}], cached {report['cached_read_s']} s "
        f"[{'met' if report['meets_cached'] else 'MISSED'}]"
    )
    print(f"{'kept' if args.keep else 'removed'} {root}; wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
