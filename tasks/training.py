"""Training tasks: assemble a federation from validated params, run one round, record it
(metrics to MLflow, then the checkpoint), and write the training reports."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from tqdm import tqdm

from aggregation import build_filter
from config.assembly import (
    build_defence,
    build_global_model,
    federation_config,
    local_training,
    local_work,
    resolve_device,
)
from config.errors import RunHalted, ServiceError
from config.params import Params, population
from federated.attacks import (
    Attack,
    Backdoor,
    DataAttack,
    ModelAttack,
    build_attack,
    choose_malicious,
    client_seed,
)
from federated.backdoor_eval import triggered_test_set
from federated.checkpoint import save_checkpoint, stale_checkpoint
from federated.client import ClientData
from federated.data import MedMNISTData, to_tensors
from federated.driver import SHOWN, RunDriver
from federated.loop import train
from federated.seeding import clients_per_round
from federated.server import (
    EvaluationSets,
    Execution,
    Federation,
    RoundReport,
    ServerState,
    ThreatModel,
)
from tasks.plots import plot_curves, plot_exclusion_heatmap, plot_sites
from tasks.reports import ProjectPaths, write_csv, write_json
from tasks.stopping import stop_if_requested
from tasks.tracking import Tracker

__all__ = [
    "TRAIL_COLUMNS",
    "RoundProgress",
    "RunOutputs",
    "build_federation",
    "build_global_model",
    "federation_config",
    "federation_from_params",
    "filters_that_cannot_exclude",
    "halt_if_bound_exceeded",
    "halt_if_tracking_lost",
    "load_checkpoint",
    "local_training",
    "malicious_clients",
    "record_budget_spent",
    "record_round",
    "report_metrics",
    "resolve_device",
    "resumed_state",
    "run_attack",
    "run_driver",
    "train_federation",
    "train_rounds",
    "trained_model_noniid",
    "write_reports",
    "write_run_info",
    "write_training_reports",
]

SITE_KEYS = ("round", "site", "n")  # a per-site row's identifiers; the rest are scores
SITE_COLUMNS = (*SITE_KEYS, "loss", "acc", "auc", "ece", "brier")
TRAIL_COLUMNS = (
    "round", "client", "num_samples", "malicious", "excluded", "reason", "score", "threshold",
    "distance", "p_term", "i_term", "d_term", "noniid_loss", "train_loss", "local_epochs",
    "local_steps", "selected", "message",
)  # fmt: skip


def malicious_clients(params: Params) -> frozenset[int]:
    """The run's malicious set (empty without an attack): seeded, fixed for the run."""
    attack = params.attack
    if attack.name == "none":
        return frozenset()
    if attack.ids is not None:
        return choose_malicious(params.partition.num_clients, ids=attack.ids, seed=params.seed)
    return choose_malicious(
        params.partition.num_clients, fraction=attack.fraction, seed=params.seed
    )


def run_attack(params: Params) -> Attack:
    """The run's attack; a backdoor's model replacement scales by n over the server's
    learning rate unless ``eta`` is given."""
    settings = params.attack.params()
    if params.attack.name == "backdoor":
        settings.setdefault("eta", params.train.server_step()[1].get("lr", 1.0))
    return build_attack(params.attack.name, **settings)


def _clients(
    params: Params,
    data: MedMNISTData,
    parts: list[np.ndarray],
    device: torch.device,
    attack: Attack,
) -> list[ClientData]:
    """Each client's images and labels on ``device``, a data attack's poison (labels, or
    images and labels for a backdoor) applied to the malicious clients' data."""
    images, targets = to_tensors(data.train, data.info, device=device)
    malicious = malicious_clients(params)
    clients = []
    for client_id, idx in enumerate(parts):
        index = torch.as_tensor(idx, device=device)
        client_images, client_targets = images[index], targets[index]
        if isinstance(attack, DataAttack) and client_id in malicious:
            client_images, client_targets = attack.poison(
                client_images,
                client_targets,
                num_classes=data.info.n_classes,
                seed=client_seed(params.seed, client_id),
            )
        clients.append(ClientData(client_id, client_images, client_targets))
    return clients


def _root_data(
    data: MedMNISTData, root: np.ndarray | None, clients: int, device: torch.device
) -> ClientData | None:
    """The server's root data as a client of its own (its id follows the clients')."""
    if root is None or len(root) == 0:
        return None
    images, targets = to_tensors(data.train, data.info, device=device)
    index = torch.as_tensor(root, device=device)
    return ClientData(clients, images[index], targets[index])


