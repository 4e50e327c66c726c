"""Look-ahead's reach (``PipeSGD(lookahead_reach=...)``, ``pipesgd-train --lookahead-reach``): the parameters move
that many times the replayed displacement and come back to the master weights; 1 is the default and changes
nothing; any other reach gives up the synchronous trajectory at world size 1 (so the option can be seen to act);
the master weights stay identical on every rank and a resumed run repeats the uninterrupted one; bad values are
refused."""
from __future__ import annotations

import math

import pytest
import torch

from pipesgd import PipeSGD
from pipesgd.delay.lookahead import Lookahead
from pipesgd.options import PipeSGDOptions
from pipesgd.train.flags import resolve
from pipesgd.train.metrics import pipe_staleness
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_lookahead import _loss, _run
from tests.test_pipesgd import make_model, snapshot

REACH = 1.2


def test_the_parameters_reach_that_many_replayed_displacements_and_come_back():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(32)), torch.nn.Parameter(torch.randn(4, 8))]
    optimizer = torch.optim.AdamW(params, lr=0.1, weight_decay=0.1)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    master = [p.detach().clone() for p in params]
    stand_in = [torch.randn_like(p) for p in params]
    plain, far = Lookahead(optimizer, params, 2), Lookahead(optimizer, params, 2, reach=REACH)
    plain.record(5, stand_in)
    plain.advance()
    reached = [p.detach().clone() for p in params]
    plain.restore()
    far.record(5, stand_in)
    far.advance()
    far.advance()  # already there: no second move
    for p, m, r in zip(params, master, reached):
        assert not torch.equal(r, m)
        torch.testing.assert_close(p.detach(), m + REACH * (r - m))
    far.restore()
    assert all(torch.equal(p.detach(), m) for p, m in zip(params, master))


def test_reach_one_is_the_default_and_another_leaves_the_synchronous_trajectory(process_group):
    synchronous = _run(1, "adamw", warmup_steps=2)
    assert _run(2, "adamw", warmup_steps=2, lookahead_reach=1.0)[0] == synchronous[0]
    far = _run(2, "adamw", warmup_steps=2, lookahead_reach=REACH)
    assert far[0][:3] == synchronous[0][:3]  # the warm-up and the step that fills the pipeline: nothing replayed
    assert far[0][3:] != synchronous[0][3:]


def _first_look(reach: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """World size 1, a parameter list (moved at step()'s end): the master and look-ahead weights after the step
    that fills the pipeline."""
    model = make_model()
    params = list(model.parameters())
    opt = PipeSGD(torch.optim.SGD(params, lr=0.1, momentum=0.9), params, width=2, warmup_steps=1,
                  lookahead_reach=reach)
    for t in range(2):
        _loss(model, t, 0).backward()
        opt.step()
        opt.zero_grad()
    looking = snapshot(model)
    master = [m.detach().clone() for m in opt._lookahead.master_params()]
    opt.close()
    return master, looking


def test_the_wrapper_passes_its_reach_to_the_look_ahead(process_group):
    master, near = _first_look(1.0)
    same_master, far = _first_look(REACH)
    for m, m2, n, f in zip(master, same_master, near, far):
        assert torch.equal(m, m2) and not torch.equal(n, m)
        torch.testing.assert_close(f, m + REACH * (n - m))


def _train(model: torch.nn.Module, opt: PipeSGD, steps: range, rank: int) -> None:
    for t in steps:
        _loss(model, t, rank).backward()
        opt.step()
        opt.zero_grad()


def _replicas(rank: int, world: int) -> list[torch.Tensor]:
    model = make_model()
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.01), model, width=3, warmup_steps=1,
                  compression="q8", error_feedback=True, lookahead_reach=REACH, check_replicas_every=1)
    _train(model, opt, range(8), rank)
    opt.flush()
    opt.check_replicas()
    opt.close()
    return snapshot(model)


def test_master_weights_stay_identical_across_ranks_with_a_longer_reach():
    per_rank = run_ranks(_replicas, 2)
    assert all(torch.equal(a, b) for a, b in zip(*per_rank))


RESUME_AT = 5


def resumable(rank: int, world: int, path: str, resume: bool, options: dict) -> list[torch.Tensor]:
    """AdamW at width 3 with q8 + error feedback and ``options`` (PipeSGD's); saved per rank at RESUME_AT, or resumed
    from there. The final weights."""
    model = make_model()
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.01), model, width=3, warmup_steps=1, compression="q8",
                  error_feedback=True, **options)
    if resume:
        state = torch.load(f"{path}.{rank}", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    else:
        _train(model, opt, range(RESUME_AT), rank)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"{path}.{rank}")
    _train(model, opt, range(RESUME_AT, 10), rank)
    opt.flush()
    opt.close()
    return snapshot(model)


def test_a_resumed_run_with_a_reach_repeats_the_uninterrupted_one(tmp_path):
    path = str(tmp_path / "state")
    uninterrupted = run_ranks(resumable, 2, path, False, dict(lookahead_reach=REACH))
    resumed = run_ranks(resumable, 2, path, True, dict(lookahead_reach=REACH))
    for want, got in zip(uninterrupted, resumed):
        assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("bad", [0.0, -1.0, 2.5, math.nan, True, "1.2"])
def test_a_bad_reach_is_refused(bad):
    with pytest.raises(ValueError, match="lookahead_reach must be a number in"):
        PipeSGDOptions(lookahead_reach=bad)


def test_a_reach_needs_look_ahead():
    with pytest.raises(ValueError, match="lookahead_reach applies to staleness='lookahead' only"):
        PipeSGDOptions(staleness="none", lookahead_reach=REACH)


def test_the_trainer_names_a_reach_in_its_summary_and_its_config():
    cfg = resolve(["--lookahead-reach", "1.2"])
    assert cfg.lookahead_reach == REACH and cfg.to_dict()["lookahead_reach"] == REACH
    assert pipe_staleness(cfg) == ", staleness lookahead (reach 1.2)"
    assert pipe_staleness(resolve([])) == ", staleness lookahead"
