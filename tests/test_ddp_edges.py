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
@pytest.mark.slow
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


def _consolidate_on_rank_zero_only(rank: int, world: int):
    import pipesgd.wrapper_state

    pipesgd.wrapper_state.ARRIVAL_WAIT_S = 3.0  # the test's own bound; the default leaves ranks a step apart room
    model = WithUnused()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    x, y = data(0, rank)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    message = None
    if rank == 0:  # the tutorial's mistake: the collective inside `if rank == 0:`
        with pytest.raises(RuntimeError) as caught:
            opt.consolidate_state_dict()
        message = str(caught.value)
    opt.close()
    return message


@pytest.mark.slow
def test_consolidate_on_one_rank_fails_fast_naming_the_fix():
    # gloo's own timeout in these ranks is far longer (0.8 x 60 s) than the bounded wait, and says nothing like this
    message = run_ranks(_consolidate_on_rank_zero_only, 2, timeout_s=60)[0]
    assert "consolidate_state_dict() is a collective: every rank must call it (before `if rank == 0:`)" in message
    assert "\n" not in message


def _consolidate_on_every_rank(rank: int, world: int):
    model = WithUnused()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    x, y = data(0, rank)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.consolidate_state_dict()
    ranks = sorted(opt.state_dict()["pipesgd"]["ranks"]) if rank == 0 else None
    opt.flush()
    opt.close()
    return ranks


@pytest.mark.slow
def test_consolidate_on_every_rank_still_gathers_every_rank():
    assert run_ranks(_consolidate_on_every_rank, 2, timeout_s=60)[0] == [0, 1]


def _stepped(width: int = 2):
    model = WithUnused()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=width, warmup_steps=0)
    x, y = data(0, 0)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    return model, opt


@pytest.mark.usefixtures("process_group")
def test_state_dict_is_shaped_like_a_torch_optimizers_and_a_plain_load_warns_at_wrap():
    model, opt = _stepped()
    state = opt.state_dict()
    assert set(state) == {"state", "param_groups", "pipesgd"} and len(state["pipesgd"]["in_flight"]) == 1
    opt.flush()
    opt.close()
    # The tutorial's order: build the optimizer, load the checkpoint into it, then wrap.
    again = WithUnused()
    plain = torch.optim.SGD(again.parameters(), lr=0.1, momentum=0.9)
    plain.load_state_dict(state)
    assert plain.state_dict()["state"].keys() == state["state"].keys()
    with pytest.warns(RuntimeWarning, match=r"losing its 1 step\(s\) in flight: wrap first, then call "
                                            r"opt.load_state_dict"):
        wrapped = PipeSGD(plain, again, width=2, warmup_steps=0)
    assert all("pipesgd_steps_in_flight" not in g for g in plain.param_groups)  # warned once, not saved again
    wrapped.close()


@pytest.mark.usefixtures("process_group")
def test_wrap_then_load_restores_the_steps_in_flight_without_a_warning():
    import warnings

    model, opt = _stepped()
    state = opt.state_dict()
    opt.close()
    again = WithUnused()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped = PipeSGD(torch.optim.SGD(again.parameters(), lr=0.1, momentum=0.9), again, width=2, warmup_steps=0)
        wrapped.load_state_dict(state)
    assert wrapped.in_flight == 1
    assert all("pipesgd_steps_in_flight" not in g for g in wrapped.optimizer.param_groups)
    wrapped.flush()
    wrapped.close()


def _next_step(model, opt, t=1):
    x, y = data(t, 0)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.usefixtures("process_group")
def test_a_model_only_snapshot_with_steps_in_flight_warns_once():
    model, opt = _stepped()
    model.state_dict()
    with pytest.warns(RuntimeWarning, match=r"model.state_dict\(\) was taken with 1 step\(s\) in flight .* save "
                                            r"opt.state_dict\(\) too, or call opt.flush\(\) first"):
        _next_step(model, opt)
    opt.close()


@pytest.mark.usefixtures("process_group")
def test_model_and_optimizer_snapshots_together_and_evaluation_copies_say_nothing():
    import warnings

    from pipesgd import model_snapshot

    model, opt = _stepped()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        {"model": model.state_dict(), "opt": opt.state_dict()}  # noqa: B018 - the usual order, model first
        _next_step(model, opt, 1)
        opt.state_dict(), model.state_dict()
        _next_step(model, opt, 2)
        with model_snapshot.for_evaluation():
            model.state_dict()
        _next_step(model, opt, 3)
        opt.flush()
        model.state_dict()  # nothing in flight
        _next_step(model, opt, 4)
        opt.close()
    assert not model._state_dict_hooks  # close() removed the hook


def test_the_exit_warning_names_a_failed_exchange_instead_of_flush():
    from pipesgd import lifecycle
    from pipesgd.comm.handles import Work
    from pipesgd.delay.pipeline import Pipeline

    class Closed:
        def close(self, timeout_s=None):
            return True

    pipeline = Pipeline(2, 0)
    failed = Work()
    failed.set_error(RuntimeError("Connection closed by peer [127.0.0.1]:29500\nat pair.cc"))
    pipeline.submit(0, failed)
    background = lifecycle.Background(Closed(), Closed(), pipeline, timeout_s=1.0)
    with pytest.warns(RuntimeWarning) as caught:
        background.close(warn=True)
    message = str(caught[0].message)
    assert "the background exchange failed (RuntimeError: Connection closed by peer [127.0.0.1]:29500)" in message
    assert "flush" not in message


@pytest.mark.usefixtures("process_group")
def test_the_trainers_checkpoint_and_deferred_evaluation_do_not_warn(tmp_path):
    import warnings

    from pipesgd.train import checkpoint
    from pipesgd.train.eval_points import EvalPoints

    model, opt = _stepped()
    evals = EvalPoints(every_epochs=0, every_steps=1, total_steps=10, deferred=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = checkpoint.RunIdentity(world_size=1, model_name="with-unused", mode="pipe")
        checkpoint.save_run(str(tmp_path), 0, run, model, opt, checkpoint.Position(step=1))
        _next_step(model, opt, 1)
        assert evals.run(model, checkpoint.Position(step=2), 0.0, lambda: (0.0, 0.0)) is None  # a deferred copy
        _next_step(model, opt, 2)
        opt.close()
