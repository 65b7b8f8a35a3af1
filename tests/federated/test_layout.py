import torch
from torch import nn

from federated.layout import use_fast_layout_
from federated.vectors import model_to_vector


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 2 * 2, 2))


def test_on_cpu_convolution_weights_become_channels_last_and_values_stay():
    model = net()
    before = model_to_vector(model)

    assert use_fast_layout_(model, "cpu") is model

    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not model[0].weight.is_contiguous()
    assert model[2].weight.is_contiguous()  # 2-D weights keep their layout
    assert torch.equal(model_to_vector(model), before)
    x = torch.randn(2, 3, 4, 4)
    assert torch.allclose(model(x), net()(x), atol=1e-6)


def test_other_devices_keep_the_layout_they_have():
    model = net()
    use_fast_layout_(model, "meta")  # stands for any non-CPU device: nothing is moved
    assert model[0].weight.is_contiguous()
