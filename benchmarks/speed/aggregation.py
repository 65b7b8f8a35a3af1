"""Speed of every registered aggregation rule, beside the memory-read floor.

For each rule and client count n it times ``rule(updates, weights)`` on float32 updates
``(n, d)`` (fastest and median of the repeats; the machine may be shared, noise only adds
time) and prints it beside the read floor ``n * d * 4 bytes / B``, where B is the
measured copy bandwidth (bytes read + written per second by ``dst.copy_(src)``): no rule
can be faster than reading its input once. It also checks each rule's fast path against
a plain reference path written here (direct pairwise differences, full sorts,
``torch.nanquantile``, the Weiszfeld iteration on explicit distances, FedLag's direct
Gaussian sum over every midpoint, ...): relative error ``||fast - ref|| / ||ref||`` at
most 1e-5 in float32, on a slice of the parameters (all of them for the cheap rules).

Sizes (the issue's): on CUDA n = 10, 50, 100 with d = 11.2M (a ResNet-18); on CPU n = 50
with d = 1M. ``--quick``: CUDA n = 50 only; CPU d = 200k. Zeno is timed with a synthetic
quadratic-loss oracle (one extra pass over the updates). Run from the repository root:

    python -m benchmarks.speed.aggregation                      # the device torch sees first
    python -m benchmarks.speed.aggregation --device cpu --threads 1 --quick

On a shared, oversubscribed CPU use ``--threads 1`` (OpenMP hand-offs between more
threads than free cores dominate otherwise). Writes
``benchmarks/results/aggregation-<device>.json`` with the device, versions and date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aggregation import build_aggregator, list_aggregators
from benchmarks.common import versions

RESULTS = Path(__file__).resolve().parents[1] / "results"
TOLERANCE = 1e-5
# The H100 targets for n = 50, d = 11.2M, in ms (reported beside CUDA timings).
GPU_TARGETS_MS = {
    "fedavg": 1.5,
    "median": 15.0,
    "trimmed_mean": 15.0,
    "ema": 15.0,
    "krum": 5.0,
    "multi_krum": 5.0,
    "geometric_median": 30.0,
    "fedlag": 500.0,
}
Reference = Callable[[Tensor, Tensor, dict[str, Any]], Tensor]


def params_for(name: str, n: int) -> dict[str, Any]:
    """Hyperparameters for n clients: f = b = max(1, (n - 3) // 4) so Bulyan fits."""
    f = max(1, (n - 3) // 4)
    return {
        "trimmed_mean": {"f": f},
        "krum": {"f": f},
        "multi_krum": {"f": f},
        "bulyan": {"f": f},
        "zeno": {"b": f},
    }.get(name, {})


def quadratic_oracle(target: Tensor) -> Callable[[Tensor], Tensor]:
    def oracle(candidates: Tensor) -> Tensor:
        return 0.5 * (candidates - target).square().sum(dim=1)

    return oracle


def call(name: str, params: dict[str, Any], updates: Tensor, weights: Tensor) -> Tensor:
    rule = build_aggregator(name, **params)
    if rule.requires_oracle:
        oracle = quadratic_oracle(torch.zeros_like(updates[0]))
        return rule.step(rule.init_state(), updates, weights, oracle=oracle)[0]
    return rule(updates, weights)


# --- reference paths: plain formulas, independent of the rules' implementations --------


def ref_fedavg(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    return (w[:, None] * x).sum(dim=0) / w.sum()


def ref_median(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    return torch.quantile(x.double(), 0.5, dim=0).float()


def ref_trimmed_mean(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    f = p["f"]
    return torch.sort(x.double(), dim=0).values[f : x.shape[0] - f].mean(dim=0).float()


def direct_sq_distances(x: Tensor) -> Tensor:
    x64 = x.double()
    return torch.stack([(x64 - row).square().sum(dim=1) for row in x64])


def krum_order(dist: Tensor, f: int) -> Tensor:
    n = dist.shape[0]
    others = dist + torch.diag(torch.full((n,), math.inf, dtype=dist.dtype, device=dist.device))
    scores = torch.sort(others, dim=1).values[:, : max(n - f - 2, 0)].sum(dim=1)
    # Equal scores (one neighbour: mutual nearest pairs) go to the smaller total distance.
    by_total = torch.argsort(dist.sum(dim=1), stable=True)
    return by_total[torch.argsort(scores[by_total], stable=True)]


def ref_krum(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    return x[krum_order(direct_sq_distances(x), p["f"])[0]]


def ref_multi_krum(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    m = x.shape[0] - p["f"]
    return x[krum_order(direct_sq_distances(x), p["f"])[:m]].double().mean(dim=0).float()


def ref_bulyan(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    f, n = p["f"], x.shape[0]
    dist = direct_sq_distances(x)
    remaining, chosen = list(range(n)), []
    for _ in range(n - 2 * f):
        sub = dist[remaining][:, remaining]
        chosen.append(remaining.pop(int(krum_order(sub, f)[0])))
    selected = x[sorted(chosen)].double()
    median = torch.quantile(selected, 0.5, dim=0)
    nearest = (selected - median).abs().topk(n - 4 * f, dim=0, largest=False).indices
    return selected.gather(0, nearest).mean(dim=0).float()


def ref_geometric_median(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    x64, alpha = x.double(), (w / w.sum()).double()
    z = alpha @ x64
    for _ in range(p["max_iter"]):
        dist = (x64 - z).square().sum(dim=1).sqrt()
        beta = alpha / dist.clamp_min(p.get("nu", 1e-6))
        z = (beta / beta.sum()) @ x64
    return z.float()


def ref_centered_clipping(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    x64 = x.double()
    v = torch.zeros_like(x64[0])
    for _ in range(p.get("n_iter", 1)):
        diffs = x64 - v
        norms = diffs.square().sum(dim=1).sqrt()
        v = v + (diffs * (p.get("tau", 10.0) / norms).clamp(max=1.0)[:, None]).mean(dim=0)
    return v.float()


def ref_ema(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    x64, k = x.double(), p.get("k", 1.5)
    q1, q3 = torch.quantile(x64, 0.25, dim=0), torch.quantile(x64, 0.75, dim=0)
    inside = (x64 >= q1 - k * (q3 - q1)) & (x64 <= q3 + k * (q3 - q1))
    kept = torch.where(inside, x64, math.nan)
    k1, m, k3 = (torch.nanquantile(kept, q, dim=0) for q in (0.25, 0.5, 0.75))
    weight = 0.70 + 0.39 / inside.sum(dim=0)
    return (weight * (k1 + k3) / 2 + (1 - weight) * m).float()


def ref_fedlag(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    values = x.double().T  # (c, n)
    n = values.shape[1]
    weights = (w / w.sum()).double()
    var = values.var(dim=1, unbiased=False, keepdim=True) + p.get("eps", 1e-12)
    i, j = torch.triu_indices(n, n, 1, device=x.device)
    out = []
    for start in range(0, values.shape[0], 64):
        v, s2 = values[start : start + 64], var[start : start + 64]
        cand = (v[:, i] + v[:, j]) / 2  # (c, C)
        score = (
            weights * torch.exp(-((cand[:, :, None] - v[:, None, :]) ** 2) / (2 * s2[:, :, None]))
        ).sum(2)
        best = score.max(dim=1, keepdim=True).values
        out.append(torch.where(score >= best * (1 - 1e-12), cand, math.inf).min(dim=1).values)
    return torch.cat(out).float()


def ref_zeno(x: Tensor, w: Tensor, p: dict[str, Any]) -> Tensor:
    x64 = x.double()
    losses = 0.5 * x64.square().sum(dim=1)  # the oracle with target 0; base loss 0
    scores = -losses - p.get("rho", 5e-4) * x64.square().sum(dim=1)
    keep = scores.argsort(descending=True, stable=True)[: x.shape[0] - p["b"]]
    return x64[keep].mean(dim=0).float()


REFERENCES: dict[str, tuple[Reference, int]] = {  # rule -> (reference, columns checked)
    "fedavg": (ref_fedavg, 1 << 20),
    "median": (ref_median, 1 << 17),
    "trimmed_mean": (ref_trimmed_mean, 1 << 17),
    "krum": (ref_krum, 1 << 17),
    "multi_krum": (ref_multi_krum, 1 << 17),
    "bulyan": (ref_bulyan, 1 << 16),
    "geometric_median": (ref_geometric_median, 1 << 16),
    "centered_clipping": (ref_centered_clipping, 1 << 17),
    "ema": (ref_ema, 1 << 16),
    "fedlag": (ref_fedlag, 1 << 10),
    "zeno": (ref_zeno, 1 << 17),
}
# The geometric median is compared after a fixed number of iterations on both paths.
CHECK_OVERRIDES: dict[str, dict[str, Any]] = {"geometric_median": {"tol": 0.0, "max_iter": 50}}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, n_bytes: int) -> float:
    """Bytes read + written per second by a large device-to-device copy (best of 5)."""
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def read_bandwidth(device: torch.device, n_bytes: int) -> float:
    """Bytes read per second by a large reduction (best of 5): the floor's other yardstick
    (on one CPU thread a copy runs well below the read rate)."""
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    best = math.inf
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        src.sum()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return src.numel() * 4 / best


def time_rule(
    name: str, params: dict[str, Any], updates: Tensor, weights: Tensor, repeats: int
) -> list[float]:
    device = updates.device
    call(name, params, updates[:, : min(updates.shape[1], 4096)], weights)  # warm-up
    times: list[float] = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        call(name, params, updates, weights)
        synchronize(device)
        times.append(time.perf_counter() - start)
        if times[-1] > 10.0:  # one run of a slow rule is enough
            break
    return times


def check_rule(
    name: str, params: dict[str, Any], updates: Tensor, weights: Tensor
) -> dict[str, Any]:
    if name not in REFERENCES:
        return {"d": 0, "rel_err": None, "ok": None}
    reference, columns = REFERENCES[name]
    sub = updates[:, : min(columns, updates.shape[1])].contiguous()
    checked = {**params, **CHECK_OVERRIDES.get(name, {})}
    fast = call(name, checked, sub, weights).double()
    ref = reference(sub, weights, checked).double()
    rel = float((fast - ref).norm() / ref.norm().clamp_min(1e-30))
    return {"d": sub.shape[1], "rel_err": rel, "ok": rel <= TOLERANCE}


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--quick", action="store_true", help="CUDA: n = 50 only; CPU: d = 200k")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=None, help="default: 3 on CPU, 10 on CUDA")
    parser.add_argument("--rules", nargs="*", default=None, help="default: every registered rule")
    parser.add_argument(
        "--ns", type=int, nargs="*", default=None, help="override the client counts"
    )
    parser.add_argument("--d", type=int, default=None, help="override the parameter count")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _sizes(args: argparse.Namespace, kind: str) -> tuple[tuple[int, ...], int]:
    """The client counts and the parameter count: the issue's, or the overrides."""
    if kind == "cuda":
        ns, d = ((50,) if args.quick else (10, 50, 100)), 11_200_000
    else:
        ns, d = (50,), (200_000 if args.quick else 1_000_000)
    return tuple(args.ns or ns), args.d or d


def measure(
    name: str, updates: Tensor, weights: Tensor, floor: float, repeats: int
) -> dict[str, Any]:
    """Time and check rule ``name`` on ``updates`` ``(n, d)``; print and return its row."""
    n, d = updates.shape
    params = params_for(name, n)
    times = time_rule(name, params, updates, weights, repeats)
    check = check_rule(name, params, updates, weights)
    best, median = min(times), statistics.median(times)
    status = (
        "-" if check["ok"] is None else f"{'ok' if check['ok'] else 'FAIL'} {check['rel_err']:.1e}"
    )
    print(
        f"{name:<18} {n:>4} {d:>9} {best * 1e3:>10.1f} {median * 1e3:>10.1f} "
        f"{floor * 1e3:>9.2f} {best / floor:>8.1f}  {status} (d={check['d']})",
        flush=True,
    )
    row: dict[str, Any] = {
        "rule": name,
        "n": n,
        "d": d,
        "params": params,
        "min_ms": best * 1e3,
        "median_ms": median * 1e3,
        "repeats": len(times),
        "floor_ms": floor * 1e3,
        "x_floor": best / floor,
        "check": check,
    }
    if updates.device.type == "cuda" and n == 50 and name in GPU_TARGETS_MS:
        row["target_ms"] = GPU_TARGETS_MS[name]
    return row


def _device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"kind": device.type, "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
    else:
        info["processor"] = platform.processor() or platform.machine()
        info["platform"] = platform.platform()
    return info


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(kind)
    if args.threads:
        torch.set_num_threads(args.threads)
    ns, d = _sizes(args, kind)
    repeats = args.repeats or (10 if kind == "cuda" else 3)
    rules = args.rules or list_aggregators()

    bandwidth = copy_bandwidth(device, min(1 << 30, max(ns) * d * 4))
    reading = read_bandwidth(device, min(1 << 30, max(ns) * d * 4))
    print(f"device {kind}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(
        f"copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write); read {reading / 1e9:.1f} GB/s"
    )
    print("floor = n * d * 4 bytes / copy bandwidth\n")
    header = f"{'rule':<18} {'n':>4} {'d':>9} {'min ms':>10} {'median ms':>10} {'floor ms':>9} {'x floor':>8}  check"
    print(header)

    gen = torch.Generator().manual_seed(args.seed)
    results = []
    for n in ns:
        updates = torch.randn(n, d, generator=gen).to(device)
        weights = torch.randint(1, 200, (n,), generator=gen).float().to(device)
        floor = n * d * 4 / bandwidth
        results += [measure(name, updates, weights, floor, repeats) for name in rules]
        del updates

    report = {
        "benchmark": "aggregation",
        "command": "python -m benchmarks.speed.aggregation "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": _device_info(device),
        "versions": versions(),
        "dtype": "float32",
        "quick": args.quick,
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "read_bandwidth_GBps": reading / 1e9,
        "floor": "n * d * 4 bytes / copy bandwidth (bytes read + written per second)",
        "tolerance": TOLERANCE,
        "results": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"aggregation-{kind}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")
    failed = [r["rule"] for r in results if r["check"]["ok"] is False]
    if failed:
        print(f"reference check FAILED for: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
