"""Which files hold any part of some float32 vectors, whatever wrote them: two entries in
a row as float32 or float64 bytes (either byte order), two of a vector's entries as
float64 anywhere (SQLite stores each REAL big-endian, apart), or two as decimal text
(JSON, CSV, YAML, logs); also inside zip archives (``torch.save``, ``.npz``, MLflow's
models) and gzip files. Zero entries are not looked for (every model has them)."""

from __future__ import annotations

import contextlib
import gzip
import io
import re
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

__all__ = ["files_holding"]

NUMBER = re.compile(rb"[-+]?\d*\.\d+(?:[eE][-+]?\d+)?")
SIGNIFICANT = 6  # a decimal that may be one of the vectors' entries has this many digits


class _Table:
    """The vectors' nonzero entries, sorted, each with its vector and position."""

    def __init__(self, vectors: Mapping[str, np.ndarray]) -> None:
        self.names = list(vectors)
        values, owners, places = [], [], []
        for owner, vector in enumerate(vectors.values()):
            vector = np.asarray(vector, dtype=np.float32)
            place = np.flatnonzero(vector != 0)
            values.append(vector[place].astype(np.float64))
            owners.append(np.full(place.size, owner))
            places.append(place)
        order = np.argsort(np.concatenate(values), kind="stable")
        self.values = np.concatenate(values)[order]
        self.owners = np.concatenate(owners)[order]
        self.places = np.concatenate(places)[order]

    def matches(self, found: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where ``found`` holds an entry, and whose and which entry each is."""
        at = np.flatnonzero((found >= self.values[0]) & (found <= self.values[-1]))
        index = np.clip(np.searchsorted(self.values, found[at]), 0, len(self.values) - 1)
        hit = self.values[index] == found[at]
        return at[hit], self.owners[index[hit]], self.places[index[hit]]

    def in_a_row(self, found: np.ndarray) -> set[str]:
        """The vectors two of whose consecutive entries are consecutive in ``found``."""
        at, owner, place = self.matches(found)
        pair = (at[1:] == at[:-1] + 1) & (owner[1:] == owner[:-1]) & (place[1:] == place[:-1] + 1)
        return {self.names[k] for k in np.unique(owner[:-1][pair])}

    def two_of(self, found: np.ndarray) -> set[str]:
        """The vectors two of whose entries (at different places) are among ``found``."""
        _, owner, place = self.matches(found)
        pairs = {(int(o), int(p)) for o, p in zip(owner, place, strict=True)}
        owners = [o for o, _ in pairs]
        return {self.names[o] for o in set(owners) if owners.count(o) >= 2}


def _binary(data: bytes, table: _Table) -> set[str]:
    holders: set[str] = set()
    scattered = []  # float64 entries anywhere (each at its own offset)
    for kind, size in (("f4", 4), ("f8", 8)):
        for order in "<>":
            for offset in range(min(size, len(data))):
                count = (len(data) - offset) // size
                if count < 2:
                    continue
                found = np.frombuffer(data, f"{order}{kind}", count, offset)
                if kind == "f8":  # a float32's float64 has its 29 low mantissa bits 0
                    bits = np.frombuffer(data, f"{order}u8", count, offset)
                    found = np.where(bits & 0x1FFFFFFF == 0, found, np.nan)
                with np.errstate(invalid="ignore", over="ignore"):  # bytes that are no float
                    found = found.astype(np.float64)
                holders |= table.in_a_row(found)
                if kind == "f8":
                    scattered.append(found[np.isfinite(found)])
    return holders | table.two_of(np.concatenate(scattered)) if scattered else holders


def _text(data: bytes, table: _Table) -> set[str]:
    numbers = [
        float(match)
        for match in NUMBER.findall(data)
        if len(re.sub(rb"^[-+]?[0.]*|[eE].*$|\.", b"", match)) >= SIGNIFICANT
    ]
    if not numbers:
        return set()
    as_float32 = np.array(numbers, dtype=np.float32).astype(np.float64)
    return table.two_of(as_float32)


def _blobs(name: str, data: bytes) -> Iterator[tuple[str, bytes]]:
    """The file's bytes, and those of every member of an archive it is (recursively)."""
    yield name, data
    if data[:2] == b"\x1f\x8b":  # or bytes that start as gzip's do: read as they are
        with contextlib.suppress(OSError, EOFError):
            yield from _blobs(f"{name}!gunzip", gzip.decompress(data))
    if data[:4] == b"PK\x03\x04":
        with (
            contextlib.suppress(zipfile.BadZipFile, OSError),
            zipfile.ZipFile(io.BytesIO(data)) as archive,
        ):
            for member in archive.namelist():
                yield from _blobs(f"{name}!{member}", archive.read(member))


def files_holding(roots: list[Path], vectors: Mapping[str, np.ndarray]) -> dict[str, list[str]]:
    """Each vector (by name) that some file (or archive member) in ``roots`` (files, and
    folders searched through) holds, and those files; empty when none does."""
    table = _Table(vectors)
    held: dict[str, list[str]] = {}
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in paths:
            for name, data in _blobs(str(path), path.read_bytes()):
                for vector in sorted(_binary(data, table) | _text(data, table)):
                    held.setdefault(vector, []).append(name)
    return held
