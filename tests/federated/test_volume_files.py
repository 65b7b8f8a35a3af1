"""Volumes as hospitals store them: series folders in the encodings archives export,
enhanced multi-frame files and NIfTI, read as the same array; the files pydicom and
nibabel ship (written by scanners and other tools, not by us); and every refusal in one
line."""

from __future__ import annotations

import gzip
import shutil
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import nibabel
import numpy as np
import pytest
import torch
from pydicom import dcmread
from pydicom.data import get_testdata_file
from pydicom.uid import (
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
)

from federated.volume_files import (
    VolumeFileError,
    VolumeSchema,
    decode_volume,
    decode_volume_bytes,
)
from federated.volume_writers import write_multiframe, write_nifti, write_series

NIBABEL_DATA = Path(nibabel.__file__).parent / "tests" / "data"
NICOM_DATA = Path(nibabel.__file__).parent / "nicom" / "tests" / "data"
SPACING = (2.0, 1.0, 1.0)  # mm between slices, rows, columns
AS_READ = VolumeSchema(size=64, spacing="stretch")  # 64 px slices: no in-plane resampling


@pytest.fixture(scope="module")
def stored() -> np.ndarray:
    """A CT-like volume of 8 slices of 64² stored values (HU + 1024), seeded."""
    rng = np.random.default_rng(0)
    volume = rng.integers(0, 2000, size=(8, 64, 64), dtype=np.uint16)
    volume[3, 10:20, 30:40] = 3000  # a bright block: order and orientation show in it
    return volume


def expected_bytes(stored: np.ndarray) -> np.ndarray:
    """What the ``auto`` policy makes of a rescaled CT: its own HU range mapped to 0-255."""
    hu = stored.astype(np.float64) - 1024
    return np.round((hu - hu.min()) * 255 / (hu.max() - hu.min())).astype(np.uint8)


def shipped(name: str) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Path(get_testdata_file(name))


@pytest.mark.parametrize(
    "syntax",
    [
        ExplicitVRLittleEndian,
        ImplicitVRLittleEndian,
        ExplicitVRBigEndian,
        DeflatedExplicitVRLittleEndian,
        RLELossless,
        JPEG2000Lossless,  # pylibjpeg-openjpeg encodes it at 32 px and above
    ],
    ids=lambda uid: uid.name,
)
def test_a_series_in_each_encoding_an_archive_exports_reads_as_written(
    stored: np.ndarray, syntax: str, tmp_path: Path
) -> None:
    folder = write_series(tmp_path / "series", stored, SPACING, syntax=syntax)
    uncompressed = write_series(tmp_path / "uncompressed", stored, SPACING)

    volume = decode_volume(folder, AS_READ)

    np.testing.assert_array_equal(volume.pixels, decode_volume(uncompressed, AS_READ).pixels)

    # stretch to 64: the slices' axis is resampled (8 -> 64), the planes stay as stored
    hu = torch.from_numpy(expected_bytes(stored).astype(np.float32))[None, None]
    along = torch.nn.functional.interpolate(hu, size=(64, 64, 64), mode="trilinear")
    assert np.abs(volume.pixels.astype(int) - along[0, 0].round().numpy()).max() <= 1
    assert volume.source_size == (8, 64, 64) and volume.spacing == pytest.approx(SPACING)


def test_a_series_is_held_as_float_once_while_it_is_read(tmp_path: Path) -> None:
    # the slices go straight into one (K, R, C) volume, which is turned to RAS+ without a
    # copy: the reader's peak is the file bytes, the decoded slices and one float volume
    # (stacking the slices along a last axis, then copying the turn, held about 3.8x)
    rng = np.random.default_rng(1)
    stored = rng.integers(0, 2000, size=(48, 128, 128), dtype=np.uint16)
    folder = write_series(tmp_path / "series", stored, SPACING)
    decode_volume(folder, VolumeSchema(size=32))  # imports and pydicom's caches, untraced

    tracemalloc.start()
    try:
        decode_volume(folder, VolumeSchema(size=32))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert peak < 3.3 * stored.size * np.dtype(np.float32).itemsize


