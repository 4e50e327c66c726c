"""Measure achieved one-way TCP throughput between two nodes, to show that the shaping works
(docs/emulated-cluster.md, "measure"): Step 1, a receiver in the destination namespace says "ready"; Step 2, a
sender in the source namespace streams zeros; Step 3, the receiver's JSON line: the bytes after ``warmup_s`` over
their time."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from .netns import ClusterError, netns_exec
from .state import ClusterState

UNSHAPED_CAP_BPS = 100e9  # bytes bound of a measurement on unshaped links (veth is far slower on these hosts)

_RECEIVER = r"""
import json, socket, sys, time
addr, warmup_s = sys.argv[1], float(sys.argv[2])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addr, 0)); srv.listen(1); srv.settimeout(30)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept(); conn.settimeout(30)
buf = bytearray(1 << 20); total = 0; t_first = t_start = None; n_start = 0
while True:
    n = conn.recv_into(buf)
    if not n:
        break
    now = time.perf_counter(); total += n
    if t_first is None:
        t_first = now
    if t_start is None and now - t_first >= warmup_s:
        t_start, n_start = now, total
t_end = time.perf_counter()
steady_s = (t_end - t_start) if t_start else 0.0
print(json.dumps({"bytes": total, "elapsed_s": t_end - (t_first or t_end),
                  "steady_bytes": total - n_start, "steady_s": steady_s}), flush=True)
"""

_SENDER = r"""
import socket, sys, time
addr, port, duration_s, max_bytes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
s = socket.create_connection((addr, port), timeout=30)
chunk = bytes(1 << 16); sent = 0; t0 = time.perf_counter()
while sent < max_bytes and time.perf_counter() - t0 < duration_s:
    s.sendall(chunk); sent += len(chunk)
s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
"""


@dataclass(frozen=True, slots=True)
class Throughput:
    """One measurement, src → dst."""

    src: int
    dst: int
    n_bytes: int            # all bytes received
    steady_bytes: int       # bytes after the warm-up window
    steady_s: float         # time those took
    requested_bps: float | None  # the tbf rate; None on an unshaped cluster

    @property
    def measured_bps(self) -> float:
        return self.steady_bytes * 8.0 / self.steady_s if self.steady_s > 0 else 0.0

    @property
    def ratio(self) -> float | None:
        return None if self.requested_bps is None else self.measured_bps / self.requested_bps

    def summary(self) -> str:
        if self.requested_bps is None:
            return (f"node{self.src} -> node{self.dst}: {self.measured_bps / 1e6:.1f} Mbit/s measured on unshaped "
                    f"links, {self.n_bytes / 1e6:.1f} MB sent")
        return (f"node{self.src} -> node{self.dst}: {self.measured_bps / 1e6:.1f} Mbit/s measured vs "
                f"{self.requested_bps / 1e6:g} Mbit/s requested ({100 * self.ratio:.1f} %), "
                f"{self.n_bytes / 1e6:.1f} MB sent")


def measure_throughput(state: ClusterState, src: int = 0, dst: int = 1, duration_s: float = 2.0,
                       max_bytes: int | None = None, warmup_s: float = 0.3) -> Throughput:
    # Bound the bytes: half as much again as the link can carry in duration_s (plus one burst).
    for node in (src, dst):
        if not 0 <= node < state.nodes:
            raise ClusterError(f"node {node} does not exist in cluster {state.name} ({state.nodes} nodes)")
    if src == dst:
        raise ClusterError("measure needs two different nodes")
    if max_bytes is None:  # unshaped: bounded by duration_s alone (and ``UNSHAPED_CAP_BPS``)
        rate_bps = state.bandwidth_bps if state.shaped else UNSHAPED_CAP_BPS
        max_bytes = int(1.5 * rate_bps / 8 * duration_s) + state.burst_bytes
    timeout_s = 30 + 3 * duration_s
    # Step 1
    recv = subprocess.Popen(
        netns_exec(state.node_netns[dst], [sys.executable, "-c", _RECEIVER, state.addresses[dst], str(warmup_s)]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = recv.stdout.readline().strip()
        if not port.isdigit():
            raise ClusterError(f"throughput receiver failed to start: {recv.stderr.read().strip()[-300:]}")
        # Step 2
        send = subprocess.run(
            netns_exec(state.node_netns[src], [sys.executable, "-c", _SENDER, state.addresses[dst], port,
                                               str(duration_s), str(max_bytes)]),
            capture_output=True, text=True, timeout=timeout_s)
        if send.returncode != 0:
            raise ClusterError(f"throughput sender failed: {send.stderr.strip()[-300:]}")
        # Step 3
        out, errs = recv.communicate(timeout=timeout_s)
        if recv.returncode != 0 or not out.strip():
            raise ClusterError(f"throughput receiver failed: {errs.strip()[-300:]}")
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return Throughput(src, dst, result["bytes"], result["steady_bytes"], result["steady_s"],
                      state.bandwidth_bps)
