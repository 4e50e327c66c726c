"""Checks shared by the tests of the update rules written out for look-ahead (``test_sgd_rule``, ``test_adam_rule``):
a small model, steps of its optimizer, and a replay compared with a stepped copy of the optimizer."""
from __future__ import annotations

import copy

import torch
from torch import nn

from pipesgd.delay.replay import OptimizerReplay


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def stepped(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for t in range(steps):
        torch.manual_seed(100 + t)
        model(torch.randn(4, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def replay_against_a_stepped_copy(model, optimizer, grads, writable=False, replay=None) -> OptimizerReplay:
    """Replay ``grads`` (one list per step in flight) and check: the parameters reach a stepped copy's bits, the
    optimizer's state is unchanged, and read-only gradients were not written; then put the master weights back.
    Returns the replay (``replay``, to reuse one across calls)."""
    oracle_model, oracle = copy.deepcopy((model, optimizer))
    for g in grads:
        for p, gp in zip(oracle_model.parameters(), g):
            p.grad = gp.clone()
        oracle.step()
    state_before = copy.deepcopy(optimizer.state_dict())
    replay = replay or OptimizerReplay(optimizer, list(model.parameters()))
    originals = [[g.clone() for g in gs] for gs in grads]
    masters = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        assert replay.replay_([(g, None, writable) for g in grads], skip_nonfinite=False) == len(grads)
    for got, want in zip(model.parameters(), oracle_model.parameters()):
        assert torch.equal(got, want)
    after = optimizer.state_dict()["state"]
    for key, state in state_before["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(after[key][name]), torch.as_tensor(value)), (key, name)
    if not writable:
        assert all(torch.equal(a, b) for gs, os in zip(grads, originals) for a, b in zip(gs, os))
    with torch.no_grad():
        for p, master in zip(model.parameters(), masters):
            p.copy_(master)
    return replay
