"""The lines a run ends with (``pipesgd.train.report``): Pipe-SGD's overlap in words, from the summary's own figures,
and the reason this machine gives when little of the all-reduce hid."""
from __future__ import annotations

from pipesgd.train.config import TrainConfig
from pipesgd.train.report import format_summary, overlap_lines


def _summary(**figures) -> dict:
    """A four-worker summary, times in seconds (made-up figures: the words must follow whatever they are)."""
    base = dict(steps=220, epochs=20, world_size=4, num_workers=4, mode="pipe", accuracy=0.5, test_loss=1.0,
                measured_steps=215, skipped_steps=5, iters_per_s=100.0, t_iter=0.010, t_compute=0.004,
                t_wait=0.001, t_update=0.001, t_other=0.004, t_comm_busy=0.005, cpu_cores=16, local_ranks=4)
    return {**base, **figures}


def test_nearly_all_hidden_says_so_and_gives_no_reason():
    (line,) = overlap_lines(_summary(t_wait=0.0001, t_comm_busy=0.005), width=2)
    assert "4.90 ms of its 5.00 ms per step (98 %) hid" in line and "waited 0.10 ms" in line


def test_more_ranks_than_cores_is_the_reason_when_little_hid():
    lines = overlap_lines(_summary(t_wait=0.004, t_comm_busy=0.005, cpu_cores=2, local_ranks=4), width=2)
    assert "1.00 ms of its 5.00 ms per step (20 %) hid" in lines[0]
    assert lines[1].startswith("Why not all of it: 4 ranks share 2 CPU cores on this machine")


def test_an_exchange_longer_than_the_step_is_the_reason_with_a_core_per_rank():
    lines = overlap_lines(_summary(t_iter=0.010, t_wait=0.006, t_comm_busy=0.012), width=2)
    assert "(50 %) hid" in lines[0]
    assert "longer than the rest of a step (12.00 ms against 4.00 ms)" in lines[1] and "--compression" in lines[1]


def test_no_words_without_an_exchange_and_plain_words_at_width_1():
    assert overlap_lines(_summary(num_workers=1, world_size=1), width=2) == []
    assert overlap_lines(_summary(t_comm_busy=0.0), width=2) == []
    assert overlap_lines(_summary(), width=1) == [
        "Pipe-SGD at width 1 is synchronous: each step waited for its own all-reduce, nothing overlapped."]


def test_the_summary_ends_with_the_overlap_for_pipe_only():
    lines = format_summary(TrainConfig(), _summary(t_wait=0.004, cpu_cores=2)).splitlines()
    assert lines[0].startswith("done: mlp on digits, mode pipe (width 2") and "220 steps, 20 epochs" in lines[0]
    assert lines[0].endswith("after the last update: test accuracy 50.0 % (loss 1.0000)")
    assert lines[-2].startswith("Pipe-SGD: ") and lines[-1].startswith("Why not all of it: 4 ranks share 2 CPU")
    sync = format_summary(TrainConfig(mode="sync", staleness="lookahead"), _summary(mode="sync")).splitlines()
    assert len(sync) == 3 and not any("Pipe-SGD" in line for line in sync)
