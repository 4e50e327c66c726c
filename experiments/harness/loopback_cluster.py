"""A stand-in for the emulated cluster with the two calls the comparison grid makes (``measure``, ``run``): every
"node" is a local process over loopback, launched by torchrun, with no root, no namespaces and no shaping. It is
the grid's quick profile (``experiments/comparison.py --loopback``): the same trainer runs, records and tables, in
minutes, on links nobody shaped (so no calibration and no predictions).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import TextIO

__all__ = ["LOOPBACK", "LoopbackCluster"]

LOOPBACK = "loopback"  # the pseudo-bandwidth of the quick profile's cells (``lenet-loopback``)


@dataclass(frozen=True, slots=True)
class _NoMeasurement:
    measured_bps: float | None = None

    def summary(self) -> str:
        return "loopback: local processes, no shaping (not measured)"


class LoopbackCluster:
    """``nodes`` local ranks; a context manager like ``Cluster.up`` (nothing to tear down)."""

    def __init__(self, nodes: int) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        self.nodes = nodes

    def __enter__(self) -> LoopbackCluster:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def measure(self) -> _NoMeasurement:
        return _NoMeasurement()

    def run(self, argv: list[str], *, timeout_s: float | None = None, out: TextIO | None = None,
            err: TextIO | None = None) -> int:
        """``argv`` (a ``pipesgd-train`` command line) on every local rank under torchrun; its exit code, 124 on
        timeout."""
        if not argv or argv[0] != "pipesgd-train":
            raise ValueError(f"the loopback cluster runs pipesgd-train only, got {argv[:1]}")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(self.nodes), "--master-port",
               str(_free_port()), "-m", "pipesgd.train", *argv[1:]]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        try:
            return subprocess.run(cmd, stdout=out, stderr=err, env=env, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return 124


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
