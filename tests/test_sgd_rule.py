"""Momentum SGD's rule written out for look-ahead (``pipesgd.delay.sgd_rule``): for every SGD option it moves
the parameters to the bits a stepped copy of the optimizer reaches, only reads the optimizer's state, and it is
used exactly where it reproduces the optimizer (else the generic replica replay runs)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd.delay.sgd_rule import closed_form_applies
from tests.replay_checks import replay_against_a_stepped_copy, small_model, stepped

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


@pytest.mark.parametrize("steps_in_flight", [1, 2, 3])
@pytest.mark.parametrize("history", [0, 3], ids=["no-buffers-yet", "with-buffers"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_rule_moves_the_parameters_to_a_stepped_copys_bits_and_only_reads_the_state(option, history,
                                                                                         steps_in_flight):
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **OPTIONS[option])
    stepped(model, optimizer, history)
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(steps_in_flight)]
    replay = replay_against_a_stepped_copy(model, optimizer, grads)
    assert replay._rule is not None and not replay._replica.state  # the rule ran, not the replica


def test_groups_with_their_own_rates_and_a_parameter_with_its_first_step_in_flight():
    model = small_model()
    first, *rest = list(model.parameters())
    optimizer = torch.optim.SGD([{"params": rest, "lr": 0.05, "nesterov": True}, {"params": [first]}],
                                lr=0.1, momentum=0.9)
    stepped(model, optimizer, 2)
    optimizer.add_param_group({"params": [nn.Parameter(torch.randn(3))]})  # no gradient: not stepped, kept out
    optimizer.state[first].clear()  # no momentum buffer yet for this one
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(2)]
    replay_against_a_stepped_copy(model, optimizer, grads, writable=True)


def test_a_tensor_learning_rate_or_the_fused_kernel_takes_the_generic_replay():
    model = small_model()
    assert not closed_form_applies(torch.optim.SGD(model.parameters(), lr=0.1, fused=True))
    assert not closed_form_applies(torch.optim.Adam(model.parameters()))
    optimizer = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1), momentum=0.9)
    stepped(model, optimizer, 2)
    replay = replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]])
    assert replay._replica.state  # the replica ran


class _SGDSubclass(torch.optim.SGD):
    pass


def test_a_subclass_may_change_the_rule_so_it_is_replayed_generically():
    assert not closed_form_applies(_SGDSubclass(small_model().parameters(), lr=0.1))
