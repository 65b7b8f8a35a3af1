"""Real sites on Flower's Deployment Runtime, on 127.0.0.1: TLS on, SuperNode
authentication on, each site a SuperNode process holding only its own data file.

The hub's ServerApp is started with ``flwr run`` as the train stage starts it; its
checkpoint and rounds are compared with the same federation simulated in this process."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from config.params import Params, params_hash, privacy_budget
from federated.checkpoint import read_checkpoint
from federated.data import dataset_info, load_digits, load_medmnist
from federated.loop import train
from federated.privacy import site_privacy
from federated.seeding import sample_clients
from federated.server import ServerState
from flowerapp.certs import make_site_key
from flowerapp.hub import HubFiles, simulated_federation, site_task, write_params
from flowerapp.lineage import round_spans
from flowerapp.plan import write_plan
from flowerapp.site_data import write_site_files
from tasks.partition import split_partition
from tasks.sites import APP_DIR
from tasks.stats import collect_client_updates, test_normality
from tasks.training import trained_model_noniid
from tests.flower.conftest import (
    FLIPPER,
    FLOWER_BIN,
    REPO,
    Hub,
    assert_no_serverapp_left,
    run_at_sites,
    site_names,
)
from tests.flower.vectors_in_files import files_holding
from tests.limits import limit, poll

pytestmark = pytest.mark.e2e  # real processes and servers: minutes

FAULTY_APP = Path(__file__).resolve().parent / "faulty_app"
TOLERANCE = 1e-6
REFUSED = "Activation failed: No SuperNode found with the given public key."


def simulated(raw: dict[str, Any], hub: Hub, names: list[str]) -> ServerState:
    """The same federation in this process: the sites' files as its clients' data."""
    params = Params.model_validate(raw)
    federation = simulated_federation(params, load_digits(), [hub.files[n] for n in names])
    return train(federation, federation.initial_state(), params.train.rounds)


def decisions(state: ServerState) -> list[tuple[int, int, bool, str]]:
    return [
        (row["round"], row["client"], bool(row["excluded"]), row["reason"]) for row in state.trail
    ]


def noniid_checked(hub: Hub, exclude: bool) -> dict[str, Any]:
    """The sites score every round's model; EMA's CV check runs every round and on the
    trained model, excluding or not."""
    checked = {"every": 1, "final": True, "exclude": exclude} | ({"z": 1.2} if exclude else {})
    return hub.flower_params(site_names(), noniid=checked, eval={"every": 1})


VALIDATION = ("val_n", "val_loss", "votes", "voters", "contribution")  # site_validation's


def with_validation(exchanges: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """A run's exchanges when its sites validate: each round's training is followed by the
    validation of the round's candidates (site_validation)."""
    validated = []
    for kind, number in exchanges:
        validated.append((kind, number))
        if kind.endswith("train"):
            validated.append(("query.validate", number))
    return validated


def assert_noniid_as_simulated(
    hub: Hub, raw: dict[str, Any], remote: ServerState, folder: str, exclude: bool
) -> list[dict[str, Any]]:
    """EMA's CV check at real sites: each site sends its loss of the model it received on
    its own training data, one number; the hub's losses, CVs, exclusions and final verdict
    equal the simulation's, which computes them on the same data in one process (and,
    where the sites validate, every site's loss of every candidate and every vote). The
    run's exchanges, in order."""
    params = Params.model_validate(raw)
    federation = simulated_federation(params, load_digits(), [hub.files[n] for n in site_names()])
    local = train(federation, federation.initial_state(), params.train.rounds)

    assert remote.round == local.round == 2
    assert decisions(remote) == decisions(local)
    left_out = [row for row in remote.trail if row["reason"] == "noniid_loss"]
    assert bool(left_out) == exclude, remote.trail
    for at_site, here in zip(remote.trail, local.trail, strict=True):
        assert abs(at_site["noniid_loss"] - here["noniid_loss"]) <= TOLERANCE, (at_site, here)
        validation = [k for k in here if k in VALIDATION or k.startswith("val_loss_without_")]
        assert validation == [k for k in at_site if k in validation], (at_site, here)
        for key in validation:  # nan (not judged) at both, or equal
            assert at_site[key] == pytest.approx(here[key], abs=TOLERANCE, nan_ok=True), key
    for at_site, here in zip(remote.history, local.history, strict=True):
        assert abs(at_site["noniid_cv"] - here["noniid_cv"]) <= TOLERANCE
    diff = (remote.global_vector - local.global_vector).abs().max().item()
    assert diff <= TOLERANCE, f"max abs difference {diff:.2e} from the simulation"
    # the sites scored each round's model on their own held-out splits, as simulated
    for at_site, here in zip(remote.sites, local.sites, strict=True):
        assert at_site.keys() == here.keys()
        assert all(abs(at_site[k] - here[k]) <= TOLERANCE for k in here), (at_site, here)
    files = HubFiles(hub.folder / folder)
    trained = json.loads(files.outcome.read_text())["trained_noniid"]
    expected = trained_model_noniid(federation, federation.selected_model(local), params)
    assert expected is not None and trained["verdict"] == expected["verdict"]
    assert trained["client_losses"].keys() == expected["client_losses"].keys()
    for site, loss in expected["client_losses"].items():
        assert abs(trained["client_losses"][site] - loss) <= TOLERANCE
    exchanges = [json.loads(line) for line in files.exchanges.read_text().splitlines()]
    validates = any(f.name == "site_validation" for f in params.filters)
    expected = with_validation(EXCHANGES[exclude]) if validates else EXCHANGES[exclude]
    assert [(e["kind"], e["round"]) for e in exchanges] == expected
    if exclude:  # the left-out sites were not asked to train
        for row in left_out:
            trained_in = next(
                e for e in exchanges if e["kind"] == "train" and e["round"] == row["round"]
            )
            assert str(row["client"]) not in trained_in["sites"], trained_in
    return exchanges


def screened_round(number: int) -> list[tuple[str, int]]:
    """A round screened before it trains: its screen, its training, its scores."""
    return [("evaluate", 0), ("train", number), ("evaluate", 0)]


