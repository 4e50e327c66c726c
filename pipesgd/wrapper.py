"""The one seam between the training loop and whatever averages gradients: the ``OptimizerWrapper`` Protocol.

``PipeSGD``, the DDP adapter and the parameter-server wrapper (sync and async) satisfy it; the trainer
calls nothing else on them. Torch-free, so it can be imported (and checked) anywhere.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pipesgd.accounting import StepStats


@runtime_checkable
class OptimizerWrapper(Protocol):
    """An optimizer that averages gradients across ranks, driven as ``backward(); step(); zero_grad()``.

    Life cycle: ``step()`` and ``zero_grad()`` once per iteration; ``flush()`` once at the end of training
    (it completes every outstanding exchange and applies what it brings, so no gradient is lost; a wrapper
    whose protocol has an end, like the parameter server's, ends it here); ``close()`` always, last, also
    after a failure (it releases threads and hooks and must not raise for an unfinished run).
    ``state_dict()`` holds everything a resumed run needs, in-flight gradients included.
    """

    last_stats: StepStats | None  # what the latest step() (or flush()) did; None before the first

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's groups (LR schedulers and the loop read and write lr here)."""
        ...

    def step(self) -> StepStats:
        """Hand this iteration's gradients on and apply the averaged gradient that is due, if any."""
        ...

    def zero_grad(self, set_to_none: bool = True) -> None:
        ...

    def flush(self) -> list[StepStats]:
        """End of training: wait for what is in flight and apply it; the stats of what was applied."""
        ...

    def close(self) -> None:
        ...

    def state_dict(self) -> dict:
        ...

    def load_state_dict(self, state: dict) -> None:
        ...
