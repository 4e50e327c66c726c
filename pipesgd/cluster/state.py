"""The emulated cluster's description: names, addresses and shaping, saved atomically as JSON.

Every name is derived from the cluster name (which must start with ``psgd``), so ``down`` can find
exactly what ``up`` made even when the state file is gone.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from timing_model.atomic import write_text_atomic

DEFAULT_NAME = "psgd"
DEFAULT_STATE_DIR = "/run/pipesgd-cluster"
STATE_DIR_ENV = "PIPESGD_CLUSTER_STATE_DIR"
# Private /24 that only ever exists inside the cluster's own namespaces (never in the host's).
SUBNET_PREFIX = "10.77.0"
FIRST_HOST = 10
MAX_NODES = 240
# Interface names (IFNAMSIZ = 16): identical in every cluster, because each lives in its own namespace.
NODE_IFNAME = "psgd-veth"
BRIDGE_IFNAME = "psgd-br"

_NAME_RE = re.compile(r"^psgd[A-Za-z0-9_-]{0,40}$")


def validate_name(name: str) -> str:
    """Cluster names start with ``psgd`` so that every namespace made is ``psgd-`` prefixed."""
    if not _NAME_RE.match(name) or name.endswith("-"):
        raise ValueError(f"bad cluster name {name!r}: must match psgd[A-Za-z0-9_-]* (at most 44 chars)")
    return name


def node_netns(name: str, node: int) -> str:
    return f"{name}-node{node}"


def switch_netns(name: str) -> str:
    return f"{name}-sw"


def port_ifname(node: int) -> str:
    """Bridge-side end of node ``node``'s veth pair (in the switch namespace)."""
    return f"psgd-p{node}"


def node_address(node: int) -> str:
    return f"{SUBNET_PREFIX}.{FIRST_HOST + node}"


def state_dir(override: str | None = None) -> str:
    return override or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR


@dataclass(frozen=True, slots=True)
class ClusterState:
    """What ``up`` built; enough for ``run``, ``status``, ``measure`` and ``down``."""

    # Identity
    name: str
    nodes: int
    # Shaping (tbf on each node's egress; also on the node's ingress when shape_ingress); bandwidth_bps None =
    # unshaped: the same namespaces and bridge with no tbf, so links run at veth speed (burst_bytes unused)
    bandwidth_bps: float | None
    burst_bytes: int
    queue_ms: float
    mtu: int
    shape_ingress: bool
    # Derived names and addresses (stored so other tools can read them without this package)
    switch_netns: str = ""
    node_netns: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    ifname: str = NODE_IFNAME
    created_at: float = 0.0
    # CPU cores each node's commands are pinned to (``cores.node_cores``); empty lists: not pinned
    node_cores: list[list[int]] = field(default_factory=list)

    def __post_init__(self):
        validate_name(self.name)
        if not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"nodes must be in 1..{MAX_NODES}, got {self.nodes}")
        if self.shaped and not (0 < self.bandwidth_bps < math.inf and self.burst_bytes > 0) \
                or not 0 < self.queue_ms < math.inf:  # (written so that NaN fails too)
            raise ValueError("bandwidth, burst and queue length must be positive and finite")
        if not 576 <= self.mtu <= 65535:
            raise ValueError(f"mtu must be in 576..65535, got {self.mtu}")
        # Fill the derived fields when they were not given (frozen: go through object.__setattr__).
        if not self.switch_netns:
            object.__setattr__(self, "switch_netns", switch_netns(self.name))
        if not self.node_netns:
            object.__setattr__(self, "node_netns", [node_netns(self.name, i) for i in range(self.nodes)])
        if not self.addresses:
            object.__setattr__(self, "addresses", [node_address(i) for i in range(self.nodes)])
        if not self.node_cores:
            object.__setattr__(self, "node_cores", [[] for _ in range(self.nodes)])
        if len(self.node_cores) != self.nodes:
            raise ValueError(f"node_cores has {len(self.node_cores)} entries for {self.nodes} nodes")

    @property
    def shaped(self) -> bool:
        """Whether links are shaped with tbf (False: an unshaped cluster, veth speed)."""
        return self.bandwidth_bps is not None

    @property
    def pinned(self) -> bool:
        """Whether each node runs on cores of its own (``up --cores-per-node``)."""
        return any(self.node_cores)

    @property
    def master_addr(self) -> str:
        return self.addresses[0]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ClusterState":
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def state_path(name: str, directory: str | None = None) -> str:
    return os.path.join(state_dir(directory), f"{validate_name(name)}.json")


def save_state(state: ClusterState, directory: str | None = None) -> str:
    """Write the state file atomically (temp file in the same directory, fsync, rename)."""
    path = state_path(state.name, directory)
    write_text_atomic(path, state.to_json() + "\n")
    return path


def load_state(name: str, directory: str | None = None) -> ClusterState | None:
    """The saved state, or None when there is no state file for ``name``."""
    try:
        with open(state_path(name, directory)) as f:
            return ClusterState.from_json(f.read())
    except FileNotFoundError:
        return None


def remove_state(name: str, directory: str | None = None) -> None:
    try:
        os.unlink(state_path(name, directory))
    except FileNotFoundError:
        pass
