"""Where a benchmark's per-rank module runs: spawned local ranks over loopback (no root), or one rank per node of an
emulated cluster under torchrun (root; ``pipesgd.cluster``). Shared by ``experiments/bench_pipeline.py`` and
``experiments/bench_agreement.py``."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable

# The repository root: ``experiments.harness`` modules run on the nodes with ``python -m``, importable from there.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

__all__ = ["LaunchError", "launch_ranks"]


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
