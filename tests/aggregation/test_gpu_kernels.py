"""The one-pass GPU kernels give the torch paths' values.

The kernels (:mod:`aggregation.order_kernels` for median, trimmed mean and EMA,
:mod:`aggregation.gram_kernel` for the centered Gram matrix behind Krum, Multi-Krum,
Bulyan and the geometric median, :mod:`aggregation.fedlag_kernel` for FedLag) run only
on CUDA with Triton installed; on such a machine these tests hold the GPU results to the
CPU results over the shapes that stress a tile: one client, even and odd counts, a count
just above a power of two, ties, a common offset far larger than the spread, a column
count that leaves a partial last tile, half precision and a non-contiguous input.
"""

from __future__ import annotations

import pytest
import torch

from aggregation import build_aggregator, ops
from aggregation.ops import _centered_gram, centered_gram, order_kernels_for

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
RULES = [("median", {}), ("trimmed_mean", {"beta": 0.2}), ("ema", {}), ("ema", {"k": 0.0})]


def test_the_kernels_are_never_chosen_for_cpu_or_float64_updates():
    assert order_kernels_for(torch.zeros(5, 3)) is None
    if torch.cuda.is_available():
        assert order_kernels_for(torch.zeros(5, 3, dtype=torch.float64, device="cuda")) is None
        assert order_kernels_for(torch.zeros(300, 3, device="cuda")) is None  # > MAX_CLIENTS


def test_without_a_c_compiler_the_kernels_are_not_loaded_and_the_user_is_told(monkeypatch, caplog):
    # Triton compiles a C launcher at a kernel's first launch; without a compiler (a slim
    # container) every launch would fail mid-round, so the torch path must be kept.
    def no_import(name):
        raise AssertionError(f"{name} imported without a C compiler")

    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(ops.shutil, "which", lambda _program: None)
    monkeypatch.setattr(ops.importlib, "import_module", no_import)
    ops._triton_module.cache_clear()
    try:
        assert ops._triton_module("order_kernels") is None
    finally:
        ops._triton_module.cache_clear()
    assert "no C compiler (CC, gcc or clang) for Triton" in caplog.text


@needs_cuda
@pytest.mark.parametrize(("name", "params"), RULES)
@pytest.mark.parametrize("n", [1, 2, 3, 10, 17, 50, 100, 256])
@pytest.mark.parametrize("values", ["normal", "ties", "outliers"])
def test_gpu_kernels_match_the_cpu_path(name, params, n, values):
    assert order_kernels_for(torch.zeros(n, 3, device="cuda")) is not None
    generator = torch.Generator().manual_seed(n)
    updates = torch.randn(n, 10_007, generator=generator)
    if values == "ties":
        updates = updates.mul(2).round()
    elif values == "outliers":
        updates[: max(1, n // 5)] *= 1e3
    rule = build_aggregator(name, **params)

    on_gpu = rule(updates.cuda())

    torch.testing.assert_close(on_gpu.cpu(), rule(updates), rtol=1e-5, atol=1e-6)


@needs_cuda
@pytest.mark.parametrize(("name", "params"), RULES)
def test_half_precision_and_strided_updates(name, params):
    updates = torch.randn(50, 64, 300, generator=torch.Generator().manual_seed(0))
    rule = build_aggregator(name, **params)
    strided = updates.cuda()[:, :, ::3].reshape(50, -1)[:, ::2]  # stride(1) != 1
    assert strided.stride(1) != 1
    half = updates.reshape(50, -1).to(torch.bfloat16)

    torch.testing.assert_close(rule(strided).cpu(), rule(strided.cpu()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        rule(half.cuda()).cpu().float(), rule(half).float(), rtol=1e-2, atol=1e-2
    )


@needs_cuda
@pytest.mark.parametrize("n", [1, 2, 11, 50, 100, 128])
@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_gpu_centered_gram_matches_the_float64_one(n, offset):
    generator = torch.Generator().manual_seed(n)
    updates = torch.randn(n, 100_003, generator=generator) + offset
    exact = _centered_gram(updates, torch.float64)

    on_gpu = centered_gram(updates.cuda()).cpu()

    assert on_gpu.dtype == torch.float64 and torch.equal(on_gpu, on_gpu.T)
    torch.testing.assert_close(on_gpu, exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max()))


@needs_cuda
@pytest.mark.parametrize("name", ["krum", "multi_krum", "bulyan", "geometric_median"])
def test_gram_based_rules_choose_on_gpu_as_on_cpu(name):
    generator = torch.Generator().manual_seed(1)
    updates = torch.randn(40, 50_000, generator=generator)
    updates[:6] += 3.0  # six attackers far from the honest cloud
    rule = build_aggregator(name, f=6) if name != "geometric_median" else build_aggregator(name)

    torch.testing.assert_close(rule(updates.cuda()).cpu(), rule(updates), rtol=1e-5, atol=1e-6)


@needs_cuda
@pytest.mark.parametrize("n", [2, 3, 10, 16, 50])  # 50: past the kernels' MAX_CLIENTS
@pytest.mark.parametrize("values", ["normal", "ties", "outliers"])
def test_gpu_fedlag_chooses_the_cpu_midpoint(n, values):
    generator = torch.Generator().manual_seed(n)
    updates = torch.randn(n, 5_003, generator=generator)
    if values == "ties":  # many equal midpoints: survivor lists overflow, the torch path
        updates = updates.mul(2).round()  # resolves those parameters
    elif values == "outliers":
        updates[: max(1, n // 5)] *= 1e3
    weights = torch.randint(1, 50, (n,), generator=generator).float()
    rule = build_aggregator("fedlag")

    assert torch.equal(rule(updates.cuda(), weights.cuda()).cpu(), rule(updates, weights))


@needs_cuda
def test_gpu_fedlag_resolves_overflowing_survivor_lists_on_the_torch_path(monkeypatch):
    from aggregation import fedlag_kernel

    monkeypatch.setattr(fedlag_kernel, "MAX_SURVIVORS", 2)
    updates = torch.randn(16, 4_000, generator=torch.Generator().manual_seed(0))
    weights = torch.full((16,), 1.0 / 16, dtype=torch.float64, device="cuda")
    _, unresolved = fedlag_kernel.fedlag(updates.cuda(), weights, 1e-12, 1e-12)
    assert unresolved.numel() > 100  # most parameters overflow a 2-entry list
    rule = build_aggregator("fedlag")

    assert torch.equal(rule(updates.cuda()).cpu(), rule(updates))
