"""The FedStNN paper's three experiments (Sec. 5): data generators and one runner.

An experiment is its frozen config dataclass: the settings (sizes, rounds, epochs, lr,
seed, device) plus what differs between experiments: its data and targets
(``make_data``), the clients trained alone for comparison (``local_clients``), the
per-round tracking (``round_tracker``) and the final metrics (``evaluate``). One runner,
:func:`run_config`, does the rest (federation, stand-alone local models, predictions) and
returns an :class:`ExperimentResult` of plain values: metrics, per-round history, the
trained models, the data and every model's predictions as numpy arrays; the figures are
drawn from them in the tasks layer (``tasks/plots_fedstnn.py``). Nothing here writes
files, draws, seeds global RNGs or reads params; ``seed`` drives one
``numpy.random.Generator`` for the data and ``torch.Generator`` objects for the model and
the noise. Pillow is imported only where the letter image is made.

Choices where the extracted text lost the numbers (the paper's words quoted):

- 1-D (Sec. 5.1): "partition the interval into 10,000 sub-intervals"; the function and
  noise level are not recoverable, so ``f(x) = sin(2πx)`` on ``[-1, 1]`` (two periods)
  with ``σ = 0.2``. "the number of clients is set to be [100]"; ``C = 0.1`` (Sec. 1: "setting
  [C = ?] will in general be the most efficient choice", citing McMahan et al., whose
  choice is 0.1); 10 rounds.
  IID: "every client will randomly select the same amount of data points from the entire
  domain" (100 each, drawn independently per client). Non-IID: "all clients will be split
  into 10 groups, with 10 clients in each group ... all data points will also be split
  into 10 groups in order, with 1,000 points in each group"; "clients in group [j] select
  100/50 points from data group [j] and 10 points from other groups", the 110- and
  60-point settings.
- 2-D (Sec. 5.2): a piecewise function on the four quadrants of ``[-1, 1]^2`` (ours:
  see :func:`function_2d`), a 100 x 100 grid, ``σ = 0.1``; "4 client groups ... every
  client in each client group will mainly focus on one quadrant" plus "points in total
  from the other three quadrants": 10 clients per group, 200 + 30 points each.
- Image (Sec. 5.3): the letters F, S, U ("clients in group [1, 2, 3] will main focus on
  pixel information from letter F, S, U"), rendered bold with Pillow's default font,
  white (1) on black (0); the image is split into three equal vertical sections, one letter
  each; 10 clients per group, each with 300 pixels of its section and 30 from the other
  two. The input is the pixel position scaled to ``[-1, 1]^2``, the target its colour.
  "The [top-K] function will map the largest [K] values ... to 1 and the rest to 0", with
  K the number of white pixels of the true image. The local models are "client 1, 11,
  and 21" (the first of each group) trained alone.

The ``autograd`` trainer's defaults (``FEDERATION`` and ``MODEL`` below; ``smp``, the
paper's recipe, is :data:`TRAINERS`), tuned on the 1-D non-IID settings, one seed, CPU: local
Adam, 100 full-batch epochs per round, lr 1e-2 decayed by 0.7 per round, K = 16 paths,
a ReLU SNN with d = 8, 32 hidden units, N = 5 blocks. Two effects drove them:

- Non-IID FedAvg needs long local training to move at all in 10 rounds (with 50 epochs the
  global MSE was still 0.6 σ²), but then each client's drift fits its ~100 points
  closely and its diffusion learns the *in-sample* residual, which is smaller than σ;
  averaged, σ̂ came out 25-40 % low. Decaying lr puts the late rounds in a near-linear
  regime where averaging recovers the global residual level.
- The diffusion network gets a smaller lr (``diffusion_lr_scale = 0.3``): it then tracks
  the residuals over the whole local run rather than the over-fitted end of it. With
  scale 3 σ̂ was 25 % low, with 1 15 %, with 0.3 7 % (1-D non-IID, 110 points).

The image adds Fourier features of the pixel position to the lift (``fourier_features``)
against the spectral bias of coordinate networks (Tancik et al. 2020); a run without
them was not tried within the CPU budget.

Metrics: ``mse`` of the predicted mean (over ``eval_paths`` paths) to the true function
on every grid point and ``mse_over_sigma2``; ``sigma_pred`` (mean predicted σ) and
``sigma_rel_error = |sigma_pred - σ| / σ`` (``sigma_rel_error_pointwise`` averages
``|σ̂(x) - σ| / σ`` instead); ``coverage_2sigma``, the share of the noisy observations
inside ``mean ± 2σ̂``. For the image: ``accuracy`` and ``iou`` (white pixels) after top-K,
for the global model and each group's local model. ``local_*`` is the local model.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from federated.fedstnn.losses import build_loss
from federated.fedstnn.train import (
    LocalTrainConfig,
    SNNClientData,
    SNNFederationConfig,
    run_federation,
    train_standalone,
)
from federated.seeding import clients_per_round
from models.snn import SNN, SNNConfig
from registry.constraints import POSITIVE, Interval, Options, allowed, check_fields

__all__ = [
    "EXPERIMENTS",
    "GAUSSIAN_2SIGMA_COVERAGE",
    "TRAINERS",
    "ExperimentConfig",
    "ExperimentData",
    "ExperimentResult",
    "Function1DConfig",
    "Function2DConfig",
    "ImageConfig",
    "Prediction",
    "RegressionConfig",
    "RoundTracker",
    "experiment_config",
    "function_1d",
    "function_2d",
    "make_function_1d_data",
    "make_function_2d_data",
    "make_image_data",
    "partition_grouped",
    "partition_iid",
    "predict_chunked",
    "regression_metrics",
    "render_letters",
    "replaced",
    "run_config",
    "run_experiment",
    "segmentation_metrics",
    "top_k_binary",
]

# ``on_round(round, global_model)``: metrics for that round's history entry
RoundTracker = Callable[[int, SNN], dict[str, float]]


# ---------------------------------------------------------------- results


@dataclass(frozen=True, kw_only=True, eq=False)
class ExperimentData:
    """An experiment's points as plain arrays: what the clients hold, what the models are
    scored against and what the figures draw. ``n`` points, ``in_dim`` input features."""

    inputs: np.ndarray  # (n, in_dim): 1-D x; 2-D (x, y); image (column, row) in [-1, 1]
    truth: np.ndarray  # (n,) the noiseless target (the image: each pixel's colour)
    observed: np.ndarray  # (n,) the targets the clients hold (truth + noise; image: truth)
    point_groups: np.ndarray  # (n,) each point's group: interval, quadrant, letter (IID: 0)
    indices: list[np.ndarray]  # per client, the indices of its points
    groups: np.ndarray  # (n_clients,) each client's group


@dataclass(frozen=True, kw_only=True, eq=False)
class Prediction:
    """One trained model on every point of the data, over ``eval_paths`` paths."""

    mean: np.ndarray  # (n,) mean output
    std: np.ndarray  # (n,) standard deviation of the output (the predicted σ)
    sample: np.ndarray  # (n,) the output of one sampled path


@dataclass(eq=False)
class ExperimentResult:
    """What :func:`run_config` returns; the caller logs it (MLflow) and draws its figures."""

    name: str
    metrics: dict[str, float]
    history: list[dict[str, Any]]
    global_model: SNN
    local_models: dict[str, SNN]  # the clients trained alone, by key (``local_clients``)
    data: ExperimentData
    predictions: dict[str, Prediction]  # "global", then each key of ``local_models``
    config: ExperimentConfig


# ---------------------------------------------------------------- configs


# The settings the presets start from: the autograd recipe's federation and its clients'
# local training, and the SNN (see the module docstring for how they were chosen)
FEDERATION = SNNFederationConfig(
    rounds=10,  # communication rounds
    fraction=0.1,  # C: share of clients sampled each round
    lr_decay=0.7,  # lr in round r: lr * lr_decay**(r - 1) (late rounds: small moves)
    local=LocalTrainConfig(
        epochs=100,  # passes over the local data per round (one step each: full batch)
        lr=1e-2,
        optimizer="adam",
        diffusion_lr_scale=0.3,  # the diffusion's lr relative to lr (see module doc)
        loss="energy_score",
        gradient="autograd",
    ),
)
MODEL = SNNConfig(
    state_dim=8,
    hidden_dim=32,
    n_blocks=5,
    n_paths=16,  # K sample paths per training step (the clients' too)
    diffusion_init=0.3,
    activation="relu",  # tanh is ~10x slower on CPU for the same fit here
)
FEDERATION_2D = dataclasses.replace(FEDERATION, fraction=0.25)
IMAGE_FEDERATION = dataclasses.replace(FEDERATION, fraction=0.3)
IMAGE_MODEL = dataclasses.replace(
    MODEL,
    hidden_dim=64,
    state_dim=16,
    diffusion_init=0.1,
    fourier_features=5,  # pixel positions need high frequencies (sharp letter edges)
    n_paths=8,  # the image has no noise to resolve; fewer paths, cheaper steps
)


Trainer = Literal["autograd", "smp"]
Partition = Literal["iid", "noniid"]


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig(abc.ABC):
    """An experiment's settings, nested as the engine takes them: ``federation`` (rounds,
    the sampled share, the per-network rules, and ``federation.local``, each client's
    training), ``model`` (the SNN; its ``in_dim`` and ``out_dim`` are the data's) and
    evaluation and reproducibility at the top, beside the data's settings, which each
    experiment's subclass adds with its data and metrics."""

    # clients in total (the data's partition)
    n_clients: int = field(default=100, metadata=allowed(Interval(int, 1)))
    # the recipe (TRAINERS) that ``federation`` and ``model`` start from
    trainer: Trainer = field(default="autograd", metadata=allowed(Options.of(Trainer)))
    federation: SNNFederationConfig = FEDERATION
    model: SNNConfig = MODEL
    # K paths when evaluating the trained models
    eval_paths: int = field(default=256, metadata=allowed(Interval(int, 2)))
    track_rounds: bool = True  # evaluate the global model after every round (history)
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_fields(self)  # this class's and its subclass's declared fields
        if (self.model.in_dim, self.model.out_dim) != (1, 1):
            raise ValueError("model.in_dim and model.out_dim are the data's: leave them out")
        local = self.federation.local
        paths = local.n_paths or self.model.n_paths
        needed = getattr(build_loss(local.loss), "min_paths", 2)
        if paths < needed:
            raise ValueError(
                f"model.n_paths must be >= {needed} for the loss {local.loss!r} (a scoring "
                f"rule needs spread), got {paths}; squared_error takes one path"
            )
        self._probe_rules()

    def _probe_rules(self) -> None:
        """Each network's rule tried on as many updates as a round samples, so a rule that
        cannot work with that many (``krum`` with ``f`` too large) is refused before the
        run starts, not in its first round."""
        sampled = clients_per_round(self.federation.fraction, self.n_clients)
        updates = torch.randn(sampled, 4, generator=torch.Generator().manual_seed(0))
        for network, rule in self.federation.rules.items():
            try:
                rule.step(rule.init_state(), updates, torch.ones(sampled))
            except ValueError as error:
                raise ValueError(
                    f"federation: the {network} network's rule cannot aggregate the "
                    f"{sampled} clients a round samples: {error}"
                ) from None

    @abc.abstractmethod
    def make_data(self, rng: np.random.Generator) -> ExperimentData:
        """The points, their targets and the clients' shares, drawn from ``rng``."""

    @abc.abstractmethod
    def local_clients(self, data: ExperimentData) -> dict[str, int]:
        """The clients trained alone beside the federation: result key -> client index."""

    @abc.abstractmethod
    def round_tracker(self, data: ExperimentData, x: Tensor) -> RoundTracker | None:
        """Per-round metrics of the global model (None: ``track_rounds`` is off);
        ``x (n, in_dim)`` is ``data.inputs`` as a tensor on the device."""

    @abc.abstractmethod
    def evaluate(
        self, data: ExperimentData, predictions: Mapping[str, Prediction]
    ) -> dict[str, float]:
        """The final metrics of every trained model, from its predictions."""


@dataclass(frozen=True, kw_only=True)
class RegressionConfig(ExperimentConfig):
    """A regression experiment (Sec. 5.1-5.2): one client's stand-alone model beside the
    global one, and the per-round fit of the global model on the noisy points."""

    local_client: int = 0  # the client whose stand-alone model is shown beside the global

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.local_client < self.n_clients:
            raise ValueError(
                f"local_client must be in [0, {self.n_clients}), got {self.local_client}"
            )

    def local_clients(self, data: ExperimentData) -> dict[str, int]:
        return {f"client_{self.local_client}": self.local_client}

    def round_tracker(self, data: ExperimentData, x: Tensor) -> RoundTracker | None:
        return _regression_tracker(self, data, x)


@dataclass(frozen=True, kw_only=True)
class Function1DConfig(RegressionConfig):
    """Sec. 5.1: ``y = sin(2πx) + σ ε`` on 10,000 points of ``[-1, 1]``."""

    n_points: int = 10_000  # grid points on [x_min, x_max]
    x_min: float = -1.0
    x_max: float = 1.0
    # σ of the Gaussian observation noise
    noise_sigma: float = field(default=0.2, metadata=allowed(POSITIVE))
    partition: Partition = field(default="iid", metadata=allowed(Options.of(Partition)))
    n_groups: int = 10  # non-IID: client groups = data groups (consecutive intervals)
    main_points: int = 100  # IID: points per client; non-IID: from the client's own group
    other_points: int = 10  # non-IID: points from the other groups (0 for IID)

    def make_data(self, rng: np.random.Generator) -> ExperimentData:
        """The noisy grid; IID: each client draws ``main_points`` anywhere; non-IID:
        ``n_groups`` consecutive intervals, one per client group."""
        x, f, y = make_function_1d_data(self, rng)
        if self.partition == "iid":
            return ExperimentData(
                inputs=x.reshape(-1, 1),
                truth=f,
                observed=y,
                point_groups=np.zeros(self.n_points, dtype=np.int64),
                indices=partition_iid(self.n_points, self.n_clients, self.main_points, rng),
                groups=np.zeros(self.n_clients, dtype=np.int64),
            )
        point_groups = np.arange(self.n_points) * self.n_groups // self.n_points
        return _grouped_data(self, rng, x.reshape(-1, 1), f, y, point_groups)

    def evaluate(
        self, data: ExperimentData, predictions: Mapping[str, Prediction]
    ) -> dict[str, float]:
        def score(p: Prediction) -> dict[str, float]:
            return regression_metrics(p.mean, p.std, data.truth, data.observed, self.noise_sigma)

        return _global_and_local(predictions, score)


@dataclass(frozen=True, kw_only=True)
class Function2DConfig(RegressionConfig):
    """Sec. 5.2: the piecewise :func:`function_2d` on a grid of ``[-1, 1]^2``, 4 groups."""

    n_clients: int = field(default=40, metadata=allowed(Interval(int, 1)))  # 4 groups of 10
    federation: SNNFederationConfig = FEDERATION_2D
    grid: int = 100  # points per axis (grid x grid observations)
    noise_sigma: float = field(default=0.1, metadata=allowed(POSITIVE))
    main_points: int = 200  # per client, from its group's quadrant
    other_points: int = 30  # per client, from the other three quadrants together
    slice_y: float = 0.5  # the fixed y of the first slice plot
    slice_x: float = -0.5  # the fixed x of the second slice plot

    def make_data(self, rng: np.random.Generator) -> ExperimentData:
        """The noisy grid; one client group per quadrant."""
        inputs, f, y = make_function_2d_data(self, rng)
        point_groups = quadrant(inputs[:, 0], inputs[:, 1])
        return _grouped_data(self, rng, inputs, f, y, point_groups)

    def evaluate(
        self, data: ExperimentData, predictions: Mapping[str, Prediction]
    ) -> dict[str, float]:
        """The 1-D metrics plus the MSE per quadrant and near / away from the jumps."""

        def score(p: Prediction) -> dict[str, float]:
            sigma = self.noise_sigma
            return (
                regression_metrics(p.mean, p.std, data.truth, data.observed, sigma)
                | _quadrant_mse(p.mean, data)
                | _jump_mse_over_sigma2(p.mean, data, sigma)
            )

        return _global_and_local(predictions, score)


@dataclass(frozen=True, kw_only=True)
class ImageConfig(ExperimentConfig):
    """Sec. 5.3: a binary image of three letters, one client group per letter."""

    text: str = "FSU"  # one letter per section and client group
    height: int = 32  # pixels
    width: int = 96  # pixels (split into len(text) equal sections)
    font_size: int = 28
    stroke_width: int = 2  # bold letters (~7 px strokes); thin strokes make IoU a contour test
    n_clients: int = field(default=30, metadata=allowed(Interval(int, 1)))  # len(text) groups of 10
    main_points: int = 300  # pixels per client from its own letter's section
    other_points: int = 30  # pixels per client from the other sections together
    federation: SNNFederationConfig = IMAGE_FEDERATION
    model: SNNConfig = IMAGE_MODEL

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.text) < 1:
            raise ValueError("text must hold at least one letter")
        if self.width % len(self.text):
            raise ValueError(
                f"width {self.width} must be divisible by len(text) = {len(self.text)}"
            )

    def make_data(self, rng: np.random.Generator) -> ExperimentData:
        """The letter image (no noise); one client group per letter's section."""
        position, colour, section = make_image_data(self)
        return _grouped_data(self, rng, position, colour, colour, section)

    def local_clients(self, data: ExperimentData) -> dict[str, int]:
        """The first client of each group ("client 1, 11, and 21")."""
        return {
            f"group_{g}_{letter}": int(np.flatnonzero(data.groups == g)[0])
            for g, letter in enumerate(self.text)
        }

    def round_tracker(self, data: ExperimentData, x: Tensor) -> RoundTracker | None:
        """The global model's IoU after top-K on every pixel (32 paths)."""
        if not self.track_rounds:
            return None
        n_white = int(data.truth.sum())
        generator = torch.Generator(device=self.device).manual_seed(self.seed + 2)

        def on_round(_: int, net: SNN) -> dict[str, float]:
            mean, _s, _k = predict_chunked(net, x, n_paths=32, generator=generator)
            binary = top_k_binary(mean[:, 0].cpu().numpy(), n_white)
            return {"global_iou": segmentation_metrics(binary, data.truth)["iou"]}

        return on_round

    def evaluate(
        self, data: ExperimentData, predictions: Mapping[str, Prediction]
    ) -> dict[str, float]:
        """Accuracy, IoU and mean σ̂ of each model after top-K (K: the true white pixels),
        and the global model's IoU margin over the best local model."""
        n_white = int(data.truth.sum())
        metrics: dict[str, float] = {"white_pixels": float(n_white)}
        for key, prediction in predictions.items():
            binary = top_k_binary(prediction.mean, n_white)
            for name, value in segmentation_metrics(binary, data.truth).items():
                metrics[f"{key}_{name}"] = value
            # torch's float32 mean: numpy's pairwise sum can differ in the last bit
            metrics[f"{key}_sigma_pred"] = float(torch.from_numpy(prediction.std).mean())
        best_local = max(metrics[f"{key}_iou"] for key in predictions if key != "global")
        metrics["iou_margin_over_best_local"] = metrics["global_iou"] - best_local
        return metrics


