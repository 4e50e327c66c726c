"""PipeSGD is a ``torch.optim.Optimizer`` whose groups and state are the wrapped optimizer's: a scheduler built on the
wrapper acts as one built on the inner optimizer, optimizer hooks run, ``GradScaler.step(opt)`` drives fp16 loss
scaling with every rank's scale kept the same, and misuse is refused in one line."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from pipesgd import PipeSGD, PipeSGDOptions
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_lookahead import _loss
from tests.test_pipesgd import make_model, snapshot


def _sgd(model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_it_is_an_optimizer_sharing_the_wrapped_groups_and_state(process_group):
    model = make_model()
    inner = _sgd(model)
    opt = PipeSGD(inner, model)
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups is inner.param_groups and opt.state is inner.state and opt.defaults is inner.defaults
    with pytest.raises(RuntimeError, match="before wrapping"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})
    opt.close()


def _trained(on_wrapper: bool) -> tuple[list[float], list[torch.Tensor]]:
    """Width 2 at world size 1 under OneCycleLR, built on the wrapper or on the inner optimizer."""
    model = make_model()
    opt = PipeSGD(_sgd(model), model, width=2, warmup_steps=2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt if on_wrapper else opt.optimizer, max_lr=0.1, total_steps=12)
    rates = []
    for t in range(10):
        _loss(model, t, 0).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        rates.append(opt.param_groups[0]["lr"])
    opt.flush()
    opt.close()
    return rates, snapshot(model)


def test_a_scheduler_built_on_the_wrapper_acts_as_one_built_on_the_inner_optimizer(process_group):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()" either
        on_wrapper = _trained(True)
    on_inner = _trained(False)
    assert on_wrapper[0] == on_inner[0] and len(set(on_wrapper[0])) > 5
    assert all(torch.equal(a, b) for a, b in zip(on_wrapper[1], on_inner[1]))


def test_optimizer_step_hooks_run_around_step(process_group):
    model = make_model()
    opt = PipeSGD(_sgd(model), model)
    seen = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append(("pre", o is opt)))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append(("post", o is opt)))
    _loss(model, 0, 0).backward()
    opt.step()
    assert seen == [("pre", True), ("post", True)]
    opt.flush()
    opt.close()


def test_a_closure_computes_the_gradients_first(process_group):
    model = make_model()
    opt = PipeSGD(_sgd(model), model, width=1)
    before = snapshot(model)
    opt.step(lambda: _loss(model, 0, 0).backward())
    assert not all(torch.equal(a, b) for a, b in zip(before, snapshot(model)))
    opt.close()


def _scaled(rank: int, world: int, through_scaler: bool, growth_interval: int = 10**6, width: int = 2):
    """fp16-style loss scaling with an overflow on rank 1 at step 4: ``scaler.step(opt); scaler.update()`` (the
    standard recipe) or ``opt.step()`` alone (the wrapper updates the scaler)."""
    model = make_model(torch.float32)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=growth_interval)
    opt = PipeSGD(_sgd(model), model, width=width, warmup_steps=1,
                  options=PipeSGDOptions(grad_scaler=scaler, check_replicas_every=1))
    skipped, scales = 0, []
    for t in range(10):
        scaler.scale(_loss(model, t, rank) * (float("inf") if (t, rank) == (4, 1) else 1.0)).backward()
        if through_scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        skipped += bool(opt.last_stats.skipped_nonfinite)
        scales.append(scaler.get_scale())
        opt.zero_grad()
    opt.flush()
    opt.close()
    return snapshot(model), skipped, scales


@pytest.mark.slow
def test_gradscaler_step_keeps_every_rank_on_the_same_scale_and_skips_the_overflow_once():
    (first, skipped, scales), (second, skipped_1, scales_1) = run_ranks(_scaled, 2, True)
    assert skipped == skipped_1 == 1 and scales == scales_1 and scales[-1] < 2.0**10  # the overflow backed off once
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    (want, _, want_scales), _ = run_ranks(_scaled, 2, False)
    assert scales == want_scales and all(torch.equal(a, b) for a, b in zip(first, want))  # as the wrapper drives it


@pytest.mark.slow
def test_gradscaler_step_with_a_growing_scale_at_width_three_keeps_the_ranks_together_through_flush():
    (first, skipped, scales), (second, skipped_1, scales_1) = run_ranks(_scaled, 2, True, 3, 3)
    assert skipped == skipped_1 == 1 and scales == scales_1 and len(set(scales)) > 2  # grew, backed off, grew
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_gradscaler_misuse_is_refused_in_one_line(process_group):
    model = make_model(torch.float32)
    scaler = torch.amp.GradScaler("cpu")
    unscaled = PipeSGD(_sgd(model), model)
    scaler.scale(_loss(model, 0, 0)).backward()
    with pytest.raises(ValueError, match=r"PipeSGDOptions\(grad_scaler=scaler\)"):
        scaler.step(unscaled)
    unscaled.close()
    opt = PipeSGD(_sgd(model), model, options=PipeSGDOptions(grad_scaler=scaler))
    scaler = opt.config.options.grad_scaler
    scaler.unscale_(opt)
    with pytest.raises(ValueError, match="max_grad_norm"):
        scaler.step(opt)
    opt.close()
