"""How long one iteration's forward + backward took, without counting the background communication: on CUDA
two events on the compute stream, on CPU the wall clock.

A device-wide ``torch.cuda.synchronize()`` would also wait for the comm worker's side stream, so the ring in
flight would be counted as compute and the wait for it would read about zero.
"""
from __future__ import annotations

import time

import torch

__all__ = ["ComputeTimer", "wait_for_compute"]


def wait_for_compute(device: torch.device | str) -> None:
    """Wait for the work queued on ``device``'s current (compute) stream only; nothing to wait for on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class ComputeTimer:
    """``start()`` before the forward pass, ``stop()`` after backward: the seconds in between on the compute
    stream (CUDA events, waited for on that stream alone) or on the wall clock (CPU)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._start_event: torch.cuda.Event | None = None
        self._start_s = 0.0

    def start(self) -> None:
        if self._cuda:
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record(torch.cuda.current_stream(self.device))
        else:
            self._start_s = time.perf_counter()

    def stop(self) -> float:
        """Seconds since ``start()``; on CUDA, once the compute stream has run everything queued until now."""
        if not self._cuda:
            return time.perf_counter() - self._start_s
        if self._start_event is None:
            raise RuntimeError("ComputeTimer.stop() without start()")
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        end.synchronize()
        seconds = self._start_event.elapsed_time(end) / 1e3
        self._start_event = None
        return seconds
