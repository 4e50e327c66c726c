"""The one asynchronous seam: every communication call returns a handle with ``wait()``.

A completed handle serves world size 1 and tests, so a single code path covers 1 and N ranks.
"""
from __future__ import annotations

import threading
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Work(Generic[T]):
    """A result that becomes available later; ``wait()`` blocks for it and re-raises the worker's error."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def set_result(self, result: T) -> None:
        self._result = result
        self._done.set()

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> T:
        if not self._done.wait(timeout):
            raise TimeoutError(f"communication did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result


class CompletedWork(Work[T]):
    """A handle whose result is known at creation (world size 1, restored state, tests)."""

    def __init__(self, result: T) -> None:
        super().__init__()
        self.set_result(result)