def test_nifti_multiframe_and_series_of_one_scan_read_as_one_array(
    stored: np.ndarray, tmp_path: Path
) -> None:
    schema = VolumeSchema(size=32)  # isotropic: 16 mm x 64 mm x 64 mm -> 8 x 32 x 32, padded

    readings = [
        decode_volume(write_nifti(tmp_path / "scan.nii.gz", stored, SPACING), schema),
        decode_volume(write_multiframe(tmp_path / "scan.dcm", stored, SPACING), schema),
        decode_volume(write_series(tmp_path / "scan", stored, SPACING), schema),
    ]

    for other in readings[1:]:
        np.testing.assert_array_equal(other.pixels, readings[0].pixels)
    occupied = np.flatnonzero(readings[0].pixels.reshape(32, -1).any(axis=1))
    assert (occupied.min(), occupied.max()) == (12, 19)  # 8 slices of 2 mm, centred


def test_slices_are_ordered_along_the_normal_not_by_name_or_instance_number(
    stored: np.ndarray, tmp_path: Path
) -> None:
    in_order = decode_volume(write_series(tmp_path / "ordered", stored, SPACING), AS_READ)
    folder = write_series(tmp_path / "shuffled", stored, SPACING)
    files = sorted(folder.iterdir())
    names = [f"IM{n:03d}" for n in np.random.default_rng(1).permutation(len(files))]
    for file, name in zip(files, names, strict=True):
        dataset = dcmread(file)
        dataset.InstanceNumber = len(files) - int(dataset.InstanceNumber) + 1  # reversed
        dataset.save_as(folder / name)
        file.unlink()

    shuffled = decode_volume(folder, AS_READ)

    np.testing.assert_array_equal(shuffled.pixels, in_order.pixels)


def test_a_series_with_its_own_window_and_each_policy(stored: np.ndarray, tmp_path: Path) -> None:
    cube = stored[:, 12:20, 32:40]  # 8³ read at size 8: no resampling, the policy alone
    folder = write_series(tmp_path / "windowed", cube, SPACING)
    for file in folder.iterdir():
        dataset = dcmread(file)
        dataset.WindowCenter, dataset.WindowWidth = 40, 400  # a soft-tissue window, in HU
        dataset.save_as(file)

    def read(policy: str) -> np.ndarray:
        return decode_volume(
            folder, VolumeSchema(size=8, spacing="stretch", intensity=policy)
        ).pixels

    hu = cube.astype(np.float64) - 1024
    windowed = read("auto")  # the series' own window
    assert (windowed[hu <= -160] == 0).all() and (windowed[hu >= 240] == 255).all()
    np.testing.assert_array_equal(read("window"), windowed)
    np.testing.assert_array_equal(read("range"), expected_bytes(cube))  # HU min..max
    clipped = read("percentiles")
    low, high = np.percentile(hu, (0.5, 99.5))
    assert (clipped[hu <= low] == 0).all() and (clipped[hu >= high] == 255).all()


def test_a_monochrome1_series_is_inverted_as_a_monochrome1_image(
    stored: np.ndarray, tmp_path: Path
) -> None:
    cube = stored[:, :8, :8]
    as_read = VolumeSchema(size=8, spacing="stretch")
    normal = decode_volume(write_series(tmp_path / "m2", cube, SPACING), as_read)
    folder = write_series(tmp_path / "m1", cube, SPACING)
    for file in folder.iterdir():
        dataset = dcmread(file)
        dataset.PhotometricInterpretation = "MONOCHROME1"  # low values are bright
        dataset.save_as(file)

    inverted = decode_volume(folder, as_read)

    np.testing.assert_array_equal(inverted.pixels, 255 - normal.pixels)


def test_pydicoms_rt_dose_reads_alike_in_three_encodings_and_in_gray() -> None:
    readings = [
        decode_volume(shipped(name), VolumeSchema(size=16, spacing="stretch"))
        for name in ("rtdose.dcm", "rtdose_expb.dcm", "rtdose_rle.dcm")
    ]  # implicit VR little endian, explicit VR big endian, RLE lossless

    for other in readings[1:]:
        np.testing.assert_array_equal(other.pixels, readings[0].pixels)
    assert readings[0].source_size == (15, 10, 10)  # frames along the grid frame offsets
    assert readings[0].spacing == pytest.approx((5.0, 10.0, 10.0))
    assert readings[0].pixels.max() == 255 and readings[0].pixels.min() == 0


