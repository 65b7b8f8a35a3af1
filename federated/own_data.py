"""A consortium's own images: a folder with a label table, or an ``.npz`` in MedMNIST's layout.

A folder holds ``labels.csv`` with the columns ``file`` (a path relative to the folder) and
``label``, and optionally ``split`` (``train``, ``val`` or ``test``). Images are PNG, JPEG,
BMP or TIFF (Pillow) or DICOM in any encoding pydicom's plugins decode, each brought to the
dataset's declared schema by :mod:`federated.image_files` (channels, size, the intensity
policy), stored as uint8 like MedMNIST and normalised when it becomes a tensor
(``(x / 255 - mean) / std``).

With a volume schema (``DatasetInfo.spatial_dims`` 3) a row names one volume instead: a
NIfTI file, a multi-frame DICOM or a folder holding one DICOM series, read by
:mod:`federated.volume_files` into uint8 ``(S, S, S)``; a series folder's digest covers
every slice file.

A label is a class name of the schema or its index; a multi-label row lists them joined
by ``;`` (an empty cell: no label). Anything that cannot be read is named in one line
(:class:`~federated.data.DataError`): the table row, the file and why.

A large folder is decoded in parallel, one file at a time per process, and kept in an
:class:`~federated.image_cache.ImageCache` when the caller names one (:class:`Reading`).
A folder is fingerprinted: the SHA-256 of the table and of every file's SHA-256, in table
order, so a run can record which data it saw and notice a folder changed since its
partition.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import multiprocessing
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from federated.data import DataError, DatasetInfo, MedMNISTData, Split
from federated.image_cache import CachedImages, ImageCache
from federated.image_files import (
    IMAGE_SUFFIXES,
    ImageFileError,
    ImageSchema,
    decode_file,
    decode_or_refuse,
)
from federated.volume_files import VolumeSchema, decode_volume_or_refuse, volume_stamp

__all__ = [
    "IMAGE_SUFFIXES",
    "TABLE",
    "DecodedFiles",
    "LabelledImages",
    "Reading",
    "decode_files",
    "load_own_dataset",
    "load_own_images",
    "read_image",
    "size_note",
    "write_image_folder",
]

TABLE = "labels.csv"
SPLIT_NAMES = ("train", "val", "test")
HOLDOUT = {"val": 0.1, "test": 0.2}  # a table without a split column, split seeded
PARALLEL_FROM = 256  # files: a smaller folder decodes faster than processes start
VOLUMES_PARALLEL_FROM = 32  # volumes: a worker starts in seconds (torch resamples)
CHUNK = 32  # files a worker decodes per message


@dataclass(frozen=True)
class Reading:
    """How a folder is read: ``cache`` (a folder for decoded images; None: no cache),
    ``workers`` (processes decoding; None: every core the process may use, for a folder
    of ``PARALLEL_FROM`` files or more) and ``progress`` (a bar on stderr)."""

    cache: Path | None = None
    workers: int | None = None
    progress: bool = False

    def workers_for(self, count: int, parallel_from: int = PARALLEL_FROM) -> int:
        if self.workers is not None:
            return max(1, min(self.workers, count))
        return len(os.sched_getaffinity(0)) if count >= parallel_from else 1


@dataclass(frozen=True)
class LabelledImages:
    """Every row of a dataset: uint8 images ``(N, H, W[, 3])``, labels ``(N, L)``, each
    row's split (``None`` when the table names none), and the data's SHA-256."""

    images: np.ndarray
    labels: np.ndarray
    splits: np.ndarray | None
    sha256: str
    source_sizes: np.ndarray | None = None  # (N, 2): each image's height, width as read

    def resized(self, size: int) -> dict[str, int]:
        """How many images were resized to ``size``, by their size as read (``"32x32"``),
        most frequent first; empty when every image was read at ``size``."""
        return {} if self.source_sizes is None else resized_counts(self.source_sizes, size)

    def size_note(self, size: int) -> str | None:
        """One line on the images resized to ``size`` (by their size as read), a warning
        when the folder mixes sizes; None when every image was read at ``size``."""
        return None if self.source_sizes is None else size_note(self.source_sizes, size)

    def split(self, name: str) -> Split:
        """The rows of one split; every row is ``train`` when the table names none."""
        if self.splits is None:
            rows = np.arange(len(self.labels)) if name == "train" else np.arange(0)
        else:
            rows = np.flatnonzero(self.splits == name)
        return Split(images=self.images[rows], labels=self.labels[rows])


def resized_counts(source_sizes: np.ndarray, size: int) -> dict[str, int]:
    """How many of the images read at ``source_sizes`` ``(N, 2)`` were resized to ``size``,
    by their size as read (``"32x32"``), most frequent first."""
    found: dict[str, int] = {}
    for shape in np.asarray(source_sizes).tolist():
        if any(length != size for length in shape):
            read = "x".join(map(str, shape))
            found[read] = found.get(read, 0) + 1
    return dict(sorted(found.items(), key=lambda item: -item[1]))


def size_note(source_sizes: np.ndarray, size: int, *, of: int | None = None) -> str | None:
    """One line on the images resized to ``size`` (``of``: out of how many, when the
    reader should hear it), a warning when they were read at mixed sizes; None when every
    image was read at ``size``. The site's data check and ``fedsieve predict`` say it."""
    resized = resized_counts(source_sizes, size)
    if not resized:
        return None
    counts = ", ".join(f"{count} from {read}" for read, count in resized.items())
    total = sum(resized.values()) if of is None else f"{sum(resized.values())} of {of}"
    dims = np.asarray(source_sizes).shape[1]
    kind = "volumes resampled" if dims == 3 else "images resized"
    note = f"{total} {kind} to {'x'.join([str(size)] * dims)} ({counts})"
    if len(np.unique(np.asarray(source_sizes), axis=0)) > 1:
        things = "volumes" if dims == 3 else "images"
        note += f"; warning: the {things} have mixed sizes, often the sign of a wrong export"
    return note


