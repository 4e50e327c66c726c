"""Link rates (``unshaped`` or a rate under ``timing_model.bandwidth``'s rule) and tbf burst sizing for the emulated
cluster."""
from __future__ import annotations

import re

from timing_model.bandwidth import parse_bandwidth_bps

# Kernel timer frequency assumed for the burst floor (CONFIG_HZ=250 here; tc(8) asks burst >= rate/HZ).
ASSUMED_HZ = 250
# Ethernet framing around an MTU-sized IP packet: header 14 + FCS 4 + preamble 8 + gap 12.
ETH_OVERHEAD_BYTES = 38
# GSO lets veth hand tbf packets of up to 64 KiB; a burst below that makes tbf re-segment every one.
GSO_MAX_BYTES = 65536

UNSHAPED = "unshaped"  # the link rate that means no tbf at all (``parse_link``)


def parse_link(text: str) -> float | None:
    """Bits per second (``timing_model.bandwidth.parse_bandwidth_bps``), or None for ``unshaped`` (the cluster's links
    then run at veth speed)."""
    return None if (text or "").strip().lower() == UNSHAPED else parse_bandwidth_bps(text)


def format_bandwidth(bandwidth_bps: float) -> str:
    """Human form in bit/s, e.g. ``1 Gbit/s``; used in status lines and reports."""
    for scale, name in ((1e12, "Tbit/s"), (1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bandwidth_bps >= scale:
            return f"{bandwidth_bps / scale:g} {name}"
    return f"{bandwidth_bps:g} bit/s"


def default_burst_bytes(bandwidth_bps: float, mtu: int = 1500) -> int:
    """tbf bucket size: the largest of one timer tick of traffic, 4 MTU frames and one GSO packet. Below ``rate/HZ`` tbf
    cannot reach its rate, below a few frames TCP stalls, below 64 KiB tbf re-segments veth's GSO packets; above, a
    larger bucket only lets more of a message leave at line rate (REFERENCES.md §3.4), so the floor is the choice."""
    per_tick = bandwidth_bps / 8.0 / ASSUMED_HZ
    frames = 4 * (mtu + ETH_OVERHEAD_BYTES)
    return int(max(per_tick, frames, GSO_MAX_BYTES))


_SIZE_RE = re.compile(r"^(?P<num>\d+(?:\.\d*)?)(?P<prefix>[kKmMgG]?)(?:i?[bB])?$")


def parse_size(text: str) -> int:
    """Parse a byte count for ``--burst``: ``65536``, ``64k``, ``64kb``, ``1mb`` (1024-based, as tc)."""
    m = _SIZE_RE.match((text or "").strip())
    if not m:
        raise ValueError(f"bad size {text!r}: expected bytes, e.g. 65536, 64kb or 1mb")
    value = int(float(m.group("num")) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group("prefix").lower()])
    if value <= 0:
        raise ValueError(f"bad size {text!r}: must be positive")
    return value
