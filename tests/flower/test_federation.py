"""Real sites on Flower's Deployment Runtime, on 127.0.0.1: TLS on, SuperNode
authentication on, each site a SuperNode process holding only its own data file.

The hub's ServerApp is started with ``flwr run`` as the train stage starts it; its
checkpoint and rounds are compared with the same federation simulated in this process."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from config.assembly import build_defence, build_global_model, federation_config, local_training
from config.params import Params, params_hash
from federated.checkpoint import read_checkpoint
from federated.client import ClientData
from federated.data import load_digits, to_tensors
from federated.loop import train
from federated.server import EvaluationSets, Execution, Federation, ServerState
from flowerapp.hub import HubFiles, write_params
from tasks.sites import APP_DIR
from tests.flower.conftest import FLIPPER, Hub, site_data, site_names

FAULTY_APP = Path(__file__).resolve().parent / "faulty_app"
TOLERANCE = 1e-6


def run_at_sites(hub: Hub, raw: dict[str, Any], name: str, app: Path = APP_DIR) -> ServerState:
    """The hub's ServerApp run through ``flwr run`` to its end; its final state."""
    params = Params.model_validate(raw)
    files = HubFiles(hub.folder / name)
    write_params(files.params, params)
    checkpoint = files.folder / "checkpoint.pt"
    config = {"hub-folder": str(files.folder), "data-root": str(hub.folder), "checkpoint": str(checkpoint)}
    done = hub.fed.run_app(app, config, timeout=600)
    outcome = json.loads(files.outcome.read_text()) if files.outcome.exists() else None
    assert outcome is not None and outcome["status"] == "finished", (outcome, done.stdout[-3000:])
    saved = read_checkpoint(checkpoint, params_hash(params))
    assert saved is not None
    return ServerState.from_dict(saved["state"])


def simulated(raw: dict[str, Any], hub: Hub, names: list[str]) -> ServerState:
    """The same federation in this process: the sites' files as its clients' data."""
    params = Params.model_validate({k: v for k, v in raw.items() if k != "federation"})
    data = load_digits()
    clients = [
        ClientData(i, *to_tensors(site.train, data.info)) for i, site in enumerate(site_data(hub.files, names))
    ]  # fmt: skip
    val = to_tensors(data.val, data.info)
    federation = Federation(
        model=build_global_model(params, data.info),
        clients=clients,
        local=local_training(params),
        config=federation_config(params),
        defence=build_defence(params, server_batch=val),
        evaluation=EvaluationSets(test=to_tensors(data.test, data.info), val=val),
        execution=Execution(backend="sequential"),
    )
    return train(federation, federation.initial_state(), params.train.rounds)


def decisions(state: ServerState) -> list[tuple[int, int, bool, str]]:
    return [(row["round"], row["client"], bool(row["excluded"]), row["reason"]) for row in state.trail]


def test_sites_end_where_the_simulation_ends_and_the_flipper_is_caught(hub: Hub) -> None:
    names = site_names()
    raw = hub.flower_params(names)
    remote = run_at_sites(hub, raw, "equivalence")
    local = simulated(raw, hub, names)

    assert remote.round == local.round == 2
    diff = (remote.global_vector - local.global_vector).abs().max().item()
    assert diff <= TOLERANCE, f"max abs difference {diff:.2e} from the simulation"
    assert decisions(remote) == decisions(local)
    caught = {row["client"] for row in remote.trail if row["excluded"]}
    assert caught == {FLIPPER}, remote.trail
    assert all(row["reason"] == "pid_made" for row in remote.trail if row["excluded"])
    # the sites scored the last round's model on their own held-out splits
    assert {int(row["site"]) for row in remote.sites if row["round"] == 2} == set(range(len(names)))
    assert all(0 <= row["acc"] <= 1 and row["n"] > 0 for row in remote.sites)


def test_a_site_that_sends_nan_or_a_wrong_shape_is_left_out_with_its_reason(hub: Hub) -> None:
    base = hub.files["site-2"]
    hub.add_site("nan-site", base, fault="nan")
    hub.add_site("shape-site", base, fault="shape")
    hub.add_site("lying-site", base, fault="count")
    names = ["site-0", "site-2", "site-3", "nan-site", "shape-site", "lying-site"]
    raw = hub.flower_params(names, train={"rounds": 1}, filters=[])
    state = run_at_sites(hub, raw, "faults", app=FAULTY_APP)

    rows = {row["client"]: row for row in state.trail}
    nan_row, shape_row, lying_row = rows[3], rows[4], rows[5]
    assert (nan_row["excluded"], nan_row["reason"]) == (True, "non_finite")
    assert (shape_row["excluded"], shape_row["reason"]) == (True, "bad_update")
    assert "shape" in shape_row["message"]
    # the lying site is kept, weighted by its registered count, and flagged
    registered = raw["federation"]["sites"][5]["samples"]
    assert not lying_row["excluded"]
    assert lying_row["num_samples"] == registered
    assert lying_row["reported_samples"] == 10 * registered
    assert "registered" in lying_row["message"]
    assert not any(rows[i]["excluded"] for i in (0, 1, 2))
    assert math.isfinite(state.global_vector.sum().item())
    assert torch.isfinite(state.global_vector).all()
