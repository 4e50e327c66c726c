"""Which CPU cores each emulated node may run on, and the wrapper that pins a node's command to them.

``pipesgd-cluster up --cores-per-node K`` gives node i the K cores ``available[i*K : (i+1)*K]`` of this process's
allowed set, exclusively, and refuses when there are fewer than nodes x K. Each node's command runs through
``python -m pipesgd.cluster.pin CORES -- ARGV`` inside its namespace, and everything it starts inherits the pin
(docs/emulated-cluster.md)."""
from __future__ import annotations

import os
import sys

__all__ = ["available_cores", "node_cores", "format_cores", "parse_cores", "pinned_argv"]


def available_cores() -> list[int]:
    """The cores this process may run on, ascending."""
    return sorted(os.sched_getaffinity(0))


def node_cores(nodes: int, cores_per_node: int, available: list[int]) -> list[list[int]]:
    """Disjoint core lists, node 0 first; [] per node when ``cores_per_node`` is 0 (no pinning)."""
    if cores_per_node < 0:
        raise ValueError(f"--cores-per-node must be >= 0, got {cores_per_node}")
    if cores_per_node == 0:
        return [[] for _ in range(nodes)]
    need = nodes * cores_per_node
    if need > len(available):
        raise ValueError(f"--cores-per-node {cores_per_node} needs {need} cores for {nodes} nodes, "
                         f"this machine allows {len(available)}")
    return [list(available[i * cores_per_node:(i + 1) * cores_per_node]) for i in range(nodes)]


def format_cores(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the kernel's list format)."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive cores
    for core in sorted(set(cores)):
        if runs and runs[-1][1] == core - 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_cores(text: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``; ValueError on anything else."""
    cores: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"bad core list {text!r}: expected e.g. 0-3,6") from None
        if first < 0 or last < first:
            raise ValueError(f"bad core list {text!r}: expected e.g. 0-3,6")
        cores.update(range(first, last + 1))
    return sorted(cores)


def pinned_argv(cores: list[int], argv: list[str]) -> list[str]:
    """``argv`` run on ``cores`` only (unchanged when ``cores`` is empty)."""
    if not cores:
        return list(argv)
    return [sys.executable, "-m", "pipesgd.cluster.pin", format_cores(cores), "--", *argv]
