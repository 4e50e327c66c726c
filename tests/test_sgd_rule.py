"""Momentum SGD's rule written out for look-ahead (``pipesgd.delay.sgd_rule``): for every SGD option it moves
the parameters to the bits a stepped copy of the optimizer reaches, only reads the optimizer's state, and it is
used exactly where it reproduces the optimizer (else the generic replica replay runs)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pipesgd.delay.replay import OptimizerReplay
from pipesgd.delay.sgd_rule import closed_form_applies

OPTIONS = {
    "momentum": dict(momentum=0.9),
    "plain": dict(),
    "nesterov": dict(momentum=0.9, nesterov=True),
    "dampening": dict(momentum=0.9, dampening=0.3),
    "weight-decay": dict(momentum=0.9, weight_decay=0.01),
    "nesterov-decay": dict(momentum=0.8, nesterov=True, weight_decay=0.01),
    "maximize": dict(momentum=0.9, weight_decay=0.01, maximize=True),
    "foreach": dict(momentum=0.9, foreach=True),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _stepped(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for t in range(steps):
        torch.manual_seed(100 + t)
        model(torch.randn(4, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _replay_against_a_stepped_copy(model, optimizer, grads, writable=False):
    oracle_model, oracle = copy.deepcopy((model, optimizer))
    for g in grads:
        for p, gp in zip(oracle_model.parameters(), g):
            p.grad = gp.clone()
        oracle.step()
    state_before = copy.deepcopy(optimizer.state_dict())
    replay = OptimizerReplay(optimizer, list(model.parameters()))
    originals = [[g.clone() for g in gs] for gs in grads]
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
    return replay


@pytest.mark.parametrize("steps_in_flight", [1, 2, 3])
@pytest.mark.parametrize("history", [0, 3], ids=["no-buffers-yet", "with-buffers"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_rule_moves_the_parameters_to_a_stepped_copys_bits_and_only_reads_the_state(option, history,
                                                                                         steps_in_flight):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **OPTIONS[option])
    _stepped(model, optimizer, history)
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(steps_in_flight)]
    replay = _replay_against_a_stepped_copy(model, optimizer, grads)
    assert replay._rule is not None and not replay._replica.state  # the rule ran, not the replica


def test_groups_with_their_own_rates_and_a_parameter_with_its_first_step_in_flight():
    model = _model()
    first, *rest = list(model.parameters())
    optimizer = torch.optim.SGD([{"params": rest, "lr": 0.05, "nesterov": True}, {"params": [first]}],
                                lr=0.1, momentum=0.9)
    _stepped(model, optimizer, 2)
    optimizer.add_param_group({"params": [nn.Parameter(torch.randn(3))]})  # no gradient: not stepped, kept out
    optimizer.state[first].clear()  # no momentum buffer yet for this one
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(2)]
    _replay_against_a_stepped_copy(model, optimizer, grads, writable=True)


def test_a_tensor_learning_rate_or_the_fused_kernel_takes_the_generic_replay():
    model = _model()
    assert not closed_form_applies(torch.optim.SGD(model.parameters(), lr=0.1, fused=True))
    assert not closed_form_applies(torch.optim.Adam(model.parameters()))
    optimizer = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1), momentum=0.9)
    _stepped(model, optimizer, 2)
    replay = _replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]])
    assert replay._replica.state  # the replica ran


class _SGDSubclass(torch.optim.SGD):
    pass


def test_a_subclass_may_change_the_rule_so_it_is_replayed_generically():
    assert not closed_form_applies(_SGDSubclass(_model().parameters(), lr=0.1))
