"""Opt-in wall-clock accumulators for the phases of the communication path (wire wait, codec, error feedback,
pack/unpack, finite check): what the pipeline benchmark splits an iteration's comm-thread time into.
Off by default; while off, ``timed`` hands back one shared no-op context, so the ring pays one global read.
While ``pipesgd-train --trace`` records (``pipesgd.runlog.trace``) and accounting is off, each phase is a trace span
instead.
"""
from __future__ import annotations

import contextlib
import time

from pipesgd.runlog import trace

__all__ = ["PHASES", "enable", "enabled", "reset", "snapshot", "timed"]

# Each phase runs on one thread only (pack/unpack on the caller's, the others on the comm worker's), so the
# per-phase sums need no lock.
PHASES = ("wire_wait", "codec", "error_feedback", "pack_unpack", "finite_check")

_totals: dict[str, float] = dict.fromkeys(PHASES, 0.0)
_on = False
_OFF = contextlib.nullcontext()


class _Timer:
    __slots__ = ("phase", "start")

    def __init__(self, phase: str) -> None:
        self.phase = phase

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        _totals[self.phase] += time.perf_counter() - self.start


def timed(phase: str):
    """A context that adds its wall time to ``phase`` while accounting is on (a shared no-op otherwise)."""
    if not _on:
        return trace.span(phase, "phase") if trace.enabled() else _OFF
    if phase not in _totals:
        raise ValueError(f"unknown phase {phase!r}; valid: {', '.join(PHASES)}")
    return _Timer(phase)


def enable(on: bool = True) -> None:
    """Switch accounting on or off for the whole process (the benchmark switches it on)."""
    global _on
    _on = bool(on)


def enabled() -> bool:
    return _on


def reset() -> None:
    for phase in PHASES:
        _totals[phase] = 0.0


def snapshot() -> dict[str, float]:
    """Seconds accumulated per phase since the last ``reset``."""
    return dict(_totals)
