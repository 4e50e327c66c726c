"""Build and tear down the emulated cluster: a bridge in a "switch" namespace, one namespace per node, tbf on each
node's link (docs/emulated-cluster.md, "Layout"). Steps of ``build`` (any failure rolls back everything made):
1. preflight (root, ip, tc); refuse an existing cluster unless ``force``;
2. the switch namespace and its bridge;
3. per node: namespace, loopback, veth pair switch↔node, address, link up;
4. tbf on each node's veth (egress) and bridge port (ingress) if asked; nothing for an unshaped cluster;
5. the state file, written atomically.
The host's own network namespace is never touched."""
from __future__ import annotations

import dataclasses
import os
import shutil
import time

from .cores import format_cores
from .units import default_burst_bytes
from .netns import (ETC_NETNS, ClusterError, cluster_netns, delete_netns, preflight, sh, stale_etc_dirs,
                    write_hosts)
from .state import (BRIDGE_IFNAME, ClusterState, load_state, port_ifname, remove_state, save_state,
                    validate_name)


def tbf_args(state: ClusterState) -> list[str]:
    """The tbf parameters shared by every shaped interface of the cluster."""
    return ["tbf", "rate", f"{int(state.bandwidth_bps)}bit", "burst", str(state.burst_bytes),
            "latency", f"{state.queue_ms:g}ms"]


def exists(name: str, directory: str | None = None) -> bool:
    return bool(cluster_netns(name)) or load_state(name, directory) is not None


def build(state: ClusterState, *, force: bool = False, directory: str | None = None) -> ClusterState:
    # Step 1
    preflight()
    if exists(state.name, directory):
        if not force:
            raise ClusterError(f"cluster {state.name!r} already exists; run `pipesgd-cluster down "
                               f"--name {state.name}` first, or pass --force to recreate it")
        teardown(state.name, directory)
    made: list[str] = []
    try:
        # Step 2
        sw = state.switch_netns
        made.append(sw)
        sh("ip", "netns", "add", sw)
        sh("ip", "-n", sw, "link", "set", "lo", "up")
        sh("ip", "-n", sw, "link", "add", BRIDGE_IFNAME, "type", "bridge", "forward_delay", "0")
        sh("ip", "-n", sw, "link", "set", BRIDGE_IFNAME, "up")
        # Step 3
        hosts = {addr: ns for ns, addr in zip(state.node_netns, state.addresses)}
        for i, (ns, addr) in enumerate(zip(state.node_netns, state.addresses)):
            made.append(ns)  # before creating: a half-made namespace (or its /etc/netns dir) is rolled back too
            sh("ip", "netns", "add", ns)
            port = port_ifname(i)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", state.ifname, "netns", ns)
            sh("ip", "-n", sw, "link", "set", port, "mtu", str(state.mtu), "master", BRIDGE_IFNAME, "up")
            sh("ip", "-n", ns, "link", "set", state.ifname, "mtu", str(state.mtu))
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", state.ifname)
            sh("ip", "-n", ns, "link", "set", state.ifname, "up")
            write_hosts(ns, hosts)
            # Step 4
            if state.shaped:
                _shape(ns, state.ifname, state)
                if state.shape_ingress:
                    _shape(sw, port, state)
        # Step 5
        state = dataclasses.replace(state, created_at=time.time())
        save_state(state, directory)
        return state
    except BaseException:  # including KeyboardInterrupt: never leave half a cluster behind
        for ns in reversed(made):
            delete_netns(ns)
        remove_state(state.name, directory)
        raise


def reshape(state: ClusterState, bandwidth_bps: float, directory: str | None = None) -> ClusterState:
    """Change every shaped link of a live cluster to ``bandwidth_bps`` (its burst scaled as ``up`` would set it),
    in place: what a link that changes under a running job looks like (``tc qdisc change``)."""
    if not state.shaped:
        raise ClusterError(f"cluster {state.name!r} has unshaped links; create it shaped to change their rate")
    new = dataclasses.replace(state, bandwidth_bps=float(bandwidth_bps),
                              burst_bytes=default_burst_bytes(bandwidth_bps, state.mtu))
    for i, ns in enumerate(state.node_netns):
        links = [(ns, state.ifname)] + ([(state.switch_netns, port_ifname(i))] if state.shape_ingress else [])
        for where, dev in links:
            sh("tc", "-n", where, "qdisc", "change", "dev", dev, "root", *tbf_args(new))
    save_state(new, directory)
    return new


def _shape(ns: str, dev: str, state: ClusterState) -> None:
    proc = sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *tbf_args(state), check=False)
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise ClusterError(f"tc tbf is not usable on this kernel ({err[-1] if err else 'unknown error'})")


def teardown(name: str, directory: str | None = None) -> list[str]:
    """Delete the cluster's namespaces (nodes first) and its state file; safe to call twice."""
    validate_name(name)
    preflight()
    found = cluster_netns(name)
    for ns in sorted(found, key=lambda n: n.endswith("-sw")):
        delete_netns(ns)
    for ns in stale_etc_dirs(name):  # left by a namespace deleted by other means
        shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)
    remove_state(name, directory)
    return found


def describe(state: ClusterState) -> str:
    """Multi-line status: one block per node with address and tbf counters (``tc -s qdisc``)."""
    from .units import format_bandwidth

    if state.shaped:
        direction = "both directions" if state.shape_ingress else "egress only"
        shaping = (f"{format_bandwidth(state.bandwidth_bps)} per link ({direction}), burst {state.burst_bytes} B, "
                   f"queue {state.queue_ms:g} ms")
    else:
        shaping = "unshaped links (veth speed)"
    lines = [f"cluster {state.name}: {state.nodes} node(s), {shaping}, mtu {state.mtu}, switch {state.switch_netns}"]
    present = set(cluster_netns(state.name))
    for i, (ns, addr) in enumerate(zip(state.node_netns, state.addresses)):
        if ns not in present:
            lines.append(f"  node {i}: {ns} MISSING")
            continue
        cores = f" cores {format_cores(state.node_cores[i])}" if state.node_cores[i] else ""
        lines.append(f"  node {i}: {ns} {addr} dev {state.ifname}{cores}")
        qdisc = sh("tc", "-n", ns, "-s", "qdisc", "show", "dev", state.ifname, check=False).stdout
        lines.extend("    egress  " + ln.strip() for ln in qdisc.splitlines() if ln.strip())
        if state.shaped and state.shape_ingress and state.switch_netns in present:
            qdisc = sh("tc", "-n", state.switch_netns, "-s", "qdisc", "show", "dev", port_ifname(i),
                       check=False).stdout
            lines.extend("    ingress " + ln.strip() for ln in qdisc.splitlines() if ln.strip())
    return "\n".join(lines)


def qdisc_sent_bytes(state: ClusterState, node: int) -> int:
    """Bytes the node's egress tbf has sent so far (to show traffic really went through the shaper)."""
    out = sh("tc", "-n", state.node_netns[node], "-s", "qdisc", "show", "dev", state.ifname).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts[:1] == ["Sent"]:
            return int(parts[1])
    raise ClusterError(f"no tbf counters on node {node}")
