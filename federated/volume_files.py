"""One volume in a dataset's schema: a NIfTI file (nibabel), a multi-frame DICOM, or a
folder holding one DICOM series (pydicom, every encoding its plugins decode).

Kept free of torch at import (the resampling imports it), as :mod:`federated.image_files`.

**Geometry.** A series' slices are ordered by their position along the slice normal
(``ImagePositionPatient`` · the cross product of ``ImageOrientationPatient``'s row and
column directions), never by file name or ``InstanceNumber``; a multi-frame file's frames
by the same projection of each frame's position (the Per-Frame Functional Groups' Plane
Position, or an RT dose's Grid Frame Offset Vector). Every volume, whatever stores it, is
turned to the nearest of its axes to RAS+ (nibabel's :func:`~nibabel.orientations.io_orientation`,
as :func:`nibabel.as_closest_canonical`) and stored as ``(D, H, W)``: inferior to superior,
posterior to anterior, patient's left to right, so a NIfTI and a
DICOM export of one scan read as the same array.

**Refused in one line**, with the cause and the remedy: missing slices (a step between
neighbours more than ``slice_tolerance`` away from the median step), two series in one
folder, two slices at one position, orientations that disagree, a slice of another size, a
single slice, a 4-D NIfTI, a multi-frame file without frame positions, a colour volume.

**Intensity** (the schema's ``intensity``, pinned in the plan, as for 2-D images): each
slice's modality LUT first (a CT in Hounsfield units from its rescale slope and
intercept, an RT dose in Gy from its dose grid scaling), then ``window`` (the series' own
window, from its first slice; a NIfTI's ``cal_min``/``cal_max``), ``range`` (the
volume's own minimum and maximum), ``percentiles`` (the volume's own percentiles,
clipped) or ``auto`` (the window when there is one; else a volume of at most 8 stored bits
without a rescale over the range its bits allow; else its own range). The bounds are taken
over the whole volume as read, before resampling.

**Resampling** (the schema's ``spacing``), pinned: ``torch.nn.functional.interpolate``,
trilinear, ``align_corners=False``, no anti-aliasing. ``isotropic`` (default) keeps the
volume's shape in millimetres: its longest physical side becomes ``size`` voxels, the
others in proportion, centred and padded with the lowest intensity (0). ``stretch`` brings
each axis to ``size`` voxels whatever its spacing, as 2-D images are resized.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from federated.image_files import (
    DICOM_MAGIC,
    DICOM_SUFFIXES,
    ImageFileError,
    ImageSchema,
    one_line,
    pixel_array,
    refusal_as_line,
    scaled_to_bytes,
    value_policy,
)

__all__ = [
    "NIFTI_SUFFIXES",
    "SPACING_POLICIES",
    "DecodedVolume",
    "VolumeFileError",
    "VolumeSchema",
    "decode_volume",
    "decode_volume_bytes",
    "decode_volume_or_refuse",
    "volume_stamp",
]

NIFTI_SUFFIXES = (".nii", ".nii.gz")
SPACING_POLICIES = ("isotropic", "stretch")
VOLUME_READER_VERSION = "1"  # bump when reading changes what a volume becomes
ORIENTATION_TOLERANCE = 1e-3  # direction cosines that differ by less are one orientation
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
ZIP_LIMIT = 4 << 30  # bytes a zipped series may unpack to


class VolumeFileError(ImageFileError):
    """A volume that cannot be read in the schema: one line saying why and what to do."""


@dataclass(frozen=True)
class VolumeSchema:
    """What every volume becomes: uint8 ``(size, size, size)``, its values scaled by
    ``intensity`` (``percentiles``: lower and upper), resampled by ``spacing``;
    ``slice_tolerance``: how far (a share of the median step) a step between neighbouring
    slices may stray before slices are taken to be missing."""

    size: int = 64
    intensity: str = "auto"
    percentiles: tuple[float, float] = (0.5, 99.5)
    spacing: str = "isotropic"
    slice_tolerance: float = 0.1

    def __post_init__(self) -> None:
        if self.spacing not in SPACING_POLICIES:
            raise ValueError(f"spacing {self.spacing!r}; allowed: {', '.join(SPACING_POLICIES)}")
        if not 0 < self.slice_tolerance < 1:
            raise ValueError(f"slice_tolerance {self.slice_tolerance}; need 0 < tolerance < 1")
        self.grey()  # the intensity settings, checked as for images

    def grey(self) -> ImageSchema:
        """The intensity settings as the 2-D reader takes them."""
        return ImageSchema(
            channels=1, size=self.size, intensity=self.intensity, percentiles=self.percentiles
        )

    def key(self) -> str:
        """The settings that decide a volume's voxels, as text (a cache's key)."""
        import nibabel

        low, high = self.percentiles
        return (
            f"volume;size={self.size};intensity={self.intensity};percentiles={low:g},{high:g};"
            f"spacing={self.spacing};slice_tolerance={self.slice_tolerance:g};"
            f"reader {VOLUME_READER_VERSION};nibabel {nibabel.__version__}"
        )


@dataclass(frozen=True)
class DecodedVolume:
    """A volume in the schema (uint8 ``(size, size, size)``, ``(D, H, W)``), its shape
    as read (voxels, after turning to RAS+), its voxel spacing in mm, and the SHA-256 of
    its file (a series: of every slice file's name and SHA-256, in name order)."""

    pixels: np.ndarray
    source_size: tuple[int, int, int]
    spacing: tuple[float, float, float]
    sha256: str


@dataclass(frozen=True)
class Stack:
    """A volume as read, before the schema: values after the modality LUT and the
    intensity policy ``(K, R, C)`` or in NIfTI's voxel order, the affine from voxel
    indices ``(i, j, k)`` to RAS+ millimetres, and the bounds mapped to 0 and 255."""

    values: np.ndarray  # float32, indexed (i, j, k) as the affine takes them
    affine: np.ndarray  # (4, 4)
    bounds: tuple[float, float]


def decode_volume(
    path: Path | str, schema: VolumeSchema, *, by_content: bool = False
) -> DecodedVolume:
    """Read the volume at ``path`` (a folder: one DICOM series) once: its SHA-256 and its
    voxels in ``schema``; its type told by its suffix or, ``by_content``, by its bytes.
    :class:`VolumeFileError` (``OSError`` for a file that cannot be opened) says why not."""
    path = Path(path)
    if path.is_dir():
        stack, sha256 = _read_series(path, schema)
        return _in_schema(stack, schema, sha256)
    raw = path.read_bytes()
    kind = _kind_of_content(raw) if by_content else _kind_of_name(path.name)
    return _in_schema(_read_file(raw, kind, schema), schema, hashlib.sha256(raw).hexdigest())


def decode_volume_bytes(raw: bytes, schema: VolumeSchema) -> DecodedVolume:
    """A NIfTI's, a multi-frame DICOM's or a zipped series' bytes (told apart by their
    content: what a served model is sent) in ``schema``, as :func:`decode_volume` reads
    the file or the folder."""
    kind = _kind_of_content(raw)
    return _in_schema(_read_file(raw, kind, schema), schema, hashlib.sha256(raw).hexdigest())


def _read_file(raw: bytes, kind: str, schema: VolumeSchema) -> Stack:
    if kind == "zip":
        return _read_zipped_series(raw, schema)[0]
    return _read_nifti(raw, schema) if kind == "nifti" else _read_multiframe(raw, schema)


def _in_schema(stack: Stack, schema: VolumeSchema, sha256: str) -> DecodedVolume:
    """A volume as read, turned to RAS+ and resampled into the schema."""
    voxels, spacing = _canonical(stack.values, stack.affine)
    pixels = _resampled(voxels, spacing, schema, stack.bounds)
    return DecodedVolume(pixels, voxels.shape, spacing, sha256)


def decode_volume_or_refuse(
    path: Path, schema: VolumeSchema, *, by_content: bool = False
) -> DecodedVolume | str:
    """:func:`decode_volume`, a refusal returned as its one line (what a worker process
    sends back, so one bad volume does not stop the others)."""
    return refusal_as_line(decode_volume, path, schema, by_content=by_content)


def volume_stamp(path: Path) -> tuple[int, int]:
    """A volume's size in bytes and last change (ns): a file's own; a series folder's
    total over its files and the latest of its own and its files' times (a slice added,
    removed, renamed or rewritten changes it), as a cache remembers a file's."""
    if not path.is_dir():
        stat = path.stat()
        return stat.st_size, stat.st_mtime_ns
    stats = [file.stat() for file in _series_files(path)]
    latest = max([path.stat().st_mtime_ns, *(stat.st_mtime_ns for stat in stats)])
    return sum(stat.st_size for stat in stats), latest


def _kind_of_name(name: str) -> str:
    lowered = name.lower()
    if lowered.endswith(NIFTI_SUFFIXES):
        return "nifti"
    if lowered.endswith(DICOM_SUFFIXES):
        return "dicom"
    if lowered.endswith(".zip"):
        return "zip"
    raise VolumeFileError(
        f"unknown volume type {Path(name).suffix or '(no suffix)'}; a volume is a folder "
        f"holding one DICOM series (or its .zip), a NIfTI ({', '.join(NIFTI_SUFFIXES)}) or a "
        f"multi-frame DICOM ({', '.join(DICOM_SUFFIXES)})"
    )


def _kind_of_content(raw: bytes) -> str:
    """What a volume's bytes hold: ``dicom`` (``DICM`` after the preamble), ``zip`` (a
    series), ``nifti`` (gzip, or a NIfTI-1 or NIfTI-2 header); anything else refused."""
    offset, magic = DICOM_MAGIC
    if raw[offset : offset + len(magic)] == magic:
        return "dicom"
    if raw[:4] == ZIP_MAGIC:
        return "zip"
    sizes = {int.from_bytes(raw[:4], order) for order in ("little", "big")}
    if raw[:2] == GZIP_MAGIC or sizes & {348, 540}:
        return "nifti"
    raise VolumeFileError(
        "not a volume: neither a NIfTI (.nii, .nii.gz), a DICOM (multi-frame) nor a zip of "
        "one DICOM series; send one of those"
    )


# NIfTI


def _read_nifti(raw: bytes, schema: VolumeSchema) -> Stack:
    """A NIfTI-1 or NIfTI-2 file's one volume, its values as its scaling gives them."""
    import nibabel

    try:
        data = gzip.decompress(raw) if raw[:2] == GZIP_MAGIC else raw
        sizes = {int.from_bytes(data[:4], order) for order in ("little", "big")}  # either endian
        kind = (
            nibabel.Nifti1Image if 348 in sizes else nibabel.Nifti2Image if 540 in sizes else None
        )
        if kind is None:
            raise ValueError("its header size is neither NIfTI-1's 348 nor NIfTI-2's 540")
        image = kind.from_bytes(data)
    except Exception as error:  # not gzip, not NIfTI, a damaged header
        raise VolumeFileError(
            f"not a readable NIfTI file ({one_line(error)}); check the file, or export it again"
        ) from None
    shape = image.shape
    if len(shape) > 3 and int(np.prod(shape[3:])) > 1:
        raise VolumeFileError(
            f"a {len(shape)}-D NIfTI of shape {'x'.join(map(str, shape))} holds "
            f"{int(np.prod(shape[3:]))} volumes (a time series, echoes or channels); export "
            "one volume a file (nibabel's four_to_three, fslsplit)"
        )
    if len(shape) < 3 or min(shape[:3]) < 2:
        raise VolumeFileError(
            f"a NIfTI of shape {'x'.join(map(str, shape))} is a single slice, not a volume; "
            "a volume has at least 2 voxels along each axis (2-D images train with "
            "data.own.spatial_dims: 2)"
        )
    try:
        values = np.asarray(image.dataobj, dtype=np.float32).reshape(shape[:3])
    except Exception as error:  # truncated data
        raise VolumeFileError(
            f"its voxels could not be read ({one_line(error)}); the file may be truncated: "
            "export it again"
        ) from None
    values = _finite(values)
    return Stack(values, image.affine, _nifti_bounds(values, image, schema))


def _finite(values: np.ndarray) -> np.ndarray:
    """NaN and infinite voxels (outside a mask, in many research exports) become the
    volume's lowest finite value; a volume with none is refused."""
    finite = np.isfinite(values)
    if finite.all():
        return values
    if not finite.any():
        raise VolumeFileError("every voxel is NaN or infinite; export the volume again")
    return np.where(finite, values, values[finite].min()).astype(np.float32)


def _nifti_bounds(values: np.ndarray, image: Any, schema: VolumeSchema) -> tuple[float, float]:
    """The NIfTI's values mapped to 0 and 255, by the schema's policy: its display window
    (``cal_min``, ``cal_max``), its stored type's range, or its own range or percentiles."""
    header = image.header
    low, high = float(header["cal_min"]), float(header["cal_max"])
    windowed = high > low
    policy = schema.intensity
    if policy == "window" and not windowed:
        raise VolumeFileError(
            "a NIfTI without a display window (cal_min, cal_max unset); use intensity auto, "
            "range or percentiles"
        )
    if policy == "auto":
        slope, inter = image.dataobj.slope, image.dataobj.inter
        scaled = not (slope in (1, None) or np.isnan(slope)) or not (
            inter in (0, None) or np.isnan(inter)
        )
        stored = np.dtype(image.get_data_dtype())
        shallow = stored.kind in "uib" and stored.itemsize == 1 and not scaled
        policy = "window" if windowed else "bits" if shallow else "range"
    if policy == "window":
        return low, high
    if policy == "bits":
        info = np.iinfo(np.dtype(image.get_data_dtype()))
        return float(info.min), float(info.max)
    return _own_bounds(values, schema)


def _own_bounds(values: np.ndarray, schema: VolumeSchema) -> tuple[float, float]:
    if schema.intensity == "percentiles":
        low, high = np.percentile(values, schema.percentiles)
        return float(low), float(high)
    return float(values.min()), float(values.max())


# DICOM


@dataclass(frozen=True)
class Slice:
    """One slice or frame: its stored pixels ``(R, C)``, the dataset its modality LUT and
    window are read from, where it lies, and the name a refusal gives it."""

    pixels: np.ndarray
    dataset: Any
    position: np.ndarray  # (3,) mm, LPS: the centre of its first voxel
    orientation: np.ndarray  # (6,) row then column direction cosines
    spacing: tuple[float, float]  # (between rows, between columns) mm
    name: str


def _series_files(folder: Path) -> list[Path]:
    """A series folder's files in name order (hidden files such as ``.DS_Store`` skipped)."""
    return sorted(
        file for file in folder.iterdir() if file.is_file() and not file.name.startswith(".")
    )


def _read_series(folder: Path, schema: VolumeSchema) -> tuple[Stack, str]:
    """A folder of single-frame DICOM files, one series, as one volume, and the SHA-256 of
    every file's name and SHA-256."""
    files = _series_files(folder)
    if not files:
        raise VolumeFileError("an empty folder; a series folder holds one DICOM file a slice")
    return _series_of_files([(file.name, file.read_bytes()) for file in files], schema)


def _read_zipped_series(raw: bytes, schema: VolumeSchema) -> tuple[Stack, str]:
    """A zip of one series' files (folders inside it flattened; hidden files and macOS's
    ``__MACOSX`` skipped), read as a series folder."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            members = [
                m for m in archive.infolist()
                if not m.is_dir() and not any(
                    part.startswith((".", "__MACOSX")) for part in Path(m.filename).parts
                )
            ]  # fmt: skip
            if sum(m.file_size for m in members) > ZIP_LIMIT:
                raise VolumeFileError(
                    f"a zip that unpacks to more than {ZIP_LIMIT >> 30} GiB; send one series"
                )
            named = sorted((m.filename, archive.read(m)) for m in members)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError) as error:
        raise VolumeFileError(
            f"not a readable zip of a series ({one_line(error)}); zip the series' folder again"
        ) from None
    if not named:
        raise VolumeFileError("an empty zip; zip the folder holding one DICOM series")
    return _series_of_files(named, schema)


def _series_of_files(named: list[tuple[str, bytes]], schema: VolumeSchema) -> tuple[Stack, str]:
    """One series' files (name, bytes) in name order, as one volume, and the SHA-256 of
    every file's name and SHA-256."""
    from pydicom import dcmread
    from pydicom.errors import InvalidDicomError

    digest = hashlib.sha256()
    datasets = []
    for name, raw in named:
        digest.update(name.encode() + b"\0" + hashlib.sha256(raw).digest())
        try:
            datasets.append(dcmread(io.BytesIO(raw)))
        except InvalidDicomError:
            raise VolumeFileError(
                f"{name} in the series folder is not a DICOM file; keep only the series' "
                "slices in its folder"
            ) from None
        except Exception as error:
            raise VolumeFileError(
                f"{name} is not a readable DICOM file ({one_line(error)}); export the series again"
            ) from None
    names = [name for name, _ in named]
    _check_one_series(datasets, names)
    slices = [_series_slice(dataset, name) for dataset, name in zip(datasets, names, strict=True)]
    return _stack(slices, schema, "slice"), digest.hexdigest()


def _check_one_series(datasets: list[Any], names: list[str]) -> None:
    """Refuse a folder of two series (each named with its count), or a multi-frame file."""
    series: dict[str, list[str]] = {}
    for dataset, name in zip(datasets, names, strict=True):
        series.setdefault(str(dataset.get("SeriesInstanceUID", "")), []).append(name)
        if int(dataset.get("NumberOfFrames", 1) or 1) > 1:
            raise VolumeFileError(
                f"{name} is a multi-frame file in a series folder; a series folder holds "
                "one frame a file: list the multi-frame file as a row of its own"
            )
    if len(series) > 1:
        parts = [
            f"{uid or '(none)'}: {_count(len(names), 'file')}" for uid, names in series.items()
        ]
        raise VolumeFileError(
            f"{len(series)} series share the folder ({'; '.join(parts[:3])}); put each "
            "series in a folder of its own, one row each"
        )


def _series_slice(dataset: Any, name: str) -> Slice:
    _check_grey(dataset)
    for keyword in ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing"):
        if keyword not in dataset:
            raise VolumeFileError(
                f"{name} has no {keyword}: a slice without its place in the patient; export "
                "the series with its geometry (CT and MR series carry it)"
            )
    return Slice(
        pixels=pixel_array(dataset),
        dataset=dataset,
        position=np.asarray(dataset.ImagePositionPatient, dtype=np.float64),
        orientation=np.asarray(dataset.ImageOrientationPatient, dtype=np.float64),
        spacing=_pixel_spacing(dataset.PixelSpacing),
        name=name,
    )


def _check_grey(dataset: Any) -> None:
    if int(dataset.get("SamplesPerPixel", 1)) != 1:
        raise VolumeFileError(
            f"a colour DICOM ({dataset.get('PhotometricInterpretation', 'colour')}); a volume "
            "is grey (CT, MR, PET, NM, dose): list colour images as 2-D images"
        )


def _pixel_spacing(values: Any) -> tuple[float, float]:
    rows, columns = (float(v) for v in values)
    return rows, columns


def _read_multiframe(raw: bytes, schema: VolumeSchema) -> Stack:
    """A multi-frame DICOM (enhanced CT/MR/PET, RT dose, a one-segment SEG) as one volume."""
    from pydicom import dcmread
    from pydicom.errors import InvalidDicomError

    try:
        dataset = dcmread(io.BytesIO(raw))
    except InvalidDicomError:
        raise VolumeFileError(
            "not a DICOM file (no 'DICM' after its 128-byte preamble); export it as a DICOM "
            "file, or give it the suffix of what it is"
        ) from None
    except Exception as error:
        raise VolumeFileError(
            f"not a readable DICOM file ({one_line(error)}); export it again"
        ) from None
    frames = int(dataset.get("NumberOfFrames", 1) or 1)
    if frames == 1:
        raise VolumeFileError(
            "a DICOM of one frame is a single slice, not a volume; list the folder holding "
            "the whole series, or a multi-frame file"
        )
    _check_grey(dataset)
    pixels = pixel_array(dataset)  # (frames, R, C)
    places = _frame_places(dataset, frames)
    slices = [
        Slice(pixels[index], view, position, orientation, spacing, f"frame {index + 1}")
        for index, (view, position, orientation, spacing) in enumerate(places)
    ]
    return _stack(slices, schema, "frame")


def _frame_places(dataset: Any, frames: int) -> list[tuple[Any, np.ndarray, np.ndarray, tuple]]:
    """Each frame's dataset view (its modality LUT and window), position, orientation and
    pixel spacing: from the Per-Frame and Shared Functional Groups (enhanced objects, SEG),
    or from an RT dose's Grid Frame Offset Vector; refused when the file has neither."""
    if "PerFrameFunctionalGroupsSequence" in dataset:
        return [_functional_place(dataset, index) for index in range(frames)]
    if "GridFrameOffsetVector" in dataset and "ImagePositionPatient" in dataset:
        origin = np.asarray(dataset.ImagePositionPatient, dtype=np.float64)
        orientation = np.asarray(dataset.ImageOrientationPatient, dtype=np.float64)
        normal = np.cross(orientation[:3], orientation[3:])
        offsets = np.asarray(dataset.GridFrameOffsetVector, dtype=np.float64)
        view = _dose_view(dataset)
        spacing = _pixel_spacing(dataset.PixelSpacing)
        return [(view, origin + (o - offsets[0]) * normal, orientation, spacing) for o in offsets]
    kind = getattr(dataset.get("SOPClassUID"), "name", None) or dataset.get("Modality", "")
    raise VolumeFileError(
        f"a multi-frame DICOM ({frames} frames, {kind or 'no SOP class'}) without frame "
        "positions (no Per-Frame Functional Groups or Grid Frame Offset Vector): a cine or a "
        "capture, not a volume; export the volume as a series or an enhanced multi-frame file"
    )


def _functional_place(dataset: Any, index: int) -> tuple[Any, np.ndarray, np.ndarray, tuple]:
    """Frame ``index``'s view and geometry from its functional groups (per frame first,
    then shared)."""

    def item(sequence: str) -> Any:
        for groups in (dataset.PerFrameFunctionalGroupsSequence[index], _shared(dataset)):
            if groups is not None and sequence in groups and len(groups[sequence].value):
                return groups[sequence].value[0]
        return None

    position, orientation, measures = (
        item("PlanePositionSequence"),
        item("PlaneOrientationSequence"),
        item("PixelMeasuresSequence"),
    )
    if position is None or orientation is None or measures is None:
        raise VolumeFileError(
            f"frame {index + 1} has no plane position, orientation or pixel measures in its "
            "functional groups; export the volume with its geometry"
        )
    view = _frame_view(
        dataset, item("PixelValueTransformationSequence"), item("FrameVOILUTSequence")
    )
    return (
        view,
        np.asarray(position.ImagePositionPatient, dtype=np.float64),
        np.asarray(orientation.ImageOrientationPatient, dtype=np.float64),
        _pixel_spacing(measures.PixelSpacing),
    )


def _shared(dataset: Any) -> Any:
    shared = dataset.get("SharedFunctionalGroupsSequence")
    return shared[0] if shared else None


def _frame_view(dataset: Any, transform: Any, window: Any) -> Any:
    """A dataset holding what pydicom's LUT functions read for one frame: the stored bits
    and, lifted from the frame's functional groups, its rescale and its window."""
    from pydicom.dataset import Dataset

    view = Dataset()
    for keyword in (
        "BitsStored",
        "BitsAllocated",
        "PixelRepresentation",
        "PhotometricInterpretation",
    ):
        if keyword in dataset:
            setattr(view, keyword, dataset[keyword].value)
    view.PixelData = b""  # integers, as the 2-D policy reads it
    for source in (dataset, transform, window):
        if source is None:
            continue
        for keyword in ("RescaleSlope", "RescaleIntercept", "RescaleType", "WindowCenter",
                        "WindowWidth", "VOILUTFunction"):  # fmt: skip
            if keyword in source:
                setattr(view, keyword, source[keyword].value)
    return view


def _dose_view(dataset: Any) -> Any:
    """An RT dose's view: its dose grid scaling as the rescale slope (values in Gy)."""
    view = _frame_view(dataset, None, None)
    if "DoseGridScaling" in dataset:
        view.RescaleSlope = float(dataset.DoseGridScaling)
        view.RescaleIntercept = 0.0
    return view


def _stack(slices: list[Slice], schema: VolumeSchema, unit: str) -> Stack:
    """Slices checked (one orientation, one size, evenly spaced) and ordered along the
    slice normal, with the values of the schema's intensity policy."""
    if len(slices) == 1:
        raise VolumeFileError(
            f"a series of a single {unit} ({slices[0].name}); a volume needs at least 2: list "
            "the whole series, or a 2-D image with data.own.spatial_dims: 2"
        )
    first = slices[0]
    for other in slices[1:]:
        if not np.allclose(other.orientation, first.orientation, atol=ORIENTATION_TOLERANCE):
            raise VolumeFileError(
                f"orientations disagree: {other.name} lies along {_cosines(other.orientation)}, "
                f"{first.name} along {_cosines(first.orientation)}; a volume has one "
                "orientation: move the other plane's slices (a localizer?) out of the series"
            )
        if not np.allclose(other.spacing, first.spacing, rtol=1e-3):
            raise VolumeFileError(
                f"{other.name} has pixels of {_mm(other.spacing)}, {first.name} of "
                f"{_mm(first.spacing)}; a volume's {unit}s share one pixel spacing: remove "
                f"the odd {unit} or export the series again"
            )
        if other.pixels.shape != first.pixels.shape:
            raise VolumeFileError(
                f"{other.name} is {_size(other.pixels)} pixels, {first.name} "
                f"{_size(first.pixels)}; a volume's {unit}s share one size: remove the odd "
                f"{unit} (a scout?) or export the series again"
            )
    normal = np.cross(first.orientation[:3], first.orientation[3:])
    along = np.array([s.position @ normal for s in slices])
    order = np.argsort(along, kind="stable")
    ordered = [slices[i] for i in order]
    step = _even_step(along[order], ordered, schema.slice_tolerance, unit)
    values = np.empty((len(ordered), *first.pixels.shape), dtype=np.float32)  # (K, R, C)
    for index, piece in enumerate(ordered):  # written in place: no stacked copy, no transpose
        values[index] = _modality(piece.pixels, piece.dataset)
    values = values.transpose(2, 1, 0)  # (C, R, K), a view: i along the rows, j the columns
    values, bounds = _dicom_policy(values, ordered[0].dataset, schema)
    row_spacing, column_spacing = first.spacing
    lps = np.eye(4)
    lps[:3, 0] = first.orientation[:3] * column_spacing
    lps[:3, 1] = first.orientation[3:] * row_spacing
    lps[:3, 2] = normal * step
    lps[:3, 3] = ordered[0].position
    return Stack(
        values.astype(np.float32, copy=False), np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps, bounds
    )


def _even_step(along: np.ndarray, ordered: list[Slice], tolerance: float, unit: str) -> float:
    """The median step between neighbouring slices; refused when two share a position or
    a step strays more than ``tolerance`` of it (slices missing, or uneven)."""
    steps = np.diff(along)
    median = float(np.median(steps))
    for index, step in enumerate(steps):
        here, there = ordered[index].name, ordered[index + 1].name
        if step <= tolerance * max(median, 1e-6):
            raise VolumeFileError(
                f"{here} and {there} lie at one position ({along[index]:.2f} mm along the "
                f"slice normal): several volumes in one (echoes, phases, segments, a repeated "
                f"{unit}); export one volume a {'file' if unit == 'frame' else 'folder'}"
            )
    strays = np.flatnonzero(np.abs(steps - median) > tolerance * median)
    if strays.size:
        index = int(strays[0])
        raise VolumeFileError(
            f"{unit}s missing or unevenly spaced: {steps[index]:.2f} mm between "
            f"{ordered[index].name} and {ordered[index + 1].name}, {median:.2f} mm between "
            f"the others ({_count(strays.size, 'such gap')}; tolerance {tolerance:.0%}); export the whole "
            "series again"
        )
    return median


def _modality(pixels: np.ndarray, dataset: Any) -> np.ndarray:
    """A slice's values after its modality LUT (a CT in Hounsfield units), as float32."""
    from pydicom.pixels import apply_modality_lut

    return np.asarray(apply_modality_lut(pixels, dataset), dtype=np.float32)


def _dicom_policy(
    values: np.ndarray, dataset: Any, schema: VolumeSchema
) -> tuple[np.ndarray, tuple[float, float]]:
    """The 2-D reader's intensity policy over the whole volume, its window and stored bits
    read from the first slice."""
    try:
        transformed, bounds = value_policy(
            values, dataset, schema.grey(), lambda: _own_bounds(values, schema)
        )
    except ImageFileError as error:
        raise VolumeFileError(str(error).replace("a DICOM without", "a series without")) from None
    transformed = np.asarray(transformed, dtype=np.float32)
    if str(dataset.get("PhotometricInterpretation", "")) == "MONOCHROME1":  # low is bright
        return -transformed, (-bounds[1], -bounds[0])
    return transformed, bounds


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _cosines(orientation: np.ndarray) -> str:
    return "[" + ", ".join(f"{value:.3g}" for value in orientation) + "]"


def _mm(spacing: tuple[float, float]) -> str:
    return "x".join(f"{value:g}" for value in spacing) + " mm"


def _size(pixels: np.ndarray) -> str:
    return "x".join(map(str, pixels.shape))


# Geometry and resampling


def _canonical(
    values: np.ndarray, affine: np.ndarray
) -> tuple[np.ndarray, tuple[float, float, float]]:
    """``values`` (indexed as ``affine`` takes them) turned to the closest RAS+ axes, as
    ``(D, H, W)`` = (S, A, R), and the voxel spacing along those axes in mm."""
    from nibabel.orientations import apply_orientation, io_orientation

    orientation = io_orientation(affine)
    zooms = np.sqrt((np.asarray(affine)[:3, :3] ** 2).sum(axis=0))
    turned = apply_orientation(values, orientation)
    spacing = np.empty(3)
    spacing[orientation[:, 0].astype(int)] = zooms
    voxels = np.ascontiguousarray(turned.transpose(2, 1, 0), dtype=np.float32)
    d, h, w = spacing[2], spacing[1], spacing[0]
    return voxels, (float(d), float(h), float(w))


def _resampled(
    voxels: np.ndarray,
    spacing: tuple[float, float, float],
    schema: VolumeSchema,
    bounds: tuple[float, float],
) -> np.ndarray:
    """``voxels`` at ``schema.size`` per axis (the ``spacing`` policy, torch trilinear),
    mapped from ``bounds`` to 0-255 as uint8."""
    import torch
    from torch.nn.functional import interpolate

    size = schema.size
    target = _target_shape(voxels.shape, spacing, size, schema.spacing)
    if target != voxels.shape:
        tensor = torch.from_numpy(voxels)[None, None]  # (1, 1, D, H, W)
        voxels = interpolate(tensor, size=target, mode="trilinear", align_corners=False)[
            0, 0
        ].numpy()
    scaled = scaled_to_bytes(voxels, bounds)
    if target == (size, size, size):
        return scaled
    out = np.zeros((size, size, size), dtype=np.uint8)  # padded with the lowest intensity
    start = [(size - length) // 2 for length in target]
    out[tuple(slice(s, s + length) for s, length in zip(start, target, strict=True))] = scaled
    return out


def _target_shape(
    shape: tuple[int, ...], spacing: tuple[float, float, float], size: int, policy: str
) -> tuple[int, int, int]:
    """Voxels per axis after resampling: ``size`` each (``stretch``), or the longest
    physical side at ``size`` and the others in proportion (``isotropic``)."""
    if policy == "stretch":
        return (size, size, size)
    extent = np.asarray(shape, dtype=np.float64) * np.asarray(spacing)
    lengths = np.clip(np.round(extent * size / extent.max()), 1, size).astype(int)
    return (int(lengths[0]), int(lengths[1]), int(lengths[2]))
