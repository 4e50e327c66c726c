"""Peer failures: recognise them, name the rank that stopped answering, and inject them in tests.

When a collective fails, every surviving rank marks itself alive in the rendezvous store and waits briefly for the
others; those that never mark themselves are named in the error line. A ``Watchdog`` fails a step that makes no
progress for ``--timeout`` seconds (gloo's point-to-point ``Work.wait()`` has no deadline). Test hooks
(environment, never flags): ``PIPESGD_TEST_DIE_AT_STEP=rank:step`` (``os._exit``) and
``PIPESGD_TEST_HANG_AT_STEP=rank:step`` (SIGSTOP) before that step."""
from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import timedelta

import torch.distributed as dist

DIE_ENV = "PIPESGD_TEST_DIE_AT_STEP"
HANG_ENV = "PIPESGD_TEST_HANG_AT_STEP"
_ALIVE_PREFIX = "pipesgd/alive/"

# Message fragments of a failed collective or store operation in gloo/NCCL/c10d.
_PEER_FAILURE_MARKERS = ("connection closed", "connection reset", "timed out", "timeout", "broken pipe",
                         "connection refused", "socket", "gloo", "nccl", "no route to host", "peer")


def _parse(env: str) -> tuple[int, int] | None:
    value = os.environ.get(env, "")
    if not value:
        return None
    rank, step = value.split(":")
    return int(rank), int(step)


def inject(rank: int, step: int) -> None:
    """Test-only: die or hang at the step chosen in the environment (first torchrun attempt only, so
    that ``torchrun --max-restarts 1 ... --resume`` can be seen recovering)."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    die = _parse(DIE_ENV)
    if die == (rank, step):
        os._exit(17)
    hang = _parse(HANG_ENV)
    if hang == (rank, step):
        os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops, as in a real hang; SIGKILL still works


class Watchdog:
    """Calls ``on_expire()`` from a daemon thread if ``beat()`` is not called for ``timeout_s`` seconds."""

    def __init__(self, timeout_s: float, on_expire) -> None:
        self.timeout_s = timeout_s
        self._on_expire = on_expire
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipesgd-watchdog", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            if time.monotonic() - self._last > self.timeout_s:
                self._on_expire()
                return


def is_peer_failure(exc: BaseException) -> bool:
    """True for errors a dead or hung peer causes (as opposed to bugs, which keep their traceback)."""
    if isinstance(exc, (dist.DistError, TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(marker in text for marker in _PEER_FAILURE_MARKERS)
    return False


def silent_ranks(rank: int, world_size: int, grace_s: float) -> list[int] | None:
    """Mark this rank alive, wait up to ``grace_s`` for the others; return those that never answered.

    Returns None when the store itself is gone (its host died), so nothing can be said.
    """
    try:
        store = dist.distributed_c10d._get_default_store()  # the rendezvous store every rank shares
        store.set_timeout(timedelta(seconds=max(grace_s, 1.0)))
        store.set(f"{_ALIVE_PREFIX}{rank}", "1")
        deadline = time.monotonic() + grace_s
        missing = [r for r in range(world_size) if r != rank]
        while missing and time.monotonic() < deadline:
            missing = [r for r in missing if not store.check([f"{_ALIVE_PREFIX}{r}"])]
            if missing:
                time.sleep(0.1)
        return missing
    except Exception:  # noqa: BLE001 - a store failure means its host is gone; say so without a guess
        return None


def describe_failure(exc: BaseException, rank: int, world_size: int, timeout_s: float) -> str:
    """One line: which rank(s) stopped answering, seen from ``rank``, and the configured timeout."""
    grace_s = min(5.0, max(1.0, timeout_s / 4))
    silent = silent_ranks(rank, world_size, grace_s) if world_size > 1 else []
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    first_line = re.sub(r"^\[[^\]]*\]\s*", "", first_line)[:160]  # drop gloo's "[.../pair.cc:553]" prefix
    if silent:
        who = ", ".join(str(r) for r in silent)
        plural = "s" if len(silent) > 1 else ""
        return (f"rank {rank}: lost connection to peer rank{plural} {who} (dead or hung; timeout {timeout_s:g} s): "
                f"{first_line}")
    if silent is None:
        return (f"rank {rank}: lost connection to the rendezvous host (rank 0 or the launcher died; "
                f"timeout {timeout_s:g} s): {first_line}")
    return f"rank {rank}: communication failed (timeout {timeout_s:g} s): {first_line}"
