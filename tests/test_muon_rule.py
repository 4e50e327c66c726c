"""Muon under look-ahead: ``MuonAdamW`` (``pipesgd.muon_adamw``) behaves as one torch optimizer, Muon's rule and
``MuonAdamW``'s written out (``pipesgd.delay.muon_rule``, ``pipesgd.delay.muon_adamw_rule``) move the parameters to
the bits a stepped copy of the optimizer reaches and only read its state, and PipeSGD width 2 with look-ahead runs
``MuonAdamW`` on 2 gloo ranks (at world size 1: the synchronous trajectory bit for bit)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pipesgd import PipeSGD
from pipesgd.delay.muon_adamw_rule import MuonAdamWRule
from pipesgd.delay.muon_rule import MuonRule, closed_form_applies
from pipesgd.delay.replay import OptimizerReplay
from pipesgd.muon_adamw import MuonAdamW, hidden_matrices
from pipesgd.options import PipeSGDOptions
from tests.distributed import run_ranks
from tests.replay_checks import replay_against_a_stepped_copy, stepped
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_pipesgd import batch, snapshot


def _model(dtype=torch.float32) -> nn.Module:
    """Two hidden matrices, one tall (8 x 6: Muon transposes it and scales its rate) and one wide, and a head."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5), nn.Tanh(), nn.Linear(5, 3)).to(dtype)


def _muon_adamw(model: nn.Module, **options) -> MuonAdamW:
    hidden = {id(p) for p in hidden_matrices(model)}
    return MuonAdamW([{"params": [p for p in model.parameters() if id(p) in hidden], "use_muon": True},
                      {"params": [p for p in model.parameters() if id(p) not in hidden], "use_muon": False}],
                     lr=0.01, **options)


def _matrices(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.dim() == 2]


MUON_OPTIONS = {
    "defaults": dict(),
    "plain-momentum": dict(nesterov=False),
    "no-decay": dict(weight_decay=0.0),
    "match-rms-adamw": dict(adjust_lr_fn="match_rms_adamw", momentum=0.9),
    "three-ns-steps": dict(ns_steps=3, eps=1e-5),
}


