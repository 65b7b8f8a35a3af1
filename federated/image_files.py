"""One image file in a dataset's schema: PNG, JPEG, BMP, TIFF (Pillow) or DICOM (pydicom).

Kept free of torch so that the processes decoding a large folder in parallel
(:mod:`federated.own_data`) start in a fraction of a second.

**DICOM encodings.** pydicom reads every transfer syntax its decoder plugins decode: the
uncompressed ones (explicit and implicit little-endian, big-endian), deflate, RLE, JPEG
baseline, extended and lossless (``pylibjpeg-libjpeg``), JPEG-LS lossless and
near-lossless (``pylibjpeg-libjpeg``) and JPEG 2000 lossless and lossy
(``pylibjpeg-openjpeg``). YBR colour becomes RGB (pydicom), and a ``PALETTE COLOR`` image
gets its palette (:func:`pydicom.pixels.apply_color_lut`).

**Intensity policy** (``ImageSchema.intensity``, pinned in the plan every site approves),
for grey images whose values are not already display values:

- ``window``: the file's own VOI LUT or window (pydicom's :func:`~pydicom.pixels.apply_voi_lut`
  after the modality LUT), its output range mapped to 0-255; a file without one is refused.
- ``range``: the image's own minimum and maximum (after the modality LUT) mapped to 0-255.
- ``percentiles``: the image's own lower and upper percentiles (``ImageSchema.percentiles``)
  mapped to 0-255, values beyond them clipped, as MONAI's ``ScaleIntensityRangePercentiles``.
- ``auto`` (the default), per file: the file's window when it has one; else an image of at
  most 8 stored bits without a rescale over the range its bits allow (an 8-bit image as
  stored, a 1-bit mask as 0 and 255); else (16- and 32-bit images, CT in Hounsfield units,
  MR, NM and ultrasound exports without a window) its own range.

Pillow's 8-bit images are display values (kept as stored under ``auto`` and ``window``);
16-bit and float ones are scaled as a DICOM without a window. Colour images are scaled
over their bit depth. MONOCHROME1 is inverted after scaling.

Every refusal is one line: why, and what to do (the caller adds the file's name).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DICOM_SUFFIXES",
    "IMAGE_SUFFIXES",
    "INTENSITY_POLICIES",
    "DecodedImage",
    "ImageFileError",
    "ImageSchema",
    "decode_file",
    "decode_image",
    "decode_or_refuse",
    "one_line",
    "pixel_array",
    "refusal_as_line",
    "scaled_to_bytes",
    "suffix_of_content",
    "value_policy",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
DICOM_SUFFIXES = (".dcm", ".dicom")
INTENSITY_POLICIES = ("auto", "window", "range", "percentiles")
RESAMPLE = ("nearest", "bilinear", "bicubic", "lanczos")
PILLOW_DEEP_MODES = ("I", "I;16", "I;16B", "I;16L", "F")
DICOM_MAGIC = (128, b"DICM")  # a DICOM file's preamble is followed by these four bytes
REASON_LENGTH = 160  # characters of a library's own message kept in a refusal


class ImageFileError(ValueError):
    """An image file that cannot be read in the schema: one line saying why."""


@dataclass(frozen=True)
class ImageSchema:
    """What every image becomes: ``channels`` (1 grey, 3 RGB) at ``size`` square pixels
    (Pillow's ``resample`` filter, not applied at that size), its grey values scaled by
    ``intensity`` (``percentiles``: lower and upper, 0-100, for that policy)."""

    channels: int = 1
    size: int = 28
    resample: str = "bilinear"
    intensity: str = "auto"
    percentiles: tuple[float, float] = (0.5, 99.5)

    def __post_init__(self) -> None:
        if self.intensity not in INTENSITY_POLICIES:
            raise ValueError(
                f"intensity {self.intensity!r}; allowed: {', '.join(INTENSITY_POLICIES)}"
            )
        low, high = self.percentiles
        if not 0 <= low < high <= 100:
            raise ValueError(f"percentiles {self.percentiles}; need 0 <= lower < upper <= 100")
        if self.resample not in RESAMPLE:
            raise ValueError(f"resample {self.resample!r}; allowed: {', '.join(RESAMPLE)}")

    def key(self) -> str:
        """The settings that decide an image's pixels, as text (a cache's key)."""
        low, high = self.percentiles
        return (
            f"channels={self.channels};size={self.size};resample={self.resample};"
            f"intensity={self.intensity};percentiles={low:g},{high:g}"
        )


@dataclass(frozen=True)
class DecodedImage:
    """A file's image in the schema (uint8 ``(size, size)`` or ``(size, size, 3)``), its
    size before resizing (height, width) and the file's SHA-256."""

    pixels: np.ndarray
    source_size: tuple[int, int]
    sha256: str