def test_a_philips_enhanced_mr_from_nibabels_test_data(tmp_path: Path) -> None:
    enhanced = tmp_path / "philips_mprage.dcm"
    enhanced.write_bytes(gzip.decompress((NICOM_DATA / "philips_mprage.dcm.gz").read_bytes()))

    volume = decode_volume(enhanced, VolumeSchema(size=16))

    # 176 sagittal frames of 256², 1 mm: the frames run right to left, the last axis of RAS+
    assert volume.source_size == (256, 256, 176)
    assert volume.spacing == pytest.approx((1.0, 1.0, 1.0), abs=1e-3)
    assert volume.pixels.shape == (16, 16, 16)


def test_a_siemens_series_from_nibabels_test_data(tmp_path: Path) -> None:
    folder = tmp_path / "siemens"
    folder.mkdir()
    for name in ("1.dcm", "0.dcm"):
        shutil.copy(NICOM_DATA / name, folder / name)

    volume = decode_volume(folder, VolumeSchema(size=32))

    assert volume.source_size == (2, 256, 256)  # two slices 3 mm apart
    assert volume.spacing[0] == pytest.approx(3.0, abs=1e-3)
    assert volume.pixels.max() == 255


@pytest.mark.parametrize(
    "name", ["anatomical.nii", "standard.nii.gz", "reoriented_anat_moved.nii"]
)  # big-endian int16 in LAS; uint8, anisotropic; big-endian float in RAS
def test_nibabels_nifti_reads_as_its_closest_canonical(name: str, tmp_path: Path) -> None:
    canonical = nibabel.as_closest_canonical(nibabel.load(NIBABEL_DATA / name))
    nibabel.save(canonical, tmp_path / "canonical.nii")

    as_shipped = decode_volume(NIBABEL_DATA / name, VolumeSchema(size=24))
    as_canonical = decode_volume(tmp_path / "canonical.nii", VolumeSchema(size=24))

    np.testing.assert_array_equal(as_shipped.pixels, as_canonical.pixels)
    assert as_shipped.source_size == canonical.shape[::-1]
    assert as_shipped.spacing == pytest.approx(canonical.header.get_zooms()[::-1])
    assert as_shipped.pixels.max() > 0


def write_broken(kind: str, stored: np.ndarray, root: Path) -> Path:
    """A volume broken in one of the ways hospital exports break."""
    folder = write_series(root / "series", stored, SPACING)
    files = sorted(folder.iterdir())
    if kind == "missing slice":
        files[4].unlink()
    elif kind == "two series":
        write_series(root / "other", stored[:3], SPACING)
        shutil.copy(root / "other" / "0001.dcm", folder / "other-0001.dcm")
    elif kind == "orientations":
        dataset = dcmread(files[2])
        dataset.ImageOrientationPatient = [0, 1, 0, 0, 0, -1]  # a sagittal localizer
        dataset.save_as(files[2])
    elif kind == "slice size":
        write_series(root / "small", stored[:3, :32, :32], SPACING)
        dataset = dcmread(root / "small" / "0002.dcm")
        dataset.SeriesInstanceUID = dcmread(files[0]).SeriesInstanceUID
        dataset.ImagePositionPatient = [0.0, 0.0, 2 * SPACING[0]]
        dataset.save_as(files[2])
    elif kind == "pixel spacing":
        dataset = dcmread(files[6])
        dataset.PixelSpacing = [0.8, 0.8]
        dataset.save_as(files[6])
    elif kind == "single slice":
        for file in files[1:]:
            file.unlink()
    elif kind == "same position":
        dataset = dcmread(files[5])
        dataset.ImagePositionPatient = dcmread(files[4]).ImagePositionPatient
        dataset.save_as(files[5])
    elif kind == "not dicom":
        (folder / "notes.txt").write_text("series exported by ...")
    elif kind == "one frame":
        return files[0]
    elif kind == "4-D nifti":
        return NIBABEL_DATA / "example4d.nii.gz"
    elif kind == "4-D nifti-2":
        return NIBABEL_DATA / "example_nifti2.nii.gz"
    elif kind == "flat nifti":
        image = nibabel.Nifti1Image(stored[:1].transpose(2, 1, 0).astype(np.int16), np.eye(4))
        nibabel.save(image, root / "flat.nii.gz")
        return root / "flat.nii.gz"
    elif kind == "truncated nifti":
        write_nifti(root / "whole.nii", stored, SPACING)
        (root / "cut.nii").write_bytes((root / "whole.nii").read_bytes()[:20_000])
        return root / "cut.nii"
    elif kind == "colour cine":
        return shipped("examples_ybr_color.dcm")
    elif kind == "no frame positions":
        dataset = dcmread(write_multiframe(root / "mf.dcm", stored, SPACING))
        del dataset.PerFrameFunctionalGroupsSequence
        dataset.save_as(root / "mf.dcm")
        return root / "mf.dcm"
    elif kind == "unknown suffix":
        (root / "scan.mha").write_bytes(b"ObjectType = Image")
        return root / "scan.mha"
    return folder


