"""Module buffers under PipeSGD: BatchNorm statistics identical on every rank after every step (``broadcast``:
rank 0's, ``average``: the mean) against a single-process reference on gloo processes (2 and 3 ranks,
rank-dependent data); not delayed under width K; the replica check covers them; bad names are refused."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD, ReplicaDivergenceError
from pipesgd.grads.buffers import BufferSync, FlatGroup
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_pipesgd import batch, due

STEPS = 8


def make_bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3)).double()


def state(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [p.detach().clone() for p in model.parameters()], [b.clone() for b in model.buffers()]


def reference(world: int, width: int, warmup: int, mode: str):
    """Single process. Step t: every rank's forward/backward starts from the synced buffers of step t-1 (the
    buffers are not delayed); the synced buffers are rank 0's (broadcast) or the mean (average) of what the
    forwards left; the gradients take the delayed path of tests.test_pipesgd.reference_trajectory."""
    model = make_bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    synced = [b.clone() for b in model.buffers()]
    grads, trajectory = {}, []

    def apply(s: int) -> None:
        for p, g in zip(model.parameters(), grads.pop(s)):
            p.grad = g.clone()
        opt.step()

    for t in range(STEPS):
        per_rank_grads, per_rank_buffers = [], []
        for rank in range(world):
            with torch.no_grad():
                for b, s in zip(model.buffers(), synced):
                    b.copy_(s)
            model.zero_grad()
            x, y = batch(t, rank)
            nn.functional.mse_loss(model(x), y).backward()
            per_rank_grads.append([p.grad.clone() for p in model.parameters()])
            per_rank_buffers.append([b.clone() for b in model.buffers()])
        grads[t] = [torch.stack(gs).mean(0) for gs in zip(*per_rank_grads)]
        if mode == "broadcast":
            synced = per_rank_buffers[0]
        else:
            synced = [torch.stack(bs).mean(0) if bs[0].is_floating_point() else bs[0] for bs in zip(*per_rank_buffers)]
        with torch.no_grad():
            for b, s in zip(model.buffers(), synced):
                b.copy_(s)
        if (due_step := due(t, width, warmup)) is not None:
            apply(due_step)
        trajectory.append(state(model))
    for s in sorted(grads):
        apply(s)
    trajectory.append(state(model))
    return trajectory


def train(rank: int, width: int, warmup: int, mode: str):
    model = make_bn_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=width, warmup_steps=warmup,
                  staleness="none",
                  options=PipeSGDOptions(buffers=mode, check_replicas_every=1 if mode != "none" else 0))  # the reference is the paper's plain delayed update
    trajectory, timed = [], []
    for t in range(STEPS):
        x, y = batch(t, rank)
        nn.functional.mse_loss(model(x), y).backward()
        timed.append(opt.step().t_buffers_s)
        opt.zero_grad()
        trajectory.append(state(model))
    opt.flush()
    trajectory.append(state(model))
    opt.close()
    return trajectory, timed


SCENARIOS = [(2, 1, "broadcast"), (3, 0, "average"), (1, 0, "average"), (2, 0, "none")]


def _scenarios(rank: int, world: int):
    return [train(rank, *scenario) for scenario in SCENARIOS]


@pytest.mark.parametrize("world", [2, 3])
def test_buffers_follow_the_reference_and_stay_identical(world):
    per_rank = run_ranks(_scenarios, world)
    for index, (width, warmup, mode) in enumerate(SCENARIOS):
        runs = [per_rank[rank][index] for rank in range(world)]
        if mode == "none":
            # Without sync every rank keeps its own statistics (what makes the other modes' test meaningful).
            assert not torch.equal(runs[0][0][-1][1][0], runs[1][0][-1][1][0])
            assert all(t is None for t in runs[0][1])
            continue
        want = reference(world, width, warmup, mode)
        for rank, (trajectory, timed) in enumerate(runs):
            assert all(t is not None and t >= 0 for t in timed)
            for t, ((params, buffers), (ref_params, ref_buffers)) in enumerate(zip(trajectory, want)):
                where = f"{mode} K={width} rank {rank} after step {t}"
                for g, w in zip(params + buffers, ref_params + ref_buffers):
                    torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=where)
                # Bitwise identical on every rank, buffers included, after every step.
                for g, w in zip(params + buffers, runs[0][0][t][0] + runs[0][0][t][1]):
                    assert torch.equal(g, w), where


def _drifted_buffer(rank: int, world: int):
    model = make_bn_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    if rank == 1:
        model[1].running_var[2] += 1e-9
    try:
        opt.check_replicas()
        return "not caught"
    except ReplicaDivergenceError as error:
        return str(error)
    finally:
        opt.close()


def test_the_replica_check_covers_buffers():
    for message in run_ranks(_drifted_buffer, 2):
        assert "'1.running_var'" in message


def test_world_size_one_and_parameter_lists_sync_nothing(process_group):
    model = make_bn_model()
    assert not BufferSync(model, "broadcast").active  # no other rank
    assert BufferSync(list(model.parameters()), "average").buffers == []  # a parameter list has no buffers
    assert BufferSync(model, "none").buffers == []
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model)
    x, y = batch(0, 0)
    nn.functional.mse_loss(model(x), y).backward()
    assert opt.step().t_buffers_s is None and "t_buffers" not in opt.last_stats.as_metrics()


class _CountOps(TorchDispatchMode):
    """The torch operations issued under it, as the dispatcher sees them from Python (one per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _buffers(count: int) -> list[torch.Tensor]:
    shapes = [(5,), (), (2, 3)]  # a BatchNorm's statistics, its 0-d counter, a 2-D buffer
    return [torch.full(shapes[i % 3], float(i)) for i in range(count)]


def test_a_flat_group_round_trips_in_the_same_number_of_calls_for_any_number_of_buffers():
    calls = []
    for count in (3, 60):
        group = FlatGroup(_buffers(count))
        flat = group.flatten()
        assert flat.shape == (sum(t.numel() for t in group.tensors),)
        with _CountOps() as seen:
            group.flatten()
            group.unflatten_(flat * 2 + 1)
        calls.append(len(seen.ops))
        for i, t in enumerate(group.tensors):  # each buffer got its own slice back, written in place
            assert torch.equal(t, torch.full_like(t, 2.0 * i + 1))
    assert calls[0] == calls[1] <= 6, calls  # a loop over the buffers made four calls each


def test_a_group_with_a_buffer_that_is_not_contiguous_still_writes_back():
    strided = torch.arange(6.0).view(2, 3).t()  # no 1-D view of it exists
    group = FlatGroup([torch.zeros(4), strided])
    assert group.views is None
    flat = group.flatten()
    assert torch.equal(flat[4:], strided.reshape(-1))
    group.unflatten_(-flat)
    assert torch.equal(group.tensors[1], -torch.arange(6.0).view(2, 3).t()) and group.tensors[1] is strided


@pytest.mark.parametrize("mode", ["sum", "", None, "Broadcast"])
def test_unknown_buffer_modes_are_refused(mode):
    model = make_bn_model()
    with pytest.raises(ValueError, match="buffers must be one of"):
        PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, options=PipeSGDOptions(buffers=mode))