def decode_file(file: Path | str, schema: ImageSchema, *, by_content: bool = False) -> DecodedImage:
    """Read ``file`` once: its SHA-256 and its image in ``schema``, its type told by its
    suffix (training: the label table names the files) or, ``by_content``, by its bytes
    (a model applied to whatever a user hands it). :class:`ImageFileError` (or
    ``OSError`` for a file that cannot be opened) says why not."""
    file = Path(file)
    raw = file.read_bytes()
    suffix = suffix_of_content(raw) if by_content else file.suffix
    pixels, source_size = decode_image(raw, suffix, schema)
    return DecodedImage(pixels, source_size, hashlib.sha256(raw).hexdigest())


def decode_or_refuse(
    file: Path, schema: ImageSchema, *, by_content: bool = False
) -> DecodedImage | str:
    """:func:`decode_file`, a refusal returned as its one line (what a worker process
    sends back, so one bad file does not stop the others)."""
    return refusal_as_line(decode_file, file, schema, by_content=by_content)


def refusal_as_line(decode: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``decode(*args, **kwargs)``, or the one line of its refusal (an
    :class:`ImageFileError`, or an ``OSError`` for a file that cannot be opened)."""
    try:
        return decode(*args, **kwargs)
    except ImageFileError as error:
        return str(error)
    except OSError as error:
        return str(error.strerror or error)


def suffix_of_content(raw: bytes) -> str:
    """``.dcm`` for a DICOM file's bytes (``DICM`` after its 128-byte preamble); otherwise
    ``.png`` (Pillow reads any image type by its content whatever the suffix)."""
    offset, magic = DICOM_MAGIC
    return DICOM_SUFFIXES[0] if raw[offset : offset + len(magic)] == magic else ".png"


def decode_image(
    raw: bytes, suffix: str, schema: ImageSchema
) -> tuple[np.ndarray, tuple[int, int]]:
    """An image file's bytes (of the type ``suffix`` names) in ``schema``, and its size
    (height, width) before resizing."""
    from PIL import Image, UnidentifiedImageError
    from pydicom.errors import InvalidDicomError

    suffix = suffix.lower()
    try:
        if suffix in DICOM_SUFFIXES:
            image = Image.fromarray(_dicom_pixels(raw, schema))
        elif suffix in IMAGE_SUFFIXES:
            with Image.open(io.BytesIO(raw)) as opened:
                opened.load()
                image = _pillow_eight_bit(opened, schema)
        else:
            raise ImageFileError(
                f"unknown image type {suffix or '(no suffix)'}; allowed: "
                f"{', '.join(IMAGE_SUFFIXES + DICOM_SUFFIXES)}"
            )
    except ImageFileError:
        raise
    except UnidentifiedImageError:
        raise ImageFileError(
            "not a readable image (no PNG, JPEG, BMP or TIFF content that Pillow recognises); "
            "check the file, or export it again"
        ) from None
    except InvalidDicomError:
        raise ImageFileError(
            "not a DICOM file (no 'DICM' after its 128-byte preamble); export it as a DICOM "
            "file, or give it the suffix of what it is"
        ) from None
    except Exception as error:  # Pillow's and pydicom's own errors: truncated, not an image
        raise ImageFileError(
            f"not a readable image ({one_line(error)}); check the file, or export it again"
        ) from None
    source_size = (image.height, image.width)
    image = image.convert("L" if schema.channels == 1 else "RGB")
    if image.size != (schema.size, schema.size):
        image = image.resize((schema.size, schema.size), _resample(schema.resample))
    return np.asarray(image, dtype=np.uint8), source_size


def _pillow_eight_bit(image: Any, schema: ImageSchema) -> Any:
    """A Pillow image as 8-bit values. 16-bit and float images are scaled by the policy
    (``auto``: their own range; ``window``: refused, Pillow's files carry none); 8-bit
    grey is scaled only under ``range`` and ``percentiles``; colour is kept as stored."""
    from PIL import Image

    deep = image.mode in PILLOW_DEEP_MODES
    if deep and schema.intensity == "window":
        kind = "float" if image.mode == "F" else f"{32 if image.mode == 'I' else 16}-bit"
        raise ImageFileError(
            f"a {kind} image file has no window; use intensity auto, range or percentiles"
        )
    scaled_by_policy = deep or (image.mode == "L" and schema.intensity in ("range", "percentiles"))
    if not scaled_by_policy:
        return image
    grey = np.asarray(image, dtype=np.float64)
    return Image.fromarray(scaled_to_bytes(grey, _bounds(grey, schema)))


def _dicom_pixels(raw: bytes, schema: ImageSchema) -> np.ndarray:
    """A single-frame DICOM image as uint8, grey ``(H, W)`` or RGB ``(H, W, 3)``."""
    from pydicom import dcmread
    from pydicom.pixels import apply_color_lut

    dataset = dcmread(io.BytesIO(raw))
    _check_is_one_image(dataset)
    pixels = pixel_array(dataset)
    interpretation = str(dataset.get("PhotometricInterpretation", ""))
    if interpretation == "PALETTE COLOR":
        colours = apply_color_lut(pixels, dataset)
        depth = int(dataset.RedPaletteColorLookupTableDescriptor[2])
        return scaled_to_bytes(colours.astype(np.float64), (0.0, 2.0**depth - 1))
    if int(dataset.get("SamplesPerPixel", 1)) != 1:  # RGB (YBR decoded to RGB by pydicom)
        return scaled_to_bytes(pixels.astype(np.float64), _bit_range(dataset))
    grey = _grey(pixels, dataset, schema)
    return 255 - grey if interpretation == "MONOCHROME1" else grey  # low values are bright


def _grey(pixels: np.ndarray, dataset: Any, schema: ImageSchema) -> np.ndarray:
    """A grey image as uint8 by the schema's policy. An integer image goes through a table
    of every stored value from its lowest to its highest: the modality LUT, the window and
    the scaling are computed once a value, not once a pixel, for the same uint8 image."""
    from pydicom.pixels import apply_modality_lut

    def modality(stored: np.ndarray) -> np.ndarray:
        return np.asarray(apply_modality_lut(stored, dataset), dtype=np.float64)

    low, high = (int(pixels.min()), int(pixels.max())) if pixels.size else (0, 0)
    if pixels.dtype.kind not in "iu" or high - low >= pixels.size:  # float, or a vast range
        values = modality(pixels)
        return scaled_to_bytes(
            *value_policy(values, dataset, schema, lambda: _bounds(values, schema))
        )
    table = modality(np.arange(low, high + 1))

    def own_bounds() -> tuple[float, float]:  # the image's, after the modality LUT
        if schema.intensity == "percentiles":
            lower, upper = np.sort(modality(np.percentile(pixels, schema.percentiles)))
            return float(lower), float(upper)
        return float(table.min()), float(table.max())

    index = pixels.astype(np.intp)  # numpy's own index type: indexing converts to it
    index -= low
    return scaled_to_bytes(*value_policy(table, dataset, schema, own_bounds))[index]


def value_policy(
    values: np.ndarray,
    dataset: Any,
    schema: ImageSchema,
    own_bounds: Callable[[], tuple[float, float]],
) -> tuple[np.ndarray, tuple[float, float]]:
    """The values to scale and the bounds mapped to 0 and 255, by the schema's policy
    (``own_bounds``: the image's own range or percentiles, after the modality LUT)."""
    from pydicom.pixels import apply_voi_lut

    windowed = "WindowCenter" in dataset or "VOILUTSequence" in dataset
    policy = schema.intensity
    if policy == "window" and not windowed:
        raise ImageFileError(
            "a DICOM without a window (no Window Center or VOI LUT); use intensity auto, "
            "range or percentiles"
        )
    if policy == "auto":
        rescaled = "RescaleSlope" in dataset or "ModalityLUTSequence" in dataset
        integers = "PixelData" in dataset  # not Float or Double Float Pixel Data
        shallow = integers and int(dataset.get("BitsStored", 8)) <= 8 and not rescaled
        policy = "window" if windowed else "bits" if shallow else "range"
    if policy == "window":  # the window's output spans what its extreme inputs give
        extremes = np.asarray(apply_voi_lut(np.array([-1e300, 1e300]), dataset), np.float64)
        windowed_values = np.asarray(apply_voi_lut(values, dataset), dtype=np.float64)
        return windowed_values, (float(extremes.min()), float(extremes.max()))
    if policy == "bits":
        return values, _bit_range(dataset)
    return values, own_bounds()


def _bounds(values: np.ndarray, schema: ImageSchema) -> tuple[float, float]:
    """The values' own percentiles under ``percentiles``; else their minimum and maximum."""
    if schema.intensity == "percentiles":
        low, high = np.percentile(values, schema.percentiles)
        return float(low), float(high)
    return float(values.min()), float(values.max())


def _bit_range(dataset: Any) -> tuple[float, float]:
    """The values a DICOM's stored bits allow (signed when its pixel representation is)."""
    bits = int(dataset.get("BitsStored", 8))
    low = -(2.0 ** (bits - 1)) if dataset.get("PixelRepresentation", 0) else 0.0
    return low, low + 2.0**bits - 1


def _check_is_one_image(dataset: Any) -> None:
    """Refuse a DICOM that holds no pixel data, or more than one frame."""
    if not any(tag in dataset for tag in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        kind = getattr(dataset.get("SOPClassUID"), "name", None) or dataset.get("Modality", "")
        raise ImageFileError(
            f"a DICOM without pixel data ({kind or 'no SOP class'}: a report, plan or "
            "waveform, not an image); list only images in the label table"
        )
    frames = int(dataset.get("NumberOfFrames", 1) or 1)
    if frames > 1:
        raise ImageFileError(
            f"a multi-frame DICOM ({frames} frames); export one frame a file, or list the "
            "frames as separate images"
        )


def pixel_array(dataset: Any) -> np.ndarray:
    """pydicom's pixel array, a failure said in one line naming the transfer syntax."""
    from pydicom.pixels import get_decoder

    syntax = getattr(dataset, "file_meta", {}).get("TransferSyntaxUID")
    name = f"{syntax.name} ({syntax})" if syntax else "no transfer syntax in its file meta"
    try:
        if syntax is not None and syntax.is_compressed:
            decoder = get_decoder(syntax)
            if not decoder.is_available:
                raise ImageFileError(
                    f"{name}: no decoder installed for it; install fedsieve's dependencies "
                    "(pylibjpeg and its plugins), or export the file uncompressed"
                )
        return dataset.pixel_array
    except NotImplementedError:
        raise ImageFileError(
            f"{name}: pydicom decodes no such encoding; export the file uncompressed, or in "
            "JPEG, JPEG-LS, JPEG 2000 or RLE"
        ) from None
    except ImageFileError:
        raise
    except Exception as error:  # a damaged stream: every plugin refused it
        raise ImageFileError(
            f"{name}: its pixel data could not be decoded ({one_line(error)}); the file "
            "may be truncated or damaged: export it again"
        ) from None


def one_line(error: BaseException) -> str:
    """A library's message on one line: its first line of substance, shortened."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # "raised by all available plugins:"
        lines = lines[1:]
    text = lines[0] if lines else type(error).__name__
    text = text if len(text) <= REASON_LENGTH else text[: REASON_LENGTH - 3] + "..."
    return f"{type(error).__name__}: {text}"


def scaled_to_bytes(values: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """``values`` mapped linearly from ``bounds`` to 0-255 (clipped), as uint8."""
    low, high = bounds
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
