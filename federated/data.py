"""MedMNIST data: metadata, verified local files, download, and tensors for training.

Files are the official ``<root>/<flag>.npz`` releases, and for MedMNIST+ (medmnist 3.x)
the larger ``<root>/<flag>_<size>.npz`` of 64, 128 and 224 pixels. A present file is
checked against the md5 in ``medmnist.INFO`` (``MD5``, ``MD5_64``, ...) before it is used (a truncated download must never train
silently); a missing one is fetched from the URL in ``medmnist.INFO`` when allowed
(medmnist's own downloader needs torchvision, which this project does not install).
Loading reads the verified file's ``<split>_images`` / ``<split>_labels`` arrays, as
medmnist's dataset classes do, and checks their shapes against ``medmnist.INFO``.

The six 3-D flags (``organmnist3d``, ``nodulemnist3d``, ``adrenalmnist3d``,
``fracturemnist3d``, ``vesselmnist3d``, ``synapsemnist3d``) hold volumes: one grey channel
of ``size`` voxels along each axis, at 28 (``<flag>.npz``) or 64 (``<flag>_64.npz``),
the only sizes MedMNIST v2 / MedMNIST+ publish for them. A volume's tensor is
``(C, D, H, W)``, an image's ``(C, H, W)`` (:attr:`DatasetInfo.spatial_dims`).

``digits`` is scikit-learn's copy of the UCI handwritten digits (1,797 images of 8×8 in
10 classes, shipped with scikit-learn: nothing to download), the stand-in here for the
papers' MNIST experiments. So that every model, attack and partition treats it as a
MedMNIST flag, its images are resized to 28×28 (bilinear, as MNIST's size) and stored as
uint8, and it is split once, stratified and seeded (seed 0): 1,257 train, 180 validation,
360 test images.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from federated.image_files import ImageSchema
from federated.volume_files import VolumeSchema

__all__ = [
    "SIZES",
    "VOLUME_SIZES",
    "DataError",
    "DatasetInfo",
    "MedMNISTData",
    "Split",
    "dataset_info",
    "download_medmnist",
    "ensure_medmnist",
    "file_md5",
    "is_volume_flag",
    "list_datasets",
    "load_digits",
    "load_medmnist",
    "to_tensors",
    "unwritable",
]

SPLITS = ("train", "val", "test")
SIZES = (28, 64, 128, 224)  # MedMNIST (28) and MedMNIST+ pixel sizes
VOLUME_SIZES = (28, 64)  # the sizes MedMNIST publishes its 3-D flags at (voxels per axis)
DIGITS = "digits"
DIGITS_SPLIT = {"train": 1257, "val": 180, "test": 360}


class DataError(RuntimeError):
    """A dataset that cannot be used: missing, corrupt, or of the wrong shape."""


@dataclass(frozen=True)
class DatasetInfo:
    """What the engine needs to know of a MedMNIST flag (from ``medmnist.INFO``)."""

    flag: str
    task: str  # "binary-class" | "multi-class" | "ordinal-regression" | "multi-label, binary-class"
    n_channels: int
    n_classes: int  # classes, or labels for multi-label tasks
    labels: tuple[str, ...]
    url: str
    md5: str
    n_samples: dict[str, int]
    size: int = 28  # image height and width in pixels (a volume's depth too)
    spatial_dims: int = 2  # 2: images (C, H, W); 3: volumes (C, D, H, W)
    # a tensor's pixels are (x / 255 - mean) / std: MedMNIST's Normalize(mean=.5, std=.5)
    mean: float = 0.5
    std: float = 0.5
    resample: str = "bilinear"  # Pillow's filter bringing an own image to ``size`` pixels
    # how an own image's grey values become 0-255 (federated/image_files.py)
    intensity: str = "auto"  # auto | window | range | percentiles
    percentiles: tuple[float, float] = (0.5, 99.5)  # lower, upper (intensity percentiles)
    # how an own volume reaches ``size`` voxels per axis (federated/volume_files.py)
    spacing: str = "isotropic"  # isotropic (its shape in mm kept, padded) | stretch
    slice_tolerance: float = 0.1  # a step between slices this share off the median: refused

    @property
    def multi_label(self) -> bool:
        return self.task.startswith("multi-label")

    @property
    def is_volume(self) -> bool:
        return self.spatial_dims == 3

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's tensor: ``(C, H, W)`` for images, ``(C, D, H, W)`` for volumes."""
        return (self.n_channels,) + (self.size,) * self.spatial_dims

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """One sample as the file stores it (uint8): ``(H, W)``, ``(H, W, 3)`` or ``(D, H, W)``."""
        return (self.size,) * self.spatial_dims + ((3,) if self.n_channels == 3 else ())

    def image_schema(self) -> ImageSchema:
        """What an own image file becomes (:mod:`federated.image_files`)."""
        if self.is_volume:
            raise DataError(f"{self.flag} holds volumes: no 2-D image file is read into it")
        return ImageSchema(
            channels=self.n_channels, size=self.size, resample=self.resample,
            intensity=self.intensity, percentiles=self.percentiles,
        )  # fmt: skip

    def volume_schema(self) -> VolumeSchema:
        """What an own volume (a NIfTI, a multi-frame DICOM, a series folder) becomes
        (:mod:`federated.volume_files`)."""
        if not self.is_volume:
            raise DataError(f"{self.flag} holds 2-D images: no volume is read into it")
        return VolumeSchema(
            size=self.size, intensity=self.intensity, percentiles=self.percentiles,
            spacing=self.spacing, slice_tolerance=self.slice_tolerance,
        )  # fmt: skip

    @property
    def file_name(self) -> str:
        """medmnist's own name: ``<flag>.npz`` at 28 pixels, ``<flag>_<size>.npz`` above."""
        return f"{self.flag}.npz" if self.size == 28 else f"{self.flag}_{self.size}.npz"


