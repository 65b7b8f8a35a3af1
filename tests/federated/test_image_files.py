"""What a hospital's archive exports, read as the model needs it: every DICOM transfer
syntax pydicom decodes with its plugins, on files pydicom ships (written by DCMTK, GDCM
and vendors, not by us), every modality's intensities kept by a declared policy, palette
colour applied, and every refusal one line that says why and what to do."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest
from pydicom import dcmread
from pydicom.data import get_testdata_file
from pydicom.uid import (
    JPEG2000,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGExtended12Bit,
    JPEGLosslessSV1,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
)

from federated.image_files import ImageFileError, ImageSchema, decode_file, decode_image

GREY_64 = ImageSchema(channels=1, size=64)
RGB_64 = ImageSchema(channels=3, size=64)


def shipped(name: str) -> Path:
    """A file from pydicom's own test data (installed with pydicom, no download)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Path(get_testdata_file(name))


def read(name: str, schema: ImageSchema = GREY_64) -> np.ndarray:
    return decode_file(shipped(name), schema).pixels


def with_changes(name: str, **changes: object) -> bytes:
    """A shipped file's bytes with some elements changed or (None) removed."""
    dataset = dcmread(shipped(name))
    for keyword, value in changes.items():
        if value is None:
            delattr(dataset, keyword)
        else:
            setattr(dataset, keyword, value)
    out = io.BytesIO()
    dataset.save_as(out)
    return out.getvalue()


EVERY_ENCODING = [
    ("MR_small.dcm", ExplicitVRLittleEndian),
    ("MR_small_implicit.dcm", ImplicitVRLittleEndian),
    ("MR_small_bigendian.dcm", ExplicitVRBigEndian),
    ("image_dfl.dcm", DeflatedExplicitVRLittleEndian),
    ("MR_small_RLE.dcm", RLELossless),
    ("SC_rgb_jpeg_dcmtk.dcm", JPEGBaseline8Bit),
    ("JPGExtended.dcm", JPEGExtended12Bit),
    ("SC_rgb_jpeg_gdcm.dcm", JPEGLosslessSV1),
    ("MR_small_jpeg_ls_lossless.dcm", JPEGLSLossless),
    ("JPEGLSNearLossless_16.dcm", JPEGLSNearLossless),
    ("MR_small_jp2klossless.dcm", JPEG2000Lossless),
    ("JPEG2000.dcm", JPEG2000),
]


@pytest.mark.parametrize(("name", "syntax"), EVERY_ENCODING)
def test_every_transfer_syntax_an_archive_exports_is_read_with_its_contrast(
    name: str, syntax: str
) -> None:
    assert dcmread(shipped(name), stop_before_pixels=True).file_meta.TransferSyntaxUID == syntax

    for schema in (GREY_64, RGB_64):
        image = read(name, schema)
        assert image.dtype == np.uint8
        assert image.shape == (64, 64) if schema.channels == 1 else (64, 64, 3)
        assert image.std() > 10  # an image, not a flat grey


@pytest.mark.parametrize(
    "name",
    ["MR_small_implicit.dcm", "MR_small_bigendian.dcm", "MR_small_RLE.dcm",
     "MR_small_jpeg_ls_lossless.dcm", "MR_small_jp2klossless.dcm"],
)  # fmt: skip
def test_a_lossless_encoding_reads_exactly_as_the_uncompressed_file(name: str) -> None:
    assert np.array_equal(read(name), read("MR_small.dcm"))


@pytest.mark.parametrize(
    "name",
    ["SC_rgb_jpeg_dcmtk.dcm", "SC_rgb_dcmtk_+eb+cy+np.dcm", "SC_ybr_full_422_uncompressed.dcm",
     "SC_rgb_jpeg_gdcm.dcm", "SC_rgb_gdcm_KY.dcm", "SC_rgb_jls_lossy_line.dcm"],
)  # fmt: skip
def test_ybr_and_compressed_colour_read_as_the_rgb_they_encode(name: str) -> None:
    reference = read("SC_rgb_rle.dcm", RGB_64).astype(int)  # uncompressed RGB of that image

    colour = read(name, RGB_64).astype(int)

    assert np.abs(colour - reference).mean() < 3  # lossy or chroma-subsampled: close


def test_sixteen_bit_images_without_a_window_keep_their_contrast() -> None:
    nm = dcmread(shipped("JPEG2000.dcm"))  # NM, int16, values -30..245, no window
    assert "WindowCenter" not in nm and (nm.pixel_array.min(), nm.pixel_array.max()) == (-30, 245)
    for name in ("JPEG2000.dcm", "CT_small.dcm", "rtdose_1frame.dcm"):  # NM, CT, 32-bit dose
        assert "WindowCenter" not in dcmread(shipped(name), stop_before_pixels=True)
        image = read(name)
        assert image.std() > 15, name  # before: 0.4 (NM) and all zeros (32-bit)
        assert np.array_equal(image, read(name, ImageSchema(size=64, intensity="range")))


