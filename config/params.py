"""params.yaml, read once at the entry point into validated pydantic models.

A bad value fails here, before anything runs, with one line naming the key, the value
and what is allowed (:class:`ConfigError`; the CLI turns it into exit code 2).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

import aggregation  # noqa: F401  (fills the registries)
from aggregation.registry import AGGREGATORS, FILTERS, PREAGGREGATORS, SERVER_OPTIMIZERS
from aggregation.server_optimizers import ServerSGD
from config.errors import ConfigError
from federated.attacks import ATTACKS
from federated.client import LocalTraining
from federated.partition import (
    DirichletPartitioner,
    IIDPartitioner,
    QuantityPartitioner,
    ShardPartitioner,
)
from federated.parts import (
    Backend,
    Execution,
    FederationConfig,
    NonIIDCheck,
    NonIIDLoss,
    RoundScores,
    Select,
    Where,
)
from federated.privacy import ClientPrivacy
from federated.seeding import clients_per_round
from registry import Registry, RegistryError
from registry.constraints import declared, describe, is_allowed

__all__ = [
    "ConfigError",
    "Params",
    "eval_batch_size",
    "ignored_settings",
    "load_params",
    "params_hash",
    "params_warnings",
    "population",
    "privacy_budget",
    "validate_params",
]


MAX_SEED = 2**32 - 1  # numpy's and torch's seeds alike
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


def engine(part: type, name: str) -> AfterValidator:
    """The check of a setting the engine's ``part`` declares as field ``name``: the bound is
    written once, in the engine (registry.constraints), and both say the same line."""
    constraints = declared(part, name)

    def check(value: Any) -> Any:
        if not is_allowed(value, constraints):
            raise ValueError(f"must be {describe(constraints, none='null')}")
        return value

    check.declared_by = (part, name)  # type: ignore[attr-defined]  (read by the tests)
    return AfterValidator(check)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OwnDataParams(_Section):
    """A dataset of the user's own images: its declared schema (federated/own_data.py)."""

    # a folder holding labels.csv (file, label[, split]) or an .npz in MedMNIST's layout,
    # relative to the project; at real sites each site names its own (fedsieve-site --data)
    path: str | None = None
    task: Literal["binary-class", "multi-class", "multi-label"]
    classes: list[str] = Field(min_length=1)  # class names; a label is a name or its index
    channels: Literal[1, 3] = 1  # grey or RGB, after conversion
    # Pillow's filter bringing an image to data.size pixels (not applied at that size)
    resample: Literal["nearest", "bilinear", "bicubic", "lanczos"] = "bilinear"
    mean: float = 0.5  # a tensor's pixels are (x / 255 - mean) / std
    std: float = Field(0.5, gt=0)
    # how grey values become 0-255 (docs/data.md): auto (the file's window, else 8-bit as
    # stored, else the image's own range) | window | range | percentiles
    intensity: Literal["auto", "window", "range", "percentiles"] = "auto"
    percentiles: tuple[float, float] = (0.5, 99.5)  # lower, upper: intensity percentiles
    # 2: images; 3: volumes (a row names a NIfTI, a multi-frame DICOM or a series folder)
    spatial_dims: Literal[2, 3] = 2
    # volumes: isotropic (the shape in mm kept, the longest side at data.size, padded) |
    # stretch (each axis to data.size); torch trilinear either way (docs/data.md)
    spacing: Literal["isotropic", "stretch"] = "isotropic"
    # volumes: a step between neighbouring slices this share off the median is refused
    # (slices missing)
    slice_tolerance: float = Field(0.1, gt=0, lt=1)

    @model_validator(mode="after")
    def _volumes_are_grey(self) -> OwnDataParams:
        if self.spatial_dims == 3 and self.channels != 1:
            raise ValueError("data.own.channels must be 1 with spatial_dims 3: volumes are grey")
        return self

    @model_validator(mode="after")
    def _classes_fit_task(self) -> OwnDataParams:
        low, high = self.percentiles
        if not 0 <= low < high <= 100:
            raise ValueError(
                "data.own.percentiles is [lower, upper] with 0 <= lower < upper <= 100"
            )
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("data.own.classes must be distinct names")
        if self.task == "binary-class" and len(self.classes) != 2:
            raise ValueError("a binary-class task has exactly two classes")
        if self.task == "multi-class" and len(self.classes) < 2:
            raise ValueError("a multi-class task has at least two classes")
        return self


OWN_SIZES = (8, 1024)  # image sizes an own dataset may declare
OWN_VOLUME_SIZES = (8, 256)  # voxels per axis an own volume dataset may declare


