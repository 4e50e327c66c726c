"""Reading a run's metrics back: per-step figures over ranks (slowest rank, or the total over ranks)."""
import json

import pytest

from pipesgd.results import load_run


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_per_step_reduces_over_ranks_and_a_resumed_step_counts_once(tmp_path):
    config = {"type": "config", "mode": "pipe", "world_size": 2}
    _write(tmp_path / "run.rank0.jsonl", [config] + [
        {"type": "step", "step": s, "rank": 0, "t_iter": 1.0 + s, "t_cpu": 0.5} for s in range(3)
    ] + [{"type": "step", "step": 2, "rank": 0, "t_iter": 9.0, "t_cpu": 0.25}])  # step 2 again after a resume
    _write(tmp_path / "run.rank1.jsonl", [
        {"type": "step", "step": s, "rank": 1, "t_iter": 2.0 + s, "t_cpu": 1.0} for s in range(3)])
    run = load_run(str(tmp_path / "run.jsonl"))
    assert run.config == config
    assert run.per_step("t_iter") == [2.0, 3.0, 9.0]  # the slowest rank; rank 0's last record of step 2
    assert run.per_step("t_cpu", skip=1, over_ranks=sum) == [1.5, 1.25]
    assert run.median("t_iter", skip=1) == 6.0
    with pytest.raises(ValueError, match="no step records"):
        run.median("t_wait")
    with pytest.raises(FileNotFoundError):
        load_run(str(tmp_path / "other.jsonl"))