def _sync_batchnorm(rank: int, world: int):
    device = torch.device("cuda", 0)  # the ranks share one GPU over gloo
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3))
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0,
                  options=PipeSGDOptions(check_replicas_every=1))
    for t in range(4):
        x, y = (v.float().to(device) for v in batch(t, rank))
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    opt.flush()
    opt.close()
    return [b.cpu() for b in model.buffers()] + [p.detach().cpu() for p in model.parameters()]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="SyncBatchNorm trains on GPU tensors only")
def test_sync_batchnorm_models_train_and_stay_identical():
    first, second = run_ranks(_sync_batchnorm, 2)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def _odd_last_forward(rank: int, world: int):
    """A forward after the last step() (an odd last micro-batch) moves this rank's running statistics; flush()
    must leave them identical again, in every syncing mode."""
    out = {}
    for mode in ("broadcast", "average", "broadcast-delayed", "average-delayed", "none"):
        model = make_bn_model()
        opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0,
                      options=PipeSGDOptions(buffers=mode))
        for t in range(3):
            x, y = batch(t, rank)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        model(batch(3, rank)[0])  # forward only: no step() follows
        opt.flush()
        out[mode] = [b.clone() for b in model.buffers()]
        opt.close()
    return out


def test_flush_leaves_buffers_identical_after_a_forward_without_step():
    first, second = run_ranks(_odd_last_forward, 2)
    for mode in ("broadcast", "average", "broadcast-delayed", "average-delayed"):
        assert all(torch.equal(a, b) for a, b in zip(first[mode], second[mode])), mode
    assert not all(torch.equal(a, b) for a, b in zip(first["none"], second["none"]))  # per rank, as asked
