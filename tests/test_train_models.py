"""Every registered model runs forward and backward on every data set's input shape."""
from __future__ import annotations

import pytest
import torch

from pipesgd.train.models import MODELS, build_model, count_params, grad_bytes

SHAPES = {"digits": (1, 8, 8), "synthetic": (64,), "mnist1d": (40,), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_backward(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape, 7, hidden=32)
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, 7)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert grad_bytes(model) == 4 * count_params(model)


def test_registry_names_and_unknown():
    assert {"mlp", "lenet", "resnet20", "alexnet"} <= set(MODELS)
    with pytest.raises(ValueError, match="unknown model 'vgg'.*mlp"):
        build_model("vgg", (4,), 2)


def test_alexnet_is_communication_heavy():
    # Most parameters (hence gradient bytes) sit in the fully connected layers.
    model = build_model("alexnet", (1, 8, 8), 10)
    fc = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert count_params(model) > 5_000_000 and fc / count_params(model) > 0.7


def test_same_seed_same_weights():
    torch.manual_seed(1)
    a = build_model("lenet", (1, 8, 8), 10)
    torch.manual_seed(1)
    b = build_model("lenet", (1, 8, 8), 10)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