def _sites(
    data: MedMNISTData, local_tests: list[np.ndarray] | None, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each client's local test split (clean: an attack poisons training data only)."""
    if local_tests is None or not any(len(t) for t in local_tests):
        return []
    images, targets = to_tensors(data.train, data.info, device=device)
    indices = [torch.as_tensor(t, device=device, dtype=torch.long) for t in local_tests]
    return [(images[index], targets[index]) for index in indices]


def _backdoor_test(
    attack: Attack, test: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, int] | None:
    """A backdoor's triggered test images and target label (its success rate is scored
    every round); ``None`` for other attacks."""
    if not isinstance(attack, Backdoor):
        return None
    return triggered_test_set(*test, attack), attack.target_label


FEW_LOCAL_STEPS = 4  # SGD steps a round below which a small model rarely leaves its start


@task(name="build-federation", cache_policy=NO_CACHE)
def build_federation(
    params: Params,
    data: MedMNISTData,
    parts: list[np.ndarray],
    root: np.ndarray | None = None,
    local_tests: list[np.ndarray] | None = None,
) -> Federation:
    if (warning := few_local_steps(params, parts)) is not None:
        get_run_logger().warning(warning)
    return federation_from_params(params, data, parts, root, local_tests)


def few_local_steps(params: Params, parts: list[np.ndarray]) -> str | None:
    """A warning when the smallest client takes fewer than ``FEW_LOCAL_STEPS`` SGD steps
    a round (20 BreastMNIST clients of about 22 images at batch 32 take two: the small
    CNN then stays at the majority class), else None."""
    if not parts:
        return None
    smallest = min(len(part) for part in parts)
    batches = -(-smallest // params.train.batch_size)  # ceil
    steps = batches * params.train.local_epochs
    if steps >= FEW_LOCAL_STEPS:
        return None
    return (
        f"the smallest client holds {smallest} images: at train.batch_size "
        f"{params.train.batch_size} and {params.train.local_epochs} local epoch(s) it takes "
        f"{steps} SGD step(s) a round, too few for most models to learn; lower "
        "train.batch_size or raise train.local_epochs"
    )


def federation_from_params(
    params: Params,
    data: MedMNISTData,
    parts: list[np.ndarray],
    root: np.ndarray | None = None,
    local_tests: list[np.ndarray] | None = None,
    *,
    validation_every_round: bool = True,
) -> Federation:
    """The engine's federation for ``params``: clients with the data attack applied, the
    seeded model, the rule and filters, the model attack, the non-IID check. Without
    ``validation_every_round`` the validation split is scored only when ``eval.select``
    needs it (a comparison cell's rounds skip it otherwise). ``root``: the server's root
    data indices (FLTrust's reference), clean, held by no client; ``local_tests``: each
    client's local test split (per-site evaluation; with ``eval.where: sites`` also where
    every round's test scores come from, pooled as real sites' are)."""
    device = resolve_device(params.train.device)
    at_hub = params.eval.where == "hub"  # sites: the hub's splits unused, none loaded
    val = to_tensors(data.val, data.info, device=device) if at_hub else None
    test = to_tensors(data.test, data.info, device=device) if at_hub else None
    attack = run_attack(params)
    evaluation = EvaluationSets(
        test=test,
        # scored every round; eval.select=best_val picks the final model by it
        val=val if validation_every_round or params.eval.select == "best_val" else None,
        sites=tuple(_sites(data, local_tests, device)),
        multi_label=data.info.multi_label,
        where=params.eval.where,
    )
    return Federation(
        model=build_global_model(params, data.info).to(device),
        clients=_clients(params, data, parts, device, attack),
        local=local_training(params),
        config=federation_config(params),
        defence=build_defence(
            params,
            data.info,
            root=_root_data(data, root, len(parts), device),
            server_batch=val,  # Zeno's held-out batch
        ),
        threat=ThreatModel(
            malicious=malicious_clients(params),
            model_attack=attack if isinstance(attack, ModelAttack) else None,
            backdoor_test=None if test is None else _backdoor_test(attack, test),
        ),
        evaluation=evaluation,
        execution=Execution(
            backend=params.train.backend,
            max_parallel=params.train.max_parallel,
            local_work=local_work(params),
        ),
    )


@dataclass(frozen=True, kw_only=True)
class RunOutputs:
    """What a training run writes besides its results. The pipeline's train stage writes
    everything; a comparison cell is the same run with everything off (it is rerun, not
    resumed, and only the grid's summary reads it)."""

    checkpoints: bool = True  # track every round as it ends and checkpoint it (resumable)
    figures: bool = True  # the training figures in reports/
    model_file: bool = True  # the final weights (artifacts/model/model.pt)
    progress: bool = True  # progress bars on a terminal and a log line per round


def train_federation(
    federation: Federation,
    state: ServerState,
    params: Params,
    tracker: Tracker,
    checkpoint: tuple[Path, str] | None,
    outputs: RunOutputs,
) -> ServerState:
    """The run's rounds through the run's driver (:class:`federated.driver.RunDriver`, the
    one a Flower hub runs too), stopped between rounds when the flow that started it was
    cancelled or failed. With ``outputs.checkpoints`` each round is tracked and
    checkpointed (``checkpoint``: the path and the params hash) as it ends; otherwise the
    rounds are tracked at the end."""
    rounds = params.train.rounds
    keep = outputs.checkpoints and checkpoint is not None
    driver = run_driver(
        rounds, tracker, checkpoint if keep else None, say=outputs.progress, track=keep
    )
    with RoundProgress(
        rounds, state.round, federation.clients_per_round, enabled=outputs.progress
    ) as progress:
        end = driver.run(
            federation, state, should_stop=stop_if_requested, on_client=progress.client_done,
            on_round=lambda report, _state: progress.round_done(report),
        )  # fmt: skip
    if not outputs.checkpoints:
        tracker.log_history(end.state.history)
    record_budget_spent(tracker, end.stopped_early)
    return end.state


def run_driver(
    rounds: int,
    tracker: Tracker,
    checkpoint: tuple[Path, str] | None,
    *,
    say: bool = True,
    track: bool = True,
) -> RunDriver:
    """The train stage's driver: each round tracked in ``tracker``'s MLflow run
    (:func:`record_round`), checkpointed at ``checkpoint`` (the path and the params hash)
    when given, and said in the flow's log."""
    save = None
    if checkpoint is not None:
        path, digest = checkpoint

        def save(state: ServerState) -> None:
            save_checkpoint(path, state=state, digest=digest, run_id=tracker.run_id)

    return RunDriver(
        rounds=rounds,
        record=(lambda report: record_round(tracker, report)) if track else None,
        checkpoint=save,
        say=get_run_logger().info if say else None,
    )


@task(name="train-rounds", cache_policy=NO_CACHE)
def train_rounds(federation: Federation, state: ServerState, rounds: int) -> ServerState:
    """Rounds up to ``rounds`` through the engine's round loop, untracked (the pre-test's
    rounds before it looks at the updates)."""
    return train(federation, state, rounds)


@task(name="find-checkpoint", cache_policy=NO_CACHE)
def load_checkpoint(path: Path, digest: str) -> dict[str, Any] | None:
    """The checkpoint at ``path`` if it was written under params hash ``digest`` by this
    code."""
    if not path.exists():
        return None
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if (stale := stale_checkpoint(checkpoint, digest)) is not None:
        get_run_logger().info("%s; starting afresh", stale)
        return None
    get_run_logger().info(
        "resuming from the checkpoint after round %d", checkpoint["state"]["round"]
    )
    return checkpoint


def resumed_state(federation: Federation, checkpoint: dict[str, Any] | None) -> ServerState:
    """The checkpoint's server state (and torch's random state), or round 0."""
    if checkpoint is None:
        return federation.initial_state()
    torch.set_rng_state(checkpoint["torch_rng"])
    return ServerState.from_dict(checkpoint["state"], device=federation.device)


@task(name="record-round", cache_policy=NO_CACHE)
def record_round(tracker: Tracker, report: RoundReport) -> None:
    """The round's metrics (and per-client losses and per-site scores) to MLflow: the
    driver's record, before its checkpoint, so a kill in between re-runs, and re-logs,
    this round identically on resume and no round's metrics go missing."""
    tracker.log_metrics(report_metrics(report), step=report.round)


def report_metrics(report: RoundReport) -> dict[str, float]:
    """A round's metrics with each client's loss (and, under local DP, its own ε) and each
    site's scores under their own MLflow names."""
    per_client = {}
    for row in report.clients:  # client_loss/<id>, ..., local_steps/<id>, afl_lambda/<id>
        for key, name in (("train_loss", "client_loss"), ("noniid_loss", "noniid_loss"),
                          ("privacy_epsilon", "privacy_epsilon"),
                          ("local_steps", "local_steps"), ("afl_lambda", "afl_lambda"),
                          ("model_loss", "model_loss")):  # fmt: skip
            if key in row:
                per_client[f"{name}/{row['client']}"] = row[key]
    for row in report.sites:  # site_acc/<id>, site_auc/<id>, site_loss/<id>, ...
        site = int(row["site"])
        per_client |= {f"site_{k}/{site}": v for k, v in row.items() if k not in SITE_KEYS}
    return {**report.metrics, **per_client}


def trail_columns(trail: list[dict[str, Any]]) -> list[str]:
    """The trail's columns: the documented ones first, any others a filter adds after."""
    extra = [k for k in dict.fromkeys(k for row in trail for k in row) if k not in TRAIL_COLUMNS]
    return [*TRAIL_COLUMNS, *extra]


def trained_model_noniid(
    federation: Federation, model: torch.nn.Module, params: Params
) -> dict[str, Any] | None:
    """The paper's non-IID check (EMA, Algorithms 3-4) on the trained model, every client,
    when ``noniid.final`` asks for it (never for multi-label data, as the per-round one)."""
    if not params.noniid.final or federation.defence.noniid is None or len(federation.clients) < 2:
        return None
    result = federation.scorer.trained_model_noniid(
        model, params.noniid.loss, params.noniid.threshold
    )
    return None if result is None else result.trained_report(params.noniid.loss)


def noniid_report(
    state: ServerState, params: Params, trained_model: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The last per-round non-IID evaluation (CV, threshold, verdict, per-client losses)
    and, under ``trained_model``, the same on the trained model (the paper's)."""
    final = {} if trained_model is None else {"trained_model": trained_model}
    checked = [row for row in state.history if "noniid_cv" in row]
    if not checked:
        verdict = "not_evaluated"
        return {"cv": None, "threshold": params.noniid.threshold, "verdict": verdict, **final}
    last = checked[-1]
    losses = {
        str(row["client"]): row["noniid_loss"]
        for row in state.trail
        if row["round"] == int(last["round"]) and "noniid_loss" in row
    }
    return {
        "cv": last["noniid_cv"],
        "threshold": params.noniid.threshold,
        "verdict": "non_iid" if last["noniid_non_iid"] else "iid",
        "round": int(last["round"]),
        "loss": params.noniid.loss,
        "client_losses": losses,
        "cv_per_round": {int(row["round"]): row["noniid_cv"] for row in checked},
        **final,
    }


def write_reports(
    paths: ProjectPaths, model: torch.nn.Module, state: ServerState, params: Params,
    tracker: Tracker, trained_noniid: dict[str, Any] | None = None,
    outputs: RunOutputs = RunOutputs(),
) -> None:  # fmt: skip
    """The final model, the per-round table, the exclusion trail, the non-IID report (with
    ``trained_noniid``, the trained model's check: :func:`trained_model_noniid`), the
    per-site scores and (``outputs.figures``) their figures, each also logged to the run."""
    if outputs.model_file:
        paths.model.parent.mkdir(parents=True, exist_ok=True)
        # contiguous: the file does not depend on the layout training used (federated.layout)
        weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        torch.save(weights, paths.model)
    write_csv(paths.rounds, state.history)
    write_csv(paths.exclusions, state.trail, columns=trail_columns(state.trail))
    write_json(paths.noniid, noniid_report(state, params, trained_noniid))
    if trained_noniid is not None:
        tracker.log_metrics({"noniid_cv_trained": trained_noniid["cv"]})
    tracker.log_table(state.trail, "exclusions.json")
    # per-site evaluation, every scored round and site (a header and a note without it)
    write_csv(paths.sites, state.sites, columns=SITE_COLUMNS if not state.sites else None)
    written = [paths.rounds, paths.exclusions, paths.noniid, paths.sites]
    if outputs.figures:
        plot_exclusion_heatmap(state.trail, paths.exclusion_heatmap)
        plot_curves(state.history, paths.curves)
        plot_sites(state.sites, paths.sites_plot)
        written += [paths.curves, paths.exclusion_heatmap, paths.sites_plot]
    for path in written:
        tracker.log_artifact(path, "reports")


write_training_reports = task(name="write-training-reports", cache_policy=NO_CACHE)(write_reports)


@task(name="write-run-info", cache_policy=NO_CACHE)
def write_run_info(
    paths: ProjectPaths, tracker: Tracker, state: ServerState, digest: str
) -> dict[str, Any]:
    """What the evaluate stage needs of this run: ``artifacts/model/run.json`` (the params
    hash, rounds, the selected round: the same bits whenever the same params are trained,
    so DVC's lock holds) and ``artifacts/model/tracking.json`` (its MLflow run, tags,
    whether tracking failed: new every run, so no DVC output). Both, merged."""
    info = {"params_hash": digest, "rounds": state.round, "selected_round": state.selected_round}
    tracking = {"run_id": tracker.run_id, "tags": tracker.tags, "tracking_failed": tracker.failed}
    write_json(paths.run_info, info)
    write_json(paths.tracking_info, tracking)
    info |= tracking
    if tracker.failed:  # already stated as a warning when it happened
        get_run_logger().info(
            "tracking was off for this run (%s); reports/ holds everything", tracker.failed
        )
    return info


class RoundProgress:
    """Progress bars on a terminal: rounds, and clients within the round."""

    def __init__(
        self, rounds: int, done: int, clients_per_round: int, *, enabled: bool = True
    ) -> None:
        on_terminal = enabled and sys.stderr.isatty()
        self.bar = tqdm(
            total=rounds, initial=done, desc="rounds", unit="round", disable=not on_terminal
        )
        self.clients = tqdm(
            total=clients_per_round, desc="clients", unit="client", leave=False,
            disable=not on_terminal,
        )  # fmt: skip

    def __enter__(self) -> RoundProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.clients.close()
        self.bar.close()

    def client_done(self, _client_id: int) -> None:
        self.clients.update(1)

    def round_done(self, report: RoundReport) -> None:
        """The bars moved on (the round's log line is the driver's)."""
        metrics = report.metrics
        self.clients.reset()
        self.bar.update(1)
        shown = {name: f"{metrics[key]:.3f}" for name, key in SHOWN[1:] if key in metrics}
        self.bar.set_postfix(shown)


def record_budget_spent(tracker: Tracker, reason: str | None) -> None:
    """A run the privacy budget ended early: said in one line, and in the MLflow run's
    ``stopped_early`` tag (the run itself finishes: its last admissible model stands)."""
    if reason is not None:
        get_run_logger().warning(reason)
        tracker.set_tags({"stopped_early": reason})


@task(name="halt-if-tracking-lost", cache_policy=NO_CACHE)
def halt_if_tracking_lost(tracker: Tracker, state: ServerState) -> None:
    """A run whose tracking failed midway (a database outage longer than the client's
    retries) ends failed here, its reports and checkpoint written, unless the store
    answers again by now (its lost rounds are then logged): never Completed with an
    MLflow run that lacks rounds. ``--resume`` later logs them from the checkpoint."""
    if not tracker.recovered(state.history):
        raise ServiceError(
            f"MLflow tracking failed during the run ({tracker.failed}); reports/ and the "
            "checkpoint are kept: run again with --resume once the tracking server answers, "
            "and the lost rounds are logged from the checkpoint"
        )


@task(name="halt-if-bound-exceeded", cache_policy=NO_CACHE)
def halt_if_bound_exceeded(state: ServerState) -> None:
    """Fail closed: a run whose round left out more clients than ``train.max_excluded``
    ends here, after its reports are written, with that round's one-line reason; so does
    a run none of whose rounds was aggregated (its model is the initial one: never
    evaluated as trained, never registered)."""
    if state.halted is not None:
        raise RunHalted(state.halted)
    rounds = [row for row in state.history if "round_skipped" in row]
    if rounds and all(row["round_skipped"] for row in rounds):
        first = next((row for row in state.trail if row["excluded"]), None)
        why = "" if first is None else f"; round 1: client {first['client']} {_left_out(first)}"
        raise RunHalted(
            f"no round was aggregated: each of the {len(rounds)} rounds kept fewer clients "
            f"than train.min_clients (reports/exclusions.csv){why}; the model is the "
            "initial one and is not registered"
        )


def _left_out(row: dict[str, Any]) -> str:
    """Why a trail row's client was left out, in a few words (its message when it has one)."""
    message = str(row.get("message") or "").strip()
    return f"{row['reason']}: {message}" if message else str(row["reason"])


def filters_that_cannot_exclude(params: Params) -> list[str]:
    """One line for each configured filter that can exclude nobody among the clients
    sampled per round (a threshold no score can pass at this size), for the run to say
    when it starts: such a run trains, unprotected by that filter."""
    sampled = clients_per_round(params.train.client_fraction, population(params))
    reasons = (build_filter(f.name, **f.params()).cannot_exclude(sampled) for f in params.filters)
    return [reason for reason in reasons if reason is not None]
