"""run_ranks(fn, n): run ``fn(rank, world_size, *args)`` in n gloo processes on CPU; run_checks: several such
independent checks one after another in one such world (starting one costs more than most checks).

Each run gets its own FileStore and a hard timeout; a failure in any rank fails the test with that rank's
traceback. Results are returned per rank (they must be picklable).

The ranks are forked by multiprocessing's fork server, which imports ``PRELOAD`` once per test session, rather than
each started as a fresh interpreter (spawn): on the 2-core CI box the spawned ranks of one call spent ~5 s starting
and importing torch, most of each distributed test's time. The fork server is itself a fresh interpreter, not a
fork of pytest, and only imports; each rank gets the caller's environment, working directory and sys.path at the
call, as a spawned one did, and is pickled the same way. (A rank's own output goes to the fork server's stdout and
stderr, not the current test's capture; failures come back through the queue with the rank's traceback.)
"""
from __future__ import annotations

import faulthandler
import gc
import io
import os
import signal
import tempfile
import time
from queue import Empty
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_TIMEOUT_S = 120.0
# torch._dynamo (the first optimizer imports it, ~1.5 s a rank) only where torch has no CUDA: the server must never
# initialise the CUDA driver, or no forked rank could use it, and that import is not known to leave it alone on a CUDA
# build (import torch does); there each rank imports it itself.
PRELOAD = ["torch", "torch.distributed"] + ([] if torch.backends.cuda.is_built() else ["torch._dynamo"])


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # used when the server starts (the first call of the session)
    return ctx


def _stack_path(store_path: str, rank: int) -> str:
    return f"{store_path}.rank{rank}.stacks"


def _entry(rank, world_size, store_path, fn, args, queue, environ, timeout_s):
    # A rank that hangs is asked for its threads' Python stacks (SIGUSR1) before it is killed, so that a timeout
    # names where it stood rather than only that it did not finish.
    stacks = open(_stack_path(store_path, rank), "w")  # noqa: SIM115 - open for the life of the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    try:
        os.environ.clear()  # the caller's, not the fork server's (started by an earlier test)
        os.environ.update(environ)
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store_path}",
            rank=rank,
            world_size=world_size,
            # Shorter than the caller's deadline: a rank left waiting in a collective raises gloo's timeout, whose
            # traceback says which collective, before the caller gives up on it.
            timeout=timedelta(seconds=max(5.0, 0.8 * timeout_s)),
        )
        try:
            result = fn(rank, world_size, *args)
            # The run's objects go while their process group lives: a DDP module in a reference cycle (its hooks
            # point back at their owner) would otherwise be collected at any later allocation, after the teardown.
            gc.collect()
            # No rank tears its connections down while a peer may still be reading from them.
            dist.barrier()
        finally:
            dist.destroy_process_group()
        # Tensors go back as bytes: torch's queue sharing would point at memory that dies with this process.
        buffer = io.BytesIO()
        torch.save(result, buffer)
        queue.put((rank, True, buffer.getvalue()))
    except BaseException:  # noqa: BLE001 - report any failure to the parent
        queue.put((rank, False, traceback.format_exc()))


def run_ranks(fn, world_size: int, *args, timeout_s: float = DEFAULT_TIMEOUT_S):
    """Start ``world_size`` processes running ``fn(rank, world_size, *args)``; return their results by rank."""
    ctx = _context()
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_entry, args=(r, world_size, store_path, fn, args, queue, dict(os.environ), timeout_s),
                        daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results, failures = {}, []
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) < world_size and not failures:
                try:
                    rank, ok, payload = queue.get(timeout=1.0)
                except Empty:
                    # A rank that died without reporting (a native abort, a kill) fails the run at once.
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                    if dead:
                        failures.append(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}")
                    elif time.monotonic() > deadline:
                        reported = sorted(results) or "none"
                        failures.append(f"ranks did not finish within {timeout_s} s (reported: {reported})")
                    continue
                if ok:
                    results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
                else:
                    failures.append(f"rank {rank} failed:\n{payload}")
            if failures:
                failures.append(_stacks_of_live(procs, store_path))
        finally:
            for p in procs:
                p.join(timeout=5 if not failures else 0.5)
                if p.is_alive():
                    p.kill()
                    p.join()
        if failures:
            raise AssertionError("\n".join(failures))
        return [results[r] for r in range(world_size)]


def _each(rank: int, world_size: int, checks: dict) -> dict:
    results = {}
    for name, (fn, *args) in checks.items():
        results[name] = fn(rank, world_size, *args)
        gc.collect()  # as after a run of its own: what one check left in a cycle goes before the next starts
    return results


def run_checks(checks: dict, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, list]:
    """Run independent checks, ``checks[name] = (fn, *args)``, one after another on the same ``world_size`` ranks;
    return each one's results by rank, as ``run_ranks(fn, world_size, *args)`` would have. A failure in any check
    fails them all, naming the rank and its traceback."""
    per_rank = run_ranks(_each, world_size, checks, timeout_s=timeout_s)
    return {name: [results[name] for results in per_rank] for name in checks}


def _stacks_of_live(procs, store_path: str) -> str:
    """The Python stacks of the ranks still running (a failure elsewhere may have left them waiting on it), dumped by
    their SIGUSR1 handler."""
    live = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in live:
        os.kill(procs[r].pid, signal.SIGUSR1)
    time.sleep(1.0)
    parts = []
    for r in live:
        try:
            with open(_stack_path(store_path, r)) as f:
                parts.append(f"\n--- rank {r} (still running) ---\n{f.read()}")
        except OSError as exc:
            parts.append(f"\n--- rank {r}: no stacks ({exc}) ---")
    return "".join(parts)
