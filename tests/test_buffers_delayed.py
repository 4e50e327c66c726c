"""Delayed buffer modes (``broadcast-delayed``, ``average-delayed``): the buffers of step t ride step t's gradient
exchange and are written on every rank when step t's gradient is applied (K-1 steps later), against a
single-process reference that keeps each rank's own buffers, on gloo processes (2 and 3 ranks, rank-dependent
data); identical on every rank after every step that applies a gradient, each rank's own while the pipeline
fills; the replica check passes through those fill steps."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd.grads.buffers import BufferSync
from tests.distributed import run_ranks
from tests.test_buffers import STEPS, make_bn_model, state, train
from tests.test_pipesgd import batch


def reference(world: int, width: int, warmup: int, mode: str) -> list[list[tuple]]:
    """Per step, per rank (params, buffers). Each rank's forward starts from its own buffers; a step's buffers
    (rank 0's or the mean of what the forwards left) replace every rank's when that step's gradient is applied."""
    model = make_bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    own = [[b.clone() for b in model.buffers()] for _ in range(world)]
    grads, snapshots, trajectory = {}, {}, []

    def apply(s: int) -> None:
        for p, g in zip(model.parameters(), grads.pop(s)):
            p.grad = g.clone()
        opt.step()
        per_rank = snapshots.pop(s)
        if mode == "broadcast-delayed":
            synced = per_rank[0]
        else:
            synced = [torch.stack(bs).mean(0) if bs[0].is_floating_point() else bs[0] for bs in zip(*per_rank)]
        for rank in range(world):
            own[rank] = [b.clone() for b in synced]

    def record() -> None:
        params = [p.detach().clone() for p in model.parameters()]
        trajectory.append([(params, [b.clone() for b in own[rank]]) for rank in range(world)])

    for t in range(STEPS):
        per_rank_grads = []
        for rank in range(world):
            with torch.no_grad():
                for b, mine in zip(model.buffers(), own[rank]):
                    b.copy_(mine)
            model.zero_grad()
            x, y = batch(t, rank)
            nn.functional.mse_loss(model(x), y).backward()
            per_rank_grads.append([p.grad.clone() for p in model.parameters()])
            own[rank] = [b.clone() for b in model.buffers()]
        grads[t] = [torch.stack(gs).mean(0) for gs in zip(*per_rank_grads)]
        snapshots[t] = [list(b) for b in own]
        if t < warmup:
            apply(t)
        elif t >= warmup + width - 1:
            apply(t - width + 1)
        record()
    for s in sorted(grads):
        apply(s)
    record()
    return trajectory


SCENARIOS = [(2, 1, "broadcast-delayed"), (3, 0, "average-delayed"), (1, 0, "average-delayed")]


def _scenarios(rank: int, world: int):
    return [train(rank, *scenario) for scenario in SCENARIOS]


@pytest.mark.parametrize("world", [2, 3])
def test_delayed_buffers_follow_the_reference(world):
    per_rank = run_ranks(_scenarios, world)
    for index, (width, warmup, mode) in enumerate(SCENARIOS):
        want = reference(world, width, warmup, mode)
        filling = set(range(warmup, warmup + width - 1))  # steps that apply nothing
        for rank in range(world):
            trajectory, timed = per_rank[rank][index]
            assert all(t is not None and t >= 0 for t in timed)  # the snapshot's time
            for t, ((params, buffers), steps) in enumerate(zip(trajectory, want)):
                ref_params, ref_buffers = steps[rank]
                where = f"{mode} K={width} rank {rank} after step {t}"
                for got, expected in zip(params + buffers, ref_params + ref_buffers):
                    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12, msg=where)
                first = per_rank[0][index][0][t]
                assert all(torch.equal(a, b) for a, b in zip(params, first[0])), where
                same = all(torch.equal(a, b) for a, b in zip(buffers, first[1]))
                # identical after every step that applies a gradient; each rank's own while the pipeline fills
                assert same == (t not in filling or rank == 0), where


def test_delayed_modes_are_named_and_checked():
    model = make_bn_model()
    assert BufferSync(model, "average-delayed").delayed and not BufferSync(model, "average").delayed
    with pytest.raises(ValueError, match="buffers must be one of"):
        BufferSync(model, "delayed")
    assert state(model)[1]  # the model has buffers to sync