@functools.cache
def _info_table() -> dict[str, dict]:
    """``medmnist.INFO``: each flag's URL, md5, task, labels and split sizes.

    Read from medmnist's ``info`` module alone. Importing the ``medmnist`` package runs its
    ``__init__``, which also imports its dataset classes and evaluator (pandas and
    scikit-learn's metrics: 1.2 s of every command that checks its params) and, where
    those are missing (the Flower environment), prints an install hint into the run's
    log. Only the table is used here."""
    if "medmnist.info" in sys.modules:  # the package is already imported
        return sys.modules["medmnist.info"].INFO
    package = importlib.util.find_spec("medmnist")
    if package is None or package.origin is None:
        raise DataError("the medmnist package is not installed (pip install medmnist)")
    location = Path(package.origin).with_name("info.py")
    spec = importlib.util.spec_from_file_location("medmnist.info", location)
    assert spec is not None and spec.loader is not None
    info = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(info)
    return info.INFO


def list_datasets() -> list[str]:
    """Every MedMNIST flag this project can train on (2-D and 3-D), and ``digits``."""
    return sorted([DIGITS, *_info_table()])


def is_volume_flag(flag: str) -> bool:
    """Whether ``flag`` is one of MedMNIST's 3-D (volume) sets: medmnist names them ``*3d``."""
    return flag.endswith("3d")


def _digits_file() -> Path:
    """scikit-learn's bundled digits file (what :func:`sklearn.datasets.load_digits` reads)."""
    from importlib.resources import files

    return Path(str(files("sklearn.datasets") / "data" / "digits.csv.gz"))


def dataset_info(flag: str, size: int = 28) -> DatasetInfo:
    """``flag``'s metadata at ``size`` pixels (its file's URL and md5 for that size)."""
    if size not in SIZES:
        raise DataError(
            f"image size {size} is not a MedMNIST size; allowed: {', '.join(map(str, SIZES))}"
        )
    if flag == DIGITS and size != 28:
        raise DataError(f"digits exists at 28 pixels only, not {size}")
    if flag == DIGITS:
        return DatasetInfo(
            flag=DIGITS,
            task="multi-class",
            n_channels=1,
            n_classes=10,
            labels=tuple(str(d) for d in range(10)),
            url="sklearn.datasets.load_digits (bundled with scikit-learn)",
            md5=file_md5(_digits_file()),
            n_samples=dict(DIGITS_SPLIT),
        )
    table = _info_table()
    if flag not in table:
        raise DataError(f"unknown dataset {flag!r}; available: {', '.join(list_datasets())}")
    if is_volume_flag(flag) and size not in VOLUME_SIZES:
        raise DataError(
            f"{flag} is a 3-D set and exists at {' and '.join(map(str, VOLUME_SIZES))} voxels "
            f"per axis only, not {size}"
        )
    info = table[flag]
    labels = tuple(info["label"][key] for key in sorted(info["label"], key=int))
    suffix = "" if size == 28 else f"_{size}"
    return DatasetInfo(
        flag=flag,
        task=info["task"],
        n_channels=int(info["n_channels"]),
        n_classes=len(labels),
        labels=labels,
        url=info[f"url{suffix}"],
        md5=info[f"MD5{suffix}"],
        n_samples={split: int(info["n_samples"][split]) for split in SPLITS},
        size=size,
        spatial_dims=3 if is_volume_flag(flag) else 2,
    )