def load_own_images(
    path: Path | str, info: DatasetInfo, reading: Reading = Reading()
) -> LabelledImages:
    """Read a folder (its ``labels.csv``), a label table's path, or an ``.npz`` in
    MedMNIST's layout, checked against ``info``'s schema; a folder as ``reading`` says."""
    path = Path(path)
    if path.suffix == ".npz":
        return _load_npz(path, info)
    table = path if path.suffix == ".csv" else path / TABLE
    if not table.is_file():
        raise DataError(
            f"{path}: no {TABLE} here; own data is a folder with {TABLE} (columns file, "
            "label[, split]) or an .npz in MedMNIST's layout"
        )
    return _load_folder(table, info, reading)


def load_own_dataset(
    path: Path | str, info: DatasetInfo, *, seed: int = 0, reading: Reading = Reading()
) -> MedMNISTData:
    """A simulation's dataset: the table's ``split`` column, or (without one) a seeded
    split of 70 % train, 10 % validation and 20 % test, stratified for single-label tasks."""
    data = load_own_images(path, info, reading)
    if data.splits is None:
        data = _seeded_splits(data, info.multi_label, seed)
    splits = {name: data.split(name) for name in SPLIT_NAMES}
    if not len(splits["train"]):
        raise DataError(f"{path}: no train rows; a dataset needs images to train on")
    note = data.size_note(info.size)
    return MedMNISTData(info=info, **splits, sha256=data.sha256, notes=(note,) if note else ())


def _seeded_splits(data: LabelledImages, multi_label: bool, seed: int) -> LabelledImages:
    from sklearn.model_selection import train_test_split

    rows = np.arange(len(data.labels))
    stratify = None if multi_label else data.labels[:, 0]
    try:
        rest, test = train_test_split(
            rows, test_size=HOLDOUT["test"], stratify=stratify, random_state=seed
        )
        share = HOLDOUT["val"] / (1 - HOLDOUT["test"])
        _, val = train_test_split(
            rest, test_size=share, stratify=None if stratify is None else stratify[rest],
            random_state=seed,
        )  # fmt: skip
    except ValueError as error:  # too few images of a class to stratify
        raise DataError(
            f"cannot split {len(rows)} images into train/val/test ({error}); give the table "
            "a split column"
        ) from None
    splits = np.full(len(rows), "train", dtype=object)
    splits[test], splits[val] = "test", "val"
    return LabelledImages(data.images, data.labels, splits, data.sha256, data.source_sizes)


