"""Where a benchmark's per-rank code runs: a function on every rank under torchrun or in spawned local gloo processes
(``run_on_ranks``), or a module on every node of an emulated cluster (root; ``pipesgd.cluster``: ``launch_ranks``)."""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipesgd.launch import exit_process

# The repository root: ``experiments.harness`` modules run on the nodes with ``python -m``, importable from there.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

__all__ = ["LaunchError", "launch_ranks", "run_on_ranks", "free_port"]


class LaunchError(RuntimeError):
    """The cluster could not be set up or its run failed; the message is one line for the user."""


def launch_ranks(module: str, settings_json: str, run_loopback: Callable[[], None], *, nodes: int,
                 bandwidth: str | None, bandwidth_bps: float | None, cluster_name: str, timeout_s: float,
                 cores_per_node: int = 0) -> str:
    """Run ``python -m module settings_json`` on every node of an emulated cluster at ``bandwidth``, or
    ``run_loopback()`` where ``bandwidth`` is None; returns a phrase saying where it ran."""
    if bandwidth is None:
        run_loopback()
        return f"{nodes} ranks on loopback"
    from pipesgd.cluster.cluster import Cluster
    from pipesgd.cluster.netns import ClusterError
    try:
        with Cluster.up(nodes, bandwidth_bps, name=cluster_name, force=True, cores_per_node=cores_per_node) as cluster:
            path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
            env = {**os.environ, "PYTHONPATH": path}  # the nodes' whole environment (it replaces os.environ)
            rc = cluster.run([sys.executable, "-m", module, settings_json], timeout_s=timeout_s, env=env)
    except ClusterError as error:
        raise LaunchError(str(error)) from None
    if rc != 0:
        raise LaunchError(f"the cluster run failed with exit code {rc}")
    where = f"{nodes} emulated nodes, {bandwidth} per link (tc tbf)"
    return where + (f", {cores_per_node} core(s) of its own per node" if cores_per_node else "")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(rank: int, world: int, port: int, threads: int, fn: Callable, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _run(fn, args, threads)
    exit_process(0)


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
