"""The multi-process test harness (tests/distributed.py) itself: results come back by rank, several checks share one
world, and a rank that hangs fails the run with its Python stack rather than only a timeout."""
from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from tests.distributed import run_checks, run_ranks


def _rank_and_sum(rank: int, world: int) -> tuple[int, int]:
    import torch
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    return rank, int(total)


def _rank_one_sleeps(rank: int, world: int) -> int:
    if rank == 1:
        time.sleep(60)  # the hang under test
    return rank


def test_results_come_back_by_rank():
    assert run_ranks(_rank_and_sum, 3, timeout_s=60) == [(0, 6), (1, 6), (2, 6)]


def _rank_plus(rank: int, world: int, offset: int) -> int:
    return rank + offset


def test_checks_in_one_world_come_back_by_name_and_rank():
    results = run_checks({"sum": (_rank_and_sum,), "plus": (_rank_plus, 10)}, 2, timeout_s=60)
    assert results == {"sum": [(0, 3), (1, 3)], "plus": [10, 11]}


@pytest.mark.slow
def test_a_hung_rank_is_reported_with_its_stack():
    with pytest.raises(AssertionError) as failure:
        run_ranks(_rank_one_sleeps, 2, timeout_s=6)
    message = str(failure.value)
    # Rank 0 waits for rank 1 at the closing barrier and reports gloo's timeout, or (on a loaded machine, where the
    # start takes longer) the caller's deadline comes first; either way rank 1 is shown where it stood.
    assert ("rank 0 failed" in message and "Timed out" in message) or "did not finish within 6 s" in message
    assert "--- rank 1 (still running) ---" in message and "_rank_one_sleeps" in message
