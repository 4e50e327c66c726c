"""The parameter server as a host, beyond its links: the kernel's socket buffer under a reply, the queue of
requests at a server whose per-request service time calibrate measured, and the pace of an asynchronous job whose
co-located worker finishes first.

With the buffer at 0 and no service time the parameter-server modes are the core's equations
(``timing_model.core.equations.ps_server_link``, ``ps_async_iteration``). Symbol table (SI units):

====  ==================================================================================
M     gradient bytes                   k     parameter servers; m = M/k per server
B_s   server bandwidth (bytes/s)       S     bytes of a reply the kernel takes without waiting for the link
n     remote workers at the server     Z     a worker's think time between two requests (s)
s     the server's seconds per request R     a request's time at the server (queue + service)
T0    the co-located worker's step     T1, T2  a remote worker's step while it trains, and after
====  ==================================================================================
"""
from __future__ import annotations

from ..core import equations

__all__ = ["KERNEL_SEND_BUFFER_BYTES", "buffered_server_link", "closed_queue_response", "colocated_pace"]

# What a calibrated cluster's kernel takes of a reply at once: Linux's default tcp_wmem maximum, 4 MiB.
KERNEL_SEND_BUFFER_BYTES = 4 * 2**20


def buffered_server_link(flows: int, M: float, k: int, B_s: float, S: float) -> float:
    """The servers' link limit of ``equations.ps_server_link`` when the kernel takes S bytes of each reply at once
    (our reconstruction):

    T_link = flows·(m + max(0, m − S))/B_s,   m = M/k.

    Links are full duplex (pushes arrive on one direction while pulls leave on the other), so a remote update
    costs m of each direction; but the server serves one request at a time and waits for its reply to be sent
    before it receives the next: a reply of up to S bytes completes into the kernel's socket buffers at once, the
    rest (m − S) only as the link carries it, so a large model's updates take the link's outbound and inbound in
    turn. S = 0 gives the core's flows·2m/B_s exactly.
    """
    if S <= 0:
        return equations.ps_server_link(flows, M, k, B_s)
    if M <= 0 or flows <= 0:
        return 0.0
    m = M / k
    return flows * (m + max(0.0, m - S)) / B_s


def closed_queue_response(n: int, Z: float, s: float) -> float:
    """Mean time a request spends at one server (queue + service) when ``n`` workers each spend Z between two of
    their requests and the server takes s per request (mean-value analysis of a closed network; exact for
    exponential service times, our approximation for the parameter server):

    Q_0 = 0,   R_j = s·(1 + Q_{j−1}),   X_j = j/(Z + R_j),   Q_j = X_j·R_j   (j = 1..n),   R = R_n.

    n = 1 gives s (nobody to queue behind); Z = 0 gives n·s (the server saturated: one request per s).
    """
    if n < 1 or s <= 0:
        return 0.0
    queue = 0.0
    for j in range(1, n + 1):
        response = s * (1.0 + queue)
        queue = j * response / (Z + response)
    return response


def colocated_pace(T0: float, T1: float, T2: float) -> float:
    """Seconds per step of an asynchronous job whose co-located worker (on the server's machine, steps of T0)
    finishes before the remote workers (steps of T1 while it trains, T2 after), every worker running S steps:
    the job ends with the remote workers, after S·T0 + (S − S·T0/T1)·T2, so per step

    T = T0 + (1 − T0/T1)·T2   if T0 < T1,   else T1 (the co-located worker is not ahead).
    """
    if T1 <= 0 or T0 >= T1:
        return T1
    return T0 + (1.0 - T0 / T1) * T2
