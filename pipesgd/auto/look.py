"""``compression="auto"``'s early look (``pipesgd.auto``, module doc): from the wrapper's initial broadcast, the least
time the uncompressed gradient's bytes take (``transfer_floor_s``) and whether that is clearly slow beside the first
step's compute (``clearly_slow``), so a slow link's warm-up runs a provisional codec from step 0."""
from __future__ import annotations

import logging

from timing_model.recommend import codec_label

log = logging.getLogger("pipesgd")

SLOW_LOOK = 0.5  # the early look's "clearly slow": the bytes alone reach half the probing step's compute (clearly_slow)
BYTES_SHARE = 0.9  # the early look reads only a broadcast that is at least this much bytes (transfer_floor_s)


def transfer_floor_s(broadcast_s: float, latency_s: float, broadcast_bytes: int, grad_bytes: float,
                     nodes: int) -> float:
    """The least time the bytes of an uncompressed ring all-reduce of ``grad_bytes`` take, from the slowest rank's
    broadcast of ``broadcast_bytes`` in ``broadcast_s`` (``latency_s`` of it not bytes): at worst a broadcast sends to
    each peer in turn, so the ring's ``2(p-1)/p x G / B`` is at least ``2/p x G/M x`` the bytes' time. 0 unless the
    broadcast is mostly bytes (``BYTES_SHARE``). A floor, not an estimate (docs/auto.md, "The early look")."""
    bytes_s = broadcast_s - latency_s
    if nodes < 2 or broadcast_bytes <= 0 or bytes_s < BYTES_SHARE * broadcast_s:
        return 0.0
    return 2 / nodes * grad_bytes / broadcast_bytes * bytes_s


def clearly_slow(floor_s: float, compute_s: float) -> bool:
    """The early look's verdict: the uncompressed gradient's bytes take at least ``SLOW_LOOK`` times the probing step's
    compute (``floor_s``: ``transfer_floor_s``). Half, not all: that step's compute holds its first calls and may read
    far longer than a later step's; a first step inflated more only makes the look decline."""
    return floor_s >= SLOW_LOOK * compute_s > 0


def announce_provisional(provisional: dict, rank: int) -> None:
    if rank == 0 and provisional["compression"] != "none":
        log.info("PipeSGD auto: the warm-up goes on with %s (provisional; chosen at its end)",
                 codec_label(provisional["compression"], provisional["error_feedback"]))
