"""A loopback federation for the Flower tests: a SuperLink with TLS and SuperNode
authentication on 127.0.0.1, and four digits sites, each a SuperNode process given only
its own data file (written from the simulated partition), site 1's labels flipped, and
each pinning the training plan of :data:`BASE_PARAMS` (what ``fedsieve plan`` writes).

Every process is started and stopped by :class:`benchmarks.sites.loopback.Loopback`, by PID.
The Flower environment (``make setup-flower``, part of ``make setup``) runs them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.sites.loopback import CONNECTION, Loopback
from config.params import Params, params_hash
from federated.checkpoint import read_checkpoint
from federated.data import DatasetInfo, dataset_info, load_digits
from federated.server import ServerState
from flowerapp.certs import SiteKey, make_site_key
from flowerapp.hub import SERVERAPP_EXIT_GRACE_S, HubFiles, site_task, write_params
from flowerapp.plan import write_plan
from flowerapp.site_data import SiteData, load_site_data, write_site_files
from tasks.partition import split_partition
from tasks.sites import APP_DIR
from tests.hub_tests import uses_hub
from tests.limits import limit

REPO = Path(__file__).resolve().parents[2]
FLOWER_BIN = REPO / ".venv-flower" / "bin"
SITES = 4
FLIPPER = 1  # this site's training labels are reversed (y -> 9 - y)
SEED = 0

# Training where a few rounds tell (digits, logistic regression), PID-MADE screening.
BASE_PARAMS: dict[str, Any] = {
    "seed": SEED,
    "data": {"dataset": "digits"},
    "model": {"name": "logreg"},
    "train": {"rounds": 2, "local_epochs": 2, "lr": 0.05, "device": "cpu", "backend": "sequential"},
    # the per-round robust threshold: it can ban in round 1 of these two-round runs
    "filters": [{"name": "pid_made", "threshold": "robust"}],
    "noniid": {"every": 0, "final": False},
    "eval": {"every": 2},
}


@dataclass
class Hub:
    """The running loopback federation and what the tests need of it."""

    fed: Loopback
    folder: Path
    files: dict[str, Path]  # site name -> its data file
    plan: Path  # the training plan every site approves unless told otherwise
    keys: dict[str, SiteKey] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)  # site name -> registered node id
    schemas: dict[str, DatasetInfo | None] = field(default_factory=dict)  # folders' schemas
    trainers: dict[str, Path] = field(default_factory=dict)  # site name -> its trainer's dir

    def add_site(
        self, name: str, data_file: Path, schema: DatasetInfo | None = None, **node_config: str
    ) -> int:
        """Register a new site's key and start its SuperNode; its node id. A folder of
        images is read in ``schema`` (the plan's) to count its training images."""
        self.files[name] = data_file
        self.schemas[name] = schema
        self.keys[name] = make_site_key(self.fed.work / "keys", name)
        self.nodes[name] = self.fed.register(self.keys[name].public)
        self.start(name, **node_config)
        return self.nodes[name]

    def start(self, name: str, **node_config: str) -> None:
        """Start the site's SuperNode, and its warm trainer unless one is running."""
        trainer = self.fed.sites.get(f"{name}.trainer")
        if trainer is None or trainer.poll() is not None:
            self.trainers[name] = self.fed.start_trainer(name, self.files[name], self.plan)
        self.fed.start_site(name, self.keys[name], self.node_config(name, **node_config))
        self.fed.wait_connected(name)

    def remove(self, name: str) -> None:
        """Stop a site a test added, and its warm trainer: the session's hub goes on with
        its own four sites, with nothing idle beside them."""
        self.fed.stop_site(name)
        self.fed.stop_site(f"{name}.trainer")

    def node_config(self, name: str, **extra: str) -> dict[str, str]:
        """What ``fedsieve-site`` gives its SuperNode: the data file, the approved plan and
        its warm trainer's directory."""
        return {
            "data-file": str(self.files[name]), "approved-plan": str(self.plan),
            "trainer-dir": str(self.trainers[name]), **extra,
        }  # fmt: skip

    def sites_params(self, names: list[str]) -> list[dict[str, Any]]:
        return [
            {"name": n, "node_id": self.nodes[n], "samples": len(load_site_data(self.files[n], self.schemas.get(n)).train)}
            for n in names
        ]  # fmt: skip

    def flower_params(self, names: list[str], **sections: Any) -> dict[str, Any]:
        params = json.loads(json.dumps(BASE_PARAMS))
        for key, value in sections.items():
            params[key] = params.get(key, {}) | value if isinstance(value, dict) else value
        params["federation"] = {
            "runtime": "flower", "superlink": CONNECTION, "sites": self.sites_params(names),
            # a guard: a round ends when every site answered; on a busy machine a site's
            # answer (a process started per message) may take tens of seconds
            "round_timeout": round(limit(300)),
        }  # fmt: skip
        return params


def run_at_sites(hub: Hub, raw: dict[str, Any], name: str, app: Path = APP_DIR) -> ServerState:
    """The hub's ServerApp run through ``flwr run`` to its end; its final state."""
    params = Params.model_validate(raw)
    files = HubFiles(hub.folder / name)
    write_params(files.params, params)
    checkpoint = files.folder / "checkpoint.pt"
    config = {
        "hub-folder": str(files.folder),
        "data-root": str(hub.folder),
        "checkpoint": str(checkpoint),
    }
    done = hub.fed.run_app(app, config, timeout=limit(600))
    outcome = json.loads(files.outcome.read_text()) if files.outcome.exists() else None
    assert outcome is not None and outcome["status"] == "finished", (outcome, done.stdout[-3000:])
    assert_no_serverapp_left(hub, files, "a hub process outlived its run")
    saved = read_checkpoint(checkpoint, params_hash(params))
    assert saved is not None
    return ServerState.from_dict(saved["state"])


def assert_no_serverapp_left(hub: Hub, files: HubFiles, what: str) -> None:
    """No ServerApp process outlives its run (``files``) by more than its exit grace (one
    whose exit deadlocked ends itself then); one that does is shown with its stacks."""
    left = hub.fed.serverapps_left(timeout=SERVERAPP_EXIT_GRACE_S + limit(60))
    assert left == [], f"{what}: {left}\n{hub.fed.serverapp_stacks(files.stacks)[-8000:]}"


def site_names(count: int = SITES) -> list[str]:
    return [f"site-{k}" for k in range(count)]


@pytest.fixture(scope="session")
def site_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The simulated partition of digits (four IID parts, a fifth of each held out) as
    four site files; site 1's training labels reversed."""
    out = tmp_path_factory.mktemp("sites")
    data = load_digits()
    split = split_partition(data.train.targets, "iid", SITES, SEED, {}, 0, 0.2)
    write_site_files(data, split.clients, split.local_tests, site_names(), out)
    flipped = out / f"site-{FLIPPER}.npz"
    with np.load(flipped) as archive:
        arrays = dict(archive)
    arrays["train_labels"] = 9 - arrays["train_labels"]
    np.savez_compressed(flipped, **arrays)
    return {name: out / f"{name}.npz" for name in site_names()}


@dataclass
class HubLifetime:
    """The session's hub is stopped once this worker has run the last test that uses it:
    ``make test`` deals those tests to one worker together (tests/conftest.py), so its
    sites stop polling while that worker goes on with other files. Where the tests are
    dealt otherwise, the hub lives to the session's end."""

    running: Loopback | None = None
    tests_left: int | None = None  # of the session's tests that use it, counted at first


HUB_LIFETIME = HubLifetime()


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item) -> None:
    if not uses_hub(item):
        return
    if HUB_LIFETIME.tests_left is None:
        HUB_LIFETIME.tests_left = sum(map(uses_hub, item.session.items))
    HUB_LIFETIME.tests_left -= 1
    if HUB_LIFETIME.tests_left == 0 and HUB_LIFETIME.running is not None:
        HUB_LIFETIME.running.close()  # the fixture's own close then finds nothing running
        HUB_LIFETIME.running = None


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory, site_files: dict[str, Path]) -> Iterator[Hub]:
    if not (FLOWER_BIN / "flwr").exists():
        pytest.fail(f"no Flower environment at {FLOWER_BIN}: run `make setup-flower`")
    with Loopback(tmp_path_factory.mktemp("loopback"), bin_dir=FLOWER_BIN) as fed:
        HUB_LIFETIME.running = fed
        fed.start_superlink()
        folder = tmp_path_factory.mktemp("hub")
        plan = folder / "plan.json"
        write_plan(plan, site_task(Params.model_validate(BASE_PARAMS), dataset_info("digits")))
        hub = Hub(fed, folder, {}, plan)
        for name in site_names():
            hub.add_site(name, site_files[name])
        yield hub


def site_data(files: dict[str, Path], names: list[str]) -> list[SiteData]:
    return [load_site_data(files[name]) for name in names]
