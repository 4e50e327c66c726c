"""The one background path: CommWorker runs jobs in order and hands errors to wait(); RingChannel runs
inline at world size 1; async rings on one group share one channel and keep their order."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

import pipesgd
from pipesgd.comm.channel import RingChannel, channel_for
from pipesgd.comm.worker import CommWorker
from pipesgd.comm.handles import CompletedWork
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture


def test_worker_runs_jobs_in_submission_order_off_the_calling_thread():
    worker = CommWorker("cpu")
    gate, order, threads = threading.Event(), [], set()

    def job(i):
        gate.wait(5)  # every job is queued before the first one runs
        order.append(i)
        threads.add(threading.get_ident())
        return i * i

    handles = [worker.submit(job, i) for i in range(6)]
    gate.set()
    assert [h.wait(5) for h in reversed(handles)] == [25, 16, 9, 4, 1, 0]
    assert order == list(range(6))
    assert threading.get_ident() not in threads and len(threads) == 1
    worker.close()
    assert not worker.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit(job, 0)


def test_a_failed_job_raises_from_wait_and_the_worker_goes_on():
    worker = CommWorker("cpu")

    def fail():
        raise ZeroDivisionError("boom")

    bad, good = worker.submit(fail), worker.submit(lambda: "fine")
    with pytest.raises(ZeroDivisionError, match="boom"):
        bad.wait(5)
    assert good.wait(5) == "fine"
    worker.close()


def test_channel_at_world_size_one_runs_inline_and_completes_the_handle():
    channel = RingChannel(None)
    calls = []
    handle = channel.submit(lambda x: calls.append(threading.get_ident()) or x + 1, 41)
    assert isinstance(handle, CompletedWork) and handle.wait() == 42
    assert calls == [threading.get_ident()] and channel.size == 1 and channel.is_open


def test_async_channels_are_shared_per_group_and_device(process_group):
    assert channel_for(None, "cpu") is channel_for(None, torch.device("cpu"))
    handle = pipesgd.ring_allreduce(torch.ones(3), async_op=True)  # world size 1: already done
    assert handle.is_completed() and torch.equal(handle.wait(), torch.ones(3))


def _async_rings_keep_their_order(rank: int, world: int):
    tensors = [torch.full((50_000,), float(rank + 10 * i)) for i in range(4)]
    expected = [t.clone() for t in tensors]
    for t in expected:
        dist.all_reduce(t)
    handles = [pipesgd.ring_allreduce(t, op="sum", async_op=True) for t in tensors]
    results = [h.wait() for h in reversed(handles)][::-1]  # waiting out of order changes nothing
    same_channel = channel_for(dist.group.WORLD, "cpu") is channel_for(dist.group.WORLD, "cpu")
    return all(torch.equal(r, e) for r, e in zip(results, expected)), same_channel


def test_async_rings_on_one_group_run_in_submission_order():
    for matched, same_channel in run_ranks(_async_rings_keep_their_order, 2):
        assert matched and same_channel