EXCHANGES = {
    # verdict only: the losses come with the exchange that trains, and the round's
    # scoring brings the next round's, so a checked round costs no exchange of its own;
    # the last two score the final model and check the trained model
    False: [("evaluate+train", 1), ("evaluate+train", 2), ("evaluate", 0), ("evaluate", 0)],
    # excluding: a site is screened before it trains (a left-out site never trains)
    True: [*screened_round(1), *screened_round(2), ("evaluate", 0)],
}


def test_sites_end_where_the_simulation_ends_catch_the_flipper_and_check_non_iid_as_simulated(
    hub: Hub,
) -> None:
    """One run at the sites (EMA's non-IID check not excluding) ends where its simulation
    ends, with the simulation's exclusions, scores, losses and verdicts; one site's warm
    trainer is down, and its ClientApps run the tasks themselves. Its defence is validation
    at the sites, in the plan every site approved: each site's loss of every candidate,
    each vote and the flipper's exclusion in round 1 are the simulation's."""
    names = site_names()
    raw = noniid_checked(hub, exclude=False) | {"filters": [{"name": "site_validation"}]}
    cold = names[-1]
    hub.fed.stop_site(f"{cold}.trainer")
    try:
        with approved(hub, raw):
            remote = run_at_sites(hub, raw, "noniid-False")
    finally:
        hub.trainers[cold] = hub.fed.start_trainer(cold, hub.files[cold], hub.plan)

    exchanges = assert_noniid_as_simulated(hub, raw, remote, "noniid-False", exclude=False)
    caught = {(row["round"], row["client"]) for row in remote.trail if row["excluded"]}
    assert caught == {(1, FLIPPER), (2, FLIPPER)}, remote.trail
    assert all(row["reason"] == "site_validation" for row in remote.trail if row["excluded"])
    # round 1: every other site voted against the flipper
    flipper = next(r for r in remote.trail if (r["round"], r["client"]) == (1, FLIPPER))
    assert (flipper["votes"], flipper["voters"]) == (len(names) - 1, len(names) - 1)
    assert remote.history[0][f"contribution_{FLIPPER}"] == flipper["contribution"] < 0
    assert {(row["round"], int(row["site"])) for row in remote.sites} == {
        (t, k) for t in (1, 2) for k in range(len(names))
    }
    # where a round's time went: each exchange's wall time at the hub, and every answering
    # site's phases, which its process spent within that wall time; a site's warm trainer
    # did every task (the ClientApp only handed it over), but where none answered
    for exchange in exchanges:
        asked = {str(k) for k in range(len(names))}
        if exchange["kind"] == "query.validate" and exchange["round"] > 1:
            asked -= {str(FLIPPER)}  # banned: not asked to validate
        assert set(exchange["sites"]) == asked, exchange
        for site, phases in exchange["sites"].items():
            assert phases.pop("warm") == float(site != str(names.index(cold))), exchange
            assert set(phases) == {
                "start_s", "imports_s", "flower_s", "handoff_s", "data_s", "work_s",
            }  # fmt: skip
            assert all(0 <= value < exchange["wall_s"] for value in phases.values()), exchange
            assert sum(phases.values()) <= exchange["wall_s"] + 0.05, exchange  # /proc: 10 ms


def test_the_hub_holds_the_server_optimizer_and_ends_where_the_simulation_ends(hub: Hub) -> None:
    """FedAdam on PID-MADE's kept mean at real sites: the hub steps and keeps the
    optimizer's memory (in its checkpoint), the sites train as they always do."""
    names = site_names()
    raw = hub.flower_params(names, train={"server_optimizer": {"name": "adam", "lr": 0.01}})

    remote = run_at_sites(hub, raw, "server-adam")
    local = simulated(raw, hub, names)

    assert remote.server_optimizer_state["step"] == local.server_optimizer_state["step"] == 2
    assert decisions(remote) == decisions(local)
    diff = (remote.global_vector - local.global_vector).abs().max().item()
    assert diff <= TOLERANCE, f"max abs difference {diff:.2e} from the simulation"
    moments = remote.server_optimizer_state["v"] - local.server_optimizer_state["v"]
    assert moments.abs().max().item() <= TOLERANCE


def test_the_non_iid_check_that_excludes_at_the_sites_equals_the_simulations(hub: Hub) -> None:
    raw = noniid_checked(hub, exclude=True)
    remote = run_at_sites(hub, raw, "noniid-True")
    assert_noniid_as_simulated(hub, raw, remote, "noniid-True", exclude=True)


@pytest.mark.parametrize(("mode", "after"), [("gradient", 1), ("delta", 0)])
def test_the_pretest_at_the_sites_tests_what_the_simulation_tests(
    hub: Hub, mode: str, after: int
) -> None:
    """The pre-test stage at real sites: ``pretest.round`` rounds trained there, then each
    site's gradient (or one-epoch update) at that model, sent to the hub; the updates and
    the normality rates equal the simulated stage's on the same files."""
    names = site_names()
    raw = hub.flower_params(names, pretest={"mode": mode, "round": after})
    params = Params.model_validate(raw)
    files = HubFiles(hub.folder / f"pretest-{mode}")
    write_params(files.params, params)
    config = {"hub-folder": str(files.folder), "data-root": str(hub.folder), "stage": "pretest"}
    done = hub.fed.run_app(APP_DIR, config, timeout=limit(600))
    outcome = json.loads(files.outcome.read_text()) if files.outcome.exists() else None
    assert outcome is not None and outcome["status"] == "finished", (outcome, done.stdout[-3000:])
    assert outcome["rounds"] == after and outcome["missing"] == []
    assert_no_serverapp_left(hub, files, "the pre-test's ServerApp outlived its run")
    saved = torch.load(files.pretest_updates, weights_only=True)

    federation = simulated_federation(params, load_digits(), [hub.files[n] for n in names])
    state = train(federation, federation.initial_state(), after)
    expected = collect_client_updates.fn(federation, state, mode)
    assert saved["client_ids"] == list(range(len(names)))
    diff = (saved["updates"] - expected).abs().max().item()
    assert diff <= TOLERANCE, f"max abs difference {diff:.2e} from the simulation"
    tested = {"alpha": 0.05, "max_tests": None, "seed": 0}
    at_sites = test_normality.fn(federation.model, saved["updates"], **tested)
    here = test_normality.fn(federation.model, expected, **tested)
    assert at_sites.n_tests == here.n_tests > 0
    assert abs(at_sites.shapiro_rate - here.shapiro_rate) <= 0.01
    assert abs(at_sites.anderson_rate - here.anderson_rate) <= 0.01