# ---------------------------------------------------------------- data


def function_1d(x: np.ndarray) -> np.ndarray:
    """The 1-D target ``sin(2πx)``."""
    return np.sin(2 * np.pi * x)


def function_2d(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The 2-D piecewise target, one smooth piece per quadrant, jumps across the axes:
    I ``sin(πx) sin(πy)``, II ``x^2 + y^2``, III ``-1 - (x + y)/2``, IV ``x y``."""
    return np.select(
        [(x >= 0) & (y >= 0), (x < 0) & (y >= 0), (x < 0) & (y < 0)],
        [np.sin(np.pi * x) * np.sin(np.pi * y), x**2 + y**2, -1 - (x + y) / 2],
        default=x * y,
    )


def quadrant(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Quadrant index 0..3 for I..IV (axes belong to the non-negative side)."""
    return np.select([(x >= 0) & (y >= 0), (x < 0) & (y >= 0), (x < 0) & (y < 0)], [0, 1, 2], 3)


def make_function_1d_data(
    config: Function1DConfig, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grid ``x (n,)``, true ``f (n,)`` and observations ``y = f + σ ε (n,)``."""
    x = np.linspace(config.x_min, config.x_max, config.n_points)
    f = function_1d(x)
    return x, f, f + config.noise_sigma * rng.standard_normal(config.n_points)


def make_function_2d_data(
    config: Function2DConfig, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grid inputs ``(n, 2)`` (``n = grid^2``, row-major in y then x), ``f (n,)``, ``y (n,)``."""
    axis = np.linspace(-1.0, 1.0, config.grid)
    yy, xx = np.meshgrid(axis, axis, indexing="ij")
    inputs = np.stack([xx.ravel(), yy.ravel()], axis=1)  # (grid*grid, 2)
    f = function_2d(inputs[:, 0], inputs[:, 1])
    return inputs, f, f + config.noise_sigma * rng.standard_normal(f.shape[0])


def render_letters(
    text: str, height: int, width: int, font_size: int, stroke_width: int = 0
) -> np.ndarray:
    """A binary image ``(height, width)``: each letter of ``text`` white (1) on black (0),
    centred in its own equal vertical section (Pillow's built-in font, no download;
    ``stroke_width`` thickens it to a bold face)."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=font_size)
    cell = width // len(text)
    for i, letter in enumerate(text):
        centre = (i * cell + cell / 2, height / 2)
        draw.text(
            centre,
            letter,
            fill=255,
            font=font,
            anchor="mm",
            stroke_width=stroke_width,
            stroke_fill=255,
        )
    return (np.asarray(image) >= 128).astype(np.float64)


def make_image_data(config: ImageConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pixel positions scaled to ``[-1, 1]^2`` ``(n, 2)`` as (column, row), colours
    ``(n,)`` and each pixel's section (letter) ``(n,)``, ``n = height * width``."""
    image = render_letters(
        config.text, config.height, config.width, config.font_size, config.stroke_width
    )
    rows, cols = np.meshgrid(np.arange(config.height), np.arange(config.width), indexing="ij")
    position = np.stack(
        [2 * cols.ravel() / (config.width - 1) - 1, 2 * rows.ravel() / (config.height - 1) - 1],
        axis=1,
    )  # (H*W, 2)
    section = cols.ravel() // (config.width // len(config.text))
    return position, image.ravel(), section


def partition_iid(
    n_points: int, n_clients: int, points: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each client draws ``points`` indices uniformly without replacement, independently
    of the other clients ("randomly select the same amount of data points")."""
    if points > n_points:
        raise ValueError(f"points per client ({points}) exceeds n_points ({n_points})")
    return [np.sort(rng.choice(n_points, size=points, replace=False)) for _ in range(n_clients)]


def partition_grouped(
    point_groups: np.ndarray,
    n_clients: int,
    main_points: int,
    other_points: int,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Non-IID split: clients in consecutive equal blocks per group (client ``c`` is in
    group ``c * G // n_clients``); each draws ``main_points`` from its group's points and
    ``other_points`` from all other groups' points, without replacement. Returns the
    per-client indices and the client groups ``(n_clients,)``."""
    n_groups = int(point_groups.max()) + 1
    client_groups = np.arange(n_clients) * n_groups // n_clients
    indices: list[np.ndarray] = []
    for group in client_groups:
        own = np.flatnonzero(point_groups == group)
        other = np.flatnonzero(point_groups != group)
        if main_points > own.size or other_points > other.size:
            raise ValueError(
                f"group {group} has {own.size} points and the others {other.size}; cannot "
                f"draw main_points={main_points}, other_points={other_points}"
            )
        picked = np.concatenate(
            [
                rng.choice(own, size=main_points, replace=False),
                rng.choice(other, size=other_points, replace=False),
            ]
        )
        indices.append(np.sort(picked))
    return indices, client_groups


def _grouped_data(
    config: Function1DConfig | Function2DConfig | ImageConfig,
    rng: np.random.Generator,
    inputs: np.ndarray,
    truth: np.ndarray,
    observed: np.ndarray,
    point_groups: np.ndarray,
) -> ExperimentData:
    """The points with :func:`partition_grouped`'s non-IID split by the ``config``'s
    client counts: what each experiment's grouped ``make_data`` ends with."""
    indices, groups = partition_grouped(
        point_groups, config.n_clients, config.main_points, config.other_points, rng
    )
    return ExperimentData(
        inputs=inputs,
        truth=truth,
        observed=observed,
        point_groups=point_groups,
        indices=indices,
        groups=groups,
    )


def _clients(
    inputs: np.ndarray,
    targets: np.ndarray,
    indices: list[np.ndarray],
    groups: np.ndarray,
    device: str,
) -> list[SNNClientData]:
    x = torch.as_tensor(inputs, dtype=torch.float32, device=device).reshape(len(inputs), -1)
    y = torch.as_tensor(targets, dtype=torch.float32, device=device).reshape(-1, 1)
    return [
        SNNClientData(
            x=x[torch.as_tensor(idx, device=device)],
            y=y[torch.as_tensor(idx, device=device)],
            group=int(g),
        )
        for idx, g in zip(indices, groups, strict=True)
    ]


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def predict_chunked(
    model: SNN,
    x: Tensor,
    *,
    n_paths: int,
    generator: torch.Generator,
    chunk: int = 2048,
    keep_samples: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Mean and std over ``n_paths`` paths for ``x (n, in)`` in chunks (bounded memory):
    ``(mean (n, out), std (n, out), samples (keep_samples, n, out))``."""
    means, stds, kept = [], [], []
    for start in range(0, x.shape[0], chunk):
        prediction = model.predict(x[start : start + chunk], n_paths=n_paths, generator=generator)
        means.append(prediction.mean)
        stds.append(prediction.std)
        kept.append(prediction.samples[:keep_samples])
    return torch.cat(means), torch.cat(stds), torch.cat(kept, dim=1)


# P(|ε| <= 2) for a standard Gaussian: what ``coverage_2sigma`` should be when calibrated
GAUSSIAN_2SIGMA_COVERAGE = math.erf(2 / math.sqrt(2))  # 0.9545


def regression_metrics(
    mean: np.ndarray, std: np.ndarray, truth: np.ndarray, observed: np.ndarray, sigma: float
) -> dict[str, float]:
    """MSE of the mean to the truth, predicted σ vs the true σ, 2σ coverage of the
    observations; all arrays ``(n,)``."""
    mse = float(np.mean((mean - truth) ** 2))
    sigma_pred = float(np.mean(std))
    return {
        "mse": mse,
        "mse_over_sigma2": mse / sigma**2,
        "sigma_true": sigma,
        "sigma_pred": sigma_pred,
        "sigma_rel_error": abs(sigma_pred - sigma) / sigma,
        "sigma_rel_error_pointwise": float(np.mean(np.abs(std - sigma))) / sigma,
        "coverage_2sigma": float(np.mean(np.abs(observed - mean) <= 2 * std)),
    }


def top_k_binary(scores: np.ndarray, k: int) -> np.ndarray:
    """The paper's top-K map: the ``k`` largest scores to 1, the rest to 0."""
    out = np.zeros(scores.shape, dtype=np.float64)
    if k > 0:
        out[np.argsort(scores, kind="stable")[-k:]] = 1.0
    return out


def segmentation_metrics(predicted: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Pixel accuracy and IoU of the white (1) pixels; arrays ``(n,)`` of 0/1."""
    p, t = predicted.astype(bool), truth.astype(bool)
    union = np.sum(p | t)
    return {
        "accuracy": float(np.mean(p == t)),
        "iou": float(np.sum(p & t) / union) if union else 1.0,
    }


# ---------------------------------------------------------------- regression metrics


def _regression_tracker(
    config: Function1DConfig | Function2DConfig, data: ExperimentData, x: Tensor
) -> RoundTracker | None:
    """Per-round global MSE and mean σ̂ on a subsample (cheap: 32 paths, at most 2,000
    points); None if ``config.track_rounds`` is off."""
    if not config.track_rounds:
        return None
    step = max(1, x.shape[0] // 2000)
    xs, ts = x[::step], data.truth[::step]
    generator = torch.Generator(device=config.device).manual_seed(config.seed + 2)

    def on_round(_: int, model: SNN) -> dict[str, float]:
        mean, std, _s = predict_chunked(model, xs, n_paths=32, generator=generator)
        m, s = mean[:, 0].cpu().numpy(), std[:, 0].cpu().numpy()
        return {"global_mse": float(np.mean((m - ts) ** 2)), "global_sigma": float(np.mean(s))}

    return on_round


def _global_and_local(
    predictions: Mapping[str, Prediction], score: Callable[[Prediction], dict[str, float]]
) -> dict[str, float]:
    """``score`` of the global model, then of the (one) local model with its keys
    prefixed ``local_``."""
    metrics: dict[str, float] = {}
    for key, prediction in predictions.items():
        prefix = "" if key == "global" else "local_"
        metrics.update({prefix + name: value for name, value in score(prediction).items()})
    return metrics


def _quadrant_mse(mean: np.ndarray, data: ExperimentData) -> dict[str, float]:
    """2-D: the MSE of ``mean (n,)`` to the truth in each quadrant (``data.point_groups``)."""
    metrics: dict[str, float] = {}
    for q in range(4):
        inside = data.point_groups == q
        metrics[f"mse_quadrant_{q + 1}"] = float(np.mean((mean[inside] - data.truth[inside]) ** 2))
    return metrics


JUMP_BAND = 0.1  # 2-D: points this close to an axis are "near the jumps" (10 % of a side)


def _jump_mse_over_sigma2(mean: np.ndarray, data: ExperimentData, sigma: float) -> dict[str, float]:
    """2-D: where the error is, MSE / σ² within :data:`JUMP_BAND` of an axis (the jumps)
    and away from them."""
    inputs, truth = data.inputs, data.truth
    near = (np.abs(inputs[:, 0]) < JUMP_BAND) | (np.abs(inputs[:, 1]) < JUMP_BAND)
    metrics: dict[str, float] = {}
    for where, mask in (("near_jumps", near), ("away_from_jumps", ~near)):
        mse = float(np.mean((mean[mask] - truth[mask]) ** 2))
        metrics[f"mse_over_sigma2_{where}"] = mse / sigma**2
    return metrics


# ---------------------------------------------------------------- the runner


def _predict(model: SNN, x: Tensor, *, n_paths: int, generator: torch.Generator) -> Prediction:
    """``model``'s first output on ``x (n, in_dim)`` over ``n_paths`` paths, as arrays."""
    mean, std, samples = predict_chunked(
        model, x, n_paths=n_paths, generator=generator, keep_samples=1
    )
    return Prediction(
        mean=mean[:, 0].cpu().numpy(),
        std=std[:, 0].cpu().numpy(),
        sample=samples[0, :, 0].cpu().numpy(),
    )


def run_config(config: ExperimentConfig, *, name: str) -> ExperimentResult:
    """Run one experiment: its data, FedStNN from a common initial model, the
    ``local_clients`` trained alone from the same model, and every model's predictions
    on all points and metrics (``config.evaluate``)."""
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, 0xDA7A]))
    data = config.make_data(rng)
    clients = _clients(data.inputs, data.observed, data.indices, data.groups, config.device)
    x = torch.as_tensor(data.inputs, dtype=torch.float32, device=config.device)  # (n, in_dim)
    init = torch.Generator().manual_seed(config.seed)
    architecture = dataclasses.replace(config.model, in_dim=x.shape[1], out_dim=1)
    model = SNN(architecture, generator=init).to(config.device)
    initial = copy.deepcopy(model)
    federation = config.federation
    on_round = config.round_tracker(data, x)
    result = run_federation(model, clients, federation, seed=config.seed, on_round=on_round)
    local_models = {
        key: train_standalone(initial, clients[c], federation, seed=config.seed, client=c)
        for key, c in config.local_clients(data).items()
    }
    evaluation = torch.Generator(device=config.device).manual_seed(config.seed + 1)
    predictions = {
        key: _predict(net, x, n_paths=config.eval_paths, generator=evaluation)
        for key, net in {"global": result.model, **local_models}.items()
    }
    return ExperimentResult(
        name=name,
        metrics=config.evaluate(data, predictions),
        history=result.history,
        global_model=result.model,
        local_models=local_models,
        data=data,
        predictions=predictions,
        config=config,
    )


# ---------------------------------------------------------------- presets

# The two training recipes. ``smp`` is the paper's Algorithm 3 as far as the extracted text
# gives it: the sample-wise SMP gradient (Eqs. 32-35), plain gradient descent (Eq. 36: a
# fixed step, no momentum, no decay, one step size for both networks), one noise sample
# per iteration, the squared-error cost (Eq. 15; federated.fedstnn.losses). Full batch, so
# an epoch is one iteration, and both recipes get the presets' iteration budget. The step
# size is not recoverable from the text: 0.3, the largest stable one of 0.05, 0.2, 0.3,
# 0.5 and 1.5 on 1-D IID (seed 0; 0.5 and 1.5 diverge to NaN). ``autograd`` is this project's
# variant: autograd with Adam, lr decay, a 0.3x diffusion step, K = 16 paths and the
# energy score (FEDERATION and MODEL above, tuned on one seed).
TRAINERS: dict[str, dict[str, Any]] = {
    "autograd": {},
    "smp": {
        "federation": {
            "lr_decay": 1.0,
            "local": {
                "gradient": "smp",
                "optimizer": "sgd",
                "momentum": 0.0,
                "lr": 0.3,
                "diffusion_lr_scale": 1.0,
                "loss": "squared_error",
            },
        },
        "model": {"n_paths": 1},
    },
}

EXPERIMENTS: dict[str, ExperimentConfig] = {
    "1d_iid": Function1DConfig(partition="iid", main_points=100, other_points=0),
    "1d_noniid_110": Function1DConfig(partition="noniid", main_points=100, other_points=10),
    "1d_noniid_60": Function1DConfig(partition="noniid", main_points=50, other_points=10),
    "2d": Function2DConfig(),
    "image": ImageConfig(),
}


def experiment_config(name: str, **overrides: Any) -> ExperimentConfig:
    """The preset ``name`` (a key of :data:`EXPERIMENTS`) trained by its ``trainer``'s
    recipe (:data:`TRAINERS`), with ``overrides`` on top: top-level fields, and nested
    ones as mappings (``federation={"rounds": 3, "local": {"epochs": 2}}``)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; available: {', '.join(EXPERIMENTS)}")
    trainer = overrides.get("trainer", EXPERIMENTS[name].trainer)
    if trainer not in TRAINERS:
        raise ValueError(f"unknown trainer {trainer!r}; available: {', '.join(TRAINERS)}")
    preset = replaced(EXPERIMENTS[name], TRAINERS[trainer])
    return replaced(preset, overrides)


def replaced(settings: Any, changes: Mapping[str, Any], path: str = "") -> Any:
    """The frozen dataclass ``settings`` with ``changes``: a mapping given for a field that
    holds a dataclass changes that one's fields in turn; an unknown name or a bad value is
    refused in one line that names it by its path (``federation.local.epochs``)."""
    fields = {f.name for f in dataclasses.fields(settings)}
    values = {}
    for key, value in changes.items():
        if key not in fields:
            raise ValueError(
                f"{path}{key} is not a setting here; allowed: {', '.join(sorted(fields))}"
            )
        current = getattr(settings, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, Mapping):
                inner = ", ".join(f.name for f in dataclasses.fields(current))
                raise ValueError(
                    f"{path}{key} takes a mapping of its settings ({inner}), got {value!r}"
                )
            value = replaced(current, value, f"{path}{key}.")
        values[key] = value
    try:
        return dataclasses.replace(settings, **values)
    except ValueError as error:  # the nested settings' own check, named by its path
        raise ValueError(f"{path.removesuffix('.')}: {error}" if path else str(error)) from None


def run_experiment(name: str, **overrides: Any) -> ExperimentResult:
    """Run the preset ``name`` (a key of :data:`EXPERIMENTS`) with ``overrides`` (see
    :func:`experiment_config`)."""
    return run_config(experiment_config(name, **overrides), name=name)
