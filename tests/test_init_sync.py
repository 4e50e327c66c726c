"""What DDP does when it wraps, PipeSGD does too: every rank starts from rank 0's parameters and buffers, and
nothing runs without a process group (issue 35, items 1-2)."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pipesgd.options import PipeSGDOptions
import pipesgd
from pipesgd import PipeSGD
from pipesgd.comm.groups import NoProcessGroupError
from pipesgd.init_sync import layout_digest, module_state, sync_initial_state
from tests.cpu_sync_batchnorm import cpu_sync_batchnorm
from tests.distributed import run_checks


def _bn_model(seed: int, sync_bn: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3))
    model[1].running_mean.normal_()  # buffers that differ per seed too
    return nn.SyncBatchNorm.convert_sync_batchnorm(model) if sync_bn else model


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _wrap_rank_seeded(rank: int, world: int, init_sync: bool, sync_bn: bool, loaded: dict | None):
    model = _bn_model(100 + rank, sync_bn)  # the common `seed + rank` before building the model
    if loaded is not None and rank == 0:
        model.load_state_dict(loaded)  # only rank 0 restored a checkpoint
    with cpu_sync_batchnorm():
        opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, options=PipeSGDOptions(init_sync=init_sync))
        before = _state(model)
        for step in range(3):
            torch.manual_seed(1000 * step + rank)
            nn.functional.mse_loss(model(torch.randn(8, 6)), torch.randn(8, 3)).backward()
            opt.step()
            opt.zero_grad()
        opt.flush()
    opt.close()
    return before, _state(model)


@pytest.mark.parametrize("sync_bn", [False, True], ids=["batchnorm", "syncbatchnorm"])
@pytest.mark.slow
def test_every_rank_starts_from_rank_zeros_parameters_and_buffers(sync_bn):
    results = in_one_world(3)[f"sync_bn={sync_bn}"]
    rank0 = _state(_bn_model(100, sync_bn))
    for before, after in results:
        assert before.keys() == rank0.keys()
        for key in rank0:
            assert torch.equal(before[key], rank0[key]), key
            assert torch.equal(after[key], results[0][1][key]), key  # and they stay identical while training


@pytest.mark.slow
def test_a_state_loaded_on_rank_zero_alone_reaches_every_rank():
    loaded = LOADED
    for before, _ in in_one_world(2)["loaded"]:
        for key in loaded:
            assert torch.equal(before[key], loaded[key]), key


@pytest.mark.slow
def test_init_sync_false_leaves_each_rank_its_own_model():
    (first, _), (second, _) = in_one_world(2)["init_sync=False"]
    assert torch.equal(first["0.weight"], _state(_bn_model(100))["0.weight"])
    assert not torch.equal(first["0.weight"], second["0.weight"])


def _timed_sync(rank: int, world: int, latency: bool) -> tuple:
    model = _bn_model(rank).double()  # two dtypes: float64 parameters and buffers, BatchNorm's int64 batch count
    synced = sync_initial_state(model, dist.group.WORLD, latency=latency)
    return synced, sync_initial_state(nn.Linear(2, 2), dist.new_group([rank]))  # a group of one: nothing to send


@pytest.mark.parametrize("latency", [False, True])
@pytest.mark.slow
def test_the_initial_broadcast_says_how_long_it_took_and_what_it_moved(latency):
    """``compression="auto"``'s early look reads the link from it (``pipesgd.auto.transfer_floor_s``)."""
    for synced, alone in in_one_world(2)[f"latency={latency}"]:
        assert alone is None
        floats = sum(t.numel() for t in _bn_model(0).double().state_dict().values() if t.is_floating_point())
        assert synced.nbytes == 8 * floats + 8 and synced.seconds > 0
        assert (synced.latency_s > 0) is latency  # one element's broadcast per dtype, only when asked


def _mismatched(rank: int, world: int):
    model = nn.Linear(4, 3 if rank == 0 else 2)
    try:
        PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.slow
def test_models_of_different_shapes_are_refused_on_every_rank():
    for message in in_one_world(2)["mismatched"]:
        assert message is not None and "differs across ranks" in message



# The checks above that run on gloo ranks, by the world size they run at, each run as ``fn(rank, world, *args)``;
# each size's checks run one after another in one world, started once for the module.
LOADED = _state(_bn_model(7))
WORLD_CHECKS = {
    2: {"loaded": (_wrap_rank_seeded, True, False, LOADED), "init_sync=False": (_wrap_rank_seeded, False, False, None),
        "latency=False": (_timed_sync, False), "latency=True": (_timed_sync, True), "mismatched": (_mismatched,)},
    3: {f"sync_bn={sync_bn}": (_wrap_rank_seeded, True, sync_bn, None) for sync_bn in (False, True)},
}


@functools.cache
def in_one_world(world: int) -> dict[str, list]:
    return run_checks(WORLD_CHECKS[world], world)


def test_the_layout_digest_sees_shapes_dtypes_and_tied_weights_once():
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    assert layout_digest(module_state(a)[0]) == layout_digest(module_state(b)[0])
    assert layout_digest(module_state(a)[0]) != layout_digest(module_state(nn.Linear(3, 4))[0])
    assert layout_digest(module_state(a)[0]) != layout_digest(module_state(nn.Linear(4, 3).double())[0])
    tied = nn.Sequential(a, nn.Linear(3, 4))
    tied[1].weight = nn.Parameter(a.weight.detach().t().clone())
    shared = nn.Sequential(a, a)
    assert len(module_state(shared)[0]) == 2 and len(module_state(tied)[0]) == 4


def test_without_a_process_group_the_wrapper_and_the_ring_refuse_to_run():
    assert not dist.is_initialized()
    model = nn.Linear(3, 1)
    with pytest.raises(NoProcessGroupError, match="init_process_group"):
        PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for async_op in (False, True):
        with pytest.raises(NoProcessGroupError, match="ring_allreduce needs"):
            pipesgd.ring_allreduce(torch.ones(2), async_op=async_op)