def _load_folder(table: Path, info: DatasetInfo, reading: Reading) -> LabelledImages:
    """The table's rows: labels and splits checked first, then every image decoded (in
    parallel over ``reading.workers`` processes for a large folder) or taken from the
    cache when the data and the schema are those it was decoded from."""
    table = table.resolve()
    rows = _read_table(table)
    at_row = [f"{table}, row {number}" for number, _ in rows]
    labels = np.stack(
        [_parse_label(row["label"], info, at) for (_, row), at in zip(rows, at_row, strict=True)]
    )
    splits = None
    if "split" in rows[0][1]:
        splits = np.array(
            [_parse_split(row["split"], at) for (_, row), at in zip(rows, at_row, strict=True)],
            dtype=object,
        )
    where = [f"{at}: {row['file']}" for (_, row), at in zip(rows, at_row, strict=True)]
    files = [table.parent / row["file"] for _, row in rows]
    table_bytes = table.read_bytes()
    schema = info.volume_schema() if info.is_volume else info.image_schema()
    cache = ImageCache(reading.cache) if reading.cache is not None else None
    stats = [_stat(file, place) for file, place in zip(files, where, strict=True)]
    if cache is not None and (digests := cache.known_digests(table, files, stats)) is not None:
        sha256 = _data_digest(table_bytes, digests)
        hit = cache.load(cache.entry_key(sha256, schema.key()))
        if hit is not None and len(hit.images) == len(files):
            return LabelledImages(hit.images, labels, splits, sha256, hit.source_sizes)
    decoded = decode_files(files, where, schema, reading)
    sha256 = _data_digest(table_bytes, decoded.digests)
    if cache is not None:
        entry = CachedImages(decoded.images, decoded.source_sizes)
        cache.store(cache.entry_key(sha256, schema.key()), entry)
        cache.remember_digests(table, files, stats, decoded.digests)
    return LabelledImages(decoded.images, labels, splits, sha256, decoded.source_sizes)


def _stat(file: Path, where: str) -> tuple[int, int]:
    """A file's size and modification time (a series folder's: :func:`volume_stamp`),
    taken once and before it is read (a file changed while it is read is hashed again next
    time); a missing file named."""
    try:
        return volume_stamp(file)
    except OSError as error:
        raise DataError(f"{where}: {error.strerror or error}") from None


def _data_digest(table_bytes: bytes, file_digests: list[str]) -> str:
    """The data's SHA-256: of the table and of every file's SHA-256, in table order."""
    digest = hashlib.sha256(table_bytes)
    for file_digest in file_digests:
        digest.update(bytes.fromhex(file_digest))
    return digest.hexdigest()


def _read_table(table: Path) -> list[tuple[int, dict[str, str]]]:
    """The table's rows (numbered as a spreadsheet shows them), its columns checked."""
    try:
        with table.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            rows = [(number, row) for number, row in enumerate(reader, start=2)]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"{table}: not a readable CSV table ({error})") from None
    missing = [c for c in ("file", "label") if c not in columns]
    unknown = [c for c in columns if c not in ("file", "label", "split")]
    if missing or unknown:
        raise DataError(
            f"{table}: columns are {', '.join(columns) or 'none'}; expected file, label and "
            "optionally split"
        )
    if not rows:
        raise DataError(f"{table}: no rows; list one image a row (file, label[, split])")
    seen: dict[str, int] = {}
    for number, row in rows:
        if row["file"] in seen:
            raise DataError(
                f"{table}, row {number}: {row['file']} is listed again (first on row "
                f"{seen[row['file']]})"
            )
        seen[row["file"]] = number
    return rows


def read_image(file: Path, info: DatasetInfo) -> np.ndarray:
    """One image file as uint8 ``(size, size)`` or ``(size, size, 3)`` in ``info``'s schema
    (a file it cannot read: a DataError saying why; the caller names the file)."""
    try:
        return decode_file(file, info.image_schema()).pixels
    except ImageFileError as error:
        raise DataError(str(error)) from None