class DataParams(_Section):
    # a dataset of your own images (its schema); absent: a MedMNIST flag or digits
    own: OwnDataParams | None = None
    # any MedMNIST flag (2-D, or 3-D: organmnist3d, adrenalmnist3d, ...) or digits; with
    # data.own, the name of your dataset
    dataset: str = "breastmnist"
    root: str = "data/medmnist"  # overridden by the MEDMNIST_ROOT environment variable
    download: bool = True
    # image size in pixels: 28 (MedMNIST) or MedMNIST+'s 64, 128, 224 (<flag>_<size>.npz);
    # a 3-D flag's voxels per axis: 28 or 64; with data.own, any size from 8 to 1024
    # (images are resized to it)
    size: int = 28

    @field_validator("size")
    @classmethod
    def _known_size(cls, value: int, info: ValidationInfo) -> int:
        from federated.data import SIZES, VOLUME_SIZES, is_volume_flag

        own = info.data.get("own")
        if own is not None:
            low, high = OWN_VOLUME_SIZES if own.spatial_dims == 3 else OWN_SIZES
            if not low <= value <= high:
                kind = "volumes are resampled" if own.spatial_dims == 3 else "images are resized"
                raise ValueError(
                    f"own {kind} to {low}..{high} {'voxels per axis' if own.spatial_dims == 3 else 'pixels'}"
                )
            return value
        if value not in SIZES:
            raise ValueError(
                f"not a MedMNIST size; allowed: {', '.join(map(str, SIZES))} (any size with data.own)"
            )
        if info.data.get("dataset") == "digits" and value != 28:
            raise ValueError("digits exists at 28 pixels only")
        dataset = info.data.get("dataset", "")
        if is_volume_flag(dataset) and value not in VOLUME_SIZES:
            raise ValueError(
                f"{dataset} is a 3-D set; allowed: {', '.join(map(str, VOLUME_SIZES))} voxels "
                "per axis"
            )
        return value

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str, info: ValidationInfo) -> str:
        from federated.data import list_datasets

        if info.data.get("own") is None:
            if value not in list_datasets():
                raise ValueError(
                    f"unknown dataset; allowed: {', '.join(list_datasets())}, or your own "
                    "images with data.own"
                )
        elif value in list_datasets() or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
            raise ValueError(
                "with data.own this names your dataset: letters, digits, _ . - and not a "
                "MedMNIST flag"
            )
        return value


class PartitionParams(_Section):
    scheme: str = "iid"  # iid | dirichlet | shards | quantity
    num_clients: int = Field(10, ge=1)
    alpha: Annotated[float, engine(DirichletPartitioner, "alpha")] = 0.5  # dirichlet concentration
    classes_per_client: Annotated[int, engine(ShardPartitioner, "classes_per_client")] = 2  # shards
    # quantity: log-normal spread of client sizes
    sigma: Annotated[float, engine(QuantityPartitioner, "sigma")] = 1.0
    min_samples: Annotated[int, engine(IIDPartitioner, "min_samples")] = 8
    # the server's root data (FLTrust's reference): training images held back from every
    # client, a seeded uniform draw (0 = none)
    root_size: int = Field(0, ge=0)
    # per-site evaluation: each client's seeded local test split, a share of its data held
    # out of its training (0 = off)
    local_test: float = Field(0.0, ge=0, lt=1)

    @field_validator("scheme")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        from federated.partition import list_partitioners

        if value not in list_partitioners():
            raise ValueError(f"unknown partition scheme; allowed: {', '.join(list_partitioners())}")
        return value

    def partitioner_params(self) -> dict[str, Any]:
        """The keys the chosen scheme takes."""
        from federated.partition import PARTITIONERS

        return {
            k: v for k, v in self.model_dump().items() if k in PARTITIONERS.parameters(self.scheme)
        }


class ModelParams(_Section):
    name: str = "small_cnn"

    @field_validator("name")
    @classmethod
    def _known_model(cls, value: str) -> str:
        from models import list_models

        if value not in list_models():
            raise ValueError(f"unknown model; allowed: {', '.join(list_models())}")
        return value


