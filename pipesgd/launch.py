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


def rank_gpu(local_rank: int, backend: str, local_world_size: int) -> torch.device:
    """The GPU of the rank with ``local_rank`` on its node: ranks share the node's GPUs round-robin (gloo reads
    CUDA tensors from any number of ranks per GPU); NCCL refuses two ranks on one GPU ("Duplicate GPU detected"),
    so there it is a ValueError naming the fix."""
    count = torch.cuda.device_count()
    if count == 0:
        raise ValueError("--device cuda but no GPU is visible (torch.cuda.device_count() is 0)")
    problem = gpu_sharing_problem(backend, local_world_size, count)
    if problem:
        raise ValueError(problem)
    return torch.device("cuda", local_rank % count)


def gpu_sharing_problem(backend: str, local_world_size: int, gpu_count: int) -> str | None:
    """Why ``local_world_size`` ranks cannot share ``gpu_count`` GPUs on ``backend``, or None if they can."""
    if backend == "nccl" and local_world_size > gpu_count:
        return (f"{local_world_size} ranks on this node but {gpu_count} GPU(s): NCCL needs one GPU per rank; "
                "use --backend gloo (ranks then share the GPUs) or fewer ranks per node")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(rank: int, world: int, port: int, threads: int, fn: Callable, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _run(fn, args, threads)
    exit_process(0)


def exit_process(code: int) -> NoReturn:
    """End this process with ``code`` after flushing stdio, skipping the interpreter's teardown; call it only once
    everything the process writes is closed. A DistributedDataParallel module keeps references to its process group
    after it is gone, so gloo's worker threads are never joined, and one still freeing a collective's tensors while
    Python finalizes needs the GIL and aborts the process (SIGABRT). Without a teardown there is nothing to race."""
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
