"""Session-wide fixtures: the official MedMNIST files, isolated tracking and Prefect."""

from __future__ import annotations

import os

from config.environment import configure_environment

# As the CLI's entry does, before torch, Prefect or MLflow load: telemetry off, and the
# pinned numerics (read once, when torch loads), so a test's in-process run and the
# `fedsieve` command it starts give the same bits.
configure_environment()
# make test's two workers share two cores: OpenMP's threads, while they wait for work,
# sleep instead of spinning (OpenMP's own setting, read when torch loads; no number changes)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import copy  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import http.server  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from federated.client import ClientData  # noqa: E402
from tests import prefect_homes  # noqa: E402
from tests.hub_tests import uses_hub  # noqa: E402
from tests.limits import TEST_LIMIT_S, limit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# Two threads, as the processes a test starts use: a float32 reduction's bits depend on
# the thread count, and tests hold in-process results equal to theirs.
torch.set_num_threads(min(2, os.cpu_count() or 1))
# What the session imported (torch, numpy, the engine) lives until the worker ends: out of
# the collector's sight, a full collection scans only what the tests make. Each Holm
# adjustment by statsmodels runs one (the report's tables make dozens).
gc.freeze()


@pytest.fixture(autouse=True)
def _torch_threads_kept() -> Iterator[None]:
    """A test leaves torch's thread count as it found it: the next test in this worker
    (which one depends on how files were dealt to workers) may hold its in-process results
    equal, bit for bit, to those of a process it starts."""
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    assert after == before, f"the test left torch at {after} threads (it found {before})"


class _BrokenClient(ClientData):
    """Client data whose access fails, as a corrupt local dataset would."""

    @property
    def images(self):
        raise OSError("disk read error")

    @images.setter
    def images(self, value):
        pass


@pytest.fixture
def broken_client() -> Callable[[int, ClientData], ClientData]:
    """``broken_client(client_id, like)``: a client shaped like ``like`` whose images
    cannot be read (``OSError: disk read error``)."""
    return lambda client_id, like: _BrokenClient(client_id, like.images, like.targets)


TEST_DATASETS = ("breastmnist", "retinamnist")
VOLUME_TEST_DATASET = ("adrenalmnist3d", 64)  # the official AdrenalMNIST3D at 64 voxels


@pytest.fixture(scope="session")
def medmnist_root() -> Path:
    """Where the official BreastMNIST and RetinaMNIST files are: MEDMNIST_ROOT, else
    ../shared/data/medmnist beside the checkout, else the project's data/medmnist, where
    they are downloaded (md5-checked) as ``make run`` does."""
    from federated.data import ensure_medmnist

    configured = os.environ.get("MEDMNIST_ROOT")
    shared = REPO.parent / "shared" / "data" / "medmnist"
    if configured:
        root = Path(configured)
    elif (shared / "breastmnist.npz").exists():
        root = shared
    else:
        root = REPO / "data" / "medmnist"
    for flag in TEST_DATASETS:
        ensure_medmnist(flag, root, download=True, progress=False)
    return root


@pytest.fixture(scope="session")
def adrenal_root(medmnist_root: Path) -> Path:
    """The folder holding the official AdrenalMNIST3D at 64 voxels (1.9 MB), md5-checked
    (downloaded as ``make run`` would where the shared copy is not beside the checkout)."""
    from federated.data import ensure_medmnist

    flag, size = VOLUME_TEST_DATASET
    ensure_medmnist(flag, medmnist_root, size=size, download=True, progress=False)
    return medmnist_root


@pytest.fixture(scope="session", autouse=True)
def _prefect_database_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Where this worker makes, when a test first needs it, the Prefect database that the
    homes of tests starting their own server copy (tests/prefect_homes.py)."""
    prefect_homes.make_under(tmp_path_factory.mktemp("prefect-database"))


@pytest.fixture(scope="session", autouse=True)
def image_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Own images decoded by the tests, and the commands they start, are cached in the
    session's temporary folder, not in the user's ~/.cache (federated/image_cache.py)."""
    path = tmp_path_factory.mktemp("image-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDSIEVE_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Prefect test server for the session; its API URL is handed to subprocesses too."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.fixture
def project(tmp_path: Path, medmnist_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throw-away project directory with the repository's params and pipeline files,
    its own MLflow store, and the shared data."""
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEDMNIST_ROOT", str(medmnist_root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


@dataclass(frozen=True)
class FabricatedFile:
    """A MedMNIST+ file fabricated for tests, served at ``url`` and registered (md5, URL)
    in the test's copy of ``medmnist.INFO``."""

    path: Path
    url: str

    @staticmethod
    def fabricate(path: Path, size: int, seed: int = 0) -> Path:
        """BreastMNIST-shaped uint8 images ``(N, size, size)`` and 0/1 labels ``(N, 1)``."""
        from federated.data import dataset_info

        rng = np.random.default_rng(seed)
        arrays = {}
        for split, n in dataset_info("breastmnist").n_samples.items():
            arrays[f"{split}_images"] = rng.integers(0, 256, (n, size, size), dtype=np.uint8)
            arrays[f"{split}_labels"] = rng.integers(0, 2, (n, 1), dtype=np.uint8)
        np.savez_compressed(path, **arrays)
        return path


@pytest.fixture
def breast_64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FabricatedFile]:
    """``breastmnist_64.npz`` fabricated, served on loopback, and its md5 and URL put in a
    copy of ``medmnist.INFO`` in place of the real ones (no MedMNIST+ file can be
    downloaded on these machines)."""
    import federated.data as data_module
    from federated.data import file_md5

    served = tmp_path / "served"
    served.mkdir()
    path = FabricatedFile.fabricate(served / "breastmnist_64.npz", 64)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/breastmnist_64.npz"
    table = copy.deepcopy(data_module._info_table())
    table["breastmnist"]["url_64"], table["breastmnist"]["MD5_64"] = url, file_md5(path)
    monkeypatch.setattr(data_module, "_info_table", lambda: table)
    yield FabricatedFile(path, url)
    server.shutdown()
    server.server_close()


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI job's timeout, a ``kill``) ends the tests as Ctrl-C does: the running
    test's fixtures are torn down, so the servers and sites it started are stopped."""

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)


HUB_GROUP = "flower-hub"


def scheduling_group(item: pytest.Item, hub_files: set[Path]) -> str:
    """The unit ``make test``'s workers are dealt (``--dist loadgroup``): the test's file
    (as ``--dist loadfile`` deals them), but one group for every file using the session's
    loopback hub, so that one worker starts it (a SuperLink and four sites, each a
    SuperNode, a SuperExec and a warm trainer, that poll while they wait) and stops it
    after their last test (tests/flower/conftest.py)."""
    return HUB_GROUP if item.path in hub_files else item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end tests (real servers, processes and federations: minutes each) first,
    the groups with the most of them first, so that under ``make test``'s two workers (one
    group at a time each, in this order: ``--no-loadscope-reorder``) the long ones start
    early and the many short files fill in at the end; the order within a file is kept.
    Every test gets pytest-timeout's guard, scaled by ``FEDSIEVE_TEST_TIME_SCALE``
    (tests/limits.py), unless it sets one."""
    hub_files = {item.path for item in items if uses_hub(item)}
    groups = {item: scheduling_group(item, hub_files) for item in items}
    end_to_end = Counter(groups[item] for item in items if item.get_closest_marker("e2e"))
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(groups[item], index)
    items.sort(key=lambda item: (-end_to_end[groups[item]], first[groups[item]]))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item]))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit(TEST_LIMIT_S)))
