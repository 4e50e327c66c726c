"""``pipesgd-train --trace``: the span recorder on its own (off = no events, the step window, Chrome trace JSON,
merge), one-line errors for bad flags, and real 2-rank gloo runs of pipe, sync, ddp and ps-async whose files
carry the expected spans per row, with pipe's communication of step t starting before step t+1's compute ends.
(That a run without --trace writes no trace file is checked on test_train_e2e's pipe run, which has none.)"""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from pipesgd.runlog import trace
from pipesgd.train.cli import main
from tests.test_train_e2e import launch


@pytest.fixture
def recorder():
    trace.name_thread(None)  # an in-process run earlier in the session may have named this (main) thread's row
    yield trace
    trace.disable()


def test_off_records_nothing(recorder):
    trace.disable()
    assert trace.span("compute", "compute") is trace.span("x", "y")  # the shared no-op
    with trace.span("compute", "compute"):
        pass
    trace.record("data", 0, 10, "data")
    trace.set_step(3)
    assert trace.events() == [] and trace.current_step() is None


def test_window_keeps_spans_that_start_inside_it(recorder):
    trace.enable(rank=1, steps=(2, 4))
    for step in range(6):
        trace.set_step(step)
        with trace.span("compute", "compute", {"step": step}):
            pass
    trace.set_step(6)
    assert [e[5]["step"] for e in trace.events()] == [2, 3]

    def worker():
        trace.name_thread("comm")
        trace.record("late", 0, 1, "comm")  # started before the window: dropped
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert len(trace.events()) == 2


def test_a_cpu_span_records_the_threads_own_cpu_time_beside_its_wall_time(recorder):
    trace.enable(rank=0, steps=(0, 1))
    trace.set_step(0)
    with trace.span("compute", "compute", {"step": 0}, cpu=True):
        time.sleep(0.05)  # waiting: wall time, no CPU
        end = time.thread_time() + 0.02
        while time.thread_time() < end:  # busy: CPU time too
            pass
    with trace.span("plain", "compute", {"step": 0}):
        pass
    (name, _, _, start, stop, args), plain = trace.events()
    assert args["step"] == 0 and 15e3 <= args["cpu_us"] < (stop - start) / 1e3 - 40e3
    assert "cpu_us" not in plain[5]  # only where asked


def test_a_span_naming_its_step_is_kept_by_its_step_whenever_it_ran(recorder):
    """The ps-async flake's cause: rank 0's co-located server serves a lagging worker's step 7 after rank 0's own loop
    passed the window (the server row once held only the receive that began before the window closed). Spans that
    name their step are kept by it, on any thread, whatever the clock says."""
    trace.enable(rank=0, steps=(6, 12))
    trace.set_step(6)  # rank 0's own loop opens the window ...
    trace.set_step(12)  # ... and has left it

    def server():
        trace.name_thread("server")
        for name in ("receive", "apply", "send"):
            with trace.span(name, "server", {"worker": 1, "step": 7}):
                pass
        with trace.span("receive", "server", {"worker": 1, "step": 12}):  # a step past the window: left out
            pass
        trace.record("late", time.time_ns(), time.time_ns(), "server")  # no step, after the window: left out
    thread = threading.Thread(target=server)
    thread.start()
    thread.join()
    assert [(e[0], e[2], e[5]["step"]) for e in trace.events()] == [
        ("receive", "server", 7), ("apply", "server", 7), ("send", "server", 7)]


