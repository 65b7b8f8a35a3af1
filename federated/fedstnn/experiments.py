"""The FedStNN paper's three experiments (Sec. 5): data generators and runners.

Each runner takes a frozen config dataclass (sizes, rounds, epochs, lr, seed, device) and
returns an :class:`ExperimentResult`: plain metrics, per-round history, the trained global
and local models and matplotlib Figures. Nothing here writes files, seeds global RNGs or
reads params; ``seed`` drives one ``numpy.random.Generator`` for the data and
``torch.Generator`` objects for the model and the noise. matplotlib and Pillow are
imported only where figures or the letter image are made.

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

The ``autograd`` trainer's defaults (the fields below; ``smp``, the paper's recipe, is
:data:`TRAINERS`), tuned on the 1-D non-IID settings, one seed, CPU: local
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

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor

from federated.fedstnn.train import (
    ClientData,
    FederationConfig,
    LocalTrainConfig,
    run_federation,
    train_standalone,
)
from models.snn import SNN, SNNConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "EXPERIMENTS",
    "GAUSSIAN_2SIGMA_COVERAGE",
    "TRAINERS",
    "ExperimentConfig",
    "ExperimentResult",
    "Function1DConfig",
    "Function2DConfig",
    "ImageConfig",
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
    "run_experiment",
    "run_function_1d",
    "run_function_2d",
    "run_image",
    "segmentation_metrics",
    "top_k_binary",
]


# ---------------------------------------------------------------- configs


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """Settings shared by the three experiments (federation, local training, model, eval)."""

    # federation
    n_clients: int = 100  # clients in total
    fraction: float = 0.1  # C: share of clients sampled each round
    rounds: int = 10  # communication rounds
    drift_rule: str = "fedavg"  # aggregation rule for the drift network (+ lift, read-out)
    drift_rule_params: Mapping[str, Any] = field(default_factory=dict)
    diffusion_rule: str = "fedavg"  # aggregation rule for the diffusion network
    diffusion_rule_params: Mapping[str, Any] = field(default_factory=dict)
    # local training: ``trainer`` names the recipe (TRAINERS) the fields below start from
    trainer: Literal["autograd", "smp"] = "autograd"
    epochs: int = 100  # passes over the local data per round (one step each if full batch)
    batch_size: int | None = None  # None: full batch
    lr: float = 1e-2  # local step size in round 0
    optimizer: Literal["adam", "sgd"] = "adam"  # local optimiser (fresh each round)
    momentum: float = 0.9  # SGD only
    diffusion_lr_scale: float = 0.3  # the diffusion's lr relative to lr (see module doc)
    lr_decay: float = 0.7  # lr in round r: lr * lr_decay**r (late rounds: small moves)
    train_paths: int = 16  # K sample paths per training step
    loss: str = "energy_score"  # scoring rule (federated.fedstnn.losses)
    gradient: Literal["autograd", "smp"] = "autograd"  # same gradient; autograd is faster
    # model (SNNConfig)
    state_dim: int = 8  # SDE state width d
    hidden_dim: int = 32  # hidden width of each block's f and g
    n_blocks: int = 5  # residual blocks N (Euler–Maruyama steps)
    horizon: float = 1.0  # T
    diffusion_init: float = 0.3  # initial diffusion g
    activation: str = "relu"  # tanh is ~10x slower on CPU for the same fit here
    fourier_features: int = 0  # Fourier features of the input in the lift (0: linear lift)
    # evaluation and reproducibility
    eval_paths: int = 256  # K paths when evaluating the trained models
    track_rounds: bool = True  # evaluate the global model after every round (history)
    figures: bool = True  # build matplotlib figures
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.n_clients < 1:
            raise ValueError(f"n_clients must be >= 1, got {self.n_clients}")
        if self.eval_paths < 2:
            raise ValueError(f"eval_paths must be >= 2, got {self.eval_paths}")
        if self.trainer not in TRAINERS:
            raise ValueError(f"trainer must be one of {', '.join(TRAINERS)}, got {self.trainer!r}")
        self.federation()  # validates the federation and local-training fields
        self.model_config(1, 1)  # validates the model fields

    def federation(self) -> FederationConfig:
        local = LocalTrainConfig(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            optimizer=self.optimizer,
            momentum=self.momentum,
            diffusion_lr_scale=self.diffusion_lr_scale,
            n_paths=self.train_paths,
            loss=self.loss,
            gradient=self.gradient,
        )
        return FederationConfig(
            rounds=self.rounds,
            fraction=self.fraction,
            lr_decay=self.lr_decay,
            drift_rule=self.drift_rule,
            drift_rule_params=dict(self.drift_rule_params),
            diffusion_rule=self.diffusion_rule,
            diffusion_rule_params=dict(self.diffusion_rule_params),
            local=local,
        )

    def model_config(self, in_dim: int, out_dim: int) -> SNNConfig:
        return SNNConfig(
            in_dim=in_dim,
            out_dim=out_dim,
            state_dim=self.state_dim,
            hidden_dim=self.hidden_dim,
            n_blocks=self.n_blocks,
            horizon=self.horizon,
            n_paths=self.train_paths,
            diffusion_init=self.diffusion_init,
            activation=self.activation,
            fourier_features=self.fourier_features,
        )


@dataclass(frozen=True, kw_only=True)
class Function1DConfig(ExperimentConfig):
    """Sec. 5.1: ``y = sin(2πx) + σ ε`` on 10,000 points of ``[-1, 1]``."""

    n_points: int = 10_000  # grid points on [x_min, x_max]
    x_min: float = -1.0
    x_max: float = 1.0
    noise_sigma: float = 0.2  # σ of the Gaussian observation noise
    partition: Literal["iid", "noniid"] = "iid"
    n_groups: int = 10  # non-IID: client groups = data groups (consecutive intervals)
    main_points: int = 100  # IID: points per client; non-IID: from the client's own group
    other_points: int = 10  # non-IID: points from the other groups (0 for IID)
    local_client: int = 0  # the client whose stand-alone model is shown beside the global

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.partition not in ("iid", "noniid"):
            raise ValueError(f"partition must be 'iid' or 'noniid', got {self.partition!r}")
        if not self.noise_sigma > 0:
            raise ValueError(f"noise_sigma must be > 0, got {self.noise_sigma}")
        if not 0 <= self.local_client < self.n_clients:
            raise ValueError(
                f"local_client must be in [0, {self.n_clients}), got {self.local_client}"
            )


@dataclass(frozen=True, kw_only=True)
class Function2DConfig(ExperimentConfig):
    """Sec. 5.2: the piecewise :func:`function_2d` on a grid of ``[-1, 1]^2``, 4 groups."""

    n_clients: int = 40  # 4 groups of 10
    fraction: float = 0.25
    grid: int = 100  # points per axis (grid x grid observations)
    noise_sigma: float = 0.1
    main_points: int = 200  # per client, from its group's quadrant
    other_points: int = 30  # per client, from the other three quadrants together
    local_client: int = 0
    slice_y: float = 0.5  # the fixed y of the first slice plot
    slice_x: float = -0.5  # the fixed x of the second slice plot

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.noise_sigma > 0:
            raise ValueError(f"noise_sigma must be > 0, got {self.noise_sigma}")


@dataclass(frozen=True, kw_only=True)
class ImageConfig(ExperimentConfig):
    """Sec. 5.3: a binary image of three letters, one client group per letter."""

    text: str = "FSU"  # one letter per section and client group
    height: int = 32  # pixels
    width: int = 96  # pixels (split into len(text) equal sections)
    font_size: int = 28
    stroke_width: int = 2  # bold letters (~7 px strokes); thin strokes make IoU a contour test
    n_clients: int = 30  # len(text) groups of 10
    fraction: float = 0.3
    main_points: int = 300  # pixels per client from its own letter's section
    other_points: int = 30  # pixels per client from the other sections together
    hidden_dim: int = 64
    state_dim: int = 16
    diffusion_init: float = 0.1
    fourier_features: int = 5  # pixel positions need high frequencies (sharp letter edges)
    train_paths: int = 8  # the image has no noise to resolve; fewer paths, cheaper steps

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.text) < 1:
            raise ValueError("text must hold at least one letter")
        if self.width % len(self.text):
            raise ValueError(
                f"width {self.width} must be divisible by len(text) = {len(self.text)}"
            )


@dataclass
class ExperimentResult:
    """What a runner returns; the caller logs it (MLflow) and saves figures."""

    name: str
    metrics: dict[str, float]
    history: list[dict[str, Any]]
    global_model: SNN
    local_models: dict[str, SNN]
    figures: dict[str, Figure]
    config: ExperimentConfig


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


def _clients(
    inputs: np.ndarray,
    targets: np.ndarray,
    indices: list[np.ndarray],
    groups: np.ndarray,
    device: str,
) -> list[ClientData]:
    x = torch.as_tensor(inputs, dtype=torch.float32, device=device).reshape(len(inputs), -1)
    y = torch.as_tensor(targets, dtype=torch.float32, device=device).reshape(-1, 1)
    return [
        ClientData(
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


# ---------------------------------------------------------------- runners


def _setup(
    config: ExperimentConfig, in_dim: int
) -> tuple[np.random.Generator, SNN, torch.Generator]:
    """Data RNG, the common initial model, and the evaluation generator, all from ``seed``."""
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, 0xDA7A]))
    init = torch.Generator().manual_seed(config.seed)
    model = SNN(config.model_config(in_dim, 1), generator=init).to(config.device)
    evaluation = torch.Generator(device=config.device).manual_seed(config.seed + 1)
    return rng, model, evaluation


def _tracker(
    x: Tensor, truth: np.ndarray, sigma: float, config: ExperimentConfig
) -> Callable[[int, SNN], dict[str, float]] | None:
    """Per-round global metrics on a subsample (cheap: 32 paths, at most 2,000 points)."""
    if not config.track_rounds:
        return None
    step = max(1, x.shape[0] // 2000)
    xs, ts = x[::step], truth[::step]
    generator = torch.Generator(device=config.device).manual_seed(config.seed + 2)

    def on_round(_: int, model: SNN) -> dict[str, float]:
        mean, std, _s = predict_chunked(model, xs, n_paths=32, generator=generator)
        m, s = mean[:, 0].cpu().numpy(), std[:, 0].cpu().numpy()
        return {"global_mse": float(np.mean((m - ts) ** 2)), "global_sigma": float(np.mean(s))}

    return on_round


def run_function_1d(config: Function1DConfig) -> ExperimentResult:
    """Sec. 5.1, IID or non-IID: FedStNN on the noisy 1-D function."""
    rng, model, evaluation = _setup(config, in_dim=1)
    x, f, y = make_function_1d_data(config, rng)
    if config.partition == "iid":
        indices = partition_iid(config.n_points, config.n_clients, config.main_points, rng)
        groups = np.zeros(config.n_clients, dtype=np.int64)
    else:
        point_groups = np.arange(config.n_points) * config.n_groups // config.n_points
        indices, groups = partition_grouped(
            point_groups, config.n_clients, config.main_points, config.other_points, rng
        )
    clients = _clients(x, y, indices, groups, config.device)
    x_all = torch.as_tensor(x, dtype=torch.float32, device=config.device).reshape(-1, 1)
    federation = config.federation()

    initial = SNN(model.config).to(config.device)
    initial.load_state_dict(model.state_dict())
    result = run_federation(
        model,
        clients,
        federation,
        seed=config.seed,
        on_round=_tracker(x_all, f, config.noise_sigma, config),
    )
    local = train_standalone(
        initial,
        clients[config.local_client],
        federation,
        seed=config.seed,
        client=config.local_client,
    )

    metrics: dict[str, float] = {}
    predictions: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for prefix, net in (("", result.model), ("local_", local)):
        mean, std, _ = predict_chunked(net, x_all, n_paths=config.eval_paths, generator=evaluation)
        m, s = mean[:, 0].cpu().numpy(), std[:, 0].cpu().numpy()
        predictions[prefix] = (m, s)
        for key, value in regression_metrics(m, s, f, y, config.noise_sigma).items():
            metrics[prefix + key] = value
    name = (
        "1d_iid"
        if config.partition == "iid"
        else f"1d_noniid_{config.main_points + config.other_points}"
    )
    figures = _figures_1d(config, x, f, y, indices, groups, predictions) if config.figures else {}
    return ExperimentResult(
        name=name,
        metrics=metrics,
        history=result.history,
        global_model=result.model,
        local_models={f"client_{config.local_client}": local},
        figures=figures,
        config=config,
    )


JUMP_BAND = 0.1  # 2-D: points this close to an axis are "near the jumps" (10 % of a side)


def run_function_2d(config: Function2DConfig) -> ExperimentResult:
    """Sec. 5.2: FedStNN on the piecewise 2-D function, one client group per quadrant."""
    rng, model, evaluation = _setup(config, in_dim=2)
    inputs, f, y = make_function_2d_data(config, rng)
    point_groups = quadrant(inputs[:, 0], inputs[:, 1])
    indices, groups = partition_grouped(
        point_groups, config.n_clients, config.main_points, config.other_points, rng
    )
    clients = _clients(inputs, y, indices, groups, config.device)
    x_all = torch.as_tensor(inputs, dtype=torch.float32, device=config.device)
    federation = config.federation()

    initial = SNN(model.config).to(config.device)
    initial.load_state_dict(model.state_dict())
    result = run_federation(
        model,
        clients,
        federation,
        seed=config.seed,
        on_round=_tracker(x_all, f, config.noise_sigma, config),
    )
    local = train_standalone(
        initial,
        clients[config.local_client],
        federation,
        seed=config.seed,
        client=config.local_client,
    )

    metrics: dict[str, float] = {}
    predictions: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for prefix, net in (("", result.model), ("local_", local)):
        mean, std, samples = predict_chunked(
            net, x_all, n_paths=config.eval_paths, generator=evaluation, keep_samples=1
        )
        m, s = mean[:, 0].cpu().numpy(), std[:, 0].cpu().numpy()
        predictions[prefix] = (m, s, samples[0, :, 0].cpu().numpy())
        for key, value in regression_metrics(m, s, f, y, config.noise_sigma).items():
            metrics[prefix + key] = value
        for q in range(4):
            inside = point_groups == q
            metrics[f"{prefix}mse_quadrant_{q + 1}"] = float(np.mean((m[inside] - f[inside]) ** 2))
        # where the error is: within JUMP_BAND of an axis (the jumps) or away from them
        near = (np.abs(inputs[:, 0]) < JUMP_BAND) | (np.abs(inputs[:, 1]) < JUMP_BAND)
        for where, mask in (("near_jumps", near), ("away_from_jumps", ~near)):
            mse = float(np.mean((m[mask] - f[mask]) ** 2))
            metrics[f"{prefix}mse_over_sigma2_{where}"] = mse / config.noise_sigma**2
    figures = _figures_2d(config, inputs, f, y, predictions) if config.figures else {}
    return ExperimentResult(
        name="2d",
        metrics=metrics,
        history=result.history,
        global_model=result.model,
        local_models={f"client_{config.local_client}": local},
        figures=figures,
        config=config,
    )


def run_image(config: ImageConfig) -> ExperimentResult:
    """Sec. 5.3: FedStNN on a binary letter image, one client group per letter; the
    global model vs the first client of each group trained alone."""
    rng, model, evaluation = _setup(config, in_dim=2)
    position, colour, section = make_image_data(config)
    indices, groups = partition_grouped(
        section, config.n_clients, config.main_points, config.other_points, rng
    )
    clients = _clients(position, colour, indices, groups, config.device)
    x_all = torch.as_tensor(position, dtype=torch.float32, device=config.device)
    federation = config.federation()
    n_white = int(colour.sum())

    initial = SNN(model.config).to(config.device)
    initial.load_state_dict(model.state_dict())
    on_round = None
    if config.track_rounds:
        generator = torch.Generator(device=config.device).manual_seed(config.seed + 2)

        def on_round(_: int, net: SNN) -> dict[str, float]:
            mean, _s, _k = predict_chunked(net, x_all, n_paths=32, generator=generator)
            binary = top_k_binary(mean[:, 0].cpu().numpy(), n_white)
            return {"global_iou": segmentation_metrics(binary, colour)["iou"]}

    result = run_federation(model, clients, federation, seed=config.seed, on_round=on_round)
    first_of_group = [int(np.flatnonzero(groups == g)[0]) for g in range(len(config.text))]
    locals_ = {
        f"group_{g}_{config.text[g]}": train_standalone(
            initial, clients[c], federation, seed=config.seed, client=c
        )
        for g, c in enumerate(first_of_group)
    }

    metrics: dict[str, float] = {"white_pixels": float(n_white)}
    images: dict[str, np.ndarray] = {}
    for key, net in {"global": result.model, **locals_}.items():
        mean, std, _ = predict_chunked(net, x_all, n_paths=config.eval_paths, generator=evaluation)
        binary = top_k_binary(mean[:, 0].cpu().numpy(), n_white)
        images[key] = binary.reshape(config.height, config.width)
        for name, value in segmentation_metrics(binary, colour).items():
            metrics[f"{key}_{name}"] = value
        metrics[f"{key}_sigma_pred"] = float(std.mean())
    best_local = max(metrics[f"{k}_iou"] for k in locals_)
    metrics["iou_margin_over_best_local"] = metrics["global_iou"] - best_local
    figures = (
        _figures_image(
            config, colour.reshape(config.height, config.width), images, position, indices
        )
        if config.figures
        else {}
    )
    return ExperimentResult(
        name="image",
        metrics=metrics,
        history=result.history,
        global_model=result.model,
        local_models=locals_,
        figures=figures,
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
# energy score (the fields' defaults above, tuned on one seed).
TRAINERS: dict[str, dict[str, Any]] = {
    "autograd": {},
    "smp": {
        "gradient": "smp",
        "optimizer": "sgd",
        "momentum": 0.0,
        "lr": 0.3,
        "lr_decay": 1.0,
        "diffusion_lr_scale": 1.0,
        "train_paths": 1,
        "loss": "squared_error",
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
    recipe (:data:`TRAINERS`), with field ``overrides`` on top."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; available: {', '.join(EXPERIMENTS)}")
    trainer = overrides.get("trainer", EXPERIMENTS[name].trainer)
    if trainer not in TRAINERS:
        raise ValueError(f"unknown trainer {trainer!r}; available: {', '.join(TRAINERS)}")
    return dataclasses.replace(EXPERIMENTS[name], **(TRAINERS[trainer] | overrides))


def run_experiment(name: str, **overrides: Any) -> ExperimentResult:
    """Run the preset ``name`` (a key of :data:`EXPERIMENTS`) with field ``overrides``."""
    config = experiment_config(name, **overrides)
    if isinstance(config, Function1DConfig):
        result = run_function_1d(config)
    elif isinstance(config, Function2DConfig):
        result = run_function_2d(config)
    else:
        assert isinstance(config, ImageConfig)
        result = run_image(config)
    result.name = name
    return result


# ---------------------------------------------------------------- figures


def _figures_1d(
    config: Function1DConfig,
    x: np.ndarray,
    f: np.ndarray,
    y: np.ndarray,
    indices: list[np.ndarray],
    groups: np.ndarray,
    predictions: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> dict[str, Figure]:
    from matplotlib.figure import Figure

    data = Figure(figsize=(10, 3.5), layout="constrained")
    ax = data.subplots()
    ax.scatter(x, y, s=1, color="0.6", alpha=0.3, label="observations")
    ax.plot(x, f, color="tab:red", lw=1.5, label="true f")
    shown = [0, config.n_clients // 4] if config.n_clients > 1 else [0]
    for c in shown:
        ax.scatter(x[indices[c]], y[indices[c]], s=8, label=f"client {c} (group {groups[c]})")
    ax.set(xlabel="x", ylabel="y", title=f"data ({config.partition})")
    ax.legend(loc="upper right", fontsize=8, markerscale=2)

    fit = Figure(figsize=(12, 4), layout="constrained")
    axes = fit.subplots(1, 2, sharey=True)
    titles = {"": "global model", "local_": f"local model (client {config.local_client}, alone)"}
    for ax, (prefix, (m, s)) in zip(axes, predictions.items(), strict=True):
        ax.scatter(x, y, s=1, color="tab:purple", alpha=0.15, label="observations")
        ax.plot(x, f, color="tab:red", lw=1.2, label="true f")
        ax.plot(x, m, color="tab:blue", lw=1.2, label="predicted mean")
        ax.fill_between(x, m - 2 * s, m + 2 * s, color="tab:blue", alpha=0.25, label="mean ± 2σ̂")
        if prefix == "local_":
            own = indices[config.local_client]
            ax.scatter(x[own], y[own], s=6, color="black", label="its data")
        ax.set(xlabel="x", title=titles[prefix])
        ax.legend(loc="upper right", fontsize=8)
    axes[0].set_ylabel("y")
    return {"data": data, "fit": fit}


def _figures_2d(
    config: Function2DConfig,
    inputs: np.ndarray,
    f: np.ndarray,
    y: np.ndarray,
    predictions: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> dict[str, Figure]:
    from matplotlib.figure import Figure

    g = config.grid
    axis = np.linspace(-1.0, 1.0, g)
    mean, std, sample = predictions[""]
    surfaces = Figure(figsize=(14, 3.6), layout="constrained")
    panels = {
        "true f": f,
        "observations": y,
        "global mean": mean,
        "|mean - f|": np.abs(mean - f),
        "global σ̂": std,
    }
    for ax, (title, values) in zip(surfaces.subplots(1, len(panels)), panels.items(), strict=True):
        image = ax.imshow(
            values.reshape(g, g), origin="lower", extent=(-1, 1, -1, 1), cmap="viridis"
        )
        ax.set_title(title)
        surfaces.colorbar(image, ax=ax, shrink=0.8)

    slices = Figure(figsize=(12, 4), layout="constrained")
    row = int(np.argmin(np.abs(axis - config.slice_y)))
    col = int(np.argmin(np.abs(axis - config.slice_x)))
    cuts = {
        f"y = {axis[row]:.2f}": (np.arange(g) + row * g, inputs[:, 0], "x"),
        f"x = {axis[col]:.2f}": (np.arange(g) * g + col, inputs[:, 1], "y"),
    }
    sigma = config.noise_sigma
    for ax, (title, (idx, coord, label)) in zip(slices.subplots(1, 2), cuts.items(), strict=True):
        t = coord[idx]
        ax.plot(t, f[idx], color="tab:green", lw=1.5, label="true f")
        ax.fill_between(
            t, f[idx] - 2 * sigma, f[idx] + 2 * sigma, color="tab:green", alpha=0.2, label="f ± 2σ"
        )
        ax.scatter(t, y[idx], s=8, color="tab:red", label="observations")
        ax.scatter(t, sample[idx], s=8, color="black", label="global model samples")
        ax.plot(t, mean[idx], color="tab:blue", lw=1, label="global mean")
        ax.set(xlabel=label, title=title)
        ax.legend(fontsize=8)
    return {"surfaces": surfaces, "slices": slices}


def _figures_image(
    config: ImageConfig,
    truth: np.ndarray,
    images: Mapping[str, np.ndarray],
    position: np.ndarray,
    indices: list[np.ndarray],
) -> dict[str, Figure]:
    from matplotlib.figure import Figure

    panels = {"true image": truth, **images}
    recon = Figure(figsize=(3.2 * len(panels), 2.0), layout="constrained")
    for ax, (title, image) in zip(recon.subplots(1, len(panels)), panels.items(), strict=True):
        ax.imshow(image, cmap="gray", vmin=0, vmax=1)
        ax.set_title(title, fontsize=9)
        ax.set_axis_off()

    data = Figure(figsize=(8, 3), layout="constrained")
    ax = data.subplots()
    ax.imshow(truth, cmap="gray", vmin=0, vmax=1, alpha=0.4)
    per_group = config.n_clients // len(config.text)
    for g in range(len(config.text)):
        own = indices[g * per_group]
        cols = (position[own, 0] + 1) / 2 * (config.width - 1)
        rows = (position[own, 1] + 1) / 2 * (config.height - 1)
        ax.scatter(cols, rows, s=4, label=f"client {g * per_group} ({config.text[g]})")
    ax.set_title("pixels held by the first client of each group")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_axis_off()
    return {"reconstruction": recon, "data": data}