class _Matrices(nn.Module):
    """The model seen through its matrices alone, the parameters a Muon-only optimizer holds (the replay checks
    give every parameter of the module they get a gradient)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.weights = nn.ParameterList(_matrices(model))


@pytest.mark.parametrize("steps_in_flight", [1, 2, 3])
@pytest.mark.parametrize("history", [0, 3], ids=["no-state-yet", "with-state"])
@pytest.mark.parametrize("option", list(MUON_OPTIONS))
def test_muons_rule_moves_the_parameters_to_a_stepped_copys_bits_and_only_reads_the_state(option, history,
                                                                                          steps_in_flight):
    model = _model()
    optimizer = torch.optim.Muon(_matrices(model), lr=0.02, **MUON_OPTIONS[option])
    stepped(model, optimizer, history)
    grads = [[torch.randn_like(p) for p in _matrices(model)] for _ in range(steps_in_flight)]
    replay = replay_against_a_stepped_copy(_Matrices(model), optimizer, grads)
    assert isinstance(replay._rule, MuonRule) and not replay._replica.state  # the rule ran, not the replica
    assert replay.state_bytes == sum(p.numel() * p.element_size() for p in _matrices(model))  # one buffer each


@pytest.mark.parametrize("steps_in_flight", [1, 2])
@pytest.mark.parametrize("history", [0, 2], ids=["no-state-yet", "with-state"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_muon_adamws_rule_moves_the_parameters_to_a_stepped_copys_bits(dtype, history, steps_in_flight):
    model = _model(dtype)
    optimizer = _muon_adamw(model, weight_decay=0.1)
    _stepped(model, optimizer, history, dtype)
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(steps_in_flight)]
    replay = replay_against_a_stepped_copy(model, optimizer, grads)
    assert isinstance(replay._rule, MuonAdamWRule) and not replay._replica.state


def _stepped(model, optimizer, steps, dtype):
    """``replay_checks.stepped`` in ``dtype``."""
    for t in range(steps):
        torch.manual_seed(100 + t)
        model(torch.randn(4, 6, dtype=dtype)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_clipping_or_a_tensor_rate_replays_muon_adamw_through_its_replica_to_the_same_bits():
    """The replica path builds a second MuonAdamW from the groups and defaults and copies the shared state in."""
    model = _model()
    optimizer = _muon_adamw(model)
    stepped(model, optimizer, 2)
    optimizer.param_groups[0]["lr"] = torch.tensor(0.01)  # as a scheduler may set it: the rules are for floats
    replay = replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]] * 2)
    assert set(replay._replica.state) == set(replay._aliases[id(p)] for p in model.parameters())  # the replica ran
    assert type(replay._replica) is MuonAdamW and replay._replica.muon.state is replay._replica.state


def test_the_replay_follows_a_state_that_changes_under_it():
    model = _model()
    optimizer = _muon_adamw(model)
    replay = replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]])
    stepped(model, optimizer, 1)  # now it has state: the rules must read it, not what they found before
    replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]], replay=replay)
    saved = copy.deepcopy(optimizer.state_dict())
    stepped(model, optimizer, 2)
    optimizer.load_state_dict(saved)  # new state tensors and group dicts: found again
    replay_against_a_stepped_copy(model, optimizer, [[torch.randn_like(p) for p in model.parameters()]] * 2, replay)


class _MuonSubclass(torch.optim.Muon):
    pass


def test_only_torchs_own_muon_takes_its_rule():
    params = _matrices(_model())
    assert closed_form_applies(torch.optim.Muon(params))
    assert not closed_form_applies(_MuonSubclass(params))
    assert not closed_form_applies(torch.optim.SGD(params, lr=0.1))
    fused = _muon_adamw(_model())
    fused.adamw.param_groups[0]["fused"] = True  # AdamW's rule does not reproduce fused: the replica then
    assert OptimizerReplay(fused, list(fused.param_groups[0]["params"]))._rule is None


# ------------------------------------------------------------------ MuonAdamW as one optimizer
def test_groups_go_to_the_optimizer_they_name_and_are_shared_with_it():
    model = _model()
    optimizer = _muon_adamw(model, weight_decay=0.05, betas=(0.8, 0.9))
    muon_group, adamw_group = optimizer.param_groups
    assert optimizer.muon.param_groups == [muon_group] and optimizer.muon.param_groups[0] is muon_group
    assert optimizer.adamw.param_groups[0] is adamw_group and optimizer.adamw.state is optimizer.state
    assert muon_group["momentum"] == 0.95 and muon_group["nesterov"] and "betas" not in muon_group
    assert adamw_group["betas"] == (0.8, 0.9) and "momentum" not in adamw_group
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.05}
    assert [p.shape for p in muon_group["params"]] == [(8, 6), (5, 8)]  # the head (3 x 5) is AdamW's
    for group in optimizer.param_groups:
        group["lr"] = 0.5  # as the trainer's schedule sets it
    assert optimizer.muon.param_groups[0]["lr"] == optimizer.adamw.param_groups[0]["lr"] == 0.5


def test_its_step_is_both_optimizers_steps_and_its_state_dict_resumes_them():
    model = _model()
    optimizer = _muon_adamw(model)
    twin_model = copy.deepcopy(model)
    hidden = {id(p) for p in hidden_matrices(twin_model)}
    muon = torch.optim.Muon([p for p in twin_model.parameters() if id(p) in hidden], lr=0.01,
                            adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([p for p in twin_model.parameters() if id(p) not in hidden], lr=0.01, weight_decay=0.1)
    for t in range(3):
        for m in (model, twin_model):
            torch.manual_seed(t)
            m(torch.randn(4, 6)).square().mean().backward()
        optimizer.step()
        muon.step()
        adamw.step()
        optimizer.zero_grad()
        muon.zero_grad()
        adamw.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin_model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    # A fresh optimizer loaded from the state dict takes the next step to the same bits.
    resumed_model = copy.deepcopy(model)
    resumed = _muon_adamw(resumed_model)
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert resumed.muon.state is resumed.state and resumed.adamw.param_groups[0] is resumed.param_groups[1]
    for m, o in ((model, optimizer), (resumed_model, resumed)):
        torch.manual_seed(9)
        m(torch.randn(4, 6)).square().mean().backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed_model.parameters()))


def test_misplaced_groups_are_refused_with_a_reason():
    model = _model()
    with pytest.raises(ValueError, match="use_muon=True"):
        MuonAdamW([{"params": list(model.parameters())}])
    with pytest.raises(ValueError, match="Muon steps 2-D parameters only"):
        MuonAdamW([{"params": list(model.parameters()), "use_muon": True}])
    optimizer = _muon_adamw(model)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optimizer.add_param_group({"params": [model[0].weight], "use_muon": True})
    assert len(optimizer.param_groups) == 2 and len(optimizer.muon.param_groups) == 1
    extra = nn.Parameter(torch.randn(4, 4))
    optimizer.add_param_group({"params": [extra], "use_muon": True, "lr": 0.1})
    assert optimizer.muon.param_groups[-1]["params"] == [extra] and optimizer.param_groups[-1]["lr"] == 0.1


def test_a_model_without_hidden_matrices_is_adamw_alone():
    optimizer = MuonAdamW([{"params": list(nn.Linear(3, 2).parameters()), "use_muon": False}])
    assert optimizer.muon is None and optimizer.optimizers == [optimizer.adamw]
    assert hidden_matrices(nn.Linear(3, 2)) == []


def test_hidden_matrices_leave_out_embeddings_a_tied_head_and_the_last_linear():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(10, 4)
            self.body = nn.Linear(4, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.tok.weight

    tied = Tied()
    assert hidden_matrices(tied) == [tied.body.weight]
    from pipesgd.train.models import build_model  # the GPT: every block matrix, no embedding or head

    gpt = build_model("gpt", (8,), 13)
    names = {id(p): n for n, p in gpt.named_parameters()}
    assert sorted(names[id(p)].split(".", 2)[2] for p in hidden_matrices(gpt)) == sorted(
        ["attn.qkv.weight", "attn.proj.weight", "mlp.0.weight", "mlp.2.weight"] * 2)


# ------------------------------------------------------------------ under PipeSGD
def _train(model, optimizer, width, rank=0, steps=8, staleness="lookahead", **options):
    """``steps`` steps of PipeSGD on rank-dependent batches, flushed (one warm-up step)."""
    opt = PipeSGD(optimizer, model, width=width, warmup_steps=1, staleness=staleness,
                  options=PipeSGDOptions(**options))
    for t in range(steps):
        x, y = batch(t, rank, torch.float32)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    opt.flush()
    return opt


def test_at_world_size_one_lookahead_under_muon_adamw_is_synchronous_bit_for_bit(process_group):
    finals = []
    for width, staleness in ((1, "lookahead"), (2, "lookahead"), (2, "none")):
        model = _model()
        _train(model, _muon_adamw(model), width, staleness=staleness).close()
        finals.append(snapshot(model))
    sync, ahead, plain = finals
    assert all(torch.equal(a, b) for a, b in zip(ahead, sync))
    assert not all(torch.equal(a, b) for a, b in zip(plain, sync))  # the plain delayed update differs


def _two_ranks(rank: int, world: int):
    model = _model()
    opt = _train(model, _muon_adamw(model), width=2, rank=rank, check_replicas_every=1)
    opt.check_replicas()  # raises if any parameter differs across ranks
    assert isinstance(opt._lookahead._replay._rule, MuonAdamWRule)
    opt.close()
    return torch.cat([p.reshape(-1) for p in snapshot(model)])


@pytest.mark.slow
def test_two_ranks_at_width_two_with_lookahead_stay_finite_and_identical():
    finals = run_ranks(_two_ranks, 2)
    assert torch.isfinite(finals[0]).all() and torch.equal(finals[0], finals[1])
    start = torch.cat([p.reshape(-1) for p in _model().parameters()])
    assert not torch.equal(finals[0], start)  # it trained
