"""DiLoCo (pipesgd.baselines.diloco) against a single-process reference written out by hand: each rank's inner AdamW
on its own data, the mean of the pseudo-gradients, the outer Nesterov step; with and without the delayed outer
update; identical data on every rank equals one process; state_dict resumes the trajectory bitwise."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipesgd.baselines import DiLoCo
from pipesgd.wrapper import OptimizerWrapper
from tests.distributed import run_checks
from tests.single_process import process_group  # noqa: F401 - a fixture

TIMEOUT_S = 90.0
WORLD = 2
SYNC_EVERY = 3
STEPS = 2 * SYNC_EVERY + 2  # two full periods, then a partial one that flush() syncs
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def _inner(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)


def _batch(step: int, rank: int, same_data: bool):
    g = torch.Generator().manual_seed(1000 + 31 * step + (0 if same_data else rank))
    return torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(6, 2, generator=g, dtype=torch.float64)


def _local_step(model, opt, step, rank, same_data) -> None:
    x, y = _batch(step, rank, same_data)
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _reference(world: int, steps: int, sync_delay: int, same_data: bool) -> list[torch.Tensor]:
    """DiLoCo by hand in one process: ``world`` replicas, pseudo-gradients averaged, Nesterov written out."""
    models = [_model() for _ in range(world)]
    inners = [_inner(m) for m in models]
    global_w = _params(models[0])
    momentum = [torch.zeros_like(w) for w in global_w]
    deltas, local = None, 0

    def outer_step(deltas):
        mean = [sum(parts) / world for parts in zip(*deltas)]
        for w, buf, d in zip(global_w, momentum, mean):
            buf.mul_(OUTER_MOMENTUM).add_(d)  # torch's SGD: buf = momentum * buf + grad (buf = grad at first)
            w.sub_(OUTER_LR * (d + OUTER_MOMENTUM * buf))  # Nesterov: grad + momentum * buf
        for m in models:
            with torch.no_grad():
                for p, w in zip(m.parameters(), global_w):
                    p.copy_(w)

    def pseudo_gradients():
        return [[w - p.detach() for w, p in zip(global_w, m.parameters())] for m in models]

    for step in range(steps):
        for rank, (m, opt) in enumerate(zip(models, inners)):
            _local_step(m, opt, step, rank, same_data)
        local += 1
        if local == SYNC_EVERY - sync_delay:
            deltas = pseudo_gradients()
        if local == SYNC_EVERY:
            outer_step(deltas)
            deltas, local = None, 0
    if deltas is not None or local:  # flush(): the pseudo-gradient in flight, or the partial period's
        outer_step(deltas if deltas is not None else pseudo_gradients())
    return global_w


def _train(rank, sync_delay, same_data, steps=STEPS, opt=None, model=None, start=0):
    model = _model() if model is None else model
    opt = opt if opt is not None else DiLoCo(_inner(model), model, SYNC_EVERY, OUTER_LR, OUTER_MOMENTUM, sync_delay=sync_delay)
    sent = []
    for step in range(start, steps):
        x, y = _batch(step, rank, same_data)
        F.mse_loss(model(x), y).backward()
        sent.append(opt.step().bytes_sent)
        opt.zero_grad()
    return model, opt, sent


def _run(rank, world, sync_delay, same_data):
    model, opt, sent = _train(rank, sync_delay, same_data)
    opt.flush()
    opt.close()
    return {"final": _params(model), "sent": sent}


def _resume(rank, world, sync_delay):
    """Stop inside the second period (a pseudo-gradient in flight where sync_delay is 1), save, rebuild, continue."""
    stop = 2 * SYNC_EVERY - 1
    whole, whole_opt, _ = _train(rank, sync_delay, False)
    whole_opt.flush()
    part, part_opt, _ = _train(rank, sync_delay, False, steps=stop)
    saved = copy.deepcopy({"model": part.state_dict(), "opt": part_opt.state_dict()})
    part_opt.close()
    model = _model()
    opt = DiLoCo(_inner(model), model, SYNC_EVERY, OUTER_LR, OUTER_MOMENTUM, sync_delay=sync_delay)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    _train(rank, sync_delay, False, opt=opt, model=model, start=stop)
    opt.flush()
    return {"whole": _params(whole), "resumed": _params(model)}


@pytest.fixture(scope="module")
def ranks():
    checks = {f"{name}-{delay}": (_run, delay, same) for delay in (0, 1)
              for name, same in (("same", True), ("different", False))}
    checks.update({f"resume-{delay}": (_resume, delay) for delay in (0, 1)})
    return run_checks(checks, WORLD, timeout_s=TIMEOUT_S)


@pytest.mark.parametrize("sync_delay", [0, 1])
def test_identical_data_on_every_rank_equals_one_process(ranks, sync_delay):
    alone = _reference(1, STEPS, sync_delay, same_data=True)
    for result in ranks[f"same-{sync_delay}"]:
        for got, want in zip(result["final"], alone, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sync_delay", [0, 1])
def test_outer_step_is_the_mean_pseudo_gradient_under_nesterov(ranks, sync_delay):
    want = _reference(WORLD, STEPS, sync_delay, same_data=False)
    alone = _reference(1, STEPS, sync_delay, same_data=True)
    finals = [r["final"] for r in ranks[f"different-{sync_delay}"]]
    for got, ref in zip(finals[0], want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(*finals))  # every rank ends on the same weights
    assert not all(torch.allclose(a, b) for a, b in zip(finals[0], alone))  # the ranks' data mattered


@pytest.mark.parametrize("sync_delay", [0, 1])
def test_bytes_are_counted_where_the_pseudo_gradient_leaves(ranks, sync_delay):
    sent = ranks[f"different-{sync_delay}"][0]["sent"]
    sending = [step for step, n in enumerate(sent) if n]
    assert sending == [step for step in range(STEPS) if step % SYNC_EVERY == SYNC_EVERY - sync_delay - 1]
    assert len(sending) == 2 + sync_delay  # with the delay the partial period's last step takes one too
    numel = sum(p.numel() for p in _model().parameters())
    assert sent[sending[0]] == 8 * numel  # float64, ring-equivalent 2 (p-1)/p with p = 2


@pytest.mark.parametrize("sync_delay", [0, 1])
def test_resume_continues_bitwise(ranks, sync_delay):
    for result in ranks[f"resume-{sync_delay}"]:
        assert all(torch.equal(a, b) for a, b in zip(result["whole"], result["resumed"], strict=True))


# -- one process -------------------------------------------------------------------------------------
def test_one_step_periods_with_plain_outer_sgd_are_the_inner_optimizer(process_group):
    """sync_every 1, outer lr 1, no momentum: global - (global - local) = local, every step."""
    plain = _model()
    plain_opt = _inner(plain)
    model = _model()
    opt = DiLoCo(_inner(model), model, sync_every=1, outer_lr=1.0, outer_momentum=0.0)
    assert isinstance(opt, OptimizerWrapper)
    for step in range(4):
        _local_step(plain, plain_opt, step, 0, True)
        _local_step(model, opt, step, 0, True)
    assert opt.flush() == []
    for a, b in zip(_params(plain), _params(model)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_single_process_matches_the_reference(process_group):
    for delay in (0, 1, 2):
        model = _model()
        opt = DiLoCo(_inner(model), model, SYNC_EVERY, OUTER_LR, OUTER_MOMENTUM, sync_delay=delay)
        for step in range(STEPS):
            _local_step(model, opt, step, 0, True)
        opt.flush()
        for a, b in zip(_params(model), _reference(1, STEPS, delay, same_data=True)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    ({"sync_every": 0}, "sync_every must be at least 1"),
    ({"sync_every": 2, "sync_delay": 2}, r"sync_delay must be in \[0, sync_every\)"),
    ({"sync_every": 2, "outer_lr": 0.0}, "outer_lr must be positive"),
    ({"sync_every": 2, "outer_momentum": 1.0}, r"outer_momentum in \[0, 1\)"),
])
def test_bad_arguments_raise(process_group, kwargs, message):
    model = _model()
    with pytest.raises(ValueError, match=message):
        DiLoCo(_inner(model), model, **kwargs)


def test_a_state_of_another_period_is_refused(process_group):
    model = _model()
    state = DiLoCo(_inner(model), model, sync_every=3).state_dict()
    with pytest.raises(ValueError, match="sync_every is 3, expected 4"):
        DiLoCo(_inner(model), model, sync_every=4).load_state_dict(state)
