"""Reading a run's metrics back: per-step figures over ranks (slowest rank, mean or total over ranks).

The files are written by the trainer's own writer, so writer and reader naming cannot drift apart.
"""
import pytest

from experiments.harness.results import load_run
from pipesgd.train.metrics import MetricsWriter


def _write(path, rank, world_size, records):
    writer = MetricsWriter(str(path), rank, world_size)
    for record in records:
        writer.write(record.pop("type"), **record)
    writer.close()


def test_per_step_reduces_over_ranks_and_a_resumed_step_counts_once(tmp_path):
    config = {"type": "config", "mode": "pipe", "world_size": 2, "wall": 0.0}
    _write(tmp_path / "run.jsonl", 0, 2, [dict(config)] + [
        {"type": "step", "step": s, "rank": 0, "t_iter": 1.0 + s, "t_cpu": 0.5} for s in range(3)
    ] + [{"type": "step", "step": 2, "rank": 0, "t_iter": 9.0, "t_cpu": 0.25}])  # step 2 again after a resume
    _write(tmp_path / "run.jsonl", 1, 2, [
        {"type": "step", "step": s, "rank": 1, "t_iter": 2.0 + s, "t_cpu": 1.0} for s in range(3)])
    run = load_run(str(tmp_path / "run.jsonl"))
    assert run.config == config
    assert run.per_step("t_iter") == [2.0, 3.0, 9.0]  # the slowest rank; rank 0's last record of step 2
    assert run.per_step("t_cpu", skip=1, over_ranks=sum) == [1.5, 1.25]
    assert run.median("t_iter", skip=1) == 6.0
    assert run.iteration_s(skip=1) == 4.5  # median of the steps' means over ranks: (3 + 2) / 2 and (9 + 4) / 2
    run.config["mode"] = "ps-async"  # workers not in lockstep: the slowest worker's mean, the job's pace
    assert run.iteration_s(skip=1) == 5.5  # rank 0 took 2 + 9 (its last record of step 2), rank 1 3 + 4
    with pytest.raises(ValueError, match="no step records"):
        run.median("t_wait")
    with pytest.raises(FileNotFoundError):
        load_run(str(tmp_path / "other.jsonl"))


def test_a_single_process_run_is_its_own_file(tmp_path):
    _write(tmp_path / "solo.jsonl", 0, 1, [{"type": "step", "step": 0, "rank": 0, "t_iter": 0.5},
                                          {"type": "summary", "accuracy": 0.75}])
    run = load_run(str(tmp_path / "solo.jsonl"))
    assert run.per_step("t_iter") == [0.5] and run.final_accuracy == 0.75
