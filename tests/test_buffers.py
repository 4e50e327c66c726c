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
    """Single process, after every step and after flush(): the parameters (the delayed path of
    tests.test_pipesgd.reference_trajectory), each rank's own buffers (every rank's forwards update its own copy),
    and the buffers every rank holds once they are synced: rank 0's (broadcast) or the mean of the ranks' own
    (average). Also, last, the buffers a sync in every step (the previous default) would have left."""
    model = make_bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    own = [[b.clone() for b in model.buffers()] for _ in range(world)]
    every_step = [b.clone() for b in model.buffers()]
    grads, trajectory = {}, []

    def reduce(per_rank: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        if mode == "broadcast":
            return [b.clone() for b in per_rank[0]]
        return [torch.stack(bs).mean(0) if bs[0].is_floating_point() else bs[0].clone() for bs in zip(*per_rank)]

    def apply(s: int) -> None:
        for p, g in zip(model.parameters(), grads.pop(s)):
            p.grad = g.clone()
        opt.step()

    for t in range(STEPS):
        per_rank_grads, per_rank_every_step = [], []
        for rank in range(world):
            with torch.no_grad():  # the forward of a sync in every step: from the synced buffers
                for b, synced in zip(model.buffers(), every_step):
                    b.copy_(synced)
                model(batch(t, rank)[0])
            per_rank_every_step.append([b.clone() for b in model.buffers()])
            with torch.no_grad():
                for b, mine in zip(model.buffers(), own[rank]):
                    b.copy_(mine)
            model.zero_grad()
            x, y = batch(t, rank)
            nn.functional.mse_loss(model(x), y).backward()
            per_rank_grads.append([p.grad.clone() for p in model.parameters()])
            own[rank] = [b.clone() for b in model.buffers()]
        grads[t] = [torch.stack(gs).mean(0) for gs in zip(*per_rank_grads)]
        every_step = reduce(per_rank_every_step)
        if (due_step := due(t, width, warmup)) is not None:
            apply(due_step)
        trajectory.append(([p.detach().clone() for p in model.parameters()], [list(b) for b in own], reduce(own)))
    for s in sorted(grads):
        apply(s)
    trajectory.append(([p.detach().clone() for p in model.parameters()], [list(b) for b in own], reduce(own)))
    return trajectory, every_step


def train(rank: int, width: int, warmup: int, mode: str):
    model = make_bn_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=width, warmup_steps=warmup,
                  staleness="none",  # the reference is the paper's plain delayed update
                  options=PipeSGDOptions(buffers=mode))
    trajectory, timed = [], []
    for t in range(STEPS):
        x, y = batch(t, rank)
        nn.functional.mse_loss(model(x), y).backward()
        timed.append(opt.step().t_buffers_s)
        opt.zero_grad()
        trajectory.append(state(model))
    flushed = opt.flush()
    trajectory.append(state(model))
    opt.close()
    return trajectory, timed, flushed[-1].t_buffers_s if flushed else None


SCENARIOS = [(2, 1, "broadcast"), (3, 0, "average"), (1, 0, "average"), (2, 0, "none")]


def _scenarios(rank: int, world: int):
    return [train(rank, *scenario) for scenario in SCENARIOS]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_buffers_follow_the_reference_and_are_synced_where_the_ranks_meet(world):
    per_rank = run_ranks(_scenarios, world)
    for index, (width, warmup, mode) in enumerate(SCENARIOS):
        runs = [per_rank[rank][index] for rank in range(world)]
        want, every_step = reference(world, width, warmup, mode)
        for rank, (trajectory, timed, flush_s) in enumerate(runs):
            assert all(t is None for t in timed)  # no step syncs buffers: nothing in step() waits on them
            if width > 1:  # flush() applies steps, and its last record holds the sync's time
                assert (flush_s is None) == (mode == "none" or world == 1)
            for t, ((params, buffers), (ref_params, ref_own, ref_synced)) in enumerate(zip(trajectory, want)):
                where = f"{mode} K={width} rank {rank} after step {t}"
                final = t == len(trajectory) - 1
                ref_buffers = ref_synced if final and mode != "none" else ref_own[rank]
                for g, w in zip(params + buffers, ref_params + ref_buffers):
                    torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=where)
                for g, w in zip(params, runs[0][0][t][0]):  # parameters bitwise identical after every step
                    assert torch.equal(g, w), where
                if final and mode != "none":  # and after flush() the buffers too
                    assert all(torch.equal(g, w) for g, w in zip(buffers, runs[0][0][t][1])), where
        if mode == "none" and world > 1:  # without sync every rank keeps its own statistics, to the end
            assert not torch.equal(runs[0][0][-1][1][0], runs[1][0][-1][1][0])
        if mode != "none":  # the same values as a collective in every step would have left (BatchNorm)
            for g, w in zip(runs[0][0][-1][1], every_step):
                torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def _synced_mid_training(rank: int, world: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    model = make_bn_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    for t in range(3):
        x, y = batch(t, rank)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    before = [b.clone() for b in model.buffers()]
    opt.sync_buffers()  # e.g. before every rank evaluates
    after = [b.clone() for b in model.buffers()]
    opt.flush()
    opt.close()
    return before, after


def test_sync_buffers_gives_every_rank_rank_0s_buffers_mid_training():
    (before_0, after_0), (before_1, after_1) = run_ranks(_synced_mid_training, 2)
    assert not all(torch.equal(a, b) for a, b in zip(before_0, before_1))  # each rank's own until then
    assert all(torch.equal(a, b) for a, b in zip(after_1, before_0)) and all(
        torch.equal(a, b) for a, b in zip(after_0, before_0))


def _drifted_buffer(rank: int, world: int):
    model = make_bn_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    if rank == 1:
        model[1].running_var[2] += 1e-9  # this rank's own statistics, as its forwards leave them between meetings
    opt.check_replicas()
    checked = [b.clone() for b in model.buffers()]
    if rank == 1:
        with torch.no_grad():
            model[0].weight[0, 0] += 1e-9  # a parameter that drifted is a divergence
    try:
        opt.check_replicas(buffers=False)
        caught = "not caught"
    except ReplicaDivergenceError as error:
        caught = str(error)
    opt.close()
    return checked, caught


def test_the_replica_check_syncs_the_buffers_and_catches_a_drifted_parameter():
    (first, caught_0), (second, caught_1) = run_ranks(_drifted_buffer, 2)
    assert all(torch.equal(a, b) for a, b in zip(first, second))  # rank 0's buffers on both after the check
    assert "'0.weight'" in caught_0 and "'0.weight'" in caught_1


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
    for mode in ("broadcast", "average", "none"):
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
    for mode in ("broadcast", "average"):
        assert all(torch.equal(a, b) for a, b in zip(first[mode], second[mode])), mode
    assert not all(torch.equal(a, b) for a, b in zip(first["none"], second["none"]))  # per rank, as asked
