"""pipesgd.measure's timing loop (median of the slowest rank) at world size 1 and over 2 gloo ranks, with a fake
clock so the durations are known; and the pure derivation of the calibration's host terms and fits."""
from __future__ import annotations

import math

import pytest

from tests.distributed import run_ranks
from timing_model.calibration import Sample
from timing_model.fitting import fit_calibration, host_record, overlap_sizes


class FakeClock:
    """Each timed call lasts the next of ``durations`` seconds: the clock advances by it between start and stop."""

    def __init__(self, durations):
        self.durations, self.now, self.reads = list(durations), 0.0, 0

    def __call__(self) -> float:
        if self.reads % 2:  # a stop: the call took the next duration
            self.now += self.durations.pop(0)
        self.reads += 1
        return self.now


def test_time_calls_warms_up_then_runs_before_then_times_each_call():
    from pipesgd.measure import time_calls, time_local

    events = []
    times = time_calls(lambda: events.append("call"), 3, warmup=2, before=lambda: events.append("barrier"),
                       clock=FakeClock([0.3, 0.1, 0.2]))
    assert events == ["call", "call", "barrier", "call", "call", "call"]
    assert times == pytest.approx([0.3, 0.1, 0.2])
    assert time_local(lambda: None, 5, warmup=0, clock=FakeClock([5.0, 1.0, 2.0, 9.0, 3.0])) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="repeats"):
        time_calls(lambda: None, 0)


def test_without_a_process_group_the_slowest_rank_is_this_one():
    from pipesgd.measure import median_of_slowest, time_collective

    assert median_of_slowest([4.0, 1.0, 2.0]) == 2.0
    assert time_collective(lambda: None, 4, warmup=1, clock=FakeClock([1.0, 8.0, 2.0, 3.0])) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="at least one"):
        median_of_slowest([])


# per rank: timed durations; medians 0.2 (rank 0) and 0.5 (rank 1) -> the slowest is 0.5 on both ranks
RANK_DURATIONS = {0: [0.1, 0.2, 0.9], 1: [0.5, 0.4, 0.6]}


def _slowest_rank(rank, world_size):
    import torch.distributed as dist

    from pipesgd.measure import median_of_slowest, time_collective

    whole = time_collective(lambda: None, 3, warmup=1, clock=FakeClock(RANK_DURATIONS[rank]))
    # medians 3 (rank 0) and 2 (rank 1): the result is 3, not the largest single time (10) nor a mean
    local_first = median_of_slowest([1.0 + rank, 10.0 * (1 - rank), 3.0])
    solo = dist.new_group(ranks=[1])  # a sub-group: only its members reduce
    alone = median_of_slowest([7.0], group=solo) if rank == 1 else None
    return whole, local_first, alone


@pytest.mark.slow
def test_two_ranks_agree_on_the_slowest_median():
    results = run_ranks(_slowest_rank, 2, timeout_s=60)
    assert [r[0] for r in results] == pytest.approx([0.5, 0.5])
    assert [r[1] for r in results] == pytest.approx([3.0, 3.0])
    assert results[1][2] == 7.0


def _overlap_row(compression, n_bytes, ring_alone, ring_together, load_alone, load_together):
    return {"compression": compression, "n_bytes": n_bytes, "ring_alone_s": ring_alone,
            "ring_together_s": ring_together, "load_alone_s": load_alone, "load_together_s": load_together}


def test_host_record_derives_the_model_terms_from_raw_timings():
    rows = [_overlap_row("none", 1e6, 0.010, 0.011, 0.020, 0.030),  # ring ×1.1, load ×1.5
            _overlap_row("none", 4e6, 0.040, 0.048, 0.020, 0.022),  # ring ×1.2, load ×1.1
            _overlap_row("bf16", 1e6, 0.010, 0.013, 0.020, 0.024)]  # ring ×1.3, load ×1.2
    raw = {"load": "matmul 256x256", "overlap": rows, "handoff_ring_s": 4e-4,
           "copy": [{"n_bytes": 1e6, "seconds": 1e-3}, {"n_bytes": 4e6, "seconds": 1e-3},
                    {"n_bytes": 2e6, "seconds": 1e-3}], "handoff_noop_s": 5e-5}
    host = host_record(raw)
    assert host["comm_slowdown_by_codec"] == pytest.approx({"none": 0.15, "bf16": 0.3})
    assert host["comm_slowdown"] == pytest.approx(0.15)  # the uncompressed one
    assert host["compute_slowdown"] == pytest.approx(0.2)  # median of 1.5, 1.1, 1.2, minus 1
    assert host["copy_Bps"] == pytest.approx(2e9)  # median of 1, 4, 2 GB/s
    assert host["handoff_s"] == 4e-4 and host["handoff_noop_s"] == 5e-5  # around a real ring wins
    assert host["load"] == "matmul 256x256" and host["overlap"] == rows
    # no interference probe (--no-overlap): copy and the no-op hand-off only
    bare = host_record({"copy": raw["copy"], "handoff_noop_s": 5e-5})
    assert set(bare) == {"copy_Bps", "copy", "handoff_noop_s", "handoff_s"} and bare["handoff_s"] == 5e-5
    # only compressed rows: the first measured codec stands in for the uncompressed κc
    assert host_record({"load": "x", "overlap": rows[2:]})["comm_slowdown"] == pytest.approx(0.3)


def test_overlap_sizes_pick_three_sizes_above_the_tbf_burst():
    assert overlap_sizes([4096, 1 << 20, 4 << 20]) == [1 << 20, 4 << 20]
    assert overlap_sizes([1 << k for k in range(12, 27)]) == [1 << 20, 1 << 23, 1 << 26]
    assert overlap_sizes([4096, 8192]) == [4096, 8192]  # none that large: all


def test_fit_calibration_keeps_the_fit_that_works_and_fails_when_none_does():
    ring = [Sample("allreduce", "ring", "none", 2, float(n), 1e-4 + n / 1e9) for n in (1 << 20, 4 << 20, 16 << 20)]
    broken = [Sample("allreduce", "backend", "none", 2, 1e6, 1e-3)]  # one sample: cannot be fitted
    cal = fit_calibration(ring + broken, {}, {}, None, {}, {"notes": ["measured on a test"]})
    assert set(cal.fits) == {"ring"} and cal.fits["ring"].bandwidth_Bps == pytest.approx(1e9, rel=1e-9)
    assert cal.meta["notes"][0] == "measured on a test" and cal.meta["notes"][1].startswith("backend: need at least 2")
    assert len(cal.residuals) == 3 and math.isinf(cal.fits["ring"].reduce_Bps)
    with pytest.raises(ValueError, match="calibration failed: backend: need at least 2"):
        fit_calibration(broken, {}, {}, None, {}, {})
