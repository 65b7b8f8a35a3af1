"""Decoded images kept on disk, so that the next stage and the next run of a large folder
read them in seconds instead of decoding every file again.

An entry is keyed by the data's SHA-256 (the label table and every file), the schema's
pixel settings (:meth:`~federated.image_files.ImageSchema.key`) and the reader's version:
a changed file, table or setting is another key, so it is decoded afresh. To know the
data's SHA-256 without reading every file again, the cache remembers each file's digest
beside its size and modification time, as git's index does: a file whose size or
modification time changed is hashed again.

The cache holds downsized copies of the images (uint8 at the schema's size), on the
machine that read them and nowhere else; its folder is the caller's to choose.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["READER_VERSION", "CachedImages", "ImageCache"]

# Bump when decoding changes what a file becomes: every earlier entry then misses.
READER_VERSION = "2"


class CachedImages:
    """A cache entry: the images (uint8 ``(N, S, S[, 3])``, volumes ``(N, S, S, S)``) and
    each one's size before resizing (``(N, 2)``: height, width; volumes ``(N, 3)``)."""

    def __init__(self, images: np.ndarray, source_sizes: np.ndarray) -> None:
        self.images = images
        self.source_sizes = source_sizes


class ImageCache:
    """The entries under ``root`` (created on first write)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def entry_key(self, data_sha256: str, schema_key: str) -> str:
        from pydicom import __version__ as pydicom_version

        text = f"{data_sha256}|{schema_key}|reader {READER_VERSION}|pydicom {pydicom_version}"
        return hashlib.sha256(text.encode()).hexdigest()

    def load(self, key: str) -> CachedImages | None:
        """The entry ``key``, or None when there is none (or it cannot be read)."""
        path = self.root / f"{key}.npz"
        try:
            with np.load(path, allow_pickle=False) as archive:
                return CachedImages(archive["images"], archive["source_sizes"])
        except (OSError, KeyError, ValueError):
            return None

    def store(self, key: str, entry: CachedImages) -> None:
        """Write the entry ``key`` whole or not at all (a reader never sees half of one)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.root, suffix=".part", delete=False) as handle:
            np.savez(handle, images=entry.images, source_sizes=entry.source_sizes)
        os.replace(handle.name, self.root / f"{key}.npz")

    def known_digests(
        self, table: Path, files: list[Path], stamps: list[tuple[int, int]]
    ) -> list[str] | None:
        """Every file's SHA-256 as remembered for ``table``, or None when any file is new
        or its size or modification time (``stamps``: bytes and ns, taken now) changed since."""
        remembered = self._remembered(table)
        digests = []
        for file, stamp in zip(files, stamps, strict=True):
            entry = remembered.get(str(file))
            if entry is None or entry[:2] != list(stamp):
                return None
            digests.append(entry[2])
        return digests

    def remember_digests(
        self,
        table: Path,
        files: list[Path],
        stamps: list[tuple[int, int]],
        digests: list[str],
    ) -> None:
        """Keep each file's SHA-256 with the size and modification time it was read at
        (a series folder: its files' total size and latest time)."""
        entries = {
            str(file): [*stamp, digest]
            for file, stamp, digest in zip(files, stamps, digests, strict=True)
        }
        self.root.mkdir(parents=True, exist_ok=True)
        target = self._digests_file(table)
        with tempfile.NamedTemporaryFile(
            "w", dir=self.root, suffix=".part", delete=False
        ) as handle:
            json.dump(entries, handle)
        os.replace(handle.name, target)

    def _remembered(self, table: Path) -> dict[str, list]:
        try:
            return json.loads(self._digests_file(table).read_text())
        except (OSError, ValueError):
            return {}

    def _digests_file(self, table: Path) -> Path:
        name = hashlib.sha256(str(table.resolve()).encode()).hexdigest()[:32]
        return self.root / f"files-{name}.json"
