"""Progress on the reporting rank: a tqdm bar (steps, rate, ETA, epoch and loss) on stderr while stderr is a
terminal, none otherwise (logs and CI keep the evaluation lines and the summary); evaluation lines go to stdout."""
from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Report training progress; silent on every rank but the reporting one."""

    def __init__(self, total_steps: int, enabled: bool, start_step: int = 0, stream: TextIO | None = None,
                 out: TextIO | None = None):
        self.enabled = enabled
        self.out = out or sys.stdout
        stream = stream or sys.stderr
        # A resumed run's bar starts where the run stands, so rate and ETA count this run's steps only.
        self.bar = tqdm(total=max(total_steps, 1), initial=start_step, unit="step", file=stream, dynamic_ncols=True,
                        disable=not (enabled and stream.isatty()))

    def update(self, step: int, epoch: int, loss: float) -> None:
        """Call after step ``step`` (0-based) finished."""
        if self.bar.disable:
            return
        self.bar.set_postfix(epoch=epoch, loss=f"{loss:.4f}", refresh=False)
        self.bar.update(step + 1 - self.bar.n)

    def message(self, text: str) -> None:
        """A line of its own (e.g. an evaluation result) on stdout, which does not garble the bar."""
        if not self.enabled:
            return
        if self.bar.disable:
            print(text, file=self.out, flush=True)
        else:
            self.bar.write(text, file=self.out)

    def close(self) -> None:
        self.bar.close()
