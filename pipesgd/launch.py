"""A rank's process: which GPU it takes on its node, and how the process ends without the interpreter's teardown."""
from __future__ import annotations

import os
import sys
from typing import NoReturn

import torch


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