@dataclass(frozen=True)
class DecodedFiles:
    """A folder's images in table order (uint8), their sizes before resizing
    ``(N, 2)``, and each file's SHA-256."""

    images: np.ndarray
    source_sizes: np.ndarray
    digests: list[str]


def decode_files(
    files: list[Path], where: list[str], schema: ImageSchema | VolumeSchema, reading: Reading
) -> DecodedFiles:
    """Decode ``files`` (a :class:`VolumeSchema`: volumes, a folder a series) into one
    uint8 array, one file at a time per process (never the whole folder as float), in
    parallel when the folder is large. Every file that cannot be read is found before the
    error names the first of them (``where``) and counts the rest."""
    count = len(files)
    if isinstance(schema, VolumeSchema):
        decode: Any = decode_volume_or_refuse
        workers = reading.workers_for(count, VOLUMES_PARALLEL_FROM)
        shape = (count, schema.size, schema.size, schema.size)
    else:
        decode = decode_or_refuse
        workers = reading.workers_for(count)
        shape = (count, schema.size, schema.size) + ((3,) if schema.channels == 3 else ())
    images = np.empty(shape, dtype=np.uint8)
    source_sizes = np.empty((count, 3 if isinstance(schema, VolumeSchema) else 2), dtype=np.int64)
    digests: list[str] = []
    refused: list[str] = []
    pool = None
    if workers > 1:
        context = multiprocessing.get_context("spawn")  # no fork of a threaded process
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
    try:
        jobs = itertools.repeat(schema)
        chunk = 1 if isinstance(schema, VolumeSchema) else CHUNK
        results = (
            pool.map(decode, files, jobs, chunksize=chunk)
            if pool is not None
            else map(decode, files, jobs)
        )
        unit = "volume" if isinstance(schema, VolumeSchema) else "image"
        for index, result in enumerate(_progress(results, count, reading.progress, unit)):
            if isinstance(result, str):
                refused.append(f"{where[index]}: {result}")
                digests.append("")
                continue
            images[index], source_sizes[index] = result.pixels, result.source_size
            digests.append(result.sha256)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    if refused:
        more = f" (and {len(refused) - 1} more unreadable files)" if len(refused) > 1 else ""
        raise DataError(refused[0] + more)
    return DecodedFiles(images, source_sizes, digests)


def _progress(results: Iterable[Any], count: int, shown: bool, unit: str) -> Iterable[Any]:
    """``results``, with a progress bar (rate and time left) on stderr when ``shown``."""
    if not shown:
        return results
    from tqdm import tqdm

    return tqdm(results, total=count, desc=f"reading {unit}s", unit=unit)


def _parse_label(cell: str, info: DatasetInfo, where: str) -> np.ndarray:
    """A row's label as ``(1,)`` (a class index) or ``(L,)`` (0/1 per label)."""
    tokens = [t.strip() for t in (cell or "").split(";") if t.strip()]
    if info.multi_label:
        row = np.zeros(info.n_classes, dtype=np.int64)
        row[[_class_index(t, info, where) for t in tokens]] = 1
        return row
    if len(tokens) != 1:
        raise DataError(f"{where}: label {cell!r}; a {info.task} dataset has one class per image")
    return np.array([_class_index(tokens[0], info, where)], dtype=np.int64)


def _class_index(token: str, info: DatasetInfo, where: str) -> int:
    if token in info.labels:
        return info.labels.index(token)
    if token.isdigit() and int(token) < info.n_classes:
        return int(token)
    raise DataError(
        f"{where}: label {token!r} is not a class; allowed: "
        f"{', '.join(repr(label) for label in info.labels)} (or 0..{info.n_classes - 1})"
    )


def _parse_split(cell: str, where: str) -> str:
    if cell not in SPLIT_NAMES:
        raise DataError(f"{where}: split {cell!r}; allowed: {', '.join(SPLIT_NAMES)}")
    return cell


