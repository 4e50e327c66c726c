"""Link rates as people write them for tc(8) and iperf, parsed by one rule for every command line. Torch-free.

The rule (``pipesgd-train``, ``pipesgd-timing`` and ``pipesgd-cluster`` all parse rates here):

- Bits: ``bit`` or ``bits`` (tc: ``100mbit``, ``1gbit``), ``b/s``, ``bit/s``, ``bits/sec`` (iperf: ``Mbits/sec``);
  ``GbE`` is the Ethernet line rate (``10GbE`` = ``10gbit``). Bytes: ``B``, ``B/s``, ``Bps``, ``byte/s``,
  ``bytes/sec`` (iperf: ``MBytes/sec``).
- Prefixes are decimal in any case, as in tc (``1gbit`` = ``1Gbit`` = 10^9 bit/s); ``Ki``, ``Mi``, ``Gi``, ``Ti``
  are binary (``500MiB/s``).
- Refused as ambiguous, with the two spellings that say it: a bare number (bits/s to tc and iperf, bytes/s to
  this project's timing model before this rule), ``bps`` with a lowercase b (``1gbps``: bytes/s to tc, bits/s to
  most people) and a lone ``b`` (``100mb``).
- Zero, negative, NaN and infinite rates are refused. Every refusal is a ``ValueError`` naming the input.
"""
from __future__ import annotations

import math
import re

__all__ = ["parse_bandwidth_bps", "parse_bandwidth_Bps"]

_RATE = re.compile(r"^\s*(?P<number>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*"
                   r"(?P<prefix>(?:[kKmMgGtT]i?)?)(?P<unit>[A-Za-z/]*)\s*$")
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_PER_SECOND = ("/sec", "/s")
_EXAMPLES = "e.g. 1gbit, 100Mbit/s, 10GbE, 1.25GB/s, 500MiB/s"


def _bits_per_unit(unit: str, text: str) -> int:
    """8 for a byte unit, 1 for a bit unit; ``ValueError`` for an ambiguous or unknown one."""
    if unit.endswith("bps"):
        raise ValueError(f"bandwidth {text!r} is ambiguous: tc reads bps as bytes/s, most people as bits/s; "
                         f"write bit (1gbit, 100Mbit/s) or B/s (125MB/s)")
    per_second = unit.endswith(_PER_SECOND) or unit.endswith("Bps")
    base = unit.removesuffix("ps") if unit.endswith("Bps") else next(
        (unit.removesuffix(tail) for tail in _PER_SECOND if unit.endswith(tail)), unit)
    if base.lower() in ("bit", "bits") or base == "bE" or (base == "b" and per_second):
        return 1
    if base == "B" or base.lower() in ("byte", "bytes"):
        return 8
    if base == "b":
        raise ValueError(f"bandwidth {text!r} is ambiguous: write bit (100mbit) or B/s (100MB/s)")
    raise ValueError(f"bandwidth {text!r}: unknown unit {unit!r} ({_EXAMPLES})")


def parse_bandwidth_bps(text: str) -> float:
    """Bits per second from a rate such as ``1gbit``, ``100Mbit/s``, ``10GbE``, ``1.25GB/s`` (the module's rule)."""
    match = _RATE.match(str(text))
    if not match:
        raise ValueError(f"bandwidth {text!r}: not a number with a unit ({_EXAMPLES})")
    number, prefix, unit = match.group("number", "prefix", "unit")
    if not unit:
        spelled = f"{number}{prefix}"
        raise ValueError(f"bandwidth {text!r} has no unit: write bits ({spelled}bit) or bytes ({spelled}B/s)")
    value = float(number) * _PREFIX[prefix.lower()] * _bits_per_unit(unit, text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"bandwidth {text!r}: must be positive and finite")
    return value


def parse_bandwidth_Bps(text: str) -> float:
    """Bytes per second: ``parse_bandwidth_bps`` / 8 (exact in floating point)."""
    return parse_bandwidth_bps(text) / 8.0
