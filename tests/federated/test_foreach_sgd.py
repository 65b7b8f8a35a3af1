"""The one place the engine uses private torch names: the foreach SGD step. These tests
fail loudly should a torch upgrade remove or change the kernels it uses."""

import pytest
import torch

from federated.foreach_sgd import FOREACH_KERNELS, sgd_step_


@pytest.mark.parametrize("kernel", FOREACH_KERNELS)
def test_the_foreach_kernels_the_step_needs_exist_in_this_torch(kernel):
    assert callable(getattr(torch, kernel, None)), (
        f"torch {torch.__version__} has no torch.{kernel}: federated/foreach_sgd.py must "
        "move to torch.optim.SGD"
    )


@pytest.mark.parametrize(
    ("momentum", "weight_decay"), [(0.9, 1e-3), (0.0, 0.0), (0.5, 0.0), (0.0, 1e-2)]
)
def test_steps_equal_torch_optim_sgd_bit_for_bit(momentum, weight_decay):
    generator = torch.Generator().manual_seed(0)
    shapes = [(4, 3), (5,), (2, 2, 3)]
    start = [torch.randn(s, generator=generator) for s in shapes]
    grads = [[torch.randn(s, generator=generator) for s in shapes] for _ in range(3)]
    reference = [w.clone().requires_grad_() for w in start]
    optimizer = torch.optim.SGD(reference, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    ours = [w.clone() for w in start]
    momenta = [torch.zeros_like(w) for w in start] if momentum else []

    for step in grads:
        for weight, grad in zip(reference, step, strict=True):
            weight.grad = grad.clone()
        optimizer.step()
        sgd_step_(ours, [g.clone() for g in step], [], momenta, lr=0.1, momentum=momentum,
                  weight_decay=weight_decay, prox_mu=0.0)  # fmt: skip

    for a, b in zip(ours, reference, strict=True):
        assert torch.equal(a, b.detach())


def test_the_fedprox_term_pulls_toward_the_anchor():
    weights, anchors = [torch.tensor([3.0])], [torch.tensor([1.0])]

    sgd_step_(weights, [torch.tensor([0.0])], anchors, [], lr=0.5, momentum=0.0,
              weight_decay=0.0, prox_mu=0.2)  # fmt: skip

    assert weights[0].item() == pytest.approx(3.0 - 0.5 * 0.2 * (3.0 - 1.0))