def _load_npz(path: Path, info: DatasetInfo) -> LabelledImages:
    """An ``.npz`` in MedMNIST's layout (``<split>_images``, ``<split>_labels``; train
    required, val and test optional), checked against the schema."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except Exception as error:  # missing, not a zip, truncated, pickled objects
        raise DataError(
            f"{path}: not a readable .npz of arrays ({type(error).__name__}); expected "
            "MedMNIST's layout: train_images, train_labels[, val_*, test_*]"
        ) from None
    if "train_images" not in arrays or "train_labels" not in arrays:
        raise DataError(f"{path}: no train_images and train_labels (MedMNIST's layout)")
    expected = info.stored_shape
    images, labels, splits = [], [], []
    for name in SPLIT_NAMES:
        if f"{name}_images" not in arrays:
            continue
        split_images = arrays[f"{name}_images"]
        if split_images.dtype != np.uint8 or split_images.shape[1:] != expected:
            raise DataError(
                f"{path}: {name}_images is {split_images.dtype} {split_images.shape}; the schema "
                f"takes uint8 (N, {', '.join(map(str, expected))})"
            )
        split_labels = _npz_labels(
            arrays.get(f"{name}_labels"), len(split_images), info, path, name
        )
        images.append(split_images)
        labels.append(split_labels)
        splits += [name] * len(split_images)
    return LabelledImages(
        images=np.concatenate(images),
        labels=np.concatenate(labels),
        splits=np.array(splits, dtype=object),
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
    )


def _npz_labels(
    labels: np.ndarray | None, count: int, info: DatasetInfo, path: Path, name: str
) -> np.ndarray:
    width = info.n_classes if info.multi_label else 1
    if labels is None or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: {name}_labels missing or not integers")
    labels = labels.reshape(len(labels), -1).astype(np.int64)
    if labels.shape != (count, width):
        raise DataError(
            f"{path}: {name}_labels has shape {labels.shape}; expected ({count}, {width})"
        )
    top = info.n_classes - 1 if width == 1 else 1
    if count and (labels.min() < 0 or labels.max() > top):
        raise DataError(
            f"{path}: {name}_labels lie in {labels.min()}..{labels.max()}; allowed 0..{top}"
        )
    return labels


def write_image_folder(
    folder: Path,
    splits: dict[str, Split],
    classes: tuple[str, ...],
    *,
    image_format: str = "png",
) -> Path:
    """Write ``splits`` as a folder of images (``png`` with Pillow, ``dcm`` with pydicom,
    8-bit, lossless) and its ``labels.csv`` (file, label by class name, split): the layout
    :func:`load_own_images` reads. For pilots, exports and tests; returns the table's path."""
    folder.mkdir(parents=True, exist_ok=True)
    table = folder / TABLE
    with table.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "label", "split"])
        for name, split in splits.items():
            for index, (image, label) in enumerate(zip(split.images, split.labels, strict=True)):
                file = f"{name}/{index:05d}.{image_format}"
                (folder / name).mkdir(exist_ok=True)
                _write_image(folder / file, image, image_format)
                names = [classes[i] for i in (np.flatnonzero(label) if len(label) > 1 else label)]
                writer.writerow([file, ";".join(names), name])
    return table


def _write_image(path: Path, image: np.ndarray, image_format: str) -> None:
    if image_format == "png":
        from PIL import Image

        Image.fromarray(image).save(path)
    elif image_format == "dcm":
        _write_dicom(path, image)
    else:
        raise ValueError(f"image_format {image_format!r}; allowed: png, dcm")


def _write_dicom(path: Path, image: np.ndarray) -> None:
    """An 8-bit secondary-capture DICOM file (grey MONOCHROME2 or RGB), uncompressed."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset = Dataset()
    dataset.file_meta = meta
    dataset.SOPClassUID = meta.MediaStorageSOPClassUID
    dataset.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    dataset.Modality = "OT"
    dataset.Rows, dataset.Columns = image.shape[:2]
    rgb = image.ndim == 3
    dataset.SamplesPerPixel = 3 if rgb else 1
    dataset.PhotometricInterpretation = "RGB" if rgb else "MONOCHROME2"
    if rgb:
        dataset.PlanarConfiguration = 0
    dataset.BitsAllocated = dataset.BitsStored = 8
    dataset.HighBit = 7
    dataset.PixelRepresentation = 0
    dataset.PixelData = np.ascontiguousarray(image, dtype=np.uint8).tobytes()
    dataset.save_as(path, enforce_file_format=True)
