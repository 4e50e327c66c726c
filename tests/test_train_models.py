"""Every registered image/vector model runs forward and backward on every such data set's input shape; the token
model (gpt) maps windows to per-position logits causally."""
from __future__ import annotations

import pytest
import torch

from pipesgd.train.models import MODELS, TOKEN_MODELS, build_model, count_params, grad_bytes

SHAPES = {"digits": (1, 8, 8), "synthetic": (64,), "mnist1d": (40,), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("name", sorted(set(MODELS) - set(TOKEN_MODELS)))
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


def test_gpt_logits_per_position_and_backward():
    torch.manual_seed(0)
    model = build_model("gpt", (16,), 11)
    tokens = torch.randint(0, 11, (3, 16))
    logits = model(tokens)
    assert logits.shape == (3, 16, 11)
    assert model(tokens[:, :5]).shape == (3, 5, 11)  # shorter windows than the context work too
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert 400_000 < count_params(build_model("gpt", (64,), 97)) < 450_000  # the documented ~0.4 M
    with pytest.raises(ValueError, match="longer than the model's context of 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="gpt takes token windows"):
        build_model("gpt", (1, 8, 8), 10)


def test_gpt_is_causal():
    """Changing the token at position t changes no logits before t, and does change those from t on."""
    torch.manual_seed(0)
    model = build_model("gpt", (12,), 9).eval()
    tokens = torch.randint(0, 9, (2, 12))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 9
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.allclose(before[:, :7], after[:, :7], rtol=0, atol=1e-6)
    assert ((before[:, 7:] - after[:, 7:]).abs().amax(dim=-1) > 1e-3).all()  # every later position sees it