class _RegistryEntry(BaseModel):
    """``{name: <registered name>, <param>: <value>, ...}``; parameters are checked by
    building the component."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def _check(self, registry: Registry) -> None:
        try:
            registry.build(self.name, **self.params())
        except RegistryError as error:
            raise ValueError(str(error)) from None


class ServerOptimizerParams(_RegistryEntry):
    """``{name: adam, lr: 0.01, ...}``: the server optimizer every aggregate goes through
    (aggregation/server_optimizers.py: sgd, momentum, adagrad, yogi, adam, flower_*)."""

    @model_validator(mode="after")
    def _buildable(self) -> ServerOptimizerParams:
        self._check(SERVER_OPTIMIZERS)
        return self


class LocalWorkParams(_Section):
    """Heterogeneous local work: each client's local epochs drawn per round, seeded."""

    epochs: tuple[int, int]  # [low, high], both included, 1 <= low <= high

    @field_validator("epochs")
    @classmethod
    def _range(cls, value: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= value[0] <= value[1]:
            raise ValueError("must be [low, high] with 1 <= low <= high")
        return value


class TrainParams(_Section):
    rounds: Annotated[int, engine(FederationConfig, "rounds")] = 20
    client_fraction: Annotated[float, engine(FederationConfig, "client_fraction")] = 1.0
    local_epochs: Annotated[int, engine(LocalTraining, "epochs")] = 1
    lr: Annotated[float, engine(LocalTraining, "lr")] = 0.01
    # SGD momentum: 1 or more never forgets a step
    momentum: Annotated[float, engine(LocalTraining, "momentum")] = 0.9
    weight_decay: Annotated[float, engine(LocalTraining, "weight_decay")] = 0.0
    batch_size: Annotated[int, engine(LocalTraining, "batch_size")] = 32
    prox_mu: Annotated[float, engine(LocalTraining, "prox_mu")] = 0.0  # FedProx proximal weight
    # global += server_lr * aggregate: shorthand for server_optimizer {name: sgd, lr: ...}
    # (left at 1.0 when server_optimizer is given)
    server_lr: Annotated[float, engine(ServerSGD, "lr")] = 1.0
    # what the server does with every aggregate (null: sgd at server_lr, FedAvg's step)
    server_optimizer: ServerOptimizerParams | None = None
    # heterogeneous local work, e.g. {epochs: [1, 5]}: each client's local epochs drawn
    # per round, seeded, in place of local_epochs (null: every client local_epochs)
    local_work: LocalWorkParams | None = None
    # SCAFFOLD (Karimireddy et al. 2020, option II): control variates correct every local
    # step; plain local SGD (momentum 0, prox_mu 0), any backend, or at real sites (each
    # keeps its c_i in its state folder: fedsieve-site --state)
    scaffold: bool = False
    min_clients: Annotated[int, engine(FederationConfig, "min_clients")] = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # how clients are trained: auto = batched on CUDA, and on a CPU for models without
    # convolutions (where it measured faster), when the model allows; else sequential
    backend: Backend = "auto"
    # batched: clients at once (null: by memory)
    max_parallel: Annotated[int | None, engine(Execution, "max_parallel")] = None
    # fail closed: the most clients a round may leave out (a count, or a share in [0, 1) of
    # the round's sampled clients); a round above it halts the run (null: off)
    max_excluded: Annotated[int | float | None, engine(FederationConfig, "max_excluded")] = None

    def server_step(self) -> tuple[str, dict[str, Any]]:
        """The server optimizer's name and parameters: ``server_optimizer``, or sgd at
        ``server_lr``."""
        if self.server_optimizer is None:
            return "sgd", {"lr": self.server_lr}
        return self.server_optimizer.name, self.server_optimizer.params()


class AggregateParams(_RegistryEntry):
    name: str = "fedavg"

    @model_validator(mode="after")
    def _buildable(self) -> AggregateParams:
        self._check(AGGREGATORS)
        return self


class PreAggregatorParams(_RegistryEntry):
    @model_validator(mode="after")
    def _buildable(self) -> PreAggregatorParams:
        self._check(PREAGGREGATORS)
        return self


class FilterParams(_RegistryEntry):
    @model_validator(mode="after")
    def _buildable(self) -> FilterParams:
        self._check(FILTERS)
        return self


class AttackParams(_RegistryEntry):
    """``{name: label_flip, fraction: 0.2, rate: 1.0}``: who attacks (a seeded ``fraction``
    of the clients, or explicit ``ids``) and how (the attack's own parameters)."""

    name: str = "none"
    fraction: float = Field(0.2, ge=0, lt=1)  # share of clients that are malicious
    ids: list[int] | None = None  # explicit malicious client ids (overrides fraction)

    @model_validator(mode="after")
    def _buildable(self) -> AttackParams:
        self._check(ATTACKS)
        return self


class PretestParams(_Section):
    """Normality pre-test of client updates (EMA paper, Section 2.2)."""

    mode: Literal["gradient", "delta"] = (
        "gradient"  # full-data gradient, or one local epoch's update
    )
    round: int = Field(0, ge=0)  # test at the global model after this many FedAvg rounds
    max_tests: int | None = Field(100_000, ge=1)  # seeded sample of coordinates; null = all
    alpha: float = Field(0.05, gt=0, lt=1)
    warn_below: float = Field(0.5, ge=0, le=1)  # say so plainly when a rate is under this


class NonIIDParams(_Section):
    """CV-based non-IID detection (EMA paper, Algorithms 3-4)."""

    every: Annotated[int, engine(NonIIDCheck, "every")] = 1  # check every N rounds (0 = never)
    final: bool = True  # also check the trained model on every client, as the paper does
    loss: NonIIDLoss = "mse"  # the paper: MSE of softmax vs one-hot
    # verdict non_iid when CV > threshold
    threshold: Annotated[float, engine(NonIIDCheck, "threshold")] = 0.25
    exclude: bool = False  # leave out clients whose loss z-score exceeds z
    z: Annotated[float, engine(NonIIDCheck, "z")] = 2.0


class MethodParams(_Section):
    """One compared method: an aggregation rule, the filters in front of it, and the
    ``train`` settings it changes (e.g. ``{server_optimizer: {name: adam}}`` for FedAdam,
    ``{scaffold: true, momentum: 0}`` for SCAFFOLD, ``{prox_mu: 0.01}`` for FedProx)."""

    aggregate: AggregateParams = AggregateParams()
    filters: list[FilterParams] = []
    preaggregators: list[PreAggregatorParams] = []
    train: dict[str, Any] = {}

    @field_validator("train")
    @classmethod
    def _train_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(TrainParams.model_fields))
        if unknown:
            raise ValueError(
                f"unknown train key {unknown[0]!r}; keys allowed: {', '.join(TrainParams.model_fields)}"
            )
        return value


