"""Volumes written as hospitals store them: a NIfTI file, a DICOM series folder (one file a
slice, in an encoding an archive exports) or an enhanced multi-frame DICOM, and a label
table naming them: the layout :func:`federated.own_data.load_own_images` reads. For
pilots, exports and tests.

Every form is written so that :func:`federated.volume_files.decode_volume` reads back the
array it was given, ``(D, H, W)`` (inferior to superior, posterior to anterior, patient's
left to right: RAS+ axes), at the spacing it was given; stored values are CT-like
Hounsfield units, ``stored + intercept``.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from federated.data import Split

__all__ = ["VOLUME_FORMS", "write_multiframe", "write_nifti", "write_series", "write_volume_folder"]

VOLUME_FORMS = ("nifti", "series", "multiframe")
INTERCEPT = -1024.0  # a CT's usual rescale intercept: stored 0 is air, -1024 HU
ENHANCED_CT = "1.2.840.10008.5.1.4.1.1.2.1"  # Enhanced CT Image Storage
CT_IMAGE = "1.2.840.10008.5.1.4.1.1.2"  # CT Image Storage
ROW_DIRECTION = (-1.0, 0.0, 0.0)  # LPS: along the rows, to the patient's right
COLUMN_DIRECTION = (0.0, -1.0, 0.0)  # LPS: down the columns, to the front


def write_nifti(path: Path, stored: np.ndarray, spacing: Sequence[float]) -> Path:
    """``stored`` ``(D, H, W)`` as a NIfTI-1 (``.nii`` or ``.nii.gz``) of int16 Hounsfield
    units, RAS+ at ``spacing`` (D, H, W) mm."""
    import nibabel

    depth, height, width = (float(s) for s in spacing)
    values = (np.asarray(stored, dtype=np.int32) + int(INTERCEPT)).astype(np.int16)
    image = nibabel.Nifti1Image(values.transpose(2, 1, 0), np.diag([width, height, depth, 1.0]))
    nibabel.save(image, path)
    return path


def write_series(
    folder: Path,
    stored: np.ndarray,
    spacing: Sequence[float],
    *,
    syntax: str = "1.2.840.10008.1.2.1",
    series_uid: str | None = None,
) -> Path:
    """``stored`` ``(D, H, W)`` as one CT series, a file a slice named by slice index, in
    the transfer syntax ``syntax`` (uncompressed, deflate, RLE or JPEG 2000 lossless:
    what pydicom's encoders write)."""
    from pydicom.uid import UID, generate_uid

    folder.mkdir(parents=True, exist_ok=True)
    series_uid = series_uid or generate_uid()
    study_uid, frame_uid = generate_uid(), generate_uid()
    for index, pixels in enumerate(np.asarray(stored, dtype=np.uint16)):
        dataset = _image_dataset(CT_IMAGE, pixels.shape, UID(syntax))
        dataset.StudyInstanceUID, dataset.SeriesInstanceUID = study_uid, series_uid
        dataset.FrameOfReferenceUID = frame_uid
        dataset.InstanceNumber = index + 1
        dataset.ImagePositionPatient = [0.0, 0.0, index * float(spacing[0])]
        dataset.ImageOrientationPatient = [*ROW_DIRECTION, *COLUMN_DIRECTION]
        dataset.PixelSpacing = [float(spacing[1]), float(spacing[2])]
        dataset.SliceThickness = float(spacing[0])
        dataset.RescaleSlope, dataset.RescaleIntercept, dataset.RescaleType = 1, INTERCEPT, "HU"
        _store_pixels(dataset, pixels, UID(syntax))
        dataset.save_as(folder / f"{index:04d}.dcm", enforce_file_format=True)
    return folder


def write_multiframe(path: Path, stored: np.ndarray, spacing: Sequence[float]) -> Path:
    """``stored`` ``(D, H, W)`` as one enhanced CT file, a frame a slice, its geometry and
    rescale in the functional groups."""
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence as DicomSequence
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    stored = np.asarray(stored, dtype=np.uint16)
    dataset = _image_dataset(ENHANCED_CT, stored.shape[1:], ExplicitVRLittleEndian)
    dataset.StudyInstanceUID, dataset.SeriesInstanceUID = generate_uid(), generate_uid()
    dataset.NumberOfFrames = len(stored)
    shared = Dataset()
    orientation, measures, transform = Dataset(), Dataset(), Dataset()
    orientation.ImageOrientationPatient = [*ROW_DIRECTION, *COLUMN_DIRECTION]
    measures.PixelSpacing = [float(spacing[1]), float(spacing[2])]
    measures.SliceThickness = float(spacing[0])
    transform.RescaleSlope, transform.RescaleIntercept, transform.RescaleType = 1, INTERCEPT, "HU"
    shared.PlaneOrientationSequence = DicomSequence([orientation])
    shared.PixelMeasuresSequence = DicomSequence([measures])
    shared.PixelValueTransformationSequence = DicomSequence([transform])
    dataset.SharedFunctionalGroupsSequence = DicomSequence([shared])
    frames = []
    for index in range(len(stored)):
        position, frame = Dataset(), Dataset()
        position.ImagePositionPatient = [0.0, 0.0, index * float(spacing[0])]
        frame.PlanePositionSequence = DicomSequence([position])
        frames.append(frame)
    dataset.PerFrameFunctionalGroupsSequence = DicomSequence(frames)
    dataset.PixelData = stored.tobytes()
    dataset.save_as(path, enforce_file_format=True)
    return path


def write_volume_folder(
    folder: Path,
    splits: dict[str, Split],
    classes: tuple[str, ...],
    *,
    forms: Sequence[str] = VOLUME_FORMS,
    spacing: Sequence[float] = (1.0, 1.0, 1.0),
) -> Path:
    """Write ``splits``' volumes (uint8 ``(N, D, H, W)``), each in the next of ``forms``
    in turn, and the ``labels.csv`` naming them (file or folder, label, split)."""
    unknown = [form for form in forms if form not in VOLUME_FORMS]
    if unknown:
        raise ValueError(f"forms {unknown}; allowed: {', '.join(VOLUME_FORMS)}")
    folder.mkdir(parents=True, exist_ok=True)
    table = folder / "labels.csv"
    turn = itertools.cycle(forms)
    with table.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "label", "split"])
        for name, split in splits.items():
            (folder / name).mkdir(exist_ok=True)
            for index, (volume, label) in enumerate(zip(split.images, split.labels, strict=True)):
                form = next(turn)
                entry = (
                    f"{name}/{index:05d}"
                    + {"nifti": ".nii.gz", "series": "", "multiframe": ".dcm"}[form]
                )
                writer_of = {
                    "nifti": write_nifti,
                    "series": write_series,
                    "multiframe": write_multiframe,
                }
                writer_of[form](folder / entry, volume, spacing)
                writer.writerow([entry, classes[int(label[0])], name])
    return table