def test_broken_lying_and_misfit_sites_are_handled_with_their_reasons(
    hub: Hub, tmp_path: Path, medmnist_root: Path
) -> None:
    """A site that sends NaN, one that sends a wrong shape, one that reports ten times its
    registered count, one whose lineage record does not read, one whose data does not fit the task (3-channel images), one
    whose operator approved another training plan (a smaller learning rate), one that
    approved the plan with local DP (this run has privacy off) and one whose operator
    insists on local DP from its command line (``require-local-dp``) whatever its plan."""
    base = hub.files["site-2"]
    cautious = tmp_path / "cautious-plan.json"
    cautious.write_text(json.dumps(json.loads(hub.plan.read_text()) | {"lr": 0.01}))
    private = tmp_path / "local-dp-plan.json"
    local_dp = {"privacy_mode": "local", "privacy_clip": 1.0, "privacy_noise_multiplier": 1.0,
                "privacy_delta": 1e-5}  # fmt: skip
    private.write_text(json.dumps(json.loads(hub.plan.read_text()) | local_dp))
    hub.add_site("nan-site", base, fault="nan")
    hub.add_site("shape-site", base, fault="shape")
    hub.add_site("lying-site", base, fault="count")
    retina = load_medmnist("retinamnist", medmnist_root, 28)
    split = split_partition(retina.train.targets, "iid", 20, 0, {}, 0, 0.0)
    (file,) = write_site_files(
        retina, split.clients[:1], split.local_tests[:1], ["retina"], tmp_path
    )
    hub.add_site("retina-site", tmp_path / file["file"])
    hub.add_site("cautious-site", base, **{"approved-plan": str(cautious)})
    hub.add_site("private-site", base, **{"approved-plan": str(private)})
    hub.add_site("insisting-site", base, **{"require-local-dp": "true"})
    hub.add_site("garbled-lineage-site", base, fault="lineage")
    names = ["site-0", "site-2", "nan-site", "shape-site", "lying-site", "retina-site"]
    names += ["cautious-site", "private-site", "insisting-site", "garbled-lineage-site"]
    raw = hub.flower_params(names, train={"rounds": 1}, filters=[])
    state = run_at_sites(hub, raw, "faults", app=FAULTY_APP)

    rows = {row["client"]: row for row in state.trail}
    nan_row, shape_row, lying_row, misfit_row, cautious_row = (rows[i] for i in range(2, 7))
    assert (nan_row["excluded"], nan_row["reason"]) == (True, "non_finite")
    assert (shape_row["excluded"], shape_row["reason"]) == (True, "bad_update")
    assert "shape" in shape_row["message"]
    # the lying site is kept, weighted by its registered count, and flagged
    registered = raw["federation"]["sites"][4]["samples"]
    assert not lying_row["excluded"]
    assert lying_row["num_samples"] == registered
    assert lying_row["reported_samples"] == 10 * registered
    assert "registered" in lying_row["message"]
    # the misfit task is refused in one logged line, answered with an error; it runs on
    assert (misfit_row["excluded"], misfit_row["reason"]) == (True, "client_error")
    assert misfit_row["message"].startswith(
        "refused: retina.npz: images are 28x28 with 3 channel(s)"
    )
    assert hub.fed.sites["retina-site"].poll() is None
    assert "task refused: retina.npz" in hub.fed.site_log("retina-site").read_text()
    # a plan the site's operator did not approve is refused, naming what differs
    assert (cautious_row["excluded"], cautious_row["reason"]) == (True, "client_error")
    assert cautious_row["message"].startswith("refused: training plan ")
    assert cautious_row["message"].endswith(": lr=0.05 (approved 0.01)")
    assert "task refused: training plan" in hub.fed.site_log("cautious-site").read_text()
    # privacy off: refused by the site that pinned local DP and by the one insisting on it
    private_row, insisting_row = rows[7], rows[8]
    assert [private_row["reason"], insisting_row["reason"]] == ["client_error"] * 2
    assert "privacy_mode=off (approved local)" in private_row["message"]
    assert insisting_row["message"] == (
        "refused: privacy_mode=off: this site trains only with local DP "
        "(privacy_mode=local; fedsieve-site --local-dp)"
    )
    assert not any(rows[i]["excluded"] for i in (0, 1))
    assert not rows[9]["excluded"]
    garbled_lineage_left_out(HubFiles(hub.folder / "faults"))
    assert torch.isfinite(state.global_vector).all()
    for name in names[2:]:
        hub.remove(name)


def garbled_lineage_left_out(files: HubFiles) -> None:
    """A lineage record that does not read (site 9's train answer) is left out of the
    run's lineage and said in the hub's log; its scoring's lineage is kept."""
    lineage = json.loads(files.outcome.read_text())["site_data"]
    assert [entry["trained"] for entry in lineage["0"]] == [[1]]
    assert [(entry["trained"], entry["scored"]) for entry in lineage["9"]] == [([], [1])]