class CompareParams(_Section):
    """The comparison grid: methods x attacks x malicious fractions x seeds, each cell a
    child run of one MLflow parent run (``fedsieve compare``)."""

    methods: dict[str, MethodParams] = {"fedavg": MethodParams()}
    attacks: list[AttackParams] = [AttackParams(name="label_flip")]
    fractions: list[float] = [0.2]
    seeds: list[Seed] = [0]
    max_parallel: int = Field(1, ge=1)  # local: cells trained at the same time
    # local: torch threads per cell (null: the machine's cores / max_parallel)
    threads_per_cell: int | None = Field(None, ge=1)
    # local: cells run in this process; deployment: each cell is a run of `deployment`
    # (pipeline-from-file), picked up by whichever worker is free, results read from MLflow
    dispatch: Literal["local", "deployment"] = "local"
    deployment: str = Field("pipeline-from-file/fedsieve", pattern=r"^[^/\s]+/[^/\s]+$")

    @field_validator("methods")
    @classmethod
    def _method_names(cls, value: dict[str, MethodParams]) -> dict[str, MethodParams]:
        bad = [name for name in value if not re.fullmatch(r"[A-Za-z0-9_.-]+", name)]
        if bad or not value:
            raise ValueError(
                f"method names may hold letters, digits, '_', '.' and '-' only (got {bad[0]!r})"
                if bad
                else "name at least one method"
            )
        return value

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, value: list[float]) -> list[float]:
        if not value or any(not 0 <= f < 1 for f in value):
            raise ValueError("fractions must be a non-empty list of shares in [0, 1)")
        return value


class EvalParams(_Section):
    # images per forward pass when scoring; null: by image size (see eval_batch_size)
    batch_size: int | None = Field(None, ge=1)
    target_acc: Annotated[float, engine(FederationConfig, "target_acc")] = 0.8
    target_loss: float | None = Field(None, gt=0)  # rounds-to-target also needs loss <= this
    # the model the run ends with: the last round's, or the best validation AUC round's
    select: Select = "last"
    every: Annotated[int, engine(FederationConfig, "site_every")] = (
        1  # score the sites' local test splits every N rounds (and the last)
    )
    # each round's test scores: loss, ACC, AUC, ECE, Brier (full), or loss and ACC only
    # (accuracy: a cross-device run's rounds; the last round is always scored fully)
    round_scores: RoundScores = "full"
    # where the global model's round and final scores come from: the hub's own validation
    # and test splits (hub), or the sites' held-out splits, pooled from their aggregates
    # (sites: the hub holds no images; in a simulation, the clients' local test splits)
    where: Where = "hub"

    @model_validator(mode="after")
    def _select_needs_auc(self) -> EvalParams:
        if self.select == "best_val" and self.round_scores != "full":
            raise ValueError(
                "select: best_val picks the round by validation AUC; it needs round_scores: full"
            )
        return self


class PrivacyParams(_Section):
    """Client-level differential privacy, DP-FedAvg (federated/privacy.py, docs/privacy.md)."""

    mode: Literal["off", "central", "local"] = "off"  # who adds the noise: server or clients
    # L2 norm every client update is clipped to
    clip: Annotated[float, engine(ClientPrivacy, "clip")] = 1.0
    # noise std = noise_multiplier x clip
    noise_multiplier: Annotated[float, engine(ClientPrivacy, "noise_multiplier")] = 1.0
    delta: Annotated[float, engine(ClientPrivacy, "delta")] = 1e-5
    # no round may take ε past it (null: none)
    target_epsilon: Annotated[float | None, engine(ClientPrivacy, "target_epsilon")] = None
    # a rule, filter or pre-aggregator outside the accountant's assumptions: refuse, or run
    # with the ε marked as not holding
    unaccounted: Literal["refuse", "warn"] = "refuse"

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false


class TrackingParams(_Section):
    experiment: str = "fedsieve"
    register_model: bool = True
    # the registered model's card (tasks/model_card.py): what it is for, and what not
    intended_use: str = "not stated"
    limitations: str = "not stated"