def test_the_files_own_window_is_applied_and_each_policy_does_what_it_says() -> None:
    windowed = "693_J2KI.dcm"  # CT, Hounsfield units, window 40/400: soft tissue
    auto = read(windowed)
    assert np.array_equal(auto, read(windowed, ImageSchema(size=64, intensity="window")))
    by_range = read(windowed, ImageSchema(size=64, intensity="range"))
    assert not np.array_equal(auto, by_range)  # the window ignored: bone to air
    assert (auto == 0).mean() > (by_range == 0).mean()  # the window clips air to black
    percentiles = ImageSchema(size=512, intensity="percentiles", percentiles=(5, 95))
    clipped = read(windowed, percentiles)
    assert (clipped == 0).mean() >= 0.04 and (clipped == 255).mean() >= 0.04

    with pytest.raises(ImageFileError, match=r"without a window.*intensity auto, range"):
        read("CT_small.dcm", ImageSchema(size=64, intensity="window"))


def test_palette_colour_is_applied_not_read_as_grey_indices() -> None:
    dataset = dcmread(shipped("examples_palette.dcm"))
    assert dataset.PhotometricInterpretation == "PALETTE COLOR"

    colour = read("examples_palette.dcm", ImageSchema(channels=3, size=64, resample="nearest"))

    assert np.abs(colour[..., 0].astype(int) - colour[..., 2]).max() > 50  # not grey


def test_ultrasound_rgb_and_a_one_bit_segmentation() -> None:
    assert read("examples_rgb_color.dcm", RGB_64).std() > 20  # US, RGB

    mask = read("liver_1frame.dcm", ImageSchema(size=512, resample="nearest"))  # SEG, 1 bit
    assert set(np.unique(mask)) == {0, 255}


def test_an_eight_bit_image_and_a_pngs_values_stay_as_stored_under_auto(tmp_path: Path) -> None:
    from PIL import Image

    ramp = np.tile(np.arange(40, 200, 10, dtype=np.uint8), (16, 1))
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    schema = ImageSchema(size=16)
    assert np.array_equal(decode_file(tmp_path / "ramp.png", schema).pixels, ramp)
    stretched = decode_file(tmp_path / "ramp.png", ImageSchema(size=16, intensity="range"))
    assert (stretched.pixels.min(), stretched.pixels.max()) == (0, 255)

    deep = (ramp.astype(np.int32) * 100).astype(np.uint16)  # a 16-bit PNG: its own range
    Image.fromarray(deep).save(tmp_path / "deep.png")
    pixels = decode_file(tmp_path / "deep.png", schema).pixels
    assert (pixels.min(), pixels.max()) == (0, 255)
    with pytest.raises(ImageFileError, match="a 16-bit image file has no window"):
        decode_file(tmp_path / "deep.png", ImageSchema(size=16, intensity="window"))


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("SC_rgb_rle_2frame.dcm", "a multi-frame DICOM (2 frames); export one frame a file"),
        ("test-SR.dcm", "a DICOM without pixel data (Comprehensive SR Storage"),
        ("rtplan.dcm", "a DICOM without pixel data (RT Plan Storage"),
        ("waveform_ecg.dcm", "a DICOM without pixel data (12-lead ECG Waveform Storage"),
        ("MR_truncated.dcm", "may be truncated or damaged: export it again"),
        ("JPEG-lossy.dcm", "JPEG Extended (Process 2 and 4) (1.2.840.10008.1.2.4.51): its pixel"),
        ("mpeg2", "MPEG2 Main Profile / Main Level (1.2.840.10008.1.2.4.100): pydicom decodes "
                  "no such encoding; export the file uncompressed"),
        ("not-dicom", "not a DICOM file (no 'DICM' after its 128-byte preamble); export it"),
    ],
)  # fmt: skip
def test_every_refusal_is_one_line_naming_the_cause_and_what_to_do(
    source: str, reason: str
) -> None:
    if source == "mpeg2":  # an encoding no plugin decodes
        raw = with_changes("SC_rgb_jpeg_dcmtk.dcm")
        dataset = dcmread(io.BytesIO(raw))
        dataset.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.100"
        out = io.BytesIO()
        dataset.save_as(out)
        raw = out.getvalue()
    elif source == "not-dicom":
        raw = b"a text file saved as .dcm\n" * 20
    else:
        raw = shipped(source).read_bytes()

    with pytest.raises(ImageFileError) as error:
        decode_image(raw, ".dcm", GREY_64)

    assert reason in str(error.value)
    assert "\n" not in str(error.value) and len(str(error.value)) < 400