def test_a_divergence_at_a_site_stops_the_run_naming_it(hub: Hub) -> None:
    """Scored at the sites, a site whose scoring finds the model's outputs non-finite
    stops the run with the site and the divergence named, as the hub's own scoring does
    (not a round carried on with NaN scores)."""
    hub.add_site("diverging-site", hub.files["site-2"], fault="diverged")
    raw = hub.flower_params(
        ["site-0", "diverging-site"], train={"rounds": 1}, filters=[], eval={"where": "sites"}
    )
    files = HubFiles(hub.folder / "diverged")
    write_params(files.params, Params.model_validate(raw))
    config = {"hub-folder": str(files.folder), "data-root": str(hub.folder),
              "checkpoint": str(files.folder / "checkpoint.pt")}  # fmt: skip
    hub.fed.run_app(FAULTY_APP, config, timeout=limit(600))
    outcome = json.loads(files.outcome.read_text())
    assert outcome["status"] == "failed"
    assert outcome["error"].startswith(
        "ModelDiverged: site 1: the model's outputs are NaN or infinite for "
    ), outcome
    assert not files.rounds.exists()  # no round was journaled with NaN scores
    assert_no_serverapp_left(hub, files, "a failed run's ServerApp outlived it")
    hub.remove("diverging-site")


def test_an_unregistered_or_revoked_key_is_refused_and_a_key_is_replaced_alone(
    hub: Hub, tmp_path: Path
) -> None:
    fed = hub.fed
    intruder = make_site_key(tmp_path, "intruder")
    fed.start_site("intruder", intruder, hub.node_config("site-0"))
    with pytest.raises(RuntimeError, match="exited"):
        fed.wait_connected("intruder", timeout=limit(60))
    assert REFUSED in fed.work.joinpath("superlink.log").read_text()

    # site-3's key is replaced: the old one is revoked (refused from then on), the new
    # one registered under a new node id; no other site is touched
    old = hub.nodes["site-3"]
    fed.stop_site("site-3")
    fed.unregister(old)
    refusals = fed.work.joinpath("superlink.log").read_text().count(REFUSED)
    fed.start_site("site-3", hub.keys["site-3"], hub.node_config("site-3"))
    with pytest.raises(RuntimeError, match="exited"):
        fed.wait_connected("site-3", timeout=limit(60))
    assert fed.work.joinpath("superlink.log").read_text().count(REFUSED) == refusals + 1
    hub.keys["site-3"] = make_site_key(tmp_path, "site-3-new")
    hub.nodes["site-3"] = fed.register(hub.keys["site-3"].public)
    hub.fed.start_site("site-3", hub.keys["site-3"], hub.node_config("site-3"))
    assert fed.wait_connected("site-3") == hub.nodes["site-3"] != old
    others = [hub.nodes[name] for name in site_names() if name != "site-3"]
    assert all(fed.node_status(node) == "online" for node in others)


def rounds_written(files: HubFiles) -> int:
    if not files.rounds.exists():
        return 0
    return sum(1 for line in files.rounds.read_text().splitlines() if line.strip())


