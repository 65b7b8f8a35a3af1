"""A consortium's own images: a folder with a label table, or an ``.npz`` in MedMNIST's layout.

A folder holds ``labels.csv`` with the columns ``file`` (a path relative to the folder) and
``label``, and optionally ``split`` (``train``, ``val`` or ``test``). Images are PNG, JPEG,
BMP or TIFF (read with Pillow) or DICOM (``.dcm``, read with pydicom). Every image is
brought to the dataset's declared schema (:class:`~federated.data.DatasetInfo`): its
channels (Pillow's ``L`` or ``RGB``), a square of ``size`` pixels (Pillow's ``resample``
filter; an image already at that size is not resampled), stored as uint8 like MedMNIST,
and normalised when it becomes a tensor (``(x / 255 - mean) / std``). A DICOM image gets
its modality LUT (rescale slope and intercept) and VOI LUT (window) applied by pydicom,
MONOCHROME1 is inverted, and its values are scaled to 0-255 by the image's own range.

A label is a class name of the schema or its index; a multi-label row lists them joined
by ``;`` (an empty cell: no label). Anything that cannot be read is named in one line
(:class:`~federated.data.DataError`): the table row, the file and why.

A folder is fingerprinted (SHA-256 of the table and of every image file, in table order),
so a run can record which data it saw and notice a folder changed since its partition.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from federated.data import DataError, DatasetInfo, MedMNISTData, Split

__all__ = [
    "IMAGE_SUFFIXES",
    "TABLE",
    "LabelledImages",
    "load_own_dataset",
    "load_own_images",
    "read_image",
    "write_image_folder",
]

TABLE = "labels.csv"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
DICOM_SUFFIXES = (".dcm", ".dicom")
SPLIT_NAMES = ("train", "val", "test")
HOLDOUT = {"val": 0.1, "test": 0.2}  # a table without a split column, split seeded


@dataclass(frozen=True)
class LabelledImages:
    """Every row of a dataset: uint8 images ``(N, H, W[, 3])``, labels ``(N, L)``, each
    row's split (``None`` when the table names none), and the data's SHA-256."""

    images: np.ndarray
    labels: np.ndarray
    splits: np.ndarray | None
    sha256: str

    def split(self, name: str) -> Split:
        """The rows of one split; every row is ``train`` when the table names none."""
        if self.splits is None:
            rows = np.arange(len(self.labels)) if name == "train" else np.arange(0)
        else:
            rows = np.flatnonzero(self.splits == name)
        return Split(images=self.images[rows], labels=self.labels[rows])


def load_own_images(path: Path | str, info: DatasetInfo) -> LabelledImages:
    """Read a folder (its ``labels.csv``), a label table's path, or an ``.npz`` in
    MedMNIST's layout, checked against ``info``'s schema."""
    path = Path(path)
    if path.suffix == ".npz":
        return _load_npz(path, info)
    table = path if path.suffix == ".csv" else path / TABLE
    if not table.is_file():
        raise DataError(
            f"{path}: no {TABLE} here; own data is a folder with {TABLE} (columns file, "
            "label[, split]) or an .npz in MedMNIST's layout"
        )
    return _load_folder(table, info)


def load_own_dataset(path: Path | str, info: DatasetInfo, *, seed: int = 0) -> MedMNISTData:
    """A simulation's dataset: the table's ``split`` column, or (without one) a seeded
    split of 70 % train, 10 % validation and 20 % test, stratified for single-label tasks."""
    data = load_own_images(path, info)
    if data.splits is None:
        data = _seeded_splits(data, info.multi_label, seed)
    splits = {name: data.split(name) for name in SPLIT_NAMES}
    if not len(splits["train"]):
        raise DataError(f"{path}: no train rows; a dataset needs images to train on")
    return MedMNISTData(info=info, **splits, sha256=data.sha256)


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
    return LabelledImages(data.images, data.labels, splits, data.sha256)


def _load_folder(table: Path, info: DatasetInfo) -> LabelledImages:
    folder = table.parent
    rows = _read_table(table)
    digest = hashlib.sha256(table.read_bytes())
    images, labels, splits = [], [], []
    for number, row in rows:
        where = f"{table}, row {number}"
        file = folder / row["file"]
        try:
            raw = file.read_bytes()
        except OSError as error:
            raise DataError(f"{where}: {row['file']}: {error.strerror or error}") from None
        digest.update(raw)
        try:
            images.append(read_image(file, info))
        except DataError as error:  # the file named with its row, as every other problem
            raise DataError(f"{where}: {row['file']}: {error}") from None
        labels.append(_parse_label(row["label"], info, where))
        if "split" in row:
            splits.append(_parse_split(row["split"], where))
    return LabelledImages(
        images=np.stack(images),
        labels=np.stack(labels),
        splits=np.array(splits, dtype=object) if splits else None,
        sha256=digest.hexdigest(),
    )


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
    from PIL import Image

    suffix = file.suffix.lower()
    try:
        if suffix in DICOM_SUFFIXES:
            image = Image.fromarray(_dicom_pixels(file))
        elif suffix in IMAGE_SUFFIXES:
            with Image.open(file) as opened:
                opened.load()
                image = _eight_bit(opened)
        else:
            raise DataError(
                f"unknown image type {suffix or '(no suffix)'}; allowed: "
                f"{', '.join(IMAGE_SUFFIXES + DICOM_SUFFIXES)}"
            )
    except DataError:
        raise
    except Exception as error:  # Pillow's and pydicom's own errors: truncated, not an image
        raise DataError(f"not a readable image ({type(error).__name__}: {error})") from None
    image = image.convert("L" if info.n_channels == 1 else "RGB")
    if image.size != (info.size, info.size):
        image = image.resize((info.size, info.size), _resample(info.resample))
    return np.asarray(image, dtype=np.uint8)


def _eight_bit(image):
    """A 16-bit or float image scaled to 0-255 by its own range; 8-bit images as they are."""
    from PIL import Image

    if image.mode not in ("I", "I;16", "I;16B", "I;16L", "F"):
        return image
    return Image.fromarray(_scaled(np.asarray(image, dtype=np.float64)))  # its own range


def _dicom_pixels(file: Path) -> np.ndarray:
    """A single-frame DICOM image as uint8 (grey ``(H, W)`` or RGB): its modality and VOI
    LUTs applied by pydicom, values scaled by the range their bit depth allows (an 8-bit
    image stays as stored), or by the image's own range when a rescale (CT's Hounsfield
    units) has no window; MONOCHROME1 inverted."""
    from pydicom import dcmread
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    dataset = dcmread(file)
    frames = int(getattr(dataset, "NumberOfFrames", 1) or 1)
    if frames > 1:
        raise DataError(f"{file}: a multi-frame DICOM ({frames} frames); one image a file")
    pixels = np.asarray(dataset.pixel_array, dtype=np.float64)
    bits = int(getattr(dataset, "BitsStored", 8))
    low = -(2.0 ** (bits - 1)) if getattr(dataset, "PixelRepresentation", 0) else 0.0
    bit_range = (low, low + 2.0**bits - 1)
    if getattr(dataset, "SamplesPerPixel", 1) != 1:
        return _scaled(pixels, bit_range)
    windowed = "WindowCenter" in dataset or "VOILUTSequence" in dataset
    rescaled = "RescaleSlope" in dataset or "ModalityLUTSequence" in dataset
    if windowed:  # the window's output spans the bit range after the modality LUT
        pixels = np.asarray(apply_voi_lut(apply_modality_lut(pixels, dataset), dataset))
        low, high = np.asarray(apply_modality_lut(np.array(bit_range), dataset), dtype=np.float64)
        bit_range = (float(low), float(high))
    elif rescaled:
        pixels = np.asarray(apply_modality_lut(pixels, dataset), dtype=np.float64)
    grey = _scaled(pixels, None if rescaled and not windowed else bit_range)
    if getattr(dataset, "PhotometricInterpretation", "") == "MONOCHROME1":
        grey = 255 - grey  # MONOCHROME1: low values are bright
    return grey


def _scaled(values: np.ndarray, bounds: tuple[float, float] | None = None) -> np.ndarray:
    """``values`` mapped linearly from ``bounds`` (default: their own range) to 0-255."""
    low, high = bounds if bounds is not None else (float(values.min()), float(values.max()))
    if high <= low:
        return np.zeros(values.shape, dtype=np.uint8)
    return np.clip(np.round((values - low) * (255.0 / (high - low))), 0, 255).astype(np.uint8)


def _resample(name: str) -> int:
    from PIL import Image

    return {
        "nearest": Image.Resampling.NEAREST,
        "bilinear": Image.Resampling.BILINEAR,
        "bicubic": Image.Resampling.BICUBIC,
        "lanczos": Image.Resampling.LANCZOS,
    }[name]


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
    expected = (info.size, info.size) + ((3,) if info.n_channels == 3 else ())
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
