"""``StepClock``: the warm-up's (and a re-check window's) own timings, from the wrapper's ``step()`` calls."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from pipesgd.auto.cores import cores_reading


class StepClock:
    """When each ``step()`` began and ended (the caller's compute lies between one's end and the next), and the
    background worker's busy time on each exchange the steps applied."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 cores: Callable[[], tuple[int, int] | None] = cores_reading) -> None:
        self._clock, self._cores = clock, cores
        self._cores_at: tuple[int, int] | None = None  # the cores' ticks where the iteration being timed began
        self.cores_ticks = [0, 0]  # busy and all ticks over the timed iterations (``cores``)
        self._began: float | None = None
        self._ended: float | None = None
        self._forward: float | None = None  # where the first step's compute began, when a hook marked it
        self.gaps: list[float] = []
        self.periods: list[float] = []  # from one step()'s start to the next: the iteration
        self.comm_busy: list[float] = []
        self.waits: list[float] = []  # what step() blocked on communication (the exposed part)
        self.durations: list[float] = []  # each step()'s own time, from its start to its end
        self.own: list[float] = []  # each step()'s time less what it blocked on communication (``update_s``)
        self.optimizer_steps: list[float] = []  # the wrapped optimizer's step() in each step that applied one
        self.iterations: list[float] = []  # from one step()'s end to the next's: the gap before a step, then the step
        self._gap: float | None = None  # this step's gap, when it had one

    def forward(self) -> None:
        """A forward pass starts: before the first step, where its compute began (later ones are ignored)."""
        if self._began is None and self._forward is None:
            self._forward = self._clock()

    def begin(self) -> None:
        now = self._clock()
        self._gap = None
        if self._ended is not None:
            self._gap = now - self._ended
        elif self._forward is not None:  # the first step: from its first forward pass
            self._gap = now - self._forward
        if self._gap is not None:
            self.gaps.append(self._gap)
        if self._began is not None:
            self.periods.append(now - self._began)
        self._began = now

    def end(self, comm_busy_s: float | None = 0.0, wait_s: float = 0.0, optimizer_s: float | None = None) -> None:
        self._ended = self._clock()
        if self._began is not None:
            self.durations.append(self._ended - self._began)
            self.own.append(max(self.durations[-1] - wait_s, 0.0))
            if self._gap is not None:
                self.iterations.append(self._gap + self.durations[-1])
        self.waits.append(wait_s)
        if comm_busy_s is not None:  # None: the step applied nothing (the pipeline fills)
            self.comm_busy.append(comm_busy_s)
        if optimizer_s is not None:
            self.optimizer_steps.append(optimizer_s)
        reading = self._cores()
        if reading is not None and self._cores_at is not None:  # the same iterations as ``iterations`` after the first
            self.cores_ticks = [self.cores_ticks[i] + reading[i] - self._cores_at[i] for i in (0, 1)]
        self._cores_at = reading

    def skip(self) -> None:
        """What ran since the last ``step()`` ended (the probe's measurements, a switch of codec) is not the caller's
        compute: the next gap starts now."""
        if self._ended is not None:
            self._ended = self._clock()
            self._cores_at = self._cores()

    def reset(self) -> None:
        """Start a new window (the gap right after a re-check, which includes its drain, is not compute)."""
        self._began, self._ended, self._forward = None, None, None
        self.gaps, self.periods, self.comm_busy, self.waits, self.durations, self.own = [], [], [], [], [], []
        self.optimizer_steps, self.iterations, self._gap = [], [], None
        self._cores_at, self.cores_ticks = None, [0, 0]

    @property
    def compute_s(self) -> float:
        """Median time between steps (0 when fewer than two steps were timed, e.g. right after a resume)."""
        return statistics.median(self.gaps) if self.gaps else 0.0

    @property
    def update_s(self) -> float:
        """Median work of ``step()`` itself on the caller's thread (update, hand-off, apply): the exchange in flight hides
        behind it as behind the compute (the model's T_cu = T_c + T_u), and under a heavy optimizer it can rival the compute."""
        return statistics.median(self.own) if self.own else 0.0

    @property
    def optimizer_s(self) -> float:
        """Median time of the wrapped optimizer's ``step()``: what the look-ahead's replay of its rule costs per step
        at width 2 and up (``Knobs.lookahead``; the timing model's ``lookahead_s``)."""
        return statistics.median(self.optimizer_steps) if self.optimizer_steps else 0.0

    @property
    def comm_s(self) -> float:
        """Median busy time of an exchange of the whole gradient."""
        return statistics.median(self.comm_busy) if self.comm_busy else 0.0

    def spreads(self) -> dict[str, float]:
        """How much compute and the exchange vary from step to step (``robust_spread``): compute's standard deviation
        and the exchange's as a share of its median (``comm_cv``)."""
        comm = robust_spread(self.comm_busy)
        return {"compute_spread_s": robust_spread(self.gaps), "comm_cv": comm / self.comm_s if comm else 0.0}

    def window(self) -> dict[str, float]:
        """A re-check's medians: compute, ``step()``'s own work, exchange, iteration, the exposed wait and the
        optimizer's step; and the cores' floor under the iteration (``cores_floor_s``)."""
        period = _median(self.periods)
        return {"compute_s": self.compute_s, "update_s": self.update_s, "comm_s": self.comm_s, "period_s": period,
                "wait_s": _median(self.waits), "optimizer_s": self.optimizer_s, **self.cores(period)}

    def cores(self, period_s: float) -> dict[str, float]:
        """How busy the cores were (every process's share of their time) over the timed iterations, from one
        ``step()``'s end to the next's as ``iterations`` times them, and so the least iteration they allow for the
        work of one of ``period_s`` (``pipesgd.auto.cores``: the same work at any width needs the same busy
        core-time); both 0 when nothing was read (every rank holds the same names: ``probes.agreed``)."""
        busy, total = self.cores_ticks
        share = busy / total if total > 0 else 0.0
        return {"cores_busy": share, "cores_floor_s": share * period_s}

    @property
    def fastest_s(self) -> float:
        """The fastest iteration, from one ``step()``'s end to the next's (0 when none was timed): the one least
        held up by first calls, probes and the other ranks' noise on shared cores."""
        return min(self.iterations, default=0.0)

    def synchronous(self) -> dict[str, float]:
        """The warm-up's synchronous steps as a configuration that ran (``decision._predictor``'s ``ran``): the iteration
        as median compute plus median ``step()`` (a period would hold step 0's first calls and the probes), the exchange,
        what ``step()`` blocked on it, and the fastest iteration (``fastest_s``) for the hold's early look."""
        period = self.compute_s + _median(self.durations)
        return {"comm_s": self.comm_s, "period_s": period, "wait_s": _median(self.waits),
                "fastest_s": self.fastest_s or period}


def robust_spread(values: list[float]) -> float:
    """A standard deviation estimated from the median absolute deviation (``1.4826 * MAD``, the normal
    distribution's factor: robust to one slow first step); 0 from fewer than two samples."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - middle) for v in values)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
