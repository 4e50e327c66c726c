"""Clipping of the averaged gradient and gradient accumulation, against a single-process reference (gloo, 2 and
3 ranks, rank-dependent data), plus their argument checks at world size 1."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD
from tests.distributed import run_ranks
from tests.test_pipesgd import batch, make_model, snapshot
from tests.single_process import process_group  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("process_group")  # PipeSGD needs a process group: one rank

STEPS = 10
MAX_NORM = 0.3  # below most of these gradients' norms, so the clip acts on most steps


def micro_batch(t: int, m: int, rank: int):
    return batch(100 * t + m, rank)


def reference(world: int, width: int, warmup: int, max_norm: float | None, accumulate: int):
    """Single process: g_t = mean over ranks of sum over micro-batches of grad(loss / accumulate); the delayed
    apply of tests.test_pipesgd.reference_trajectory; clip_grad_norm_ on the averaged gradient before the
    optimizer. Returns the weights after every step and the norm of each applied gradient, in apply order."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads, norms, trajectory = {}, [], []

    def apply(s: int) -> None:
        for p, g in zip(model.parameters(), grads.pop(s)):
            p.grad = g.clone()
        if max_norm is not None:
            norms.append(float(nn.utils.clip_grad_norm_(list(model.parameters()), max_norm)))
        opt.step()

    for t in range(STEPS):
        per_rank = []
        for rank in range(world):
            model.zero_grad()
            for m in range(accumulate):
                x, y = micro_batch(t, m, rank)
                (nn.functional.mse_loss(model(x), y) / accumulate).backward()
            per_rank.append([p.grad.clone() for p in model.parameters()])
        grads[t] = [torch.stack(gs).mean(0) for gs in zip(*per_rank)]
        if t < warmup:
            apply(t)
        elif t >= warmup + width - 1:
            apply(t - width + 1)
        trajectory.append(snapshot(model))
    for s in sorted(grads):
        apply(s)
    trajectory.append(snapshot(model))
    return trajectory, norms


def train(rank: int, width: int, warmup: int, max_norm: float | None, accumulate: int):
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=width, warmup_steps=warmup,
                  staleness="none", options=PipeSGDOptions(max_grad_norm=max_norm))  # the reference: plain delay
    trajectory, norms = [], []
    for t in range(STEPS):
        for m in range(accumulate):
            x, y = micro_batch(t, m, rank)
            (nn.functional.mse_loss(model(x), y) / accumulate).backward()
        stats = opt.step()
        opt.zero_grad()
        if stats.applied_step is not None and max_norm is not None:
            norms.append(stats.grad_norm)
        trajectory.append(snapshot(model))
    norms += [s.grad_norm for s in opt.flush() if max_norm is not None]
    trajectory.append(snapshot(model))
    opt.close()
    return trajectory, norms


SCENARIOS = [  # (width, warmup, max_grad_norm, micro-batches per step)
    (1, 0, MAX_NORM, 1),
    (2, 1, MAX_NORM, 1),
    (3, 2, MAX_NORM, 1),
    (2, 1, None, 3),
    (2, 2, MAX_NORM, 2),
]


def _scenarios(rank: int, world: int):
    return [train(rank, *scenario) for scenario in SCENARIOS]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_clipping_and_accumulation_match_the_reference(world):
    per_rank = run_ranks(_scenarios, world)
    for index, scenario in enumerate(SCENARIOS):
        want, want_norms = reference(world, *scenario)
        width, warmup, max_norm, _ = scenario
        if max_norm is not None:
            # The clip acts (else this test could not tell clipping from none).
            assert sum(n > max_norm for n in want_norms) >= STEPS // 2, want_norms
            unclipped, _ = reference(world, width, warmup, None, scenario[3])
            assert not torch.allclose(unclipped[-1][0], want[-1][0])
        for rank in range(world):
            trajectory, norms = per_rank[rank][index]
            torch.testing.assert_close(norms, want_norms, rtol=1e-10, atol=1e-12, msg=f"{scenario} rank {rank}")
            for t, (got, ref) in enumerate(zip(trajectory, want)):
                for g, w in zip(got, ref):
                    torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"{scenario} rank {rank} step {t}")
            # Every rank applies the same bits, so the clip decision and the weights are identical too.
            assert norms == per_rank[0][index][1]
            assert all(torch.equal(g, w) for g, w in zip(trajectory[-1], per_rank[0][index][0][-1]))


def test_no_applied_gradient_exceeds_the_clip_at_world_size_one():
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = PipeSGD(inner, model, width=2, warmup_steps=0, options=PipeSGDOptions(max_grad_norm=MAX_NORM))
    seen = []
    inner.register_step_pre_hook(lambda o, *_: seen.append(float(nn.utils.get_total_norm(
        [p.grad for p in model.parameters()]))))
    for t in range(STEPS):
        x, y = batch(t, 0)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    opt.flush()
    assert len(seen) == STEPS and max(seen) <= MAX_NORM * (1 + 1e-9)
    assert opt.last_stats.grad_norm > MAX_NORM  # the last one was clipped, and its norm before is reported


def test_accumulation_keeps_the_misuse_guards():
    """Several backward() then one step() is accumulation; a step() without a backward() since the last
    step() still raises, and zero_grad() between the micro-batches and step() still refuses to drop them."""
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    for m in range(3):
        x, y = micro_batch(0, m, 0)
        nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(RuntimeError, match="discard this step's gradients"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()
    with pytest.raises(RuntimeError, match="without a backward"):
        opt.step()
    opt.flush()


@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan"), "1.0", True])
def test_bad_max_grad_norm_is_refused(value):
    model = make_model()
    with pytest.raises(ValueError, match="max_grad_norm"):
        PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, options=PipeSGDOptions(max_grad_norm=value))


@pytest.mark.parametrize("value", [0, 0.0, None])
def test_zero_or_none_turns_clipping_off(value):
    """As HF Trainer's ``max_grad_norm`` and nanoGPT's ``grad_clip``: 0 means no clipping."""
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=1,
                  options=PipeSGDOptions(max_grad_norm=value))
    assert opt.config.options.max_grad_norm is None
    nn.functional.mse_loss(model(batch(0, 0)[0]), batch(0, 0)[1] * 1e6).backward()  # a huge gradient
    assert opt.step().grad_norm is None  # nothing clipped, no norm computed
