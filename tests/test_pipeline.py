"""The K-deep pipeline against completed and controllable handles, without processes or tensors."""
from __future__ import annotations

import pytest

from pipesgd.comm.handles import CompletedWork
from pipesgd.delay.pipeline import InFlight, Pipeline
from tests.fake_handles import ControllableWork


def expected_due(t: int, width: int, warmup: int) -> int | None:
    """The paper's rule, written independently: own gradient in warm-up, none while filling, then t-K+1."""
    if t < warmup:
        return t
    if t < warmup + width - 1:
        return None
    return t - width + 1


def run(pipeline: Pipeline, steps: int, make_handle=CompletedWork) -> tuple[list, list]:
    due = []
    for t in range(steps):
        pipeline.submit(t, make_handle(t))
        entry = pipeline.pop_due(t)
        due.append(None if entry is None else entry.step)
    return due, [entry.step for entry in pipeline.flush()]


@pytest.mark.parametrize("width, warmup", [(1, 0), (1, 3), (2, 0), (2, 3), (3, 2), (4, 10)])
def test_warm_up_at_depth_one_then_depth_k_applies_every_step_once_in_order(width, warmup):
    steps = 12
    pipeline = Pipeline(width, warmup)
    due, flushed = run(pipeline, steps)
    assert due == [expected_due(t, width, warmup) for t in range(steps)]
    applied = [s for s in due if s is not None] + flushed
    assert applied == list(range(steps))  # every step exactly once, in order
    assert len(pipeline) == 0


def test_in_flight_count_and_entries_follow_the_depth():
    pipeline = Pipeline(width=3, warmup_steps=1)
    counts = []
    for t in range(5):
        pipeline.submit(t, CompletedWork(t))
        pipeline.pop_due(t)
        counts.append(len(pipeline))
    assert counts == [0, 1, 2, 2, 2]
    assert [e.step for e in pipeline.entries()] == [3, 4]
    assert len(pipeline) == 2  # entries() leaves them in place


def test_the_pipeline_never_waits_on_a_handle():
    pipeline = Pipeline(width=2, warmup_steps=0)
    handles = [ControllableWork(t) for t in range(4)]
    popped = []
    for t, handle in enumerate(handles):
        pipeline.submit(t, handle)
        entry = pipeline.pop_due(t)
        if entry is not None:
            popped.append(entry)
    popped += pipeline.flush()
    assert [e.step for e in popped] == [0, 1, 2, 3]
    assert [e.handle for e in popped] == handles
    assert all(h.waits == 0 and not h.is_completed() for h in handles)


def test_restore_refills_an_empty_pipeline_and_steps_go_on_from_there():
    pipeline = Pipeline(width=2, warmup_steps=0)
    run(pipeline, 3)  # leaves it empty, last step 2
    pipeline.restore([InFlight(5, CompletedWork("five"))])
    pipeline.submit(6, CompletedWork("six"))
    entry = pipeline.pop_due(6)
    assert entry.step == 5 and entry.handle.wait() == "five"
    assert [e.step for e in pipeline.flush()] == [6]


def test_restore_resets_the_order_so_an_older_checkpoint_can_be_loaded_after_flush():
    pipeline = Pipeline(width=2, warmup_steps=0)
    run(pipeline, 10)
    pipeline.restore([])
    pipeline.submit(4, CompletedWork(4))  # allowed: a checkpoint from step 4 was loaded
    assert pipeline.pop_due(4) is None


def test_misuse_raises():
    pipeline = Pipeline(width=2, warmup_steps=0)
    pipeline.submit(0, CompletedWork(0))
    with pytest.raises(RuntimeError, match="each step goes in once"):
        pipeline.submit(0, CompletedWork(0))
    with pytest.raises(RuntimeError, match="pop_due"):
        pipeline.pop_due(1)
    assert pipeline.pop_due(0) is None
    pipeline.submit(1, CompletedWork(1))
    with pytest.raises(RuntimeError, match="already in flight"):  # a second submit without popping
        pipeline.submit(2, CompletedWork(2))
    with pytest.raises(RuntimeError, match="call flush"):
        pipeline.restore([])
    pipeline.flush()
    with pytest.raises(ValueError, match="cannot restore"):
        pipeline.restore([InFlight(3, CompletedWork(3)), InFlight(2, CompletedWork(2))])
    with pytest.raises(ValueError, match="cannot restore"):
        pipeline.restore([InFlight(2, CompletedWork(2)), InFlight(3, CompletedWork(3))])  # K-1 at most


@pytest.mark.parametrize("width, warmup, match", [(0, 0, "width"), (2.0, 0, "width"), (2, -1, "warmup_steps")])
def test_bad_arguments(width, warmup, match):
    with pytest.raises(ValueError, match=match):
        Pipeline(width, warmup)