def test_chrome_trace_and_merge(recorder, tmp_path):
    trace.enable(rank=1, steps=(0, 10))
    trace.set_step(0)
    with trace.span("compute", "compute"):
        pass

    def worker():
        trace.name_thread("comm")
        with trace.span("exchange", "comm", {"step": 0}):
            pass
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    path = trace.write(str(tmp_path / "t.json"), rank=1, world_size=2)
    assert path == str(tmp_path / "t.rank1.json")
    data = json.load(open(path))
    names = {(e["args"]["name"], e["tid"]) for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert names == {("main", 0), ("comm", 1)}
    assert {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "rank 1"}} in data["traceEvents"]
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["tid"], e["pid"]) for e in spans] == [("compute", 0, 1), ("exchange", 1, 1)]
    assert all(e["dur"] >= 0 and e["ts"] > 1e15 for e in spans)  # wall clock in microseconds
    other = tmp_path / "t.rank0.json"
    other.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "compute", "pid": 0, "tid": 0, "ts": 1, "dur": 1}]}))
    out = str(tmp_path / "merged.json")
    assert trace.main(["merge", out, str(other), path]) == 0
    merged = json.load(open(out))["traceEvents"]
    assert len(merged) == 1 + len(data["traceEvents"]) and {e["pid"] for e in merged} == {0, 1}


