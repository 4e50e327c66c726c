"""A span recorder for ``pipesgd-train --trace``: what each thread of a rank did and when, as a Chrome / Perfetto
trace (complete "X" events in microseconds, pid = rank, tid = a thread row). Off by default: one global read per
call. Times are wall clock, so ranks on other machines need synchronised clocks. Merge per-rank files with
``python -m pipesgd.runlog.trace merge OUT.json IN...``."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

from timing_model.atomic import write_text_atomic
from timing_model.run_metrics import metrics_path

__all__ = ["enable", "disable", "enabled", "set_step", "current_step", "span", "record", "name_thread", "events", "chrome_trace",
           "write", "merge", "trace_path", "parse_steps"]

# Thread rows in the order a reader expects them (others follow in order of first appearance).
ROW_ORDER = ("main", "comm", "server", "server-send")

_on = False
_rank = 0
_steps: tuple[int, int] = (0, 0)  # [first, last) traced steps of the training loop
_open_ns: int | None = None  # wall clock when the first traced step began; None before it
_close_ns: int | None = None  # wall clock when the first step past the window began
_step_now: int | None = None  # the training loop's current step (labels work other threads do for it)
_events: list[tuple[str, str, str, int, int, dict | None]] = []  # (name, cat, thread, start_ns, end_ns, args)
_lock = threading.Lock()  # list.append is atomic in CPython; the lock guards the window and snapshotting
_names = threading.local()
_OFF = contextlib.nullcontext()


def enable(rank: int, steps: tuple[int, int]) -> None:
    """Start a recording for this process (rank ``rank``) that keeps the spans of ``steps`` (``record``)."""
    global _on, _rank, _steps, _open_ns, _close_ns, _step_now
    with _lock:
        _events.clear()
        _on, _rank, _steps, _open_ns, _close_ns, _step_now = True, int(rank), steps, None, None, None


def disable() -> None:
    global _on
    _on = False


def enabled() -> bool:
    return _on


def set_step(step: int) -> None:
    """This rank's training loop is at ``step``: opens the window at its first step and closes it after the last
    (for spans that name no step), and labels the jobs other threads run for it (``current_step``)."""
    global _open_ns, _close_ns, _step_now
    if not _on:
        return
    _step_now = step
    if _open_ns is None and step >= _steps[0]:
        _open_ns = time.time_ns()
    if _close_ns is None and step >= _steps[1]:
        _close_ns = time.time_ns()


def current_step() -> int | None:
    """The step the training loop is at (None when not tracing)."""
    return _step_now if _on else None


def name_thread(name: str) -> None:
    """Name the calling thread's row (``"comm"``, ``"server"``, ...); unnamed threads use their Python name,
    the main thread ``"main"``."""
    _names.name = name


def _thread_name() -> str:
    name = getattr(_names, "name", None)
    if name is not None:
        return name
    current = threading.current_thread()
    return "main" if current is threading.main_thread() else current.name


def record(name: str, start_ns: int, end_ns: int, cat: str, thread: str | None = None,
           args: dict | None = None) -> None:
    """Keep a span observed elsewhere (``thread``: the caller's row by default) if it belongs to the window: a span that
    names its step (``args["step"]``) when that step is traced, whenever it ran (the co-located server serves a
    lagging worker's step after this rank's loop passed it); any other span when it starts while the window is open."""
    if not _on:
        return
    step = args.get("step") if args else None
    if step is not None:
        if not _steps[0] <= step < _steps[1]:
            return
    elif _open_ns is None or start_ns < _open_ns or (_close_ns is not None and start_ns >= _close_ns):
        return
    _events.append((name, cat, thread or _thread_name(), start_ns, end_ns, args))


class _Span:
    __slots__ = ("name", "cat", "args", "start", "cpu")

    def __init__(self, name: str, cat: str, args: dict | None, cpu: bool) -> None:
        self.name, self.cat, self.args, self.cpu = name, cat, args, cpu

    def __enter__(self) -> None:
        self.start = time.time_ns()
        if self.cpu:
            self.cpu = time.thread_time_ns()

    def __exit__(self, *exc) -> None:
        args = self.args
        if self.cpu:  # the thread's own CPU time: below the wall time when it waited, or shared its core
            args = dict(args or {}, cpu_us=(time.thread_time_ns() - self.cpu) / 1e3)
        record(self.name, self.start, time.time_ns(), self.cat, args=args)


def span(name: str, cat: str, args: dict | None = None, cpu: bool = False):
    """A context recording its wall time on the caller's row while tracing (a shared no-op otherwise); with
    ``cpu``, also the calling thread's CPU time inside it (``args["cpu_us"]``)."""
    return _Span(name, cat, args, cpu) if _on else _OFF


def events() -> list[tuple[str, str, str, int, int, dict | None]]:
    """A snapshot of the kept spans."""
    with _lock:
        return list(_events)


def chrome_trace(rank: int | None = None) -> dict:
    """This process's spans as a Chrome trace: metadata naming process ``rank N`` and its thread rows, then
    one "X" event per span (ts and dur in microseconds)."""
    pid = _rank if rank is None else rank
    spans = events()
    threads = sorted({s[2] for s in spans}, key=lambda t: (ROW_ORDER.index(t) if t in ROW_ORDER else len(ROW_ORDER),
                                                          min(s[3] for s in spans if s[2] == t)))
    tids = {name: i for i, name in enumerate(threads)}
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for name, tid in tids.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    for name, cat, thread, start, end, args in sorted(spans, key=lambda s: s[3]):
        event = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tids[thread],
                 "ts": start / 1e3, "dur": max(end - start, 0) / 1e3}
        if args:
            event["args"] = args
        out.append(event)
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def trace_path(path: str, rank: int, world_size: int) -> str:
    """``FILE.json`` for a single process, ``FILE.rankN.json`` for rank N of several (named as metrics are)."""
    return metrics_path(path if os.path.splitext(path)[1] else path + ".json", rank, world_size)


