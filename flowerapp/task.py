"""The task a site receives: one typed record with one schema, on both sides of the wire.

The hub builds a :class:`SiteTask` from the run's params (:func:`flowerapp.hub.site_task`),
sends it as a Flower ``ConfigRecord`` (:meth:`SiteTask.to_config`) and the site reads it
back with every value's type checked against the schema (:meth:`SiteTask.from_config`): a
task with a missing, unknown or mistyped setting is refused in one line, never cast. The
training plan a site's operator approves (:mod:`flowerapp.plan`) is the record's fields
minus the per-message ones (:meth:`SiteTask.plan`).

Adding a setting is one typed line in :class:`SiteTask` (with a default where a site may
meet tasks of a hub without it); ``per_message()`` marks a field that changes with every
message and is not part of the plan. Types a field may have: ``str``, ``int``, ``float``,
``bool`` and ``tuple[T, ...]`` of those (a list in the record and in the plan's JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import cache
from typing import Any, get_args, get_origin, get_type_hints

from federated.client import LocalTraining
from federated.data import DatasetInfo

__all__ = ["SiteTask", "TaskError", "per_message"]

Scalar = str | int | float | bool
VOLUME_FIELDS = ("spatial_dims", "spacing", "slice_tolerance")  # not in a plan of images
Value = Scalar | list[Scalar]


class TaskError(ValueError):
    """A task that does not follow the schema: what is wrong, in one line."""


def per_message(default: int | str = 0) -> Any:
    """A field that changes with every message (the round, the client): not the plan's."""
    return field(default=default, metadata={"per_message": True})


@dataclass(frozen=True, kw_only=True)
class SiteTask:
    """What a site needs besides the global vector to train and score exactly as a
    simulated client would: the model, the data shape it expects, the local settings."""

    model: str  # a name in the model registry
    # the data's schema: what a site's images become before the model sees them
    dataset: str  # the dataset's name (a MedMNIST flag, or a consortium's own)
    task: str  # binary-class | multi-class | multi-label, binary-class | ...
    class_names: tuple[str, ...]  # a label is a class name or its index
    channels: int  # image channels after the site's preprocessing
    classes: int  # classes, or labels of a multi-label task
    size: int  # image height and width in pixels (a volume's depth too)
    multi_label: bool
    resample: str  # Pillow's filter bringing an image to ``size``
    intensity: str  # how grey values become 0-255 (federated/image_files.py)
    percentiles: tuple[float, ...]  # lower, upper (the percentiles intensity policy)
    mean: float  # a tensor's pixels are (x / 255 - mean) / std
    std: float
    # volumes (federated/volume_files.py): 2 images, 3 volumes; how a volume reaches
    # ``size`` voxels per axis; the share off the median slice step a series may be
    spatial_dims: int = 2
    spacing: str = "isotropic"
    slice_tolerance: float = 0.1
    epochs: int  # local epochs a round
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int
    prox_mu: float  # FedProx's proximal weight (0: FedAvg)
    eval_batch_size: int  # images per scoring pass
    # the privacy the site is promised, or (local) applies itself: off | central | local
    privacy_mode: str = "off"
    privacy_clip: float = 0.0  # the L2 norm a site clips its update to (local)
    privacy_noise_multiplier: float = 0.0  # noise std = multiplier x clip (local)
    privacy_delta: float = 0.0
    privacy_target_epsilon: float = 0.0  # a site trains no further past it (0: no target)
    # the site scores the round's leave-one-site-out candidates on its held-out split
    # (filter site_validation): it then sees models that differ by one peer's update
    validation: bool = False
    # SCAFFOLD (option II): the site trains with the hub's c and its own c_i, which it
    # keeps in its state folder, and sends Δc_i beside its update
    scaffold: bool = False
    round: int = per_message()
    client: int = per_message()  # the site's client id: its place in federation.sites
    shuffle_seed: int = per_message()  # its batch order this round (the simulation's)
    run_key: str = per_message("")  # the run a SCAFFOLD variate belongs to (params hash)

    @classmethod
    def per_message_fields(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls) if f.metadata.get("per_message"))

    def plan(self) -> dict[str, Any]:
        """The settings a site's operator approves: every field but the per-message ones,
        as JSON values, by name."""
        every = self.to_config()
        if not self.scaffold:  # as plans were before SCAFFOLD at the sites: still approved
            del every["scaffold"]
        if self.spatial_dims == 2:  # as plans of images were before volumes: still approved
            for key in VOLUME_FIELDS:
                del every[key]
        return {key: every[key] for key in sorted(every) if key not in self.per_message_fields()}

    def to_config(self) -> dict[str, Value]:
        """The record's values for a Flower ``ConfigRecord`` (tuples as lists)."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in asdict(self).items()
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SiteTask:
        """The task a ``ConfigRecord`` (or any mapping) holds, every value checked against
        the schema; :class:`TaskError` names the first setting that is wrong."""
        schema = _schema(cls)
        unknown = sorted(set(config) - set(schema))
        if unknown:
            raise TaskError(
                f"the task has setting(s) this site does not know: {', '.join(unknown)} "
                "(is the site's fedsieve older than the hub's?)"
            )
        values = {}
        for item in fields(cls):
            if item.name in config:
                values[item.name] = _checked(item.name, config[item.name], schema[item.name])
            elif item.default is MISSING:
                raise TaskError(f"the task lacks the setting {item.name}")
        return cls(**values)

    def local_training(self) -> LocalTraining:
        return LocalTraining(
            epochs=self.epochs, lr=self.lr, momentum=self.momentum,
            weight_decay=self.weight_decay, batch_size=self.batch_size, prox_mu=self.prox_mu,
        )  # fmt: skip

    def dataset_info(self) -> DatasetInfo:
        """The data's schema: how the site reads its images, and what the model takes."""
        return DatasetInfo(
            flag=self.dataset, task=self.task, n_channels=self.channels, n_classes=self.classes,
            labels=self.class_names, url="", md5="", n_samples={}, size=self.size,
            mean=self.mean, std=self.std, resample=self.resample, intensity=self.intensity,
            percentiles=(self.percentiles[0], self.percentiles[1]),
            spatial_dims=self.spatial_dims, spacing=self.spacing,
            slice_tolerance=self.slice_tolerance,
        )  # fmt: skip


@cache
def _schema(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _checked(name: str, value: Any, kind: Any) -> Any:
    """``value`` as the schema's ``kind`` (an int where a float is due becomes one), or
    :class:`TaskError`."""
    if get_origin(kind) is tuple:
        (item, _) = get_args(kind)
        if not isinstance(value, list | tuple):
            raise TaskError(f"task setting {name} = {value!r} is {_name(value)}, not a list")
        return tuple(_checked(name, element, item) for element in value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise TaskError(f"task setting {name} = {value!r} is {_name(value)}, not {kind.__name__}")


def _name(value: Any) -> str:
    return type(value).__name__
