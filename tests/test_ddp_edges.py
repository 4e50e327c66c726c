"""What a user coming from DDP meets at the edges: unused parameters, a model still in DDP, frozen models,
``consolidate_state_dict()`` on one rank, load-then-wrap, model-only snapshots, and the exit after a peer died."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd import PipeSGD
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture

STEPS = 15


class WithUnused(nn.Module):
    """A model whose second layer the forward never uses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = nn.Linear(4, 3).double()
        self.unused = nn.Linear(4, 3).double()

    def forward(self, x):
        return self.used(x)


def data(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 4, generator=g, dtype=torch.float64) * (1 + rank), torch.randn(8, 3, generator=g,
                                                                                       dtype=torch.float64)


def _unused_stays(rank: int, world: int, width: int):
    model = WithUnused()
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1), model, width=width,
                  warmup_steps=2)
    for t in range(STEPS):
        x, y = data(t, rank)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    opt.flush()
    opt.check_replicas()
    opt.close()
    return [p.detach().clone() for p in model.parameters()]


def reference(world: int, width: int, warmup: int = 2):
    """One process: the mean of every rank's gradient, applied K-1 steps late after the warm-up (no look-ahead: the
    reference runs at width 1 only), AdamW seeing grad None for the unused layer as torch alone does."""
    model = WithUnused()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    for t in range(STEPS):
        grads = []
        for r in range(world):
            model.zero_grad(set_to_none=True)
            x, y = data(t, r)
            nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.used.parameters()])
        model.zero_grad(set_to_none=True)
        for i, p in enumerate(model.used.parameters()):
            p.grad = sum(g[i] for g in grads) / world
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("width", [1, 2])
def test_unused_parameters_are_left_alone_on_every_rank(width):
    start = [p.detach().clone() for p in WithUnused().unused.parameters()]
    per_rank = run_ranks(_unused_stays, 2, width, timeout_s=120)
    for weights in per_rank:
        assert all(torch.equal(a, b) for a, b in zip(weights, per_rank[0]))  # replicas bitwise identical
        assert torch.equal(weights[2], start[0]) and torch.equal(weights[3], start[1])  # the unused layer
    if width == 1:  # synchronous: exactly torch's trajectory on the averaged gradient
        expected = reference(2, 1)
        for got, want in zip(per_rank[0][:2], expected[:2]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    else:  # the used layer trained
        assert not torch.equal(per_rank[0][0], WithUnused().used.weight)


@pytest.mark.usefixtures("process_group")
def test_a_parameter_used_only_later_is_refused_by_name():
    model = WithUnused()
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.05), model, width=1)
    x, y = data(0, 0)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    nn.functional.mse_loss(model(x) + model.unused(x), y).backward()
    with pytest.raises(RuntimeError, match="'unused.weight' got a gradient at step 1"):
        opt.step()
    opt.close()


@pytest.mark.usefixtures("process_group")
def test_ddp_wrapped_and_frozen_models_are_refused():
    model = nn.Linear(3, 2)
    ddp = nn.parallel.DistributedDataParallel(model)
    with pytest.raises(TypeError, match=r"pass the unwrapped module \(ddp_model.module\)"):
        PipeSGD(torch.optim.SGD(ddp.parameters(), lr=0.1), ddp)
    frozen = nn.Linear(3, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="all are frozen"):
        PipeSGD(torch.optim.SGD(frozen.parameters(), lr=0.1), frozen)