def wait_for_round(files: HubFiles, round_number: int, process: Any, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while rounds_written(files) < round_number:
        assert process.poll() is None, f"the run ended before round {round_number}"
        assert time.monotonic() < deadline, f"round {round_number} not reached in {timeout} s"
        time.sleep(0.2)


def wait_for_checkpoint(path: Path, process: Any, timeout: float = 60) -> None:
    """Until the round the journal shows is checkpointed too (the driver journals first)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint at {path} in {timeout} s"
        time.sleep(0.2)


def logged_rounds(client: Any, run_id: str) -> dict[int, float]:
    """The test accuracy an MLflow run logged, by round; a round logged twice fails."""
    history = client.get_metric_history(run_id, "test_acc")
    steps = [metric.step for metric in history]
    assert len(steps) == len(set(steps)), f"rounds logged more than once: {sorted(steps)}"
    return {metric.step: metric.value for metric in history}


def assert_refused_in_one_line(said: str, line: str) -> None:
    """A run that failed closed: exit 1, its last line the reason, no traceback."""
    assert said.startswith("rc 1:") and "Traceback" not in said, said
    assert said.rstrip().splitlines()[-1].startswith(line), said


def assert_the_run_log_says_what_each_site_read(log: str, read: list[dict[str, Any]]) -> None:
    """At the start of its stages at the sites (the pre-test, then training before round
    1), the run's log has one line per site: its images per class, held out, and digest,
    as the site's lineage on the run (reports/site_data.json) has them."""
    lines = log.splitlines()
    first_round = next(i for i, line in enumerate(lines) if "round 1/2:" in line)
    for site in read:
        classes = "; ".join(f"{label}: {count}" for label, count in site["classes"].items())
        said = (
            f"site {site['site']} read {sum(site['classes'].values())} training images "
            f"({classes}) and {sum(site['history'][0]['test'])} held out; data sha256 "
            f"{site['sha256'][:12]}"
        )
        at = [i for i, line in enumerate(lines) if line.endswith(said)]
        assert len(at) >= 2 and at[1] < first_round, (said, log[-4000:])  # pre-test, training


def assert_sites_hold_the_data(project: Path) -> None:
    """The partition and pre-test stages at real sites: no simulated partition, its report
    saying that the sites hold the data; the pre-test run on what every site sent."""
    partition = json.loads((project / "reports" / "partition.json").read_text())
    assert partition["held_at"] == "sites" and "clients" not in partition
    pretest = json.loads((project / "reports" / "pretest.json").read_text())
    assert pretest["runtime"] == "flower" and pretest["sites"] == site_names(), pretest
    assert pretest["n_tests"] > 0 and 0 <= pretest["shapiro_rate"] <= 1, pretest


def test_a_site_killed_mid_run_is_left_out_with_its_reason_and_rejoins(
    hub: Hub, tmp_path: Path
) -> None:
    """...and ``fedsieve check-simulation`` names the outage as why the run is not its
    simulation (the hub's records laid out as a run's: params, checkpoint, journal)."""
    fed, victim = hub.fed, "site-2"
    raw = hub.flower_params(site_names(), train={"rounds": 6}, filters=[], eval={"every": 6})
    # a live site answers well within it; Flower answers for the dead one once its
    # heartbeat lapses (at most 60 s), or the round's deadline passes first
    raw["federation"]["round_timeout"] = round(limit(90))
    params = Params.model_validate(raw)
    project = tmp_path / "project"
    (project / "params.yaml").parent.mkdir()
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    files = HubFiles(project / "artifacts" / "hub")
    write_params(files.params, params)
    checkpoint = project / "artifacts" / "checkpoints" / "train.pt"
    run = fed.start_app(
        APP_DIR,
        {
            "hub-folder": str(files.folder),
            "data-root": str(hub.folder),
            "checkpoint": str(checkpoint),
        },
    )
    wait_for_round(files, 1, run)
    fed.kill_site(victim)  # SIGKILL: no goodbye, the SuperLink learns it by the heartbeat
    fed.wait_status([hub.nodes[victim]], "offline", timeout=limit(120))
    hub.start(victim)
    assert run.wait(timeout=limit(600)) == 0, fed.app_log(run).read_text()[-3000:]

    state = ServerState.from_dict(read_checkpoint(checkpoint, params_hash(params))["state"])
    rows = [row for row in state.trail if row["client"] == 2]
    missed = [row for row in rows if row["excluded"]]
    assert missed and {row["reason"] for row in missed} <= {"client_timeout", "client_unavailable"}
    assert all(row["message"] for row in missed)
    assert not rows[-1]["excluded"], f"the restarted site did not rejoin: {rows}"
    others = [row for row in state.trail if row["client"] != 2 and row["excluded"]]
    assert not others, others
    assert state.round == 6 and all(h["clients_kept"] >= 3 for h in state.history)

    checked = subprocess.run(
        [sys.executable, "-m", "fedsieve.cli", "check-simulation", "--params", "params.yaml",
         "--data", str(hub.files[victim].parent)],
        cwd=project, capture_output=True, text=True, timeout=limit(600),
    )  # fmt: skip
    said = checked.stdout.splitlines()
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert said[-2].startswith("fedsieve: the run at the sites is not its simulation: "), said
    rounds = [row["round"] for row in missed]
    assert said[-1] == (
        f"  cause: site {victim} did not answer in round{'s' if len(rounds) > 1 else ''} "
        f"{round_spans(rounds)} ({', '.join(sorted({row['reason'] for row in missed}))}), "
        "which the simulation cannot replay: it trains every site every round"
    )


def test_a_hub_killed_with_sigkill_resumes_from_its_checkpoint_with_the_sites_connected(
    hub: Hub, tmp_path: Path, prefect_server: str
) -> None:
    """The hub's whole side (the ``fedsieve train`` flow and the SuperLink with its
    ServerApp) SIGKILLed after round 1 of 2; the SuperLink restarted on its database, the
    sites reconnect by themselves; the whole pipeline resumed (``fedsieve run --resume``:
    no partition at the hub, training at the sites, evaluation with the sites' own scores)
    ends where an uninterrupted run ends, in the same MLflow run."""
    names, rounds = site_names(), 2  # one round before the kill, one after the resume
    raw = hub.flower_params(names, train={"rounds": rounds}, eval={"every": rounds})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    fedsieve = [sys.executable, "-m", "fedsieve.cli"]
    command = [*fedsieve, "train", "--params", "params.yaml", "--resume"]
    env = hub.fed.flwr_env() | {
        "PREFECT_API_URL": prefect_server,
        "FEDSIEVE_FLOWER_BIN": str(FLOWER_BIN),
    }
    files = HubFiles(tmp_path / "artifacts" / "hub")
    with (tmp_path / "first.log").open("wb") as log:
        first = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )  # fmt: skip
        try:
            wait_for_round(files, 1, first)
            wait_for_checkpoint(tmp_path / "artifacts" / "checkpoints" / "train.pt", first)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    hub.fed.kill_superlink()
    checkpoint = tmp_path / "artifacts" / "checkpoints" / "train.pt"
    params = Params.model_validate(raw)
    killed_at = read_checkpoint(checkpoint, params_hash(params))
    assert killed_at is not None and 1 <= killed_at["state"]["round"] < rounds

    hub.fed.start_superlink()
    hub.fed.wait_status(hub.nodes[name] for name in names)  # back by themselves
    second = subprocess.run(
        [*fedsieve, "run", "--params", "params.yaml", "--resume"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=limit(900),
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]

    state = ServerState.from_dict(read_checkpoint(checkpoint, params_hash(params))["state"])
    local = simulated(raw, hub, names)
    assert state.round == rounds
    assert (state.global_vector - local.global_vector).abs().max().item() <= TOLERANCE
    assert decisions(state) == decisions(local)
    with (tmp_path / "reports" / "rounds.csv").open() as table:
        assert [int(float(row["round"])) for row in csv.DictReader(table)] == [1, 2]
    tracking = json.loads((tmp_path / "artifacts" / "model" / "tracking.json").read_text())
    assert tracking["run_id"] == killed_at["run_id"] and not tracking["tracking_failed"]
    # the resumed run logged the rounds after its checkpoint, each once, into the same run
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert logged_rounds(client, tracking["run_id"]) == {
        int(row["round"]): row["test_acc"] for row in state.history
    }
    assert_sites_hold_the_data(tmp_path)
    # the final per-site table is what the sites scored on their own held-out splits
    final_sites = json.loads((tmp_path / "reports" / "sites.json").read_text())
    scored = [row for row in state.sites if row["round"] == rounds]
    assert sorted(int(row["site"]) for row in final_sites["sites"]) == list(range(len(names)))
    assert {int(r["site"]): r["acc"] for r in final_sites["sites"]} == pytest.approx(
        {int(r["site"]): r["acc"] for r in scored}
    )
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert metrics["rounds"] == rounds
    assert metrics["site_acc_worst"] == min(r["acc"] for r in scored)


def site_variates(states: dict[str, Path]) -> dict[str, np.ndarray]:
    """Every SCAFFOLD variate the sites keep on their disks (``site-k@round``)."""
    variates = {}
    for name, folder in states.items():
        [path] = (folder / "scaffold").glob("*.npz")
        with np.load(path) as saved:
            for round_number, control in zip(saved["rounds"], saved["controls"], strict=True):
                variates[f"{name}@{round_number}"] = control
    return variates


def first_variate(variates: dict[str, np.ndarray], key: str) -> bool:
    """Whether ``key`` (``site@round``) is its site's first round in ``variates``."""
    site, round_number = key.split("@")
    return int(round_number) == min(
        int(k.split("@")[1]) for k in variates if k.startswith(f"{site}@")
    )


def assert_scaffold_as_simulated(
    remote: ServerState, local: ServerState, variates: dict[str, np.ndarray]
) -> None:
    """The run at the sites ended where its simulation ends: the model, c, the decisions
    and whose control deltas counted; the hub kept c only; each site's latest c_i is its
    simulated client's."""
    assert remote.round == local.round and remote.client_controls == {}
    assert decisions(remote) == decisions(local)
    counted = [(row["client"], row["control_counted"]) for row in remote.trail]
    assert counted == [(row["client"], row["control_counted"]) for row in local.trail]
    assert (FLIPPER, False) in counted  # left out by PID-MADE: its Δc_i did not count
    for ours, theirs in (
        (remote.global_vector, local.global_vector),
        (remote.control, local.control),
    ):
        assert (ours - theirs).abs().max().item() <= TOLERANCE
    for client in local.client_controls:
        site = site_names()[client]
        latest = max(int(key.split("@")[1]) for key in variates if key.startswith(f"{site}@"))
        diff = torch.from_numpy(variates[f"{site}@{latest}"]) - local.client_controls[client]
        assert diff.abs().max().item() <= TOLERANCE, (site, latest)


def restart_site(hub: Hub, name: str, state: Path) -> None:
    """Stop a site's SuperNode and warm trainer and start both again, its state folder
    given as ``fedsieve-site --state`` gives it."""
    hub.fed.stop_site(name)
    hub.fed.stop_site(f"{name}.trainer")
    hub.start(name, **{"state-dir": str(state)})


def test_scaffold_at_the_sites_keeps_each_variate_at_its_site_through_restarts(
    hub: Hub, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, prefect_server: str
) -> None:
    """SCAFFOLD through the pipeline (``fedsieve train``) at the four sites, three of them
    sampled a round, PID-MADE leaving the flipper out: the hub is SIGKILLed after a round,
    every site restarted on its state folder, and the run resumed ends where its
    simulation ends (the model, c, the decisions and whose control deltas counted), each
    site holding its simulated client's c_i. No file the hub wrote (its project: run
    folder, checkpoints, reports, MLflow's database and artifacts; Prefect's home; the
    SuperLink's database) holds any of the variates the sites keep."""
    names = site_names()
    # seed 1's samples: sites 0, 2, 3 in round 1 (before the kill); 0, 1, 2 in round 2,
    # where sites 0 and 2 train on the variates they kept through their restarts
    raw = hub.flower_params(
        names, seed=1, train={"rounds": 2, "scaffold": True, "momentum": 0.0,
                              "client_fraction": 0.75}, eval={"every": 2},
    )  # fmt: skip
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    states = {name: tmp_path_factory.mktemp(f"{name}-state") for name in names}
    fedsieve = [sys.executable, "-m", "fedsieve.cli", "train", "--params", "params.yaml",
                "--resume"]  # fmt: skip
    env = hub.fed.flwr_env() | {"PREFECT_API_URL": prefect_server,
                                "FEDSIEVE_FLOWER_BIN": str(FLOWER_BIN)}  # fmt: skip
    files = HubFiles(tmp_path / "artifacts" / "hub")
    checkpoint = tmp_path / "artifacts" / "checkpoints" / "train.pt"
    with approved(hub, raw):
        for name in names:
            restart_site(hub, name, states[name])
        with (tmp_path / "first.log").open("wb") as log:
            first = subprocess.Popen(
                fedsieve, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                wait_for_round(files, 1, first)
                wait_for_checkpoint(checkpoint, first)
            finally:
                if first.poll() is None:
                    os.killpg(first.pid, signal.SIGKILL)
                first.wait()
        assert first.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()[-3000:]
        hub.fed.kill_superlink()
        hub.fed.start_superlink()
        hub.fed.wait_status(hub.nodes[name] for name in names)
        for name in names:  # each site stopped, its variate left on its own disk ...
            hub.fed.stop_site(name)
            hub.fed.stop_site(f"{name}.trainer")
        hub.fed.wait_status((hub.nodes[name] for name in names), "offline", timeout=limit(180))
        for name in names:  # ... and started again on it
            hub.start(name, **{"state-dir": str(states[name])})
        second = subprocess.run(
            fedsieve, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=limit(900)
        )  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]

    saved = read_checkpoint(checkpoint, params_hash(Params.model_validate(raw)))
    assert saved is not None
    variates = site_variates(states)
    assert_scaffold_as_simulated(
        ServerState.from_dict(saved["state"]), simulated(raw, hub, names), variates
    )

    hub_wrote = files_holding([tmp_path, Path(os.environ["PREFECT_HOME"])], variates)
    assert hub_wrote == {}, hub_wrote
    # a site's first variate is the Δc_i it sent, which Flower carried through its database;
    # none of the later ones was ever sent
    later = {key: value for key, value in variates.items() if not first_variate(variates, key)}
    assert later and files_holding(sorted(hub.fed.work.glob("superlink.db*")), later) == {}
    # and the search finds them where they are: on each site's own disk
    found = files_holding(list(states.values()), variates)
    assert set(found) == set(variates)


def write_site_plan(hub: Hub, path: Path, **sections: Any) -> Path:
    """The training plan of ``hub.flower_params(..., **sections)``, for sites that are
    not registered yet (a plan names no site)."""
    raw = hub.flower_params([], **sections)
    del raw["federation"]
    write_plan(path, site_task(Params.model_validate(raw), dataset_info("digits")))
    return path


def test_sites_noise_their_own_updates_account_their_own_epsilon_and_stop_at_its_target(
    hub: Hub, tmp_path: Path
) -> None:
    """Local DP at real sites. Two sites pin a plan with ``privacy.mode: local`` (clip
    0.5, noise multiplier 3, target ε 1.8: one update per site fits, two do not); one site
    a round is sampled, the same site both rounds. Its round-1 update reaches the hub
    clipped and noised by the site (the global model moves by it alone), both it and the
    hub account its ε as the simulation does, and it refuses round 2 past its target.
    (A task with privacy off at a site that pinned local DP: the faults test.)"""
    z, clip, target = 3.0, 0.5, 1.8
    seed = next(s for s in range(100) if sample_clients(s, 1, 2, 1) == sample_clients(s, 2, 2, 1))
    names = ["ldp-0", "ldp-2"]
    private = {"privacy": {"mode": "local", "clip": clip, "noise_multiplier": z,
                           "target_epsilon": target}, "filters": [], "seed": seed,
               "train": {"client_fraction": 0.5}, "partition": {"num_clients": 2},
               "eval": {"every": 1}}  # fmt: skip
    plan = write_site_plan(hub, tmp_path / "local-dp-plan.json", **private)
    for name, base in zip(names, ("site-0", "site-2"), strict=True):
        hub.add_site(name, hub.files[base], **{"approved-plan": str(plan)})
    raw = hub.flower_params(names, **private)
    remote = run_at_sites(hub, raw, "local-dp")

    [chosen] = sample_clients(seed, 1, 2, 1)
    first, second = remote.trail
    budget = site_privacy(clip=clip, noise_multiplier=z, delta=1e-5, target_epsilon=target)
    assert (first["client"], second["client"]) == (chosen, chosen)
    assert not first["excluded"] and first["privacy_epsilon"] == budget.site_epsilon(1)
    assert (second["excluded"], second["reason"]) == (True, "client_error")
    assert second["message"].startswith(
        "refused: privacy budget: one more update would take this site's ε to "
        f"{budget.site_epsilon(2):.3f}, past privacy_target_epsilon = 1.8"
    )
    # round 1's model was scored at both sites, the one refusing to train on it too
    assert {(row["round"], int(row["site"])) for row in remote.sites} == {
        (t, k) for t in (1, 2) for k in (0, 1)
    }
    log = hub.fed.site_log(names[chosen]).read_text()
    assert f"this site's ε = {budget.site_epsilon(1):.4f} (δ = 1e-05) after 1 updates" in log
    # the simulation's accountant gives the site the same ε for the same round
    simulation = simulated_federation(
        Params.model_validate(raw), load_digits(), [hub.files[n] for n in names]
    )
    start = simulation.initial_state().global_vector
    local = train(simulation, simulation.initial_state(), 1)
    assert local.trail[0]["client"] == chosen
    assert local.trail[0]["privacy_epsilon"] == first["privacy_epsilon"]
    # round 2 was skipped: the model moved by the site's privatised update alone, its
    # clipped update (norm <= 0.5) plus noise of std z * clip = 1.5 in each of 650 weights
    moved = remote.global_vector - start
    assert moved.std().item() == pytest.approx(z * clip, rel=0.15)  # 5 standard errors
    assert abs(moved.norm().item() - z * clip * moved.numel() ** 0.5) <= clip + 4 * z * clip

    for name in names:
        hub.remove(name)


def fedsieve_run(project: Path, env: dict[str, str], raw: dict[str, Any]) -> str:
    """``fedsieve run`` with params ``raw`` in ``project``; its exit code and stderr."""
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    done = subprocess.run(
        [sys.executable, "-m", "fedsieve.cli", "run", "--params", "params.yaml"],
        cwd=project, env=env, capture_output=True, text=True, timeout=limit(900),
    )  # fmt: skip
    return f"rc {done.returncode}: {done.stderr[-3000:]}"


def make_run(project: Path, env: dict[str, str], raw: dict[str, Any]) -> str:
    """``make run`` (``fedsieve dvc repro``) in ``project`` with the repository's
    params.yaml and ``raw``'s sections in it (DVC needs every key its stages list)."""
    full = yaml.safe_load((REPO / "params.yaml").read_text())
    for key, value in raw.items():
        merged = isinstance(value, dict) and isinstance(full.get(key), dict)
        full[key] = full[key] | value if merged else value
    # the training settings are the plan the sites approved, not the repository's
    full["train"] |= Params.model_validate(raw).train.model_dump(mode="json")
    full["partition"]["num_clients"] = len(raw["federation"]["sites"])  # the sites
    (project / "params.yaml").write_text(yaml.safe_dump(full))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "fedsieve"), "dvc", "repro"],
        cwd=project, env=env, capture_output=True, text=True, timeout=limit(900),
    )  # fmt: skip
    return f"rc {done.returncode}: {done.stdout[-1500:]} {done.stderr[-3000:]}"