def write(path: str, rank: int, world_size: int) -> str:
    """Write this rank's trace (atomically) to its per-rank file; returns the file's path."""
    target = trace_path(path, rank, world_size)
    write_text_atomic(target, json.dumps(chrome_trace(rank)) + "\n")
    return target


def merge(out: str, inputs: list[str]) -> int:
    """Concatenate the events of per-rank trace files into one file; returns the number of events."""
    merged: list[dict] = []
    for path in inputs:
        try:
            with open(path) as handle:
                data = json.load(handle)
        except FileNotFoundError:
            raise ValueError(f"trace file not found: {path}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not JSON ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
            raise ValueError(f"{path} is not a Chrome trace (no traceEvents list)")
        merged.extend(data["traceEvents"])
    write_text_atomic(out, json.dumps({"traceEvents": merged, "displayTimeUnit": "ms"}) + "\n")
    return len(merged)


def parse_steps(text: str) -> tuple[int, int]:
    """``"A:B"`` -> (A, B), the traced steps [A, B); ValueError with a one-line reason otherwise."""
    parts = text.split(":")
    try:
        first, last = (int(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        first = last = None
    if first is None or last is None or first < 0 or last <= first:
        raise ValueError(f"--trace-steps must be A:B with 0 <= A < B (got {text!r})")
    return first, last


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[0] != "merge":
        print("usage: python -m pipesgd.runlog.trace merge OUT.json FILE.rank0.json [FILE.rank1.json ...]",
              file=sys.stderr)
        return 2
    try:
        count = merge(argv[1], argv[2:])
    except (ValueError, OSError) as exc:
        print(f"pipesgd.runlog.trace: error: {exc}", file=sys.stderr)
        return 2
    print(f"{argv[1]}: {count} events from {len(argv) - 2} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