class SiteParams(_Section):
    """A site of a Flower federation: the trail's client id is its place in the list."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    node_id: int = Field(ge=1)  # what `flwr supernode register <its key>` printed
    samples: int = Field(ge=1)  # its training samples as registered: its weight in the mean


class FederationParams(_Section):
    """Where the clients train: simulated in this process, or at real sites (Flower
    SuperNodes behind a SuperLink; docs/federation.md)."""

    runtime: Literal["simulation", "flower"] = "simulation"
    superlink: str = "hub"  # the Flower CLI's SuperLink connection (FLWR_HOME/config.toml)
    sites: list[SiteParams] = []
    round_timeout: float = Field(300.0, gt=0)  # seconds a round waits for the sites' replies

    @field_validator("sites")
    @classmethod
    def _distinct(cls, sites: list[SiteParams]) -> list[SiteParams]:
        for key in ("name", "node_id"):
            values = [getattr(site, key) for site in sites]
            if len(set(values)) != len(values):
                raise ValueError(f"two sites share a {key}; each site has its own")
        return sites


class Params(_Section):
    seed: Seed = 0
    data: DataParams = DataParams()
    partition: PartitionParams = PartitionParams()
    model: ModelParams = ModelParams()
    train: TrainParams = TrainParams()
    aggregate: AggregateParams = AggregateParams()
    filters: list[FilterParams] = []
    preaggregators: list[PreAggregatorParams] = []
    attack: AttackParams = AttackParams()
    pretest: PretestParams = PretestParams()
    noniid: NonIIDParams = NonIIDParams()
    eval: EvalParams = EvalParams()
    privacy: PrivacyParams = PrivacyParams()
    tracking: TrackingParams = TrackingParams()
    compare: CompareParams = CompareParams()
    federation: FederationParams = FederationParams()

    @model_validator(mode="after")
    def _model_fits_data(self) -> Params:
        """A model of images on volumes (or the reverse) is refused naming the models that
        fit."""
        from models import list_models, model_spatial_dims

        dims = 3 if self.volumes else 2
        if model_spatial_dims(self.model.name) != dims:
            kind = "a 3-D set of volumes (C, D, H, W)" if dims == 3 else "2-D images (C, H, W)"
            raise ValueError(
                f"model.name = {self.model.name} does not take {self.data.dataset}, "
                f"{kind}; allowed: {', '.join(list_models(dims))}"
            )
        return self

    @property
    def volumes(self) -> bool:
        """Whether the run's data are 3-D volumes (a MedMNIST 3-D flag, or own volumes)."""
        from federated.data import is_volume_flag

        if self.data.own is not None:
            return self.data.own.spatial_dims == 3
        return is_volume_flag(self.data.dataset)

    @model_validator(mode="after")
    def _scaffold_as_written(self) -> Params:
        """SCAFFOLD's option II reads the local steps as plain SGD's: (x − y)/(Kη)."""
        if not self.train.scaffold:
            return self
        for key, value, why in (
            ("momentum", self.train.momentum, "train.momentum: 0"),
            ("prox_mu", self.train.prox_mu, "train.prox_mu: 0"),
        ):
            if value:
                raise ValueError(
                    f"train.scaffold with train.{key} = {value:g}: SCAFFOLD's option II "
                    f"assumes plain local SGD steps; set {why}"
                )
        return self

    @model_validator(mode="after")
    def _one_server_step(self) -> Params:
        if self.train.server_optimizer is not None and self.train.server_lr != 1.0:
            raise ValueError(
                f"train.server_lr = {self.train.server_lr:g} and train.server_optimizer are both "
                "set: give the rate as train.server_optimizer.lr (server_lr stays 1.0)"
            )
        return self

    @model_validator(mode="after")
    def _each_clients_own_row(self) -> Params:
        """FedNova and AFL weigh each client's own update by what they know of that
        client: rows a pre-aggregator remade belong to no one client."""
        why = {"fednova": "its local work", "afl": "its λ and loss"}
        if self.aggregate.name in why and self.preaggregators:
            raise ValueError(
                f"aggregate {self.aggregate.name} weighs each client's own update by "
                f"{why[self.aggregate.name]}: preaggregators, which remake the rows, cannot "
                "go before it (use [])"
            )
        return self

    @model_validator(mode="after")
    def _replacement_scaled_by_sgd(self) -> Params:
        """A backdoor's model replacement scales by n/η for the server step
        ``x + η·mean``: only sgd takes that step."""
        name, _ = self.train.server_step()
        replaces = self.attack.name == "backdoor" and self.attack.params().get("model_replacement")
        if replaces and name != "sgd":
            raise ValueError(
                f"attack backdoor with model_replacement scales by n/η for the server step "
                f"x + η·mean, which train.server_optimizer {name} does not take; use sgd"
            )
        return self

    @model_validator(mode="after")
    def _sites_run_it(self) -> Params:
        """At real sites the sites hold the data: what only a simulation can do is
        refused in one line."""
        if self.federation.runtime == "simulation":
            return self
        for key, reason in remote_unsupported(self):
            raise ValueError(f"federation.runtime = flower: {key} {reason}")
        return self

    @model_validator(mode="after")
    def _own_images_here(self) -> Params:
        own = self.data.own
        if own is None or own.path is not None:
            return self
        if self.federation.runtime == "simulation":
            raise ValueError(
                "data.own.path is not set: a simulation reads the images here; name the folder "
                "(labels.csv inside) or the .npz"
            )
        if self.eval.where == "hub":
            raise ValueError(
                "data.own.path is not set but eval.where is hub: the hub scores the model on "
                "images of its own; name them, or score at the sites (eval.where: sites)"
            )
        return self

    @model_validator(mode="after")
    def _hub_holds_no_data(self) -> Params:
        """Scored at the sites, the hub holds no images: what needs them there is refused
        in one line."""
        for key, reason in hub_data_needed(self):
            raise ValueError(f"eval.where = sites: {key} {reason}")
        return self

    @model_validator(mode="after")
    def _nothing_ignored(self) -> Params:
        """A setting the run would not read is refused, not dropped: a user who set
        ``privacy.noise_multiplier`` with privacy off believes the model is private."""
        for key, reason in ignored_settings(self):
            raise ValueError(f"{key} is set but {reason}, so it would be ignored")
        return self

    @model_validator(mode="after")
    def _methods_run(self) -> Params:
        """Each compared method's train settings, over the run's, as its cells run them:
        a combination a cell would refuse is refused here, naming the method."""
        for name, method in self.compare.methods.items():
            if not method.train:
                continue
            cell = self.model_dump(mode="json", exclude={"compare"}, exclude_unset=True)
            cell["train"] = {**cell.get("train", {}), **method.train}
            try:
                Params.model_validate(cell)
            except ValidationError as error:
                first = error.errors()[0]
                raise ValueError(
                    f"compare.methods.{name}.train: {first['msg'].removeprefix('Value error, ')}"
                ) from None
        return self

    @model_validator(mode="after")
    def _sites_can_validate(self) -> Params:
        """Validation at the sites needs held-out splits there, and its candidates (models
        one site's update apart) are seen by the peers: not under central DP."""
        if not any(f.name == "site_validation" for f in self.filters):
            return self
        if self.federation.runtime == "simulation" and not self.partition.local_test:
            raise ValueError(
                "filters site_validation: each site scores candidates on its own held-out "
                "split, in a simulation its local test split: set partition.local_test > 0 "
                "(e.g. 0.2)"
            )
        if self.privacy.mode == "central":
            raise ValueError(
                "filters site_validation with privacy.mode = central: the sites would see "
                "candidate models one site's unnoised update apart, which the hub's ε does not "
                "cover; use privacy.mode local (docs/privacy.md)"
            )
        return self

    @model_validator(mode="after")
    def _privacy_accounted(self) -> Params:
        privacy = self.privacy
        if privacy.mode == "off":
            return self
        reasons = privacy_unaccounted(self)
        if reasons and privacy.unaccounted == "refuse":
            raise ValueError(
                f"privacy.mode = {privacy.mode}: the accountant's ε holds only for the clipped "
                f"mean (aggregate fedavg, no filters, pre-aggregators or noniid.exclude), not "
                f"with {'; '.join(reasons)}; set privacy.unaccounted: warn to run it anyway"
            )
        first = privacy_budget(self).epsilon(1)
        if privacy.target_epsilon is not None and first > privacy.target_epsilon:
            raise ValueError(
                f"privacy.target_epsilon = {privacy.target_epsilon:g} is spent before round 1 "
                f"(ε after one round = {first:.3f}); raise privacy.noise_multiplier, sample "
                "fewer clients (train.client_fraction) or raise the target"
            )
        return self


