"""The end of a PipeSGD wrapper's background work: ``close()``, garbage collection, or the interpreter's exit.

At interpreter exit Python stops a daemon thread wherever it is; inside a gloo wait the process then aborts on
every rank. So every wrapper's ``Background`` is closed once: by ``close()`` or, through a ``weakref.finalize``,
when the wrapper is collected or at ``atexit``. Closing lets the rings in flight finish (every rank submitted the
same ones), stops the worker and destroys the private groups; the finalizer also warns how many steps were never
applied, and why if a ring failed."""
from __future__ import annotations

import warnings
import weakref

from pipesgd.comm.channel import RingChannel
from pipesgd.defaults import EXIT_WAIT_S
from pipesgd.delay.pipeline import Pipeline
from pipesgd.comm.uneven import Participation


class Background:
    """What a wrapper runs beside training: its channel (worker thread, private group), the uneven-input
    agreement's group, and the pipeline whose steps are in flight on them."""

    def __init__(self, channel: RingChannel, participation: Participation, pipeline: Pipeline,
                 timeout_s: float | None) -> None:
        self.channel = channel
        self.participation = participation
        self.pipeline = pipeline
        self.timeout_s = timeout_s

    def close(self, warn: bool) -> None:
        """Finish the rings in flight and close the channel and groups; with ``warn``, say how many steps in flight
        were never applied: the script ended without ``flush()``, or, if a ring failed, what ended it."""
        pending = len(self.pipeline)
        wait_s = self.timeout_s if self.timeout_s is not None else EXIT_WAIT_S
        closed = self.channel.close(wait_s)
        failure = _failure(self.pipeline)  # among the jobs that finished
        if warn and pending and failure is not None:
            _warn(f"PipeSGD closed with {pending} step(s) in flight that were never applied: the background "
                  f"exchange failed ({failure})")
        elif warn and pending:
            _warn(f"PipeSGD closed with {pending} step(s) in flight that were never applied; call opt.flush() at "
                  f"the end of training to apply them")
        if not closed:
            _warn(f"PipeSGD's background ring had not finished after {wait_s:g} s (a peer stopped answering); "
                  f"leaving it running")
            return
        self.participation.close()


def _failure(pipeline: Pipeline) -> str | None:
    """The first line of the error that the oldest failed step in flight holds (a peer died, a connection closed,
    a rank ran out of data), or None if none failed."""
    for entry in pipeline.entries():
        if entry.handle.is_completed():
            try:
                entry.handle.wait()
            except BaseException as error:  # noqa: BLE001 - only described
                lines = str(error).strip().splitlines()
                return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__
    return None


def _warn(message: str) -> None:
    # Attributed to the library, not to weakref's or atexit's frame that happens to call this.
    warnings.warn_explicit(message, RuntimeWarning, "<pipesgd>", 0, module="pipesgd")


def close_when_dropped(owner: object, background: Background) -> weakref.finalize:
    """Close ``background`` with a warning when ``owner`` is collected or the interpreter exits first; an explicit
    close detaches this finalizer (``finalize.detach()``) and closes without one."""
    return weakref.finalize(owner, background.close, True)
