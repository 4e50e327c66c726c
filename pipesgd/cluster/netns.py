"""Thin wrappers over ``ip`` and ``tc``: preflight checks, namespaces, and killing what runs in them.

Every command is run without a shell; a failure raises ClusterError carrying the tool's own stderr line.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time


ETC_NETNS = "/etc/netns"


class ClusterError(RuntimeError):
    """A refusal or failure with a one-line, user-facing message (the CLI prints it without traceback)."""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one ip/tc command; on failure raise ClusterError with the command and its stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise ClusterError(f"`{' '.join(argv)}` failed: {err[-1] if err else f'exit {proc.returncode}'}")
    return proc


def preflight() -> None:
    """Refuse early, in one line, when this machine cannot host the cluster."""
    if os.geteuid() != 0:
        raise ClusterError("needs root (network namespaces and tc); run it as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ClusterError(f"`{tool}` not found; install iproute2")


def list_netns() -> list[str]:
    """Names of all network namespaces registered under /run/netns."""
    out = sh("ip", "netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _cluster_pattern(name: str) -> re.Pattern:
    # Exact pattern, so cluster "psgd" never matches cluster "psgd-x"'s namespaces.
    return re.compile(rf"^{re.escape(name)}-(sw|node\d+)$")


def cluster_netns(name: str) -> list[str]:
    """Namespaces that belong to cluster ``name``."""
    pattern = _cluster_pattern(name)
    return [ns for ns in list_netns() if pattern.match(ns)]


def stale_etc_dirs(name: str) -> list[str]:
    """/etc/netns entries of cluster ``name`` (normally removed together with their namespace)."""
    pattern = _cluster_pattern(name)
    try:
        return [d for d in os.listdir(ETC_NETNS) if pattern.match(d)]
    except FileNotFoundError:
        return []


def netns_pids(ns: str) -> list[int]:
    proc = sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def kill_netns_processes(ns: str, grace_s: float = 2.0) -> None:
    """SIGTERM every process living in ``ns`` (ours: the namespace is), then SIGKILL what remains."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and netns_pids(ns):
            time.sleep(0.05)


def delete_netns(ns: str) -> None:
    """Kill what runs inside, then delete; deleting a namespace also deletes the interfaces in it."""
    kill_netns_processes(ns)
    sh("ip", "netns", "delete", ns, check=False)
    shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)


def write_hosts(ns: str, hosts: dict[str, str]) -> None:
    """A per-namespace /etc/hosts (``ip netns exec`` bind-mounts /etc/netns/NS/hosts over /etc/hosts): gloo and c10d
    look up the peer's name for their log lines, and without an entry each connect waits on unreachable DNS and warns."""
    directory = os.path.join(ETC_NETNS, ns)
    os.makedirs(directory, exist_ok=True)
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", "::ffff:127.0.0.1 localhost"]
    lines += [f"{addr} {host}" for addr, host in hosts.items()]
    # c10d's TCPStore listens dual-stack, so peers appear as v4-mapped IPv6 addresses; glibc's files
    # backend only matches those when they are listed in that form.
    lines += [f"::ffff:{addr} {host}" for addr, host in hosts.items()]
    with open(os.path.join(directory, "hosts"), "w") as f:
        f.write("\n".join(lines) + "\n")


def netns_exec(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]