def reported_rounds(project: Path) -> dict[int, float]:
    with (project / "reports" / "rounds.csv").open() as rounds:
        return {int(float(row["round"])): float(row["test_acc"]) for row in csv.DictReader(rounds)}


@contextmanager
def serving(project: Path, env: dict[str, str], prefect_server: str, name: str) -> Iterator[Any]:
    """``fedsieve serve --cron`` in ``project`` (what an operator schedules) while the block
    runs; the deployment as the Prefect server holds it. Stopped by its PID."""
    import httpx

    command = [sys.executable, "-m", "fedsieve.cli", "serve", "--cron", "0 3 * * *",
               "--name", name]  # fmt: skip
    log = project / "serve.log"
    # the runner looks for runs to start every 10 s by default: a run the test starts would
    # wait out half of that on average, and the next run the rest of its last look
    looks = {"PREFECT_RUNNER_POLL_FREQUENCY": "2"}  # as the scheduling tests' worker
    with log.open("wb") as out:
        serve = subprocess.Popen(
            command, cwd=project, env=env | looks, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def deployment() -> dict[str, Any] | None:
        assert serve.poll() is None, log.read_text()[-3000:]
        found = httpx.get(f"{prefect_server}/deployments/name/pipeline/{name}", timeout=limit(30))
        return found.json() if found.status_code == 200 else None

    try:
        yield poll("the served deployment", deployment, timeout=limit(120))
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=limit(60))


