"""Adam's and AdamW's rule written out for look-ahead (``pipesgd.delay.adam_rule``): for every option it moves the
parameters to the bits a stepped copy of the optimizer reaches, only reads the optimizer's state, follows a state
that changes under it (a first step, ``load_state_dict``), and it is used exactly where it reproduces the optimizer
(else the generic replica replay runs)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pipesgd.delay.adam_rule import AdamRule, closed_form_applies
from pipesgd.delay.replay import OptimizerReplay
from tests.replay_checks import replay_against_a_stepped_copy, small_model, stepped

OPTIONS = {
    "adam": (torch.optim.Adam, dict()),
    "adam-decay": (torch.optim.Adam, dict(weight_decay=0.01)),
    "adam-maximize-decay": (torch.optim.Adam, dict(weight_decay=0.01, maximize=True)),
    "adamw": (torch.optim.AdamW, dict()),
    "adamw-decay-betas": (torch.optim.AdamW, dict(weight_decay=0.1, betas=(0.8, 0.95), eps=1e-6)),
    "adamw-maximize": (torch.optim.AdamW, dict(maximize=True)),
    "adamw-foreach": (torch.optim.AdamW, dict(foreach=True)),
    "adam-decoupled": (torch.optim.Adam, dict(weight_decay=0.01, decoupled_weight_decay=True)),
}


@pytest.mark.parametrize("steps_in_flight", [1, 2, 3])
@pytest.mark.parametrize("history", [0, 3], ids=["no-state-yet", "with-state"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_rule_moves_the_parameters_to_a_stepped_copys_bits_and_only_reads_the_state(option, history,
                                                                                         steps_in_flight):
    model = small_model()
    kind, options = OPTIONS[option]
    optimizer = kind(model.parameters(), lr=0.01, **options)
    stepped(model, optimizer, history)
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(steps_in_flight)]
    replay = replay_against_a_stepped_copy(model, optimizer, grads)
    assert isinstance(replay._rule, AdamRule) and not replay._replica.state  # the rule ran, not the replica


def test_groups_with_their_own_rates_a_first_step_in_flight_and_a_state_that_changes_between_replays():
    model = small_model()
    first, *rest = list(model.parameters())
    optimizer = torch.optim.AdamW([{"params": rest, "lr": 0.005, "weight_decay": 0.0}, {"params": [first]}],
                                  lr=0.01, weight_decay=0.1)
    stepped(model, optimizer, 2)
    optimizer.add_param_group({"params": [nn.Parameter(torch.randn(3))]})  # no gradient: not stepped, kept out
    del optimizer.state[first]  # no state yet for this one: its step in flight is its first
    replay = replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]])
    stepped(model, optimizer, 1)  # now it has state: the rule must read it, not what it found before
    replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]], replay)
    saved = copy.deepcopy(optimizer.state_dict())
    stepped(model, optimizer, 2)
    optimizer.load_state_dict(saved)  # new state tensors: found again
    replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]] * 2, replay)


def test_the_rule_costs_two_moment_copies_of_scratch():
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters())
    stepped(model, optimizer, 1)
    replay = replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]])
    assert replay.state_bytes == 2 * sum(p.numel() * p.element_size() for p in model.parameters())


class _AdamSubclass(torch.optim.Adam):
    pass


@pytest.mark.parametrize("build", [
    lambda ps: torch.optim.Adam(ps, amsgrad=True),
    lambda ps: torch.optim.AdamW(ps, fused=True),
    lambda ps: torch.optim.Adam(ps, capturable=True),
    lambda ps: torch.optim.Adam(ps, betas=(torch.tensor(0.9), torch.tensor(0.999)), capturable=True),
    lambda ps: _AdamSubclass(ps),
    lambda ps: torch.optim.SGD(ps, lr=0.1),
], ids=["amsgrad", "fused", "capturable", "tensor-betas", "subclass", "sgd"])
def test_what_the_rule_does_not_reproduce_takes_the_generic_replay(build):
    assert not closed_form_applies(build(small_model().parameters()))


def test_the_rule_is_not_used_once_a_learning_rate_is_a_tensor():
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    replay = OptimizerReplay(optimizer, list(model.parameters()))
    assert replay._rule.usable()
    optimizer.param_groups[0]["lr"] = torch.tensor(0.01)  # as a scheduler may set it
    assert not replay._rule.usable()


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_a_learning_rate_a_scheduler_made_a_tensor_replays_through_the_replica_to_the_same_bits(kind):
    """torch's foreach Adam refuses a tensor lr unless capturable, so the replica (foreach on CPU otherwise) then
    runs the original's own implementation choice."""
    model = small_model()
    optimizer = kind(model.parameters(), lr=0.01, **({"momentum": 0.9} if kind is torch.optim.SGD else {}))
    stepped(model, optimizer, 2)
    optimizer.param_groups[0]["lr"] = torch.tensor(0.01)
    replay = replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]])
    assert replay._replica.state  # the replica ran
    optimizer.param_groups[0]["lr"] = 0.01  # a float again: the rule again, from the same replay object
    replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]], replay=replay)