def file_md5(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.md5()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def download_medmnist(info: DatasetInfo, root: Path, *, progress: bool = True) -> Path:
    """Fetch ``<root>/<file name>`` from its official URL, checking the md5 before the file
    is moved into place (so a broken download never lands as the real file)."""
    created = [folder for folder in (root, *root.parents) if not folder.exists()]
    root.mkdir(parents=True, exist_ok=True)
    try:
        return _fetch_checked(info, root, progress=progress)
    except BaseException:
        for folder in created:  # deepest first: a failed download leaves no empty folder
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _fetch_checked(info: DatasetInfo, root: Path, *, progress: bool) -> Path:
    from tqdm import tqdm

    target = root / info.file_name
    with tempfile.NamedTemporaryFile(dir=root, suffix=".part", delete=False) as tmp:
        tmp_path = Path(tmp.name)
        try:
            with urllib.request.urlopen(info.url, timeout=60) as response:
                total = int(response.headers.get("Content-Length") or 0) or None
                with tqdm(
                    total=total,
                    unit="B",
                    unit_scale=True,
                    desc=info.file_name,
                    disable=not progress,
                ) as bar:
                    while chunk := response.read(1 << 20):
                        tmp.write(chunk)
                        bar.update(len(chunk))
        except BaseException:
            tmp_path.unlink(missing_ok=True)
            raise
    actual = file_md5(tmp_path)
    if actual != info.md5:
        tmp_path.unlink(missing_ok=True)
        raise DataError(
            f"downloaded {target.name} has md5 {actual}, expected {info.md5}; try again"
        )
    shutil.move(str(tmp_path), target)
    return target


def unwritable(folder: Path) -> str | None:
    """Why this process's user cannot create files in ``folder`` (or, where it does not
    exist yet, in the nearest existing folder above it): that folder, its owner and mode.
    None when it can."""
    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if os.path.lexists(p))
    if os.access(existing, os.W_OK | os.X_OK, effective_ids=True):
        return None
    try:
        stat = existing.stat()
        return f"{existing} belongs to uid {stat.st_uid} (mode {stat.st_mode & 0o7777:o})"
    except OSError:
        return f"{existing} cannot be reached"


def ensure_medmnist(
    flag: str, root: Path, *, size: int = 28, download: bool = True, progress: bool = True
) -> Path:
    """Return the verified path of ``flag``'s file at ``size`` pixels under ``root``,
    downloading it when missing and allowed. Raises :class:`DataError` naming the file,
    its md5 and how to obtain it. ``digits`` is scikit-learn's own file: nothing to fetch."""
    info = dataset_info(flag, size)
    if flag == DIGITS:
        return _digits_file()
    path = Path(root) / info.file_name
    if path.exists():
        actual = file_md5(path)
        if actual != info.md5:
            raise DataError(
                f"{path} has md5 {actual} but the official file has {info.md5} "
                f"(truncated or altered?); delete it and download it again from {info.url}"
            )
        return path
    how = f"download it from {info.url} (md5 {info.md5}) into {path.parent} or set MEDMNIST_ROOT"
    if not download:
        raise DataError(f"{path} not found and downloads are off; {how}")
    if (reason := unwritable(path.parent)) is not None:  # said before the download, not as it
        uid = os.geteuid()
        raise DataError(
            f"{path} not found, and the data folder {path.parent} cannot be written by uid "
            f"{uid} to download it: {reason}; make it writable for uid {uid}, run the "
            f"container as the folder's owner (docker run --user $(id -u):$(id -g) ...), or "
            f"{how}"
        )
    try:
        return download_medmnist(info, Path(root), progress=progress)
    except DataError:
        raise
    except OSError as error:
        raise DataError(f"{path} not found and the download failed ({error}); {how}") from error


