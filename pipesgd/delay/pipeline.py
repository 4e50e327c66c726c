"""The K-deep pipeline of PipeSGD: which step's averaged gradient is due at each step.

Step t submits the handle of its own ring, then pops the oldest entry if the pipeline holds ``depth(t)``: 1
during warm-up (a step applies its own gradient), the width K afterwards (step t applies step t-K+1; nothing is
due while the pipeline fills). ``flush()`` pops the rest, oldest first, so every step comes out once, in order.
The pipeline never waits on a handle (its caller does), so it is tested against completed or fake handles."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, Iterable, TypeVar

from pipesgd.comm.handles import Work

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class InFlight(Generic[T]):
    """One step's handed-off gradients: the step that produced them and the handle of their ring."""

    step: int
    handle: Work[T]


class Pipeline(Generic[T]):
    """A FIFO of in-flight steps with the warm-up-then-width rule for when the oldest is due."""

    def __init__(self, width: int, warmup_steps: int) -> None:
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"width must be an integer >= 1, got {width!r}")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        self.width = width
        self.warmup_steps = warmup_steps
        self._queue: deque[InFlight[T]] = deque()
        self._last_step: int | None = None  # the step submitted last: steps go in once, in order

    def depth(self, step: int) -> int:
        """How many steps are in flight when step ``step``'s oldest entry is due."""
        return 1 if step < self.warmup_steps else self.width

    def submit(self, step: int, handle: Work[T]) -> None:
        """Add step ``step``'s handle; raises if the step is not newer than the last one or no room is left."""
        if self._last_step is not None and step <= self._last_step:
            raise RuntimeError(f"step {step} submitted after step {self._last_step}: each step goes in once, in order")
        if len(self._queue) >= self.width:
            raise RuntimeError(
                f"{len(self._queue)} steps already in flight with width {self.width}: pop the due one first"
            )
        self._queue.append(InFlight(step, handle))
        self._last_step = step

    def pop_due(self, step: int) -> InFlight[T] | None:
        """The oldest entry if step ``step`` (the one just submitted) completes the depth, else None."""
        if step != self._last_step:
            raise RuntimeError(f"pop_due({step}) but the last step submitted is {self._last_step}")
        if len(self._queue) >= self.depth(step):
            return self._queue.popleft()
        return None

    def flush(self) -> list[InFlight[T]]:
        """Every entry still in flight, oldest first; the pipeline is empty afterwards."""
        entries = list(self._queue)
        self._queue.clear()
        return entries

    def entries(self) -> tuple[InFlight[T], ...]:
        """The entries in flight, oldest first, left in place (for a checkpoint)."""
        return tuple(self._queue)

    def restore(self, entries: Iterable[InFlight[T]]) -> None:
        """Refill an empty pipeline from a checkpoint; the next step submitted must be newer than these."""
        if self._queue:
            raise RuntimeError("load_state_dict() with steps in flight; call flush() first")
        restored = list(entries)
        steps = [entry.step for entry in restored]
        if steps != sorted(set(steps)) or len(restored) >= self.width:
            raise ValueError(f"cannot restore steps {steps} into a pipeline of width {self.width}")
        self._queue.extend(restored)
        self._last_step = steps[-1] if steps else None

    def __len__(self) -> int:
        return len(self._queue)
