"""Metrics JSONL records (contract fields, strict JSON) and the progress reporter."""
from __future__ import annotations

import io
import json

from timing_model.run_metrics import metrics_path
from pipesgd.train.metrics import EVAL_FIELDS, STEP_FIELDS, MetricsWriter
from pipesgd.train.progress import Progress


def test_rank_paths():
    assert metrics_path("out/m.jsonl", 0, 1) == "out/m.jsonl"
    assert metrics_path("out/m.jsonl", 3, 4) == "out/m.rank3.jsonl"


def test_records_are_strict_json_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    w = MetricsWriter(str(path), rank=1, world_size=2)
    w.write("config", world_size=2, mode="pipe", params=10)
    w.write("step", step=0, epoch=0, rank=1, mode="pipe", loss=float("nan"), t_iter=0.1, t_compute=0.05,
            t_wait=0.01, t_update=0.001, bytes_sent=100, applied_step=None, compression_ratio=1.0,
            residual_norm=None, t_comm_busy=0.0)
    # flushed per line: readable before close
    lines = (tmp_path / "m.rank1.jsonl").read_text().splitlines()
    w.write("eval", step=1, epoch=1, accuracy=0.5, loss=1.0)
    w.close()
    lines = (tmp_path / "m.rank1.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))) for line in lines]
    assert [r["type"] for r in records] == ["config", "step", "eval"]
    assert set(STEP_FIELDS) <= set(records[1]) and records[1]["loss"] is None  # NaN written as null
    assert set(EVAL_FIELDS) <= set(records[2]) and records[2]["wall"] >= 0


def test_writer_without_path_does_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative file the writer made by mistake would land here
    w = MetricsWriter("", 0, 1)
    assert w.write("step", step=0)["type"] == "step"
    w.close()
    assert list(tmp_path.iterdir()) == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_tqdm_bar_with_rate_and_eta_on_a_terminal():
    err, out = _Terminal(), io.StringIO()
    p = Progress(total_steps=20, enabled=True, stream=err, out=out)
    for step in range(20):
        p.update(step, 0, 1.0)
    p.message("epoch 1: test accuracy 90.0 %")
    p.close()
    bar = err.getvalue()
    assert "20/20" in bar and "<00:00" in bar and "loss=1.0000" in bar  # steps, ETA, the postfix
    assert "step/s" in bar or "s/step" in bar  # the rate (tqdm turns it round below one step per second)
    assert out.getvalue() == "epoch 1: test accuracy 90.0 %\n"  # the evaluation line, not inside the bar


def test_progress_is_off_when_stderr_is_not_a_terminal():
    """Logs and CI get no bar (nor its carriage returns); evaluation lines still reach stdout."""
    err, out = io.StringIO(), io.StringIO()
    p = Progress(total_steps=20, enabled=True, stream=err, out=out)
    for step in range(20):
        p.update(step, 0, 1.0)
    p.message("epoch 1: test accuracy 90.0 %")
    p.close()
    assert err.getvalue() == "" and out.getvalue() == "epoch 1: test accuracy 90.0 %\n"


def test_progress_of_a_resumed_run_starts_where_it_stands_and_other_ranks_are_silent():
    err = _Terminal()
    p = Progress(total_steps=20, enabled=True, start_step=15, stream=err)
    p.update(15, 1, 1.0)
    p.close()
    assert "| 15/20" in err.getvalue() and "| 16/20" in err.getvalue() and "| 0/20" not in err.getvalue()
    err, out = _Terminal(), io.StringIO()
    silent = Progress(total_steps=5, enabled=False, stream=err, out=out)
    silent.update(4, 0, 1.0)
    silent.message("epoch 1")
    silent.close()
    assert err.getvalue() == "" and out.getvalue() == ""


def test_step_stats_yield_the_step_record_names():
    from pipesgd.accounting import StepStats

    stats = StepStats(step=4, applied_step=3, t_wait_s=0.5, t_update_s=0.25, t_comm_busy_s=0.125, bytes_sent=8,
                      compression_ratio=4.0, residual_norm=1.5, skipped_nonfinite=True)
    assert stats.as_metrics() == {"applied_step": 3, "t_wait": 0.5, "t_update": 0.25, "t_comm_busy": 0.125,
                                  "bytes_sent": 8, "compression_ratio": 4.0, "residual_norm": 1.5,
                                  "skipped_nonfinite": True}
    assert set(stats.as_metrics()) <= set(STEP_FIELDS) | {"skipped_nonfinite"}
