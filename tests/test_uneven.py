"""Uneven inputs: a rank that runs out of data ends the run on every rank with an error naming it, within the
timeout, never a hang (gloo, 2 and 3 ranks)."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD
from pipesgd.comm.uneven import UnevenInputsError
from tests.distributed import run_ranks
from tests.fake_topology import LoopbackTopology
from tests.test_pipesgd import batch, make_model

TIMEOUT_S = 20.0


def _uneven(rank: int, world: int, width: int, compression: str = "none", standin: str = "local", steps: int = 7,
            last_steps: int = 5):
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=width, warmup_steps=1,
                  compression=compression, error_feedback=compression != "none",
                  options=PipeSGDOptions(timeout_s=TIMEOUT_S, lookahead_standin=standin))
    steps = last_steps if rank == world - 1 else steps  # the last rank has two batches fewer (or more)
    start = time.monotonic()
    try:
        for t in range(steps):
            x, y = batch(t, rank)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        opt.flush()
        return "no error", time.monotonic() - start
    except UnevenInputsError as error:
        return str(error), time.monotonic() - start
    finally:
        opt.close()


@pytest.mark.parametrize("world, width, compression", [(2, 2, "none"), (3, 1, "none"), (3, 3, "none"), (3, 2, "q8")])
@pytest.mark.slow
def test_the_rank_that_ran_out_is_named_on_every_rank(world, width, compression):
    """The finished rank joins the others' ring of that step with zeros (the backend's all_reduce, or our ring with
    a codec and error feedback), so they learn who ran out from the agreement, not from a timeout."""
    last = world - 1
    for rank, (message, seconds) in enumerate(run_ranks(_uneven, world, width, compression)):
        assert f"rank {last} ran out of data after 5 steps" in message, (rank, message)
        assert "same number of steps" in message and seconds < TIMEOUT_S


def test_a_rank_without_a_single_step_is_named_too():
    """It never took the first step, whose agreement on unused parameters its peers wait in: flush() joins that."""
    for rank, (message, seconds) in enumerate(run_ranks(_uneven, 2, 2, "none", "local", 3, 0)):
        assert "rank 1 ran out of data after 0 steps" in message, (rank, message)
        assert seconds < TIMEOUT_S


def _even(rank: int, world: int):
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    for t in range(4):
        x, y = batch(t, rank)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    applied = [s.applied_step for s in opt.flush()] + [s.applied_step for s in opt.flush()]
    opt.close()
    return applied


@pytest.mark.slow
def test_even_ranks_finish_quietly_and_flush_twice():
    assert run_ranks(_even, 2) == [[3], [3]]


def _agreements(rank: int, world: int, check_uneven: bool):
    """How many agreements a 4-step even run made, and its final weights."""
    from pipesgd.comm import uneven

    calls = []
    post = uneven.Participation._post

    def counting(self, steps):
        calls.append(steps)
        return post(self, steps)

    uneven.Participation._post = counting
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=1,
                  options=PipeSGDOptions(check_uneven=check_uneven))
    for t in range(4):
        x, y = batch(t, rank)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    opt.flush()
    opt.close()
    return len(calls), [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow
def test_check_uneven_off_skips_the_per_step_agreement_and_trains_the_same():
    """The trainer runs the same number of steps on every rank and turns the agreement off (a latency-bound
    collective per step); the weights are the same bits either way."""
    (checked, weights), _ = run_ranks(_agreements, 2, True)
    (unchecked, same), _ = run_ranks(_agreements, 2, False)
    assert checked == 5 and unchecked == 0  # 4 steps + the flush's, or none
    assert all(torch.equal(a, b) for a, b in zip(weights, same))


def test_check_uneven_must_be_a_bool():
    model = make_model()
    with pytest.raises(ValueError, match="check_uneven must be True or False"):
        PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, options=PipeSGDOptions(check_uneven="no"))


class _Recorded:
    """An agreement in flight that records when it is waited for, and answers 'everyone still trains'."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def wait(self) -> bool:
        self.events.append("agreement read")
        return True


def test_the_ring_starts_before_the_agreement_is_answered(monkeypatch):
    """The agreement is posted and the ring runs at once; its answer is read after the ring. (A ring that waited
    for it started a compute time late on shared cores: the latency-bound collective finished only when the
    slowest rank's compute did.) No process group: ``dist.all_reduce`` is replaced by the recording one."""
    from pipesgd.comm import uneven

    events: list[str] = []

    def post(word, group=None, async_op=False):
        assert async_op, "the agreement must not block the ring"
        events.append("agreement posted")
        return _Recorded(events)

    monkeypatch.setattr(uneven.dist, "all_reduce", post)
    topology = LoopbackTopology()
    topology.group = None  # group ranks are global ranks
    participation = uneven.Participation(topology, torch.device("cpu"), group=None)
    result = participation.exchange(lambda buffers: events.append("ring") or "averaged", [], step=3)
    assert result == "averaged"
    assert events == ["agreement posted", "ring", "agreement read"]


def _agreement_word_device(rank: int, world: int) -> str:
    from pipesgd.comm.topology import RingTopology
    from pipesgd.comm.uneven import Participation

    topology = RingTopology(dist.group.WORLD)
    part = Participation(topology, torch.device("cuda"), dist.new_group(list(range(world))))
    try:
        word, pending = part._post(None)  # a CUDA word would fail here, on a machine without one
        pending.wait()
        return f"{word.device.type} {word.tolist()}"
    finally:
        part.close()


def test_the_agreement_word_lives_on_the_host_for_gloo_even_for_a_cuda_model():
    # Gloo reduces host memory: a CUDA word is staged through the host, and writing its entry was a blocking copy
    # that the H100 run's sync check caught on every step's job.
    assert run_ranks(_agreement_word_device, 2, timeout_s=60) == ["cpu [0, 0]", "cpu [0, 0]"]
