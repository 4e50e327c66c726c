"""Run a function on every rank: under torchrun (env:// rendezvous) or, launched alone, in spawned local
gloo processes. Benchmark and experiment scripts use this so each also runs without torchrun."""
from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from typing import Any, Callable, NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(rank: int, world: int, port: int, threads: int, fn: Callable, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _run(fn, args, threads)
    exit_process(0)


def exit_process(code: int) -> NoReturn:
    """End this process with ``code`` after flushing stdio, skipping the interpreter's teardown.

    Call it only once everything the process writes is closed. Why: a DistributedDataParallel module keeps
    references to its process group after the module is gone (10 per DDP, counted with ``sys.getrefcount``), so
    ``destroy_process_group`` cannot join gloo's worker threads. One of them may still be freeing a finished
    collective's tensors while Python finalizes; it then needs the GIL the finalizing interpreter no longer grants
    and the process aborts ("terminate called without an active exception", SIGABRT; seen in 3 of 165
    ``bench_pipeline.py`` runs with DDP rows, and once in CI). Without a teardown there is nothing to race.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can reach it anyway
            pass
    os._exit(code)


def _run(fn: Callable, args: tuple, threads: int, timeout_s: float = 600.0) -> Any:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    try:
        return fn(dist.get_rank(), dist.get_world_size(), *args)
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn: Callable, ranks: int, *args: Any, threads: int = 1) -> None:
    """``fn(rank, world_size, *args)`` on every rank; under torchrun ``ranks`` is ignored."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _run(fn, args, threads)
    else:
        mp.spawn(_spawned, args=(ranks, free_port(), threads, fn, args), nprocs=ranks, join=True)
