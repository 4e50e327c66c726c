"""Handles for the handle-level test layer: a controllable one that a test completes, and a recording one
that runs its job only when waited for and notes the order of waits."""
from __future__ import annotations

from typing import Any, Callable

from pipesgd.comm.handles import Work


class ControllableWork(Work):
    """Not done until the test calls ``set_result``; counts how often it was waited for."""

    def __init__(self, name: Any = None) -> None:
        super().__init__()
        self.name = name
        self.waits = 0

    def wait(self, timeout: float | None = None):
        self.waits += 1
        return super().wait(timeout if timeout is not None else 5.0)


class RecordingWork(Work):
    """Runs ``fn()`` on the first ``wait()`` and appends ``name`` to ``log``, so a test sees which handle
    was waited for, when, and that no handle is waited for twice."""

    def __init__(self, name: Any, fn: Callable[[], Any], log: list) -> None:
        super().__init__()
        self.name, self._fn, self._log = name, fn, log

    def wait(self, timeout: float | None = None):
        if not self.is_completed():
            self._log.append(self.name)
            self.set_result(self._fn())
        return super().wait(timeout)
