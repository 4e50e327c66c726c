"""The cores' floor under any iteration (``pipesgd.auto.cores``): ``/proc/stat`` read over the CPUs this process may
run on, the busy share over the timed iterations, and a decision that does not pipeline where the cores were already
busy; with the warm-up's synchronous run counted as measured at width 1."""
from __future__ import annotations

import os

import pytest
import torch

from pipesgd import auto
from pipesgd.auto import cores
from tests.test_auto_codec import SLOW, _measured

STAT = """cpu  900 0 100 1000 0 0 0 0 0 0
cpu0 400 0 50 500 0 0 0 0 0 0
cpu1 500 7 50 500 3 2 1 10 0 0
intr 1 2 3
"""


def test_the_reading_sums_the_cpus_this_process_may_run_on(tmp_path, monkeypatch):
    path = tmp_path / "stat"
    path.write_text(STAT)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {1})
    # cpu1: busy = user 500 + nice 7 + system 50 + irq 2 + softirq 1 + steal 10; all = that + idle 500 + iowait 3
    assert cores.cores_reading(str(path)) == (570, 1073)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    assert cores.cores_reading(str(path)) == (450 + 570, 950 + 1073)
    assert cores.cores_reading(str(tmp_path / "missing")) is None


def test_the_real_reading_is_a_share():
    reading = cores.cores_reading()
    if reading is None:
        pytest.skip("no /proc/stat here")
    busy, total = reading
    assert 0 <= busy <= total and total > 0


def test_the_clock_reads_the_cores_over_the_iterations_it_times():
    readings = iter([(0, 0), (90, 100), (95, 110), (140, 170), (170, 200)])
    clock = auto.StepClock(cores=lambda: next(readings))
    clock.begin()
    clock.end()  # the first reading: where the first timed iteration begins
    clock.begin()
    clock.end()  # +90 busy of +100
    clock.skip()  # the probe's work is no iteration's: read afresh from here
    clock.begin()
    clock.end()  # +45 of +60
    assert clock.cores_ticks == [135, 160]
    assert clock.cores(0.1) == {"cores_busy": pytest.approx(135 / 160), "cores_floor_s": pytest.approx(13.5 / 160)}
    clock.reset()
    assert clock.cores(0.1) == {"cores_busy": 0.0, "cores_floor_s": 0.0}  # a new window reads afresh
    clock.begin()
    clock.end()
    assert clock.cores_ticks == [0, 0]


def test_no_reading_no_floor():
    clock = auto.StepClock(cores=lambda: None)
    for _ in range(3):
        clock.begin()
        clock.end()
    assert clock.cores(0.1) == {"cores_busy": 0.0, "cores_floor_s": 0.0}


FREE = auto.Knobs(None, None, None)


def test_busy_cores_keep_the_width_where_pipelining_cannot_hide():
    """A 60 ms uncompressed all-reduce beside 100 ms of compute hides at width 2 (about 100 ms per iteration), and
    width 1 (about 160 ms) is not within ``WIDER_GAIN`` of that. Where the synchronous steps kept the cores so busy
    that no iteration runs under 150 ms, width 2 is raised to 150 and width 1 is within it."""
    measured = _measured(0.06, 0.06 / 64 + 6e-4)
    choice = auto.decide(measured, nodes=4, grad_bytes=4e6, knobs=FREE)
    assert (choice["width"], choice["compression"]) == (2, "none")
    busy = {**measured, "cores_busy": 0.9, "cores_floor_s": 0.15}
    choice = auto.decide(busy, nodes=4, grad_bytes=4e6, knobs=FREE)
    assert (choice["width"], choice["compression"]) == (1, "none")
    assert "the cores were 90% busy, so no iteration is predicted under 150 ms" in choice["reason"]
    # At a named width 2 with 40 ms of compute nothing hides (q4's 60 ms exchange neither): the floor raises the
    # compute window, and q8's longer exchange still shows beyond it (raised alike, q8 came first on the ladder).
    short = {**_measured(0.06, SLOW["small_allreduce_s"], compute_s=0.04), "cores_busy": 0.9,
             "cores_floor_s": 0.15}  # read while q4 + feedback ran: it bounds every codec the ladder tries
    choice = auto.decide(short, nodes=4, grad_bytes=4e6, knobs=auto.Knobs(2, None, None), measured_with=("q4", True))
    assert (choice["width"], choice["compression"]) == (2, "q4") and "nothing tried hides" in choice["reason"]
    spare = {**measured, "cores_busy": 0.3, "cores_floor_s": 0.05}  # cores to spare: the floor does not bind
    choice = auto.decide(spare, nodes=4, grad_bytes=4e6, knobs=FREE)
    assert (choice["width"], choice["compression"]) == (2, "none")


def test_a_configuration_that_ran_is_not_raised_to_the_floor():
    from timing_model.predict import Scenario

    busy = {**SLOW, "cores_busy": 0.9, "cores_floor_s": 10.0}
    ran = {"2:q4+ef": {"comm_s": 0.06, "period_s": 0.1, "wait_s": 0.0}}
    predict = auto.decision._predictor(busy, measured_with="q4", ran=ran)
    case = Scenario(nodes=4, grad_bytes=4e6, compute_s=0.1, bandwidth_Bps=12.5e6, width=2, compression="q4",
                    error_feedback=True)
    assert predict(case).iteration_s == 0.1
    q8 = predict(case.with_changes(compression="q8"))
    assert q8.iteration_s == pytest.approx(10.0 + q8.exposed_comm_s + q8.codec_s) and q8.iteration_s > 10.0
    synchronous = predict(case.with_changes(width=1, compression="q8"))  # the floor is the whole iteration's
    assert synchronous.iteration_s == 10.0


def test_on_a_gpu_the_cores_are_not_read():
    class Bucket:
        numel, dtype, device = 10, torch.float32, torch.device("cuda")

    config = auto.AutoConfig([Bucket()], FREE, warmup_steps=3, group=None)
    assert config.clock._cores() is None
    assert auto.AutoConfig([], FREE, warmup_steps=3, group=None).clock._cores is cores.cores_reading


def test_the_floor_bounds_only_codecs_that_send_as_many_bytes():
    """Read while uncompressed exchanges ran, the floor bounds none at any width, not q4: after a link dropped from 1
    Gbit/s to 100 Mbit/s the uncompressed exchanges kept the cores 90 % busy where q4 ran 2.5x faster. Read with q4,
    it bounds every codec the ladder tries before it."""
    from timing_model.predict import Scenario

    busy = {**SLOW, "cores_busy": 0.9, "cores_floor_s": 10.0}
    case = Scenario(nodes=4, grad_bytes=4e6, compute_s=0.1, bandwidth_Bps=12.5e6, width=2, compression="q4",
                    error_feedback=True)
    assert auto.decision._predictor(busy, measured_with="none")(case).iteration_s < 1.0
    assert auto.decision._predictor(busy, measured_with="none")(case.with_changes(compression="none")).iteration_s > 10
    read_with_q4 = auto.decision._predictor(busy, measured_with="q4")
    for codec in ("none", "bf16", "q8", "q4"):
        assert read_with_q4(case.with_changes(compression=codec)).iteration_s >= 10
    assert auto.decision._floored("q4", "q4") and not auto.decision._floored("sign", "q4")
    assert auto.decision._floored("custom", "custom") and not auto.decision._floored("custom", "none")
