"""Python API of the emulated cluster, for experiments that script it.

    with Cluster.up(nodes=4, bandwidth_bps=1e9, name="psgd-exp") as c:
        print(c.measure().summary())
        rc = c.run(["pipesgd-train", "--mode", "pipe"], timeout_s=600)
    # namespaces are gone here, even after an exception
"""
from __future__ import annotations

import subprocess
import sys
from typing import TextIO

from . import topology
from .cores import available_cores, node_cores
from .launch import LaunchSpec, cluster_commands
from .measure import Throughput, measure_throughput
from .netns import ClusterError, netns_exec, preflight
from .state import DEFAULT_NAME, ClusterState, load_state, validate_name
from .supervise import supervise
from .units import default_burst_bytes

DEFAULT_QUEUE_MS = 50.0  # tbf "latency": how long a packet may wait in the shaper before being dropped

# Ask the node's own kernel for a free port, so the rendezvous port never collides inside that node.
_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


class Cluster:
    """A live emulated cluster (see ``topology``); a context manager that always tears it down."""

    def __init__(self, state: ClusterState, state_dir: str | None = None):
        self.state = state
        self.state_dir = state_dir

    # -- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def up(cls, nodes: int, bandwidth_bps: float | None, *, name: str = DEFAULT_NAME, burst_bytes: int | None = None,
           mtu: int = 1500, queue_ms: float = DEFAULT_QUEUE_MS, shape_ingress: bool = True,
           force: bool = False, state_dir: str | None = None, cores_per_node: int = 0) -> "Cluster":
        """Create the namespaces, bridge and shaping (none when ``bandwidth_bps`` is None: unshaped links at veth
        speed); refuse if ``name`` exists unless ``force``. ``cores_per_node`` > 0 pins every command a node runs
        to cores of its own (``cores.node_cores``); 0 lets all nodes share all cores."""
        if nodes < 1:
            raise ClusterError(f"--nodes must be >= 1, got {nodes}")
        try:
            shaped = bandwidth_bps is not None
            state = ClusterState(name=name, nodes=nodes, bandwidth_bps=float(bandwidth_bps) if shaped else None,
                                 burst_bytes=(burst_bytes or default_burst_bytes(bandwidth_bps, mtu)) if shaped else 0,
                                 queue_ms=queue_ms, mtu=mtu, shape_ingress=shape_ingress,
                                 node_cores=node_cores(nodes, cores_per_node, available_cores()))
        except ValueError as e:
            raise ClusterError(str(e)) from None
        return cls(topology.build(state, force=force, directory=state_dir), state_dir)

    @classmethod
    def load(cls, name: str = DEFAULT_NAME, state_dir: str | None = None) -> "Cluster":
        """Attach to a cluster made earlier (by ``up`` in another process)."""
        try:
            validate_name(name)
        except ValueError as e:
            raise ClusterError(str(e)) from None
        state = load_state(name, state_dir)
        if state is None:
            raise ClusterError(f"no cluster named {name!r}; create it with `pipesgd-cluster up --name {name} ...`")
        return cls(state, state_dir)

    def down(self) -> None:
        topology.teardown(self.state.name, self.state_dir)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    # -- use ------------------------------------------------------------------------------------
    def reshape(self, bandwidth_bps: float) -> None:
        """Change every link's rate while the cluster runs (``topology.reshape``)."""
        self.state = topology.reshape(self.state, bandwidth_bps, self.state_dir)

    def free_port(self, node: int = 0) -> int:
        out = subprocess.run(netns_exec(self.state.node_netns[node], [sys.executable, "-c", _FREE_PORT]),
                             capture_output=True, text=True, check=True).stdout
        return int(out.strip())

    def launch_spec(self, *, nproc_per_node: int = 1, torchrun: bool = True, max_restarts: int = 0,
                    master_port: int | None = None) -> LaunchSpec:
        return LaunchSpec(nnodes=self.state.nodes, master_addr=self.state.master_addr,
                          master_port=master_port or self.free_port(0), ifname=self.state.ifname,
                          nproc_per_node=nproc_per_node, torchrun=torchrun, max_restarts=max_restarts)

    def run(self, argv: list[str], *, nproc_per_node: int = 1, torchrun: bool = True, max_restarts: int = 0,
            timeout_s: float | None = None, env: dict[str, str] | None = None,
            out: TextIO | None = None, err: TextIO | None = None) -> int:
        """Run ``argv`` on every node (see ``launch`` for the exact command); the worst exit code."""
        preflight()
        missing = set(self.state.node_netns) - set(topology.cluster_netns(self.state.name))
        if missing:
            raise ClusterError(f"cluster {self.state.name!r} is incomplete (missing {sorted(missing)}); "
                               "recreate it with `pipesgd-cluster up --force`")
        try:
            spec = self.launch_spec(nproc_per_node=nproc_per_node, torchrun=torchrun, max_restarts=max_restarts)
            commands = cluster_commands(self.state, spec, list(argv), env)
        except ValueError as e:
            raise ClusterError(str(e)) from None
        return supervise(commands, timeout_s=timeout_s, out=out, err=err)

    def measure(self, src: int = 0, dst: int = 1, duration_s: float = 2.0) -> Throughput:
        preflight()
        return measure_throughput(self.state, src, dst, duration_s)

    def status(self) -> str:
        return topology.describe(self.state)

    def sent_bytes(self, node: int) -> int:
        """Bytes through node ``node``'s egress shaper so far."""
        return topology.qdisc_sent_bytes(self.state, node)