@contextmanager
def approved(hub: Hub, raw: dict[str, Any]) -> Iterator[None]:
    """The sites' operators approve ``raw``'s plan while the block runs, then their own."""
    before = hub.plan.read_bytes()
    write_plan(hub.plan, site_task(Params.model_validate(raw), dataset_info("digits")))
    try:
        yield
    finally:
        hub.plan.write_bytes(before)


def centrally_private(hub: Hub, names: list[str], **sections: Any) -> dict[str, Any]:
    """Params with central DP whose target ε lets round 1 through and stops round 2, scored
    for accuracy only each round."""
    private = hub.flower_params(
        names, filters=[], eval={"every": 1, "round_scores": "accuracy"},
        privacy={"mode": "central", "noise_multiplier": 1.0}, **sections,
    )  # fmt: skip
    budget = privacy_budget(Params.model_validate(private))
    private["privacy"]["target_epsilon"] = (budget.epsilon(1) + budget.epsilon(2)) / 2
    return private


def assert_only_the_sites_pretest_logged(client: Any, run: Any) -> None:
    """A ``make run`` at the sites logs the pre-test of what the sites sent, and nothing
    its partition stage could have simulated."""
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "partition" not in artifacts
    assert "pretest" in artifacts
    assert "pretest_shapiro_rate" in run.data.metrics