def _image_dataset(sop_class: str, shape: tuple[int, ...], syntax: str) -> Any:
    """A 16-bit grey image's dataset and file meta, without its pixel data."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import UID, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID(sop_class)
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = UID(syntax)
    dataset = Dataset()
    dataset.file_meta = meta
    dataset.SOPClassUID, dataset.SOPInstanceUID = (
        meta.MediaStorageSOPClassUID,
        meta.MediaStorageSOPInstanceUID,
    )
    dataset.Modality = "CT"
    dataset.Rows, dataset.Columns = (int(length) for length in shape)
    dataset.SamplesPerPixel = 1
    dataset.PhotometricInterpretation = "MONOCHROME2"
    dataset.BitsAllocated, dataset.BitsStored, dataset.HighBit = 16, 16, 15
    dataset.PixelRepresentation = 0
    return dataset


def _store_pixels(dataset: Any, pixels: np.ndarray, syntax: Any) -> None:
    """The slice's pixels, encoded as ``syntax`` asks (pydicom's encoders for RLE and
    JPEG 2000 lossless; uncompressed and deflate as they are)."""
    if syntax.is_compressed and not syntax.is_deflated:
        dataset.compress(syntax, pixels, generate_instance_uid=False)
    else:
        order = ">" if not syntax.is_little_endian else "<"
        dataset.PixelData = np.ascontiguousarray(pixels, dtype=f"{order}u2").tobytes()
