"""SyncBatchNorm models under PipeSGD (issue 10): on gloo processes (2 and 3 ranks, rank-dependent data), the
real ``nn.SyncBatchNorm`` module and autograd function, with CPU stand-ins for its CUDA-only kernels
(``tests.cpu_sync_batchnorm``), train beside the background ring without a hang, follow a single-process
BatchNorm on the ranks' batches put together (the statistics SyncBatchNorm computes are global), and end every
step with parameters and buffers bitwise identical on every rank, under each buffer mode.
``experiments/gpu_check.py`` runs the same model with the real kernels on a GPU."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD
from tests.cpu_sync_batchnorm import cpu_sync_batchnorm
from tests.distributed import run_ranks
from tests.test_buffers import make_bn_model, state
from tests.test_pipesgd import batch, due

STEPS = 6
# (width K, buffers): SyncBatchNorm's running statistics are global, so they are identical even with "none".
SCENARIOS = [(1, "broadcast"), (2, "none"), (2, "broadcast"), (2, "average")]


def reference(world: int, width: int):
    """One process, plain BatchNorm on every rank's batch of the step put together; step t computes its gradient
    and applies step t-K+1's (warm-up 0), the rest at the end, as PipeSGD's flush does."""
    model = make_bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads, trajectory = {}, []

    def apply(s: int) -> None:
        for p, g in zip(model.parameters(), grads.pop(s)):
            p.grad = g
        opt.step()

    for t in range(STEPS):
        x, y = (torch.cat(parts) for parts in zip(*(batch(t, rank) for rank in range(world))))
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        grads[t] = [p.grad.clone() for p in model.parameters()]
        if (due_step := due(t, width, warmup=0)) is not None:
            apply(due_step)
        trajectory.append(state(model))
    for s in sorted(grads):
        apply(s)
    trajectory.append(state(model))
    return trajectory


def train(rank: int, width: int, buffers: str):
    model = nn.SyncBatchNorm.convert_sync_batchnorm(make_bn_model())
    assert isinstance(model[1], nn.SyncBatchNorm)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=width, warmup_steps=0,
                  staleness="none", options=PipeSGDOptions(buffers=buffers, check_replicas_every=1))  # the reference: plain delay
    trajectory = []
    for t in range(STEPS):
        x, y = batch(t, rank)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        trajectory.append(state(model))
    opt.flush()
    trajectory.append(state(model))
    opt.close()
    return trajectory


def _scenarios(rank: int, world: int):
    with cpu_sync_batchnorm():
        return [train(rank, *scenario) for scenario in SCENARIOS]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_sync_batchnorm_follows_the_reference_and_stays_identical(world):
    per_rank = run_ranks(_scenarios, world)
    for index, (width, buffers) in enumerate(SCENARIOS):
        want = reference(world, width)
        for rank in range(world):
            for t, ((params, bufs), (ref_params, ref_bufs)) in enumerate(zip(per_rank[rank][index], want)):
                where = f"K={width} buffers={buffers} rank {rank} after step {t}"
                # Training-mode normalisation uses the batch's statistics, so parameters never depend on the
                # buffer mode, and SyncBatchNorm's statistics are global, so neither do its buffers.
                for got, expected in zip(params + bufs, ref_params + ref_bufs):
                    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12, msg=where)
                first = per_rank[0][index][t]
                assert all(torch.equal(g, w) for g, w in zip(params + bufs, first[0] + first[1])), where


def test_the_stand_in_kernels_are_what_the_test_relies_on():
    """Outside ``cpu_sync_batchnorm()`` SyncBatchNorm still refuses CPU input in a process group, so the test
    above really ran the stand-ins (without a group SyncBatchNorm falls back to plain batch norm)."""
    assert all("expected input tensor to be on GPU" in message for message in run_ranks(_refused, 2))


def _refused(rank: int, world: int) -> str:
    model = nn.SyncBatchNorm.convert_sync_batchnorm(make_bn_model())
    try:
        model(batch(0, rank)[0])
    except ValueError as error:
        return str(error)
    return "accepted"