def test_runs_in_one_checkout_by_hand_on_schedule_and_by_make_run_log_their_own_rounds(
    hub: Hub, tmp_path: Path, prefect_server: str, medmnist_root: Path
) -> None:
    """Four runs in one checkout (a git repository with the DVC pipeline) at the same sites:

    - a ``fedsieve run`` that fails (closed by ``train.max_excluded: 0`` once the flipper
      is left out);
    - two runs of a scheduled deployment (``fedsieve serve --cron`` with ``runtime:
      flower``: the deployment carries the sites). The first trains at the sites with the
      sites' own scores and registers its model. The second is started with other params
      (central DP, which the sites approved): scored for accuracy only (no AUC before the
      last round), its privacy budget ends it after round 1, and it finishes, tagged
      ``stopped_early``;
    - a ``make run`` (``dvc repro``), whose partition and pre-test stages only say that the
      sites hold the data.

    Each MLflow run holds its own rounds, once each, as its reports/rounds.csv has them (a
    deployment's run is tagged with its own Prefect flow run); none reads the journal
    another run left."""
    from mlflow import MlflowClient
    from prefect.deployments import run_deployment

    from tests.flows.test_pipeline import pipeline_repo

    names = site_names()
    project, env = pipeline_repo(tmp_path, medmnist_root, rounds=1)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    env |= hub.fed.flwr_env() | {
        "PREFECT_API_URL": prefect_server,
        "FEDSIEVE_FLOWER_BIN": str(FLOWER_BIN),
    }
    # one-round models, not ones the registration gate passes: these runs register none
    unregistered = {"register_model": False}
    private = centrally_private(hub, names, tracking=unregistered)
    failing = hub.flower_params(names, train={"max_excluded": 0}, tracking=unregistered)
    said = [fedsieve_run(project, env, failing)]
    reported = {"failed": reported_rounds(project)}
    (project / "params.yaml").write_text(
        yaml.safe_dump(hub.flower_params(names, eval={"every": 2}))
    )
    with serving(project, env, prefect_server, "at-sites") as deployment:
        flow_runs = [run_deployment("pipeline/at-sites", timeout=limit(600), poll_interval=2)]
        reported["scheduled"] = reported_rounds(project)
        metrics = json.loads((project / "reports" / "metrics.json").read_text())
        sites, read = (  # each site's scores; what each site read
            json.loads((project / "reports" / name).read_text())["sites"]
            for name in ("sites.json", "site_data.json")
        )
        with approved(hub, private):
            flow_runs.append(
                run_deployment(
                    "pipeline/at-sites", parameters={"params": private}, timeout=limit(600),
                    poll_interval=2,
                )
            )  # fmt: skip
        reported["private"] = reported_rounds(project)
    said.append(make_run(project, env, hub.flower_params(names, train={"rounds": 1},
                                                         tracking=unregistered)))  # fmt: skip
    reported["third"] = reported_rounds(project)

    log = (project / "serve.log").read_text()
    assert "rc 0:" not in said[0] and "rc 0:" in said[1], said
    assert_refused_in_one_line(said[0], "fedsieve: error: round ")
    for output in (*said, log):  # the sites trained each run
        assert "no round was aggregated" not in output and "JSONDecodeError" not in output, output
    experiment = client.get_experiment_by_name("fedsieve").experiment_id
    logged = client.search_runs([experiment], order_by=["attributes.start_time ASC"])
    assert [run.info.status for run in logged] == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    for run, name in zip(logged, reported, strict=True):
        assert logged_rounds(client, run.info.run_id) == pytest.approx(reported[name]), name
    assert [list(reported[name]) for name in ("scheduled", "private", "third")] == [
        [1, 2],
        [1],
        [1],
    ]
    assert_sites_hold_the_data(project)

    scheduled, private_run, third = logged[1:]
    served = deployment["parameters"]["params"]["federation"]
    assert served["runtime"] == "flower" and len(served["sites"]) == len(names)
    assert deployment["schedules"][0]["schedule"]["cron"] == "0 3 * * *"
    for mlflow_run, flow_run in zip((scheduled, private_run), flow_runs, strict=True):
        assert flow_run.state is not None and flow_run.state.is_completed(), log[-4000:]
        assert mlflow_run.data.params["federation.runtime"] == "flower"
        assert mlflow_run.data.tags["prefect_flow_run_id"] == str(flow_run.id)  # its own
    assert client.search_model_versions(f"run_id = '{scheduled.info.run_id}'")
    assert metrics["rounds"] == 2
    assert scheduled.data.metrics["final_test_acc"] == pytest.approx(metrics["test_acc"])
    assert sorted(int(row["site"]) for row in sites) == list(range(len(names)))  # their own
    assert_the_run_log_says_what_each_site_read(log, read)

    assert "test_auc" not in client.get_run(private_run.info.run_id).data.metrics
    assert private_run.data.tags["stopped_early"].startswith("privacy budget: round 2 would")
    assert "stopped_early" not in third.data.tags
    assert_only_the_sites_pretest_logged(client, third)