def ignored_settings(params: Params) -> list[tuple[str, str]]:
    """Settings given explicitly (in the file, by ``--set`` or a deployment) that nothing
    reads under the rest of ``params``: each as (dotted key, why it is not read)."""
    from federated.partition import PARTITIONERS

    def given(section: BaseModel, name: str) -> list[str]:
        return [f"{name}.{key}" for key in sorted(section.model_fields_set)]

    ignored: list[tuple[str, str]] = []
    if params.privacy.mode == "off":
        ignored += [
            (key, "privacy.mode is off (the run would not be private: choose central or local)")
            for key in given(params.privacy, "privacy")
            if key != "privacy.mode"
        ]
    partition, takes = params.partition, PARTITIONERS.parameters(params.partition.scheme)
    ignored += [
        (f"partition.{key}", f"partition.scheme {partition.scheme} does not take it")
        for key in sorted(partition.model_fields_set & set(SCHEME_KEYS) - set(takes))
    ]
    attack = params.attack
    if attack.name == "none":
        ignored += [
            (key, "attack.name is none (no client attacks)")
            for key in given(attack, "attack")
            if key != "attack.name"
        ]
    elif attack.ids is not None and "fraction" in attack.model_fields_set:
        ignored.append(("attack.fraction", "attack.ids names the malicious clients"))
    if not params.noniid.exclude and "z" in params.noniid.model_fields_set:
        ignored.append(("noniid.z", "noniid.exclude is false (no client is left out)"))
    if params.federation.runtime == "simulation":
        ignored += [
            (key, "federation.runtime is simulation (no sites: the clients train here)")
            for key in given(params.federation, "federation")
            if key != "federation.runtime"
        ]
    if params.train.backend == "sequential" and params.train.max_parallel is not None:
        ignored.append(("train.max_parallel", "train.backend is sequential"))
    own = params.data.own
    if own is not None and own.spatial_dims == 2:
        ignored += [
            (f"data.own.{key}", "data.own.spatial_dims is 2 (images: no slices to space)")
            for key in sorted(own.model_fields_set & {"spacing", "slice_tolerance"})
        ]
    elif own is not None and "resample" in own.model_fields_set:
        ignored.append(
            ("data.own.resample", "volumes are resampled as data.own.spacing says (trilinear)")
        )
    return ignored


