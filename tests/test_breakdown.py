"""experiments.harness.breakdown: where an iteration's time goes, read from a synthetic trace of two steps."""
from __future__ import annotations

import json

import pytest

from experiments.harness.breakdown import markdown, median_breakdown, read_breakdown


def _trace(path, compute_ms: float = 10.0, job_ms: float = 8.0, wire_ms: float = 5.0) -> str:
    threads = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "main"}},
               {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "comm"}}]
    spans = []
    for step in range(2):
        t0 = 100_000 * step
        spans += [{"ph": "X", "name": "compute", "cat": "compute", "pid": 0, "tid": 0, "ts": t0, "dur": compute_ms * 1e3,
                   "args": {"step": step, "cpu_us": 0.8 * compute_ms * 1e3}},
                  {"ph": "X", "name": "opt.step", "cat": "step", "pid": 0, "tid": 0, "ts": t0 + 20_000, "dur": 3.5e3,
                   "args": {"step": step, "cpu_us": 2.5e3}},
                  {"ph": "X", "name": "wait", "cat": "wait", "pid": 0, "tid": 0, "ts": t0 + 20_100, "dur": 0.5e3},
                  {"ph": "X", "name": "update", "cat": "update", "pid": 0, "tid": 0, "ts": t0 + 21_000, "dur": 1e3},
                  {"ph": "X", "name": "exchange", "cat": "comm", "pid": 0, "tid": 1, "ts": t0 + 20_000,
                   "dur": job_ms * 1e3, "args": {"step": step, "cpu_us": 2e3}},
                  {"ph": "X", "name": "wire_wait", "cat": "phase", "pid": 0, "tid": 1, "ts": t0 + 21_000,
                   "dur": wire_ms * 1e3}]
    path.write_text(json.dumps({"traceEvents": threads + spans}))
    return str(path)


def test_the_parts_per_step_and_the_limit(tmp_path):
    parts = read_breakdown(_trace(tmp_path / "a.json"))
    assert parts.compute_s == pytest.approx(0.010) and parts.step_s == pytest.approx(0.0035)
    assert parts.update_s == pytest.approx(0.001) and parts.wait_s == pytest.approx(0.0005)
    assert parts.step_own_work_s == pytest.approx(0.002)  # neither the update nor the wait
    assert parts.step_thread_cpu_s == pytest.approx(0.0025)
    assert parts.exchange_s == pytest.approx(0.008) and parts.wire_s == pytest.approx(0.005)
    assert parts.exchange_cpu_s == pytest.approx(0.003)
    assert parts.compute_thread_cpu_s == pytest.approx(0.008)  # the threads' own CPU, from the spans' cpu_us
    assert parts.exchange_thread_cpu_s == pytest.approx(0.002)
    assert parts.limit_s(shared_core=False) == pytest.approx(0.011)  # compute + update beats the exchange
    assert parts.limit_s(shared_core=True) == pytest.approx(0.014)  # and the exchange's CPU runs on that core too
    slow = read_breakdown(_trace(tmp_path / "b.json", job_ms=30.0, wire_ms=25.0))
    assert slow.limit_s(shared_core=True) == pytest.approx(0.030)  # the exchange sets the pace
    # an exchange shorter than its bytes at the link's rate had token-bucket credit a busy link never earns
    assert slow.limit_s(shared_core=True, link_s=0.036) == pytest.approx(0.036)
    assert slow.limit_s(shared_core=True, link_s=None) == pytest.approx(0.030)  # unshaped: no floor


def test_the_median_over_sittings_and_the_table(tmp_path):
    paths = [_trace(tmp_path / f"{i}.json", compute_ms=ms) for i, ms in enumerate((10.0, 12.0, 30.0))]
    parts = median_breakdown(paths)
    assert parts.compute_s == pytest.approx(0.012)
    table = markdown([("sync", 0.020, parts), ("pipe", 0.016, parts)], {"pipe": 0.013})
    assert "| pipe | 16.0 | 12.0 (9.6) | 2.0 | 1.0 | 0.5 | 8.0 | 5.0 | 3.0 (2.0) | 13.0 | 0.81 |" in table  # CPU in brackets
    assert "| sync | 20.0 |" in table and table.count("\n") == 3
