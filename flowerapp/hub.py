"""The hub's side of a federation of real sites, without Flower: the registered sites as
the trail's clients, the federation the ServerApp drives, what every task tells a site,
and the files the ServerApp and the hub's pipeline share (:class:`HubFiles`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.assembly import (
    build_defence,
    build_global_model,
    dataset_info_of,
    federation_config,
    local_training,
    resolve_device,
)
from config.params import Params, eval_batch_size, params_hash
from federated.client import ClientData, RegisteredClient
from federated.data import DatasetInfo, MedMNISTData, to_tensors
from federated.execution import ClientExecutor, SiteScorer
from federated.seeding import SHUFFLE, derive_seed
from federated.server import EvaluationSets, Execution, Federation, RoundReport
from flowerapp.site_data import load_site_data
from flowerapp.task import SiteTask

# Flower's own exit of a ServerApp (push the output, stop the log uploader and heartbeat)
# takes seconds; one still alive this long after its ``main`` returned is stuck on its way
# out, and ends itself (:func:`flowerapp.server_app.end_if_exit_hangs`).
SERVERAPP_EXIT_GRACE_S = 60.0

__all__ = [
    "HubFiles",
    "hub_federation",
    "privacy_task",
    "registered_clients",
    "round_report",
    "shuffle_seed",
    "simulated_federation",
    "site_nodes",
    "site_task",
    "write_params",
]


def registered_clients(params: Params) -> list[RegisteredClient]:
    """The sites in params order: client id = place in ``federation.sites``."""
    return [
        RegisteredClient(client_id, site.samples, site.name)
        for client_id, site in enumerate(params.federation.sites)
    ]


def site_nodes(params: Params) -> dict[int, int]:
    """Client id -> the Flower node id registered for that site."""
    return {client_id: site.node_id for client_id, site in enumerate(params.federation.sites)}


def site_task(params: Params, info: DatasetInfo) -> SiteTask:
    """What every site is asked to run (:class:`flowerapp.task.SiteTask`, its per-message
    fields left at 0): the model, the data's schema (what a site's images become before
    the model sees them), the local settings, and the privacy it is promised or
    (``local``) applies itself."""
    local = local_training(params)
    return SiteTask(
        model=params.model.name, dataset=info.flag, task=info.task,
        class_names=tuple(info.labels), channels=info.n_channels, classes=info.n_classes,
        size=info.size, multi_label=info.multi_label, resample=info.resample,
        intensity=info.intensity, percentiles=info.percentiles, mean=info.mean, std=info.std,
        spatial_dims=info.spatial_dims, spacing=info.spacing,
        slice_tolerance=info.slice_tolerance, epochs=local.epochs, lr=local.lr,
        momentum=local.momentum,
        weight_decay=local.weight_decay, batch_size=local.batch_size, prox_mu=local.prox_mu,
        eval_batch_size=eval_batch_size(params), **privacy_task(params),
        validation=any(f.name == "site_validation" for f in params.filters),
        scaffold=params.train.scaffold, run_key=params_hash(params),
    )  # fmt: skip


def privacy_task(params: Params) -> dict[str, Any]:
    """``privacy_mode``, and unless it is off the clip, noise multiplier, δ and target ε
    (0: none): in ``local`` mode the site clips and noises its own update with them, and a
    site that pinned them refuses a task asking for less."""
    privacy = params.privacy
    if privacy.mode == "off":
        return {"privacy_mode": "off"}
    return {
        "privacy_mode": privacy.mode, "privacy_clip": privacy.clip,
        "privacy_noise_multiplier": privacy.noise_multiplier, "privacy_delta": privacy.delta,
        "privacy_target_epsilon": privacy.target_epsilon or 0.0,
    }  # fmt: skip


def shuffle_seed(params: Params, round_number: int, client_id: int) -> int:
    """The seed of a client's batch order in a round: the simulation's, so a site given
    the same data trains the same update."""
    return derive_seed(params.seed, round_number, client_id, SHUFFLE)


def hub_federation(
    params: Params, data: MedMNISTData | None, executor: ClientExecutor, scorer: SiteScorer
) -> Federation:
    """The federation a hub runs: the registered sites (no data here), the seeded model,
    the defence of ``params``, and the evaluation: on the hub's validation and test splits
    (``eval.where: hub``, ``data``) with the sites' own scores every ``eval.every`` rounds,
    or pooled from the sites' held-out splits every round (``sites``: ``data`` is None,
    the hub holds no images)."""
    device = resolve_device(params.train.device)
    info = dataset_info_of(params.data)
    if data is None:
        evaluation = EvaluationSets(where="sites", multi_label=info.multi_label, site_scorer=scorer)
        val = None
    else:
        val = to_tensors(data.val, data.info, device=device)
        evaluation = EvaluationSets(
            test=to_tensors(data.test, data.info, device=device), val=val,
            multi_label=data.info.multi_label, site_scorer=scorer,
        )  # fmt: skip
    return Federation(
        model=build_global_model(params, info).to(device),
        clients=registered_clients(params),
        local=local_training(params),
        config=federation_config(params),
        defence=build_defence(params, info, server_batch=val),
        evaluation=evaluation,
        execution=Execution(executor=executor),
    )


def simulated_federation(
    params: Params, data: MedMNISTData | None, site_files: Sequence[Path]
) -> Federation:
    """What a run at the sites must equal, in one process: each site's file as the client
    of its place in ``site_files`` (the order of ``federation.sites``), trained one after
    another, scored on the hub's splits (``eval.where: hub``; each site's rows on its
    file's test split) or on each file's test and validation splits as a site scores them
    (``sites``). The loopback tests and benchmark
    compare with it."""
    info = dataset_info_of(params.data)
    sites = [load_site_data(file, info) for file in site_files]
    clients = [
        ClientData(client_id, *to_tensors(site.train, info)) for client_id, site in enumerate(sites)
    ]
    val = None
    if params.eval.where == "sites":
        evaluation = EvaluationSets(
            where="sites", multi_label=info.multi_label,
            sites=tuple(to_tensors(site.test, info) for site in sites),
            site_vals=tuple(to_tensors(site.val, info) for site in sites),
        )  # fmt: skip
    else:
        val = to_tensors(data.val, data.info)
        evaluation = EvaluationSets(
            test=to_tensors(data.test, data.info), val=val, multi_label=data.info.multi_label,
            sites=tuple(to_tensors(site.test, info) for site in sites),  # their own rows
            site_vals=tuple(to_tensors(site.val, info) for site in sites),  # site_validation's
        )  # fmt: skip
    return Federation(
        model=build_global_model(params, info),
        clients=clients,
        local=local_training(params),
        config=federation_config(params),
        defence=build_defence(params, info, server_batch=val),
        evaluation=evaluation,
        execution=Execution(backend="sequential"),
    )


@dataclass(frozen=True)
class HubFiles:
    """What the hub's pipeline hands the ServerApp (``params.json``: the run's validated
    params) and what the ServerApp writes back, round by round (``rounds.jsonl``: the
    journal of each round's report; ``outcome.json`` at the end), in one folder on the hub.

    Every journal line and the outcome carry the run's token (a new one each time the
    pipeline starts ``flwr run``), so a line or an outcome another run left in the folder,
    or a ServerApp of an earlier run still writes there, is never read as this run's."""

    folder: Path

    @property
    def params(self) -> Path:
        return self.folder / "params.json"

    @property
    def rounds(self) -> Path:
        return self.folder / "rounds.jsonl"

    @property
    def outcome(self) -> Path:
        return self.folder / "outcome.json"

    @property
    def exchanges(self) -> Path:
        """Each exchange with the sites: its wall time and the sites' phases (timing)."""
        return self.folder / "exchanges.jsonl"

    @property
    def champion(self) -> Path:
        """The registered champion to score beside the run's model at the sites'
        held-out splits (``torch.save``: ``version``, ``vector``, ``token``; under
        ``eval.where: sites``, where the hub holds no image to score it on)."""
        return self.folder / "champion.pt"

    @property
    def pretest_updates(self) -> Path:
        """The pre-test stage's updates from the sites (``torch.save``: ``client_ids``,
        ``updates`` stacked ``(n_sites, d)``, ``token``)."""
        return self.folder / "pretest-updates.pt"

    @property
    def stacks(self) -> Path:
        """Where the ServerApp writes every thread's stack on ``kill -USR1 <pid>``: where a
        hub process that outlived its run waits (Flower sends its output to /dev/null)."""
        return self.folder / "stacks.txt"

    def record_exchange(self, exchange: dict[str, Any], token: str) -> None:
        with self.exchanges.open("a") as out:
            out.write(json.dumps({"run": token, **exchange}) + "\n")

    def read_params(self) -> Params:
        return Params.model_validate(json.loads(self.params.read_text()))

    def clear(self) -> None:
        """Before a run starts: no journal or outcome of an earlier run left to read."""
        self.rounds.unlink(missing_ok=True)
        self.outcome.unlink(missing_ok=True)
        self.exchanges.unlink(missing_ok=True)
        self.pretest_updates.unlink(missing_ok=True)
        self.champion.unlink(missing_ok=True)

    def journal(
        self, report: RoundReport, token: str, *, first_heard: dict[str, Any] | None = None,
        **extra: float,
    ) -> None:  # fmt: skip
        """Append one round's report as one line (one write: a reader never sees half of
        it as a line); ``first_heard``: the data of the sites first heard from in the
        round (client id -> digest and images per class, :mod:`flowerapp.lineage`)."""
        record = {"run": token, "round": report.round, "metrics": report.metrics,
                  "clients": report.clients, "sites": report.sites, **extra}  # fmt: skip
        if first_heard:
            record["first_heard"] = first_heard
        with self.rounds.open("a") as out:
            out.write(json.dumps(record, default=float) + "\n")

    def journaled(self, token: str, offset: int = 0) -> tuple[list[RoundReport], int]:
        """The rounds run ``token`` journaled after byte ``offset``, and the offset after
        the last whole line (a line still being written is read next time)."""
        records, offset = self.run_records(token, offset)
        return [round_report(record) for record in records], offset

    def run_records(self, token: str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """The journal's records of run ``token`` after byte ``offset``, and the offset
        after the last whole line. Lines of other runs, lines that are not a record, and a
        last line still being written are passed over."""
        if not self.rounds.exists():
            return [], offset
        records = []
        with self.rounds.open("rb") as journal:
            journal.seek(offset)
            for line in journal:
                if not line.endswith(b"\n"):
                    break
                offset += len(line)
                record = _record(line)
                if record is not None and record.get("run") == token:
                    records.append(record)
        return records, offset

    def write_outcome(self, token: str, outcome: dict[str, Any]) -> None:
        self.outcome.write_text(json.dumps({"run": token, **outcome}) + "\n")

    def read_outcome(self, token: str) -> dict[str, Any] | None:
        """How run ``token`` ended, once its ServerApp said so (None before, or when the
        file is another run's)."""
        if not self.outcome.exists():
            return None
        outcome = _record(self.outcome.read_bytes())
        return outcome if outcome is not None and outcome.get("run") == token else None


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def round_report(record: dict[str, Any]) -> RoundReport:
    """The round report a journal record holds."""
    return RoundReport(*(record[k] for k in ("round", "metrics", "clients", "sites")))


def write_params(path: Path, params: Params) -> None:
    """The run's params for the ServerApp: only the keys given, so it validates what the
    user wrote, as the hub's pipeline did."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(params.model_dump_json(exclude_unset=True, indent=1))