def remote_unsupported(params: Params) -> list[tuple[str, str]]:
    """What a federation of real sites cannot run, each as (setting, why)."""
    refused = []
    if params.attack.name != "none":
        refused.append(
            ("attack.name", "must be none: a site's data is its own, attacks are simulated")
        )
    if params.partition.root_size:
        refused.append(("partition.root_size", "must be 0: the hub holds no training images"))
    if params.train.local_work is not None:
        refused.append(
            (
                "train.local_work",
                "must be null: each site trains the epochs of the plan it approved",
            )
        )
    if params.train.scaffold and params.privacy.mode == "local":
        refused.append(
            (
                "train.scaffold",
                "must be false with privacy.mode local: the sites' control deltas would "
                "leave them neither clipped nor noised",
            )
        )
    if params.aggregate.name == "afl":
        refused.append(
            ("aggregate afl", "is simulated only: its λ needs every client's loss each round")
        )
    sites, given = len(params.federation.sites), params.partition.num_clients
    if sites and "num_clients" in params.partition.model_fields_set and given != sites:
        refused.append(
            (
                "partition.num_clients",
                f"= {given} but federation.sites names {sites} sites: the sites are the "
                "clients; leave partition.num_clients out or make it "
                f"{sites}",
            )
        )
    return refused


def hub_data_needed(params: Params) -> list[tuple[str, str]]:
    """What needs images at the hub, each as (setting, why), when ``eval.where`` is sites
    (the hub holds none); empty otherwise."""
    if params.eval.where == "hub":
        return []
    needed = []
    rule = AGGREGATORS.build(params.aggregate.name, **params.aggregate.params())
    if rule.requires_oracle or rule.requires_reference:
        needed.append(
            (
                f"aggregate {params.aggregate.name}",
                "needs the hub's own images (a server batch or root data)",
            )
        )
    if params.partition.root_size:
        needed.append(("partition.root_size", "must be 0: the hub holds no training images"))
    if params.attack.name == "backdoor":
        needed.append(("attack.name backdoor", "is scored on triggered test images at the hub"))
    if params.federation.runtime == "simulation":
        if not params.partition.local_test:
            needed.append(
                (
                    "partition.local_test",
                    "must be > 0: in a simulation the sites score on their local test splits",
                )
            )
        if params.eval.select == "best_val":
            needed.append(
                (
                    "eval.select best_val",
                    "needs validation splits at the sites; a simulation's clients hold none (use last)",
                )
            )
    return needed


def population(params: Params) -> int:
    """The clients a round samples from: the registered sites at real sites
    (``federation.sites``), the simulated partition's clients otherwise."""
    if params.federation.runtime == "flower":
        return len(params.federation.sites)
    return params.partition.num_clients


SCHEME_KEYS = ("alpha", "classes_per_client", "sigma")  # each taken by one partition scheme


