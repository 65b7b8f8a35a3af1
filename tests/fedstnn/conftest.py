"""One intra-op thread for these tests: their tensors are tiny, and OpenMP threads that
spin-wait on a busy 2-core machine make each step many times slower."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