@dataclass(frozen=True)
class Split:
    """One split as uint8 images ``(N, H, W[, 3])`` (volumes ``(N, D, H, W)``) and integer
    labels ``(N, L)``."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def targets(self) -> np.ndarray:
        """Class index ``(N,)`` for single-label tasks; the 0/1 matrix ``(N, L)`` otherwise."""
        return self.labels[:, 0] if self.labels.shape[1] == 1 else self.labels


@dataclass(frozen=True)
class MedMNISTData:
    """A dataset's three splits (a MedMNIST file's, or a user's own images')."""

    info: DatasetInfo
    train: Split
    val: Split
    test: Split
    sha256: str = ""  # own images: the SHA-256 of the table and files read (MedMNIST: its md5)
    notes: tuple[str, ...] = ()  # what a reader should hear of the data (resized images)


def load_medmnist(flag: str, root: Path, size: int = 28) -> MedMNISTData:
    """Load ``flag``'s local file at ``size`` pixels (verify it first with
    :func:`ensure_medmnist`) and check its arrays have the shapes ``medmnist.INFO`` promises."""
    info = dataset_info(flag, size)
    if flag == DIGITS:
        return load_digits()
    path = Path(root) / info.file_name
    splits: dict[str, Split] = {}
    try:
        with np.load(path) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except Exception as error:  # missing file, BadZipFile, a truncated member, ...
        raise DataError(
            f"{path} is not a readable MedMNIST file ({type(error).__name__}: {error})"
        ) from error
    for split in SPLITS:
        missing = [k for k in (f"{split}_images", f"{split}_labels") if k not in arrays]
        if missing:
            raise DataError(f"{path} is not a MedMNIST file: it has no {', '.join(missing)}")
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        expected = (info.n_samples[split], *info.stored_shape)
        if images.shape != expected or images.dtype != np.uint8:
            raise DataError(
                f"{path}: {split}_images has shape {images.shape} {images.dtype}, expected {expected} uint8"
            )
        labels = labels.reshape(len(labels), -1)
        if labels.shape[0] != expected[0] or (labels.shape[1] != 1 and not info.multi_label):
            raise DataError(
                f"{path}: {split}_labels has shape {labels.shape}, expected ({expected[0]}, 1)"
            )
        splits[split] = Split(images=images, labels=labels.astype(np.int64))
    return MedMNISTData(info=info, **splits)


def load_digits() -> MedMNISTData:
    """scikit-learn's digits as a MedMNIST-shaped dataset: 28×28 uint8 images, a seeded
    stratified train / validation / test split."""
    import torch.nn.functional as F
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    pixels = torch.from_numpy(bunch.images).float().unsqueeze(1) * (255.0 / 16.0)  # (N,1,8,8)
    images = F.interpolate(pixels, size=(28, 28), mode="bilinear", align_corners=False)
    images_u8 = images.squeeze(1).round().clamp(0, 255).to(torch.uint8).numpy()  # (N, 28, 28)
    labels = bunch.target.astype(np.int64).reshape(-1, 1)
    index = np.arange(len(labels))
    rest, test = train_test_split(
        index, test_size=DIGITS_SPLIT["test"], stratify=labels[:, 0], random_state=0
    )
    train, val = train_test_split(
        rest, test_size=DIGITS_SPLIT["val"], stratify=labels[rest, 0], random_state=0
    )
    splits = {
        name: Split(images=images_u8[np.sort(rows)], labels=labels[np.sort(rows)])
        for name, rows in (("train", train), ("val", val), ("test", test))
    }
    return MedMNISTData(info=dataset_info(DIGITS), **splits)


def to_tensors(
    split: Split, info: DatasetInfo, *, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """Images as float32 ``(N, C, H, W)`` (volumes ``(N, C, D, H, W)``) normalised by the
    dataset's mean and std (MedMNIST's ``Normalize(mean=.5, std=.5)``: [-1, 1]); targets as
    int64 ``(N,)`` or float32 ``(N, L)``."""
    images = torch.from_numpy(split.images).to(device=device, dtype=torch.float32)
    if info.n_channels == 1:  # (N, H, W) -> (N, 1, H, W); (N, D, H, W) -> (N, 1, D, H, W)
        images = images.unsqueeze(1)
    else:  # (N, H, W, 3) -> (N, 3, H, W)
        images = images.permute(0, 3, 1, 2).contiguous()
    images = (images / 255.0 - info.mean) / info.std
    targets = torch.from_numpy(split.targets).to(device=device)
    targets = targets.float() if info.multi_label else targets.long()
    return images, targets
