"""Cost of PID-MADE scoring vs the number of clients, beside Krum and the geometric median.

The PID-MADE paper (Appendix B.1, Table 3) reports 2.2-4.8 ms for 5-20 clients vs 75-143 ms
for RFA, and claims O(n·d) per round. This measures, on the same float32 inputs
``(n, d)`` (``d = 1M`` by default), the wall time of

- ``pid_made``: one full filter step (mean centroid, distances, P/I/D terms, threshold)
  from a state that already holds every client's history (a steady-state round);
- ``krum``: the registered rule if ``aggregation.krum`` exists, else a Gram-matrix Krum
  defined here (pairwise squared distances from ``X Xᵀ``: O(n²·d));
- ``geometric_median``: the registered rule if present, else the Weiszfeld iterations
  inside the PID-MADE module (O(T·n·d)).

It fits, on the fastest of the repeats (the machine may be shared; noise only adds time),
the log-log slope of time vs n (1 = linear) and a straight line ``t = a + b·n``, and writes ``benchmarks/results/pid-cost-cpu.json``. Run from the repository root:

    python -m benchmarks.speed.pid_cost --threads 1   # n = 5, 10, 20, 50, 100, 1000; d = 1M
    python -m benchmarks.speed.pid_cost --d 100000 --ns 5 10 20

On a shared, oversubscribed machine use ``--threads 1``: with more torch threads than free
cores, OpenMP hand-offs between kernels dominated and timings varied tenfold.

n = 1000 at d = 1M holds 4 GB of float32; the distances are computed in row blocks, so
PID-MADE itself needs O(d) memory beyond the input.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from aggregation import build_aggregator
from aggregation.filters.pid_made import PIDMADE
from benchmarks.common import cpu_environment

DEFAULT_NS = (5, 10, 20, 50, 100, 1000)
OUT = Path(__file__).resolve().parents[1] / "results" / "pid-cost-cpu.json"


def gram_krum(updates: Tensor, f: int) -> Tensor:
    """Krum (Blanchard et al. 2017): the update with the smallest sum of squared distances
    to its ``n − f − 2`` nearest neighbours; distances from the Gram matrix."""
    n = updates.shape[0]
    gram = updates @ updates.T  # (n, n)
    sq = gram.diagonal()  # (n,) squared norms
    dist = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min(0.0)
    dist.fill_diagonal_(math.inf)
    scores = dist.topk(n - f - 2, dim=1, largest=False).values.sum(dim=1)
    return updates[int(scores.argmin())]


def krum_callable(f: int) -> tuple[Callable[[Tensor], Tensor], str]:
    try:
        return build_aggregator("krum", f=f), "aggregation.krum (registry)"
    except ValueError:  # n too small for Krum's condition at this f
        pass
    return (lambda x: gram_krum(x, f)), "benchmarks.speed.pid_cost.gram_krum (Gram matrix)"


def geomed_callable() -> tuple[Callable[[Tensor], Tensor], str]:
    return build_aggregator("geometric_median"), "aggregation.geometric_median (registry)"


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "repeats": repeats}


def fit(ns: list[int], ms: list[float]) -> dict[str, float]:
    x, y = np.asarray(ns, dtype=float), np.asarray(ms, dtype=float)
    loglog = float(np.polyfit(np.log(x), np.log(y), 1)[0])
    slope, intercept = np.polyfit(x, y, 1)
    pred = slope * x + intercept
    r2 = 1.0 - float(((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())
    return {
        "loglog_slope": loglog,
        "linear_ms_per_client": float(slope),
        "linear_intercept_ms": float(intercept),
        "linear_r2": r2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=1_000_000, help="parameters per update")
    parser.add_argument("--ns", type=int, nargs="+", default=list(DEFAULT_NS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    ns = sorted(args.ns)

    gen = torch.Generator().manual_seed(args.seed)
    print(f"generating {max(ns)} x {args.d} float32 updates ...", flush=True)
    pool = torch.randn(max(ns), args.d, generator=gen)  # (n_max, d); rows sliced per n
    pool[0] *= 10.0  # one boosted client, so there is something to exclude

    geomed, geomed_impl = geomed_callable()
    rows = []
    for n in ns:
        x = pool[:n]
        ids = list(range(n))
        f = max(1, n // 5)
        filt = PIDMADE(threshold="gaussian")
        _, state = filt.step(filt.init_state(), x, ids)  # warm-up, fills every history
        big = n * args.d >= 200_000_000
        reps_fast, reps_slow = (3, 1) if big else (15, 5)
        pid = timed(
            lambda x=x, ids=ids, state=state, filt=filt: filt.step(state, x, ids), reps_fast
        )
        krum, krum_impl = krum_callable(f)
        if not big:
            krum(x)  # warm-up
        kr = timed(lambda x=x, krum=krum: krum(x), reps_slow)
        gm = timed(lambda x=x: geomed(x), reps_slow)
        row = {"n": n, "f_krum": f, "pid_made": pid, "krum": kr, "geometric_median": gm}
        rows.append(row)
        print(
            f"n={n:5d}  min (median) ms: pid_made {pid['min_ms']:.2f} ({pid['median_ms']:.2f})"
            f"  krum {kr['min_ms']:.2f} ({kr['median_ms']:.2f})"
            f"  geometric_median {gm['min_ms']:.2f} ({gm['median_ms']:.2f})",
            flush=True,
        )

    fits = {
        name: {
            "all_n": fit(ns, [r[name]["min_ms"] for r in rows]),
            "n_ge_20": fit(
                [n for n in ns if n >= 20],
                [r[name]["min_ms"] for r in rows if r["n"] >= 20],
            )
            if sum(n >= 20 for n in ns) >= 2
            else None,
        }
        for name in ("pid_made", "krum", "geometric_median")
    }
    for name, fitted in fits.items():
        print(
            f"{name:17s} log-log slope vs n: {fitted['all_n']['loglog_slope']:.3f} (all n)", end=""
        )
        if fitted["n_ge_20"] is not None:
            print(f", {fitted['n_ge_20']['loglog_slope']:.3f} (n >= 20)", end="")
        print(f"; linear fit R^2 {fitted['all_n']['linear_r2']:.4f}")

    report = {
        "benchmark": "pid_cost",
        "command": " ".join(["python -m benchmarks.speed.pid_cost", *sys.argv[1:]]),
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **cpu_environment(),
        "d": args.d,
        "dtype": "float32",
        "seed": args.seed,
        "implementations": {
            "pid_made": "aggregation.filters.pid_made.PIDMADE(threshold='gaussian'), mean centroid",
            "krum": krum_impl,
            "geometric_median": geomed_impl,
        },
        "results": rows,
        "fits": fits,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