@pytest.mark.parametrize(
    ("kind", "cause", "remedy"),
    [
        ("missing slice", "slices missing or unevenly spaced: 4.00 mm between", "export the whole series"),
        ("two series", "2 series share the folder", "put each series in a folder of its own"),
        ("orientations", "orientations disagree", "move the other plane's slices"),
        ("slice size", "0002.dcm is 32x32 pixels, 0000.dcm 64x64", "remove the odd slice"),
        ("pixel spacing", "0006.dcm has pixels of 0.8x0.8 mm, 0000.dcm of 1x1 mm", "remove the odd slice"),
        ("single slice", "a series of a single slice", "list the whole series"),
        ("same position", "lie at one position", "export one volume a folder"),
        ("not dicom", "notes.txt in the series folder is not a DICOM file", "keep only the series"),
        ("one frame", "a DICOM of one frame is a single slice", "list the folder holding"),
        ("4-D nifti", "holds 2 volumes", "export one volume a file"),
        ("4-D nifti-2", "holds 2 volumes", "export one volume a file"),
        ("flat nifti", "is a single slice, not a volume", "spatial_dims: 2"),
        ("truncated nifti", "could not be read", "export it again"),
        ("colour cine", "a colour DICOM (YBR_FULL_422)", "list colour images as 2-D images"),
        ("no frame positions", "without frame positions", "export the volume as a series"),
        ("unknown suffix", "unknown volume type .mha", "a folder holding one DICOM series"),
    ],
)  # fmt: skip
def test_each_broken_volume_is_refused_in_one_line_with_cause_and_remedy(
    kind: str, cause: str, remedy: str, stored: np.ndarray, tmp_path: Path
) -> None:
    path = write_broken(kind, stored, tmp_path)

    with pytest.raises(VolumeFileError) as refused:
        decode_volume(path, AS_READ)

    line = str(refused.value)
    assert cause in line and remedy in line and "\n" not in line, line


def test_what_a_served_model_is_sent_reads_as_the_files(stored: np.ndarray, tmp_path: Path) -> None:
    schema = VolumeSchema(size=32)
    folder = write_series(tmp_path / "series", stored, SPACING)
    zipped = tmp_path / "series.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        for file in sorted(folder.iterdir()):
            archive.write(file, f"export/series/{file.name}")
        archive.writestr("__MACOSX/export/._0000.dcm", b"resource fork")
    nifti = write_nifti(tmp_path / "scan.nii.gz", stored, SPACING)
    multiframe = write_multiframe(tmp_path / "scan.dcm", stored, SPACING)
    expected = decode_volume(folder, schema).pixels

    for path in (zipped, nifti, multiframe):
        np.testing.assert_array_equal(
            decode_volume_bytes(path.read_bytes(), schema).pixels, expected
        )
    np.testing.assert_array_equal(decode_volume(zipped, schema, by_content=True).pixels, expected)
    np.testing.assert_array_equal(decode_volume(zipped, schema).pixels, expected)  # a table's row
    with pytest.raises(VolumeFileError) as refused:
        decode_volume_bytes(b"\x89PNG\r\n\x1a\n" + bytes(400), schema)
    assert str(refused.value) == (
        "not a volume: neither a NIfTI (.nii, .nii.gz), a DICOM (multi-frame) nor a zip of one "
        "DICOM series; send one of those"
    )


def test_a_schema_that_cannot_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="spacing 'nearest'; allowed: isotropic, stretch"):
        VolumeSchema(spacing="nearest")
    with pytest.raises(ValueError, match=r"slice_tolerance 1\.5"):
        VolumeSchema(slice_tolerance=1.5)
