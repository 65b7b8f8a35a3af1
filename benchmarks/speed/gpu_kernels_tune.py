"""Launch settings of the Triton aggregation kernels on the GPU at hand (not a test).

    python -m benchmarks.speed.gpu_kernels_tune [--order] [--gram] [--fedlag]

At n = 10, 50, 100 clients and d = 11.2M (a ResNet-18), median of
``triton.testing.do_bench`` (CUDA events):

- ``--order``: the median, trimmed mean and EMA kernels (:mod:`aggregation.order_kernels`)
  for every (TILE_ELEMENTS, NUM_WARPS) pair;
- ``--gram``: the centered Gram kernel (:mod:`aggregation.gram_kernel`) for every
  (BLOCK, PRECISION, PROGRAMS_PER_SM) triple;
- ``--fedlag``: the FedLag kernels (:mod:`aggregation.fedlag_kernel`) for every
  (SCREEN_WARPS, CHOOSE_BLOCK, MAX_SURVIVORS) triple, at the n it takes (at most its
  MAX_CLIENTS: n = 10 only).

Prints each setting's time and the best per n beside the read floor. No flag: all.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import torch
import triton.testing
from torch import Tensor

from aggregation import fedlag_kernel, gram_kernel, order_kernels

D = 11_200_000


def sweep(
    label: str,
    module: ModuleType,
    names: tuple[str, ...],
    settings: Iterable[tuple[Any, ...]],
    kernel: Callable[[Tensor], Tensor],
    updates: Tensor,
    floor_ms: float,
) -> None:
    """Time ``kernel(updates)`` under each setting of the module constants ``names``."""
    defaults = tuple(getattr(module, name) for name in names)
    timings = {}
    for setting in settings:
        for name, value in zip(names, setting, strict=True):
            setattr(module, name, value)
        try:
            timings[setting] = triton.testing.do_bench(
                lambda: kernel(updates), return_mode="median"
            )
        except Exception as error:  # out of resources: skip the setting
            print(f"  {label} {setting}: {type(error).__name__}")
    for name, value in zip(names, defaults, strict=True):
        setattr(module, name, value)
    best = min(timings, key=timings.__getitem__)
    print(f"{label} best {dict(zip(names, best, strict=True))} {timings[best]:.2f} ms "
          f"(floor {floor_ms:.2f} ms)")  # fmt: skip
    for setting, ms in sorted(timings.items(), key=lambda item: item[1]):
        print(f"    {setting}: {ms:.2f} ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--order", action="store_true")
    parser.add_argument("--gram", action="store_true")
    parser.add_argument("--fedlag", action="store_true")
    args = parser.parse_args(argv)
    every = not (args.order or args.gram or args.fedlag)
    copy = torch.empty(256 * 2**20, device="cuda")
    seconds = triton.testing.do_bench(lambda: copy.clone(), return_mode="median") / 1e3
    bandwidth = 2 * copy.numel() * 4 / seconds
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write)")
    statistics = {
        "median": order_kernels.median,
        "trimmed_mean": lambda u: order_kernels.trimmed_mean(u, u.shape[0] // 10),
        "ema": lambda u: order_kernels.estimated_mean(u, 1.5),
    }
    for n in (10, 50, 100):
        updates = torch.randn(n, D, device="cuda")
        floor_ms = n * D * 4 / bandwidth * 1e3
        if args.order or every:
            for name, kernel in statistics.items():
                settings = itertools.product((512, 1024, 2048, 4096), (1, 2))
                sweep(f"{name} n={n}", order_kernels, ("TILE_ELEMENTS", "NUM_WARPS"),
                      settings, kernel, updates, floor_ms)  # fmt: skip
        if args.gram or every:
            settings = itertools.product((32, 64, 128), ("ieee", "tf32x3"), (2, 4, 8))
            sweep(f"gram n={n}", gram_kernel, ("BLOCK", "PRECISION", "PROGRAMS_PER_SM"),
                  settings, gram_kernel.centered_gram, updates, floor_ms)  # fmt: skip
        if (args.fedlag or every) and n <= fedlag_kernel.MAX_CLIENTS:
            weights = torch.full((n,), 1.0 / n, dtype=torch.float64, device="cuda")

            def fused(u: Tensor, weights: Tensor = weights) -> Tensor:
                return fedlag_kernel.fedlag(u, weights, 1e-12, 1e-12)[0]

            settings = itertools.product((2, 4, 8), (32, 64, 128), (16, 32))
            sweep(f"fedlag n={n}", fedlag_kernel,
                  ("SCREEN_WARPS", "CHOOSE_BLOCK", "MAX_SURVIVORS"),
                  settings, fused, updates, floor_ms)  # fmt: skip


if __name__ == "__main__":
    main()