def test_merge_of_a_bad_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert trace.main(["merge", str(tmp_path / "o.json"), str(bad)]) == 2
    assert trace.main(["merge", str(tmp_path / "o.json"), str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"pipesgd.runlog.trace: error: {bad} is not a Chrome trace (no traceEvents list)",
                   f"pipesgd.runlog.trace: error: trace file not found: {tmp_path / 'missing.json'}"]
    assert not os.path.exists(tmp_path / "o.json")


BAD = [
    (["--trace", "t.json", "--trace-steps", "5"], "--trace-steps must be A:B with 0 <= A < B (got '5')"),
    (["--trace", "t.json", "--trace-steps", "8:3"], "--trace-steps must be A:B with 0 <= A < B (got '8:3')"),
    (["--trace", "t.json", "--trace-steps", "a:b"], "--trace-steps must be A:B"),
    (["--trace-steps", "1:3"], "--trace-steps needs --trace FILE"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_trace_steps_are_one_line_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesgd-train: error: ") and message in err, err


# -- real runs: 2 gloo ranks per mode --------------------------------------------------------------------------
STEPS = ["--steps", "20", "--eval-every", "0", "--timeout", "60", "--warmup-steps", "4"]  # traced: steps 6 to 11
EXPECTED = {  # mode flags -> {rank: {row: span names that must be there}}
    "pipe": (["--mode", "pipe"], {r: {"main": {"data", "compute", "opt.step", "wait", "update"},
                                      "comm": {"exchange"}} for r in (0, 1)}),
    "sync": (["--mode", "sync"], {r: {"main": {"data", "compute", "wait", "update"}, "comm": {"exchange"}}
                                  for r in (0, 1)}),
    "ddp": (["--mode", "ddp"], {r: {"main": {"compute", "update"}, "comm": {"allreduce bucket 0"}} for r in (0, 1)}),
    "ps-async": (["--mode", "ps-async"], {0: {"main": {"compute", "pull"}, "server": {"receive", "apply", "send"}},
                                          1: {"main": {"compute", "push", "pull"}}}),
}


def _rows(path: str) -> tuple[dict[str, set[str]], list[dict], dict[int, str]]:
    data = json.load(open(path))
    events = data["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    rows: dict[str, set[str]] = {}
    for e in spans:
        rows.setdefault(threads[e["tid"]], set()).add(e["name"])
    return rows, spans, threads


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    cache = {}

    def get(mode: str) -> str:
        if mode not in cache:
            path = str(out / f"{mode}.json")
            for rc, _, err in launch([*EXPECTED[mode][0], *STEPS, "--trace", path]):
                assert rc == 0, err
            cache[mode] = path
        return cache[mode]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(EXPECTED))
def test_each_mode_traces_its_rows(mode, traced):
    base = traced(mode)
    for rank, want in EXPECTED[mode][1].items():
        rows, spans, _ = _rows(base.replace(".json", f".rank{rank}.json"))
        for row, names in want.items():
            assert names <= rows.get(row, set()), (rank, row, rows)
        computes = sorted(e["args"]["step"] for e in spans if e["name"] == "compute")
        assert computes == list(range(6, 12)), computes  # only the window's steps
    assert not os.path.exists(base)  # world size 2: per-rank files only


@pytest.mark.slow
def test_pipe_exchange_of_step_t_lies_between_its_submit_and_its_apply(traced):
    """Width 2's order, read from real events (no timing assumption: whether the exchange of step t actually
    overlaps step t+1's compute depends on thread scheduling): it starts after step t's backward ended, and it has
    ended by the end of step t+1's opt.step, which applies it."""
    slack_us = 1.0  # rounding of the microsecond timestamps
    for rank in (0, 1):
        _, spans, threads = _rows(traced("pipe").replace(".json", f".rank{rank}.json"))
        compute_end = {e["args"]["step"]: e["ts"] + e["dur"] for e in spans if e["name"] == "compute"}
        step_end = {e["args"]["step"]: e["ts"] + e["dur"] for e in spans
                    if e["name"] == "opt.step" and threads[e["tid"]] == "main"}
        comm = [e for e in spans if threads[e["tid"]] == "comm" and e["name"] == "exchange"]
        checked = 0
        for e in comm:
            t = e["args"]["step"]
            if t in compute_end and t + 1 in step_end:
                assert e["ts"] >= compute_end[t] - slack_us, (t, e)
                assert e["ts"] + e["dur"] <= step_end[t + 1] + slack_us, (t, e)
                checked += 1
        assert checked >= 4


# -- the timeline experiment's trimming, on hand-made per-rank traces ------------------------------------------
def _rank_file(path, rank, spans):
    """spans: (row, name, cat, start_us, dur_us, step) -> a Chrome trace file like trace.write makes."""
    rows = sorted({s[0] for s in spans})
    events = [{"ph": "M", "name": "thread_name", "pid": rank, "tid": rows.index(r), "args": {"name": r}} for r in rows]
    events += [{"ph": "X", "name": n, "cat": c, "pid": rank, "tid": rows.index(r), "ts": ts, "dur": d,
                "args": {"step": st}} for r, n, c, ts, d, st in spans]
    with open(trace.trace_path(path, rank, 2), "w") as handle:
        json.dump({"traceEvents": events}, handle)


def test_timeline_trim_keeps_a_common_interval(tmp_path):
    from experiments.harness.timeline import overlap_summary, trim

    path = str(tmp_path / "pipe.json")
    # rank 0 computes steps 0-3 every 100 us from t=1000; rank 1 is 30 us late; comm of step t runs 60 us from the
    # end of compute t; step 0 is the warm-up the figure skips
    for rank, late in ((0, 0), (1, 30)):
        spans = []
        for step in range(4):
            t = 1000 + late + 100 * step
            spans += [("main", "compute", "compute", t, 50, step), ("comm", "exchange", "comm", t + 50, 60, step),
                      ("main", "codec", "phase", t + 50, 5, step)]
        _rank_file(path, rank, spans)
    spans = trim(path, world_size=2, first_step=1, traced=2)
    # interval: from rank 1's step-1 compute (t=1130) for 2 periods of 100 us, in ms
    assert {s[3] for s in spans} == {"compute", "comm"}  # phases are left out
    assert min(s[4] for s in spans) == 0.0 and max(s[4] + s[5] for s in spans) == pytest.approx(0.2)
    first = [s for s in spans if s[0] == 0 and s[2] == "compute"][0]
    assert first[4] == 0.0 and first[5] == pytest.approx(0.02)  # rank 0's step 1 (1100-1150) clipped at 1130
    summary = overlap_summary({"schemes": {"pipe": {"spans": spans}}})["pipe"]
    # comm of step t (t+50 .. t+110) overlaps compute of step t+1 (t+100 .. t+150) for 10 of its 60 us
    assert 0 < summary["comm_overlapping_compute"] < 0.5 and summary["blocked_share"] == 0.0
