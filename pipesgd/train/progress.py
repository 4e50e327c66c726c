"""Progress on rank 0: a live one-line bar on a terminal, plain periodic lines otherwise (logs, CI)."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Report training progress; disabled on every rank but the reporting one."""

    def __init__(self, total_steps: int, enabled: bool, stream: TextIO | None = None, every_s: float = 2.0):
        self.total_steps = max(total_steps, 1)
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.tty = enabled and self.stream.isatty()
        self.every_s = every_s
        # Plain mode prints about ten lines per run, and at least one every ``every_s`` seconds.
        self.every_steps = max(1, self.total_steps // 10)
        self._last_print = time.perf_counter()
        self._start = self._last_print

    def update(self, step: int, epoch: int, loss: float) -> None:
        """Call after step ``step`` (0-based) finished."""
        if not self.enabled:
            return
        done = step + 1
        now = time.perf_counter()
        rate = done / max(now - self._start, 1e-9)
        if self.tty:
            width = 30
            filled = int(width * done / self.total_steps)
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\r[{bar}] step {done}/{self.total_steps} epoch {epoch} loss {loss:.4f} "
                              f"{rate:.1f} it/s")
            self.stream.flush()
        elif done % self.every_steps == 0 or done == self.total_steps or now - self._last_print >= self.every_s:
            self.stream.write(f"step {done}/{self.total_steps} epoch {epoch} loss {loss:.4f} {rate:.1f} it/s\n")
            self.stream.flush()
            self._last_print = now

    def message(self, text: str) -> None:
        """A line of its own (e.g. an evaluation result) that does not garble the bar."""
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
