"""The background communication worker: a thread that runs rings while the caller computes, one per
``pipesgd.comm.channel.RingChannel``; jobs run in submission order, which keeps the rings of all ranks matched.

On CUDA the thread also owns a side stream: a job waits for an event recorded on the caller's stream at
submission and records a done-event that the handle's ``wait()`` makes the caller's stream wait for, so the
compute side never synchronises the host. A failed job records its event too, and ``close()`` waits for the side
stream, so no error path frees a buffer that a queued kernel still uses."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

import torch

from pipesgd.runlog import trace
from pipesgd.comm.handles import Work

_STOP = object()


class StreamWork(Work):
    """A handle whose result, on CUDA, is only valid on a stream after waiting for the job's done-event."""

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__()
        self.device = device  # the worker's device: its current stream is the one that waits
        self.done_event: torch.cuda.Event | None = None
        self.busy_s = 0.0

    def wait(self, timeout: float | None = None):
        try:
            with trace.span("wait", "wait"):  # the caller blocked on the background ring (its exposed part)
                return super().wait(timeout)
        finally:
            # On success and on error alike: the caller's stream must not touch the job's tensors (or free
            # them) before the kernels the job queued on the side stream have run.
            if self.done_event is not None:
                torch.cuda.current_stream(self.device).wait_event(self.done_event)


class CommWorker:
    """Runs submitted callables on one background thread (and, on CUDA, one side stream), in order."""

    def __init__(self, device: torch.device | str = "cpu", name: str = "pipesgd-comm") -> None:
        self.device = torch.device(device)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> StreamWork:
        """Queue ``fn(*args)``; returns a handle whose ``wait()`` gives its result or raises its error."""
        if not self._thread.is_alive():
            raise RuntimeError("the communication worker has been closed")
        work = StreamWork(self.device if self._stream is not None else None)
        ready = None
        if self._stream is not None:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        self._jobs.put((fn, args, work, ready, trace.current_step()))
        return work

    def is_alive(self) -> bool:
        """False once ``close()`` has stopped the thread."""
        return self._thread.is_alive()

    def close(self, timeout_s: float | None = None) -> bool:
        """Finish queued jobs, stop the thread, and wait for the kernels they queued on the side stream; False (the thread
        left running) if it was still running a job after ``timeout_s``."""
        if self._thread.is_alive():
            self._jobs.put(_STOP)
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return False
        if self._stream is not None:
            self._stream.synchronize()
        return True

    def _loop(self) -> None:
        if self._stream is not None:
            torch.cuda.set_device(self.device)
        trace.name_thread("comm")
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            fn, args, work, ready, step = job
            start = time.perf_counter()
            try:
                # One span per job, labelled with the trainer step that submitted it (on CUDA it covers the
                # host side of the job: the kernels it queues may still run on the side stream afterwards).
                with trace.span(getattr(fn, "__name__", "job"), "comm", {"step": step}, cpu=True), \
                        torch.profiler.record_function("pipesgd::allreduce"):
                    if self._stream is None:
                        result = fn(*args)
                    else:
                        with torch.cuda.stream(self._stream):
                            self._stream.wait_event(ready)
                            try:
                                result = fn(*args)
                            finally:  # a failed job may have queued kernels too
                                work.done_event = torch.cuda.Event()
                                work.done_event.record(self._stream)
                work.busy_s = time.perf_counter() - start
                work.set_result(result)
            except BaseException as error:  # noqa: BLE001 - handed to the waiting caller
                work.set_error(error)
