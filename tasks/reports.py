"""Files the pipeline writes (reports/, artifacts/): one place, plain formats."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from config.errors import ConfigError
from federated.data import MedMNISTData

__all__ = [
    "ProjectPaths",
    "check_partitioned_images",
    "read_local_tests",
    "read_partition",
    "read_root",
    "write_csv",
    "write_json",
    "write_partition",
    "write_sites_partition",
]


@dataclass(frozen=True)
class ProjectPaths:
    """Where every stage reads and writes, relative to the project directory."""

    root: Path

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def partition(self) -> Path:
        return self.artifacts / "partition" / "clients.npz"

    @property
    def partition_report(self) -> Path:
        return self.reports / "partition.json"

    @property
    def partition_plot(self) -> Path:
        return self.reports / "partition.png"

    @property
    def checkpoint(self) -> Path:
        return self.artifacts / "checkpoints" / "train.pt"

    @property
    def model(self) -> Path:
        return self.artifacts / "model" / "model.pt"

    @property
    def run_info(self) -> Path:
        return self.artifacts / "model" / "run.json"

    @property
    def tracking_info(self) -> Path:
        """Which MLflow run the training is (no DVC output: its id differs every run)."""
        return self.artifacts / "model" / "tracking.json"

    @property
    def rounds(self) -> Path:
        return self.reports / "rounds.csv"

    @property
    def exclusions(self) -> Path:
        return self.reports / "exclusions.csv"

    @property
    def exclusion_heatmap(self) -> Path:
        return self.reports / "exclusions.png"

    @property
    def noniid(self) -> Path:
        return self.reports / "noniid.json"

    @property
    def pretest(self) -> Path:
        return self.reports / "pretest.json"

    @property
    def pretest_plot(self) -> Path:
        return self.reports / "pretest.png"

    @property
    def calibration(self) -> Path:
        return self.reports / "calibration.png"

    @property
    def sites(self) -> Path:
        return self.reports / "sites.csv"

    @property
    def sites_plot(self) -> Path:
        return self.reports / "sites.png"

    @property
    def site_data(self) -> Path:
        """At real sites: what data each site said it trained on (its SHA-256, per class)."""
        return self.reports / "site_data.json"

    @property
    def champion_at_sites(self) -> Path:
        """At real sites (``eval.where: sites``): the run's model and the champion, scored
        in the same federated evaluation at the run's end."""
        return self.reports / "champion_at_sites.json"

    @property
    def sites_final(self) -> Path:
        return self.reports / "sites.json"

    @property
    def curves(self) -> Path:
        return self.reports / "curves.png"

    @property
    def metrics(self) -> Path:
        return self.reports / "metrics.json"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, payload: Mapping[str, Any]) -> Path:
    """Write atomically (a kill mid-write never leaves half a report)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(payload), indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def write_csv(
    path: Path, rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None
) -> Path:
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in columns})
    tmp.replace(path)
    return path


def write_partition(
    path: Path,
    parts: Sequence[np.ndarray],
    root: np.ndarray | None = None,
    local_tests: Sequence[np.ndarray] = (),
) -> Path:
    """Each client's training indices, the server's root data (``root``) and each
    client's local test split (``local_test_<i>``), those two when there are any."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"client_{i}": part for i, part in enumerate(parts)}
    if root is not None and len(root):
        arrays["root"] = root
    arrays |= {f"local_test_{i}": test for i, test in enumerate(local_tests) if len(test)}
    with path.open("wb") as handle:
        np.savez(handle, **arrays)
    return path


def write_sites_partition(path: Path, sites: Sequence[Mapping[str, Any]]) -> Path:
    """At real sites: the registered sites' names and sample counts, no client's indices."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = np.array([str(site["name"]) for site in sites])
    samples = np.array([int(site["samples"]) for site in sites], dtype=np.int64)
    with path.open("wb") as handle:
        np.savez(handle, sites=names, samples=samples)
    return path


def read_partition(path: Path) -> list[np.ndarray]:
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: run the partition stage first (fedsieve partition)"
        )
    with np.load(path, allow_pickle=False) as archive:
        if "sites" in archive.files:
            raise FileNotFoundError(
                f"{path} lists real sites (federation.runtime: flower), not a partition: "
                "run the partition stage again (fedsieve partition)"
            )
        clients = sum(name.startswith("client_") for name in archive.files)
        return [archive[f"client_{i}"] for i in range(clients)]


def read_local_tests(path: Path) -> list[np.ndarray] | None:
    """Each client's local test split written with the partition, or None (none held)."""
    with np.load(path, allow_pickle=False) as archive:
        if not any(name.startswith("local_test_") for name in archive.files):
            return None
        clients = sum(name.startswith("client_") for name in archive.files)
        empty = np.empty(0, dtype=np.int64)
        return [
            archive[f"local_test_{i}"] if f"local_test_{i}" in archive.files else empty
            for i in range(clients)
        ]


def read_root(path: Path) -> np.ndarray | None:
    """The server's root data indices written with the partition, or None."""
    with np.load(path, allow_pickle=False) as archive:
        return archive["root"] if "root" in archive.files else None


def check_partitioned_images(paths: ProjectPaths, data: MedMNISTData) -> None:
    """Own images that changed since they were partitioned are refused in one line: the
    partition's indices would point at other images (a MedMNIST file is md5-checked)."""
    if not data.sha256 or not paths.partition_report.exists():
        return
    partitioned = json.loads(paths.partition_report.read_text()).get("data_sha256")
    if partitioned not in (None, data.sha256):
        raise ConfigError(
            f"{data.info.url}: the images changed since they were partitioned (sha256 "
            f"{data.sha256[:12]}, partitioned {partitioned[:12]}); partition again "
            "(fedsieve run, or dvc repro)"
        )