def eval_batch_size(params: Params) -> int:
    """Images per scoring pass: ``eval.batch_size``, or 512 at 28 px scaled by the pixel
    (voxel) count (98 at 64 px, 24 at 128 px, 8 at 224 px and for volumes at 28 or 64
    voxels), so a pass needs about the same memory at every MedMNIST+ size."""
    if params.eval.batch_size is not None:
        return params.eval.batch_size
    return max(8, 512 * 28 * 28 // params.data.size ** (3 if params.volumes else 2))


def privacy_budget(params: Params) -> ClientPrivacy:
    """The run's DP-FedAvg settings for the engine (``privacy.mode`` is not off)."""
    privacy, clients = params.privacy, population(params)
    return ClientPrivacy(
        clip=privacy.clip,
        noise_multiplier=privacy.noise_multiplier,
        population=clients,
        per_round=clients_per_round(params.train.client_fraction, clients),
        mode=privacy.mode,
        delta=privacy.delta,
        target_epsilon=privacy.target_epsilon,
    )


def privacy_unaccounted(params: Params) -> list[str]:
    """What makes the released model depend on one client by more than DP-FedAvg's clipped
    sum allows (so the accounted ε does not hold): empty when it holds."""
    reasons = []
    if params.aggregate.name != "fedavg":
        reasons.append(f"aggregate {params.aggregate.name}")
    if params.filters:
        reasons.append(f"filters {', '.join(f.name for f in params.filters)}")
    if params.preaggregators:
        reasons.append(f"pre-aggregators {', '.join(p.name for p in params.preaggregators)}")
    if params.noniid.exclude:
        reasons.append("noniid.exclude")
    if params.train.scaffold:
        reasons.append("train.scaffold (its control deltas are neither clipped nor noised)")
    return reasons


HONEST_MAJORITY_RULES = {
    "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "geometric_median", "ema",
    "fedlag", "centered_clipping", "zeno",
}  # fmt: skip


def params_warnings(params: Params) -> list[str]:
    """Settings that run but whose results a user should doubt (printed once, up front)."""
    warnings: list[str] = []
    if params.privacy.mode != "off" and (unaccounted := privacy_unaccounted(params)):
        warnings.append(
            f"privacy: the logged ε does not hold with {'; '.join(unaccounted)} "
            "(privacy.unaccounted: warn); only the clipped mean is accounted"
        )
    if params.privacy.target_epsilon is not None:
        budget = privacy_budget(params)
        admitted = sum(budget.admits(r) for r in range(1, params.train.rounds + 1))
        if admitted < params.train.rounds:
            warnings.append(
                f"privacy: privacy.target_epsilon = {budget.target_epsilon:g} admits {admitted} "
                f"of the {params.train.rounds} rounds (ε after {admitted} = "
                f"{budget.epsilon(admitted):.3f}); the run will end there"
            )
    attack = params.attack
    if attack.name != "none":
        share = (
            len(attack.ids) / params.partition.num_clients
            if attack.ids is not None
            else attack.fraction
        )
        guarded = [params.aggregate.name] if params.aggregate.name in HONEST_MAJORITY_RULES else []
        honest_majority = ("pid_made", "distance_cusum", "site_validation")  # votes: a majority
        guarded += [f.name for f in params.filters if f.name in honest_majority]
        if share >= 0.5 and guarded:
            warnings.append(
                f"attack.fraction={share:.2f}: {', '.join(guarded)} assume an honest majority "
                "(fewer than half of the clients malicious); expect no protection"
            )
        if attack.ids is not None and any(
            not 0 <= i < params.partition.num_clients for i in attack.ids
        ):
            raise ConfigError(
                f"attack.ids = {attack.ids}: ids must be in [0, {params.partition.num_clients})"
            )
    return warnings


def _format_error(
    error: ValidationError, source: str, overridden: Sequence[str] = (), option: str = "--set"
) -> str:
    """The error in one line; an unknown key first (a misspelt key also leaves the key it
    meant missing: ``node-id`` for ``node_id``). A key an override set (``overridden``, the
    keys of ``option``: ``--set``, DVC's ``-S``) is named as the option's, not the file's."""
    errors = error.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    key = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if not key:  # a check across sections: its message names the keys
        return f"{given_source(source, overridden, option)}: {message}"
    if any(_overlaps(key, set_key) for set_key in overridden):
        source = option
    if first["type"] == "extra_forbidden":
        section = ".".join(str(p) for p in first["loc"][:-1]) or "the top level"
        allowed = ", ".join(_section_keys(first["loc"][:-1]))
        return f"{source}: unknown key {key!r}; keys allowed in {section}: {allowed}"
    value = first.get("input")
    shown = json.dumps(value, default=str)
    extra = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{source}: {key} = {shown}: {message}{extra}"


def override_keys(overrides: Sequence[str] | None) -> list[str]:
    """The dotted keys ``key=value`` overrides set."""
    return [override.partition("=")[0].strip() for override in overrides or []]


def given_source(path: str, overridden: Sequence[str], option: str = "--set") -> str:
    """Where params came from, for an error that spans several keys: the file, and the keys
    ``option`` changed in it."""
    return f"{path} with {option} {', '.join(overridden)}" if overridden else path


def _overlaps(key: str, set_key: str) -> bool:
    """Whether the dotted ``key`` lies in, or holds, the dotted ``set_key``."""
    return key == set_key or key.startswith(f"{set_key}.") or set_key.startswith(f"{key}.")


def _section_keys(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the section at ``loc`` (e.g. ``("train",)`` -> TrainParams' keys)."""
    model: type[BaseModel] = Params
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        model = annotation.__args__[0] if hasattr(annotation, "__args__") else annotation
    return list(model.model_fields)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def load_params(
    path: Path | str = "params.yaml", overrides: list[str] | None = None, option: str = "--set"
) -> Params:
    """Read and validate ``path`` with ``key.sub=value`` overrides (values parsed as YAML),
    given by ``option`` (named in an error)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({_yaml_problem(error)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    for override in overrides or []:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"{option} {override!r}: expected key=value, e.g. train.rounds=3")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ConfigError(
                f"{option} {key.strip()}: the value {text!r} is not valid YAML "
                f"({_yaml_problem(error)}); quote the whole option and close every bracket, "
                f"e.g. {option} 'compare.seeds=[0, 1]'"
            ) from None
        _set_dotted(raw, key.strip(), value)
    return validate_params(raw, str(path), override_keys(overrides), option)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """What the YAML parser found wrong, and where (line and column, counted from 1)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    if mark is None:
        return problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def validate_params(
    raw: dict[str, Any], source: str, overridden: Sequence[str] = (), option: str = "--set"
) -> Params:
    """Validate a params tree; a bad value is a one-line :class:`ConfigError` naming
    ``source``, or ``option`` where one of the ``overridden`` keys holds it."""
    try:
        return Params.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(_format_error(error, source, overridden, option)) from None


def params_hash(params: Params) -> str:
    """A short stable hash of everything that changes results (tracking settings excluded)."""
    payload = params.model_dump(mode="json", exclude={"tracking", "compare"})
    if params.federation.runtime == "simulation":  # the simulated runs' hashes stay as they were
        payload.pop("federation")
    if params.data.own is None:  # likewise for MedMNIST runs
        payload["data"].pop("own")
    if params.eval.where == "hub":  # as they were before eval.where
        payload["eval"].pop("where")
    for key in ("server_optimizer", "local_work", "scaffold"):  # unset: hashed as before
        if not getattr(params.train, key):
            payload["train"].pop(key)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
