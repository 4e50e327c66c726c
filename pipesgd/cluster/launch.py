"""How ``pipesgd-cluster run`` starts a command on every node: command lines and environments (pure).

What runs on node i (inside ``ip netns exec {name}-node{i}``), with torchrun (the default):

    python -m torch.distributed.run --nnodes N --node-rank i --nproc-per-node k
        --master-addr 10.77.0.10 --master-port P --max-restarts R  TAIL

where TAIL is the user's command (everything after ``--``) as torchrun takes it: ``-m pipesgd.train ARGS`` for
``pipesgd-train``, ``-m MODULE`` or ``SCRIPT.py`` for Python, ``--no-python CMD ARGS`` for any other executable.
With ``--no-torchrun`` the command runs unchanged, once per node, with NODE_RANK, NNODES, MASTER_ADDR,
MASTER_PORT and NPROC_PER_NODE set. In both cases GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME /
TP_SOCKET_IFNAME name the node's shaped veth, so inter-node traffic cannot bypass the shaper. On a cluster
made with ``--cores-per-node``, the command inside the namespace is wrapped in
``python -m pipesgd.cluster.pin CORES --`` (``cores.pinned_argv``), so the node runs on its own cores.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from .cores import pinned_argv
from .netns import netns_exec
from .state import ClusterState

TRAIN_MODULE = "pipesgd.train"
TRAIN_SCRIPT = "pipesgd-train"
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """How one ``run`` is launched across the cluster."""

    nnodes: int
    master_addr: str
    master_port: int
    ifname: str
    nproc_per_node: int = 1
    torchrun: bool = True   # False: run the raw command once per node (--no-torchrun)
    max_restarts: int = 0   # passed to torchrun; pair with pipesgd-train --resume to recover

    def __post_init__(self):
        if self.nnodes < 1 or self.nproc_per_node < 1:
            raise ValueError("nnodes and nproc_per_node must be >= 1")
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"bad master port {self.master_port}")
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")


def _is_python(exe: str) -> bool:
    return exe == sys.executable or bool(_PYTHON_RE.match(os.path.basename(exe)))


def torchrun_tail(argv: list[str]) -> list[str]:
    """Translate the user's command into what follows torchrun's own options (see module docstring)."""
    if not argv:
        raise ValueError("no command given after --")
    exe, rest = argv[0], list(argv[1:])
    base = os.path.basename(exe)
    if base in ("torchrun", "pipesgd-cluster"):
        raise ValueError(f"do not pass {base} after --: pipesgd-cluster starts torchrun itself "
                         "(use --no-torchrun to run a command as is)")
    if base == TRAIN_SCRIPT:
        return ["-m", TRAIN_MODULE, *rest]
    if _is_python(exe):
        if len(rest) >= 2 and rest[0] == "-m":
            return ["-m", rest[1], *rest[2:]]
        if rest and not rest[0].startswith("-"):
            return rest
        raise ValueError("under torchrun a python command must be `python -m MODULE ...` or "
                         "`python SCRIPT.py ...` (use --no-torchrun for anything else)")
    if exe.endswith(".py"):
        return [exe, *rest]
    return ["--no-python", exe, *rest]


def node_argv(spec: LaunchSpec, node: int, argv: list[str]) -> list[str]:
    """The command to start on ``node`` (before the ``ip netns exec`` wrapper)."""
    if not 0 <= node < spec.nnodes:
        raise ValueError(f"node {node} out of range 0..{spec.nnodes - 1}")
    if not spec.torchrun:
        if not argv:
            raise ValueError("no command given after --")
        return list(argv)
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(spec.nnodes), "--node-rank", str(node),
            "--nproc-per-node", str(spec.nproc_per_node),
            "--master-addr", spec.master_addr, "--master-port", str(spec.master_port),
            "--max-restarts", str(spec.max_restarts),
            *torchrun_tail(argv)]


def node_env(spec: LaunchSpec, node: int, base_env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for ``node``: the caller's, plus the rendezvous and socket-interface variables."""
    env = dict(os.environ if base_env is None else base_env)
    env.update({
        # Bind gloo / NCCL / TensorPipe to the shaped veth; without this they could pick lo for
        # same-node peers only, but naming the device makes the choice explicit and checkable.
        "GLOO_SOCKET_IFNAME": spec.ifname,
        "NCCL_SOCKET_IFNAME": spec.ifname,
        "TP_SOCKET_IFNAME": spec.ifname,
        "NODE_RANK": str(node),
        "NNODES": str(spec.nnodes),
        "NPROC_PER_NODE": str(spec.nproc_per_node),
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        # Line-by-line output so the [node i] streams interleave as they happen.
        "PYTHONUNBUFFERED": "1",
    })
    return env


def cluster_commands(state: ClusterState, spec: LaunchSpec, argv: list[str],
                     base_env: dict[str, str] | None = None) -> list[tuple[list[str], dict[str, str]]]:
    """(argv pinned to the node's cores and wrapped in ``ip netns exec``, env) for every node, node 0 first."""
    if spec.nnodes != state.nodes:
        raise ValueError(f"spec has {spec.nnodes} nodes but cluster {state.name} has {state.nodes}")
    return [(netns_exec(state.node_netns[i], pinned_argv(state.node_cores[i], node_argv(spec, i, argv))),
             node_env(spec, i, base_env)) for i in range(state.nodes)]
