"""Benchmark: EMA Pre-Testing at the paper's scale on CPU (not a test).

    python -m benchmarks.speed.pretest [--coords 1075621] [--clients 50] [--scipy-sample 500]

Runs both normality tests (vectorised Shapiro–Wilk + Anderson–Darling, one call to
``federated.stats.pretest_normality``) on ``coords`` coordinates across ``clients``
synthetic clients, times a per-coordinate scipy loop (``shapiro`` + ``anderson``) on a
small sample and extrapolates it, checks the sample agrees, and writes
``benchmarks/results/pretest-cpu.json``. Target: <= 60 s for 1,075,621 x 50 on 2 cores.
The load average is recorded before and after: on a shared machine it explains the spread.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy
from scipy import stats

from benchmarks.common import cpu_device, versions
from federated.stats import pretest_normality
from federated.stats.normality import DEFAULT_CHUNK

TARGET_S = 60.0


def _client_updates(n_clients: int, n_coords: int, seed: int) -> np.ndarray:
    """float32 ``(n_clients, n_coords)``: mostly normal columns, every 5th Student-t(3)
    (heavy-tailed, like many gradient coordinates), every 1000th constant (frozen)."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n_clients, n_coords), dtype=np.float32)
    heavy = np.arange(0, n_coords, 5)
    values[:, heavy] = rng.standard_t(3, size=(n_clients, heavy.size)).astype(np.float32)
    values[:, ::1000] = 0.0
    return values


def _scipy_loop(values: np.ndarray, coords: np.ndarray) -> tuple[float, np.ndarray]:
    """Seconds for shapiro + anderson per coordinate, and their (W, p, A²) rows."""
    out = np.empty((coords.size, 3))
    start = time.perf_counter()
    for i, j in enumerate(coords):
        col = values[:, j].astype(np.float64)
        sw = stats.shapiro(col)
        ad = stats.anderson(col, dist="norm", method="interpolate")
        out[i] = sw.statistic, sw.pvalue, ad.statistic
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coords", type=int, default=1_075_621)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--scipy-sample", type=int, default=500)
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pretest-cpu.json"))
    args = parser.parse_args(argv)

    values = _client_updates(args.clients, args.coords, args.seed)

    load_before = os.getloadavg()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    res = pretest_normality(values, alpha=0.05, chunk_size=args.chunk_size)
    seconds = time.perf_counter() - wall0
    cpu_seconds = time.process_time() - cpu0
    load_after = os.getloadavg()

    rng = np.random.default_rng(args.seed + 1)
    live = np.flatnonzero(~res.constant)
    sample = np.sort(rng.choice(live, size=min(args.scipy_sample, live.size), replace=False))
    loop_s, ref = _scipy_loop(values, sample)
    ours = np.column_stack(
        [res.tests.shapiro_w[sample], res.tests.shapiro_p[sample], res.tests.anderson_a2[sample]]
    )
    rel = np.abs(ours - ref) / np.maximum(np.abs(ref), 1e-300)
    per_coord = loop_s / sample.size
    extrapolated = per_coord * args.coords

    report = {
        "benchmark": "pretest",
        "command": " ".join(["python -m benchmarks.speed.pretest", *(argv or sys.argv[1:])]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": cpu_device(),
        "versions": versions(scipy=scipy.__version__),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in load_after],
        "n_clients": args.clients,
        "n_coords": args.coords,
        "chunk_size": args.chunk_size,
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "coords_per_s": round(args.coords / seconds),
        "target_seconds": TARGET_S,
        "meets_target": seconds <= TARGET_S,
        "n_constant": res.n_constant,
        "shapiro_rate": res.shapiro_rate,
        "anderson_rate": res.anderson_rate,
        "scipy_loop": {
            "sample": int(sample.size),
            "seconds": round(loop_s, 3),
            "seconds_per_coord": per_coord,
            "extrapolated_seconds": round(extrapolated, 1),
            "max_rel_diff_w_p_a2": [float(x) for x in rel.max(axis=0)],
        },
        "speedup_vs_scipy_loop": round(extrapolated / seconds, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")

    print(
        f"pretest: {args.coords:,} coords x {args.clients} clients, both tests: "
        f"{seconds:.1f} s wall ({cpu_seconds:.1f} s CPU), {report['coords_per_s']:,} coords/s "
        f"[target {TARGET_S:.0f} s: {'met' if report['meets_target'] else 'MISSED'}]"
    )
    print(
        f"scipy loop: {per_coord * 1e3:.2f} ms/coord on {sample.size} coords -> "
        f"~{extrapolated:,.0f} s extrapolated ({report['speedup_vs_scipy_loop']}x slower); "
        f"max rel diff W/p/A2 = {', '.join(f'{x:.1e}' for x in rel.max(axis=0))}"
    )
    print(
        f"load avg before {report['load_avg_before']}, after {report['load_avg_after']}, "
        f"nproc {report['device']['nproc']}; rates SW {res.shapiro_rate:.3f} "
        f"AD {res.anderson_rate:.3f}; wrote {args.out}"
    )
    return report


if __name__ == "__main__":
    main()
