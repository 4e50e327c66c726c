"""Parse quantities as people write them (``10gbit``, ``1.25GB/s``, ``50us``, ``61M``, ``4KiB``) into SI units.

Conventions (everything inside the timing model is seconds, bytes and bytes per second):

- Decimal prefixes are powers of ten: ``MB`` = 10^6 bytes, ``Gbit`` = 10^9 bits. Binary prefixes are
  spelled with an ``i``: ``KiB`` = 1024, ``MiB`` = 2^20, ``GiB`` = 2^30 bytes.
- Bandwidths follow the one rule of ``timing_model.bandwidth`` (shared with ``pipesgd-cluster``): ``10gbit`` =
  ``10Gb/s`` = ``10GbE`` = 1.25e9 B/s, ``1.25GB/s`` = 1.25e9 B/s; a bare number, ``bps`` and a lone ``b`` are
  refused as ambiguous. ``parse_bandwidth`` returns bytes per second.
- A bare number is seconds for a time and bytes for a size, unless the caller asks for a unit (``require_unit``,
  as every command line does: only ``0`` goes without); a count needs none.
- Counts (parameters) take ``K``, ``M``, ``G`` or ``B`` (billion), ``T``: ``61M`` = 61·10^6.
- Zero, negative, NaN or infinite values and unknown units raise ``ValueError`` naming the input.
"""
from __future__ import annotations

import math
import re

from timing_model.bandwidth import parse_bandwidth_Bps as parse_bandwidth  # bytes/s, the model's unit

__all__ = [
    "parse_bandwidth",
    "parse_time",
    "parse_bytes",
    "parse_count",
    "parse_fraction",
    "parse_size_range",
    "parse_list",
    "format_number",
    "format_time",
    "format_bytes",
    "format_bandwidth",
]

_NUMBER = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$")
_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_TIME = {
    "": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "usec": 1e-6, "ns": 1e-9,
    "min": 60.0, "h": 3600.0,
}
_COUNT = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}


def _split(text: str, what: str) -> tuple[float, str]:
    """Split ``'1.25GB/s'`` into ``(1.25, 'GB/s')``; reject non-numbers."""
    if not isinstance(text, str):
        text = str(text)
    match = _NUMBER.match(text)
    if not match:
        raise ValueError(f"{what} {text!r}: not a number with an optional unit")
    value = float(match.group(1))
    if not math.isfinite(value):
        raise ValueError(f"{what} {text!r}: must be finite")
    return value, match.group(2)


def _positive(value: float, text: str, what: str, allow_zero: bool = False) -> float:
    if value < 0 or (value == 0 and not allow_zero) or not math.isfinite(value):
        bound = "zero or positive" if allow_zero else "positive"
        raise ValueError(f"{what} {text!r}: must be {bound}")
    return value


def _prefix_scale(prefix: str, text: str, what: str) -> float:
    low = prefix.lower()
    if low in _BINARY:
        return _BINARY[low]
    if low in _DECIMAL:
        return _DECIMAL[low]
    raise ValueError(f"{what} {text!r}: unknown unit prefix {prefix!r}")


def _unit_given(value: float, unit: str, text: str, what: str, examples: tuple[str, str]) -> None:
    """Refuse a bare non-zero number, suggesting ``examples`` (units) for it."""
    if not unit and value != 0:
        number = str(text).strip()
        raise ValueError(f"{what} {number!r}: give a unit, e.g. {number}{examples[0]} or {number}{examples[1]}")


def parse_time(text: str, allow_zero: bool = True, require_unit: bool = False) -> float:
    """Seconds from ``50us``, ``2ms``, ``0.12s``, ``120 ms`` or a bare number of seconds (refused, but for ``0``,
    with ``require_unit``)."""
    what = "time"
    value, unit = _split(text, what)
    if require_unit:
        _unit_given(value, unit, text, what, ("ms", "s"))
    scale = _TIME.get(unit, _TIME.get(unit.lower()))
    if scale is None:
        raise ValueError(f"{what} {text!r}: unknown unit {unit!r} (use s, ms, us or ns)")
    return _positive(value * scale, text, what, allow_zero=allow_zero)


def parse_bytes(text: str, allow_zero: bool = False, require_unit: bool = False) -> float:
    """Bytes from ``100MB`` (10^8), ``4KiB`` (4096), ``25M`` (25·10^6), ``1.5GiB`` or a bare number (refused, but
    for ``0``, with ``require_unit``)."""
    what = "size"
    value, unit = _split(text, what)
    if require_unit:
        _unit_given(value, unit, text, what, ("MB", "B"))
    match = re.fullmatch(r"([kKmMgGtTpP]i?|)(B|bytes?|)", unit)
    if not match:
        raise ValueError(f"{what} {text!r}: unknown unit {unit!r} (use e.g. 100MB, 4KiB, 1GiB)")
    scale = _prefix_scale(match.group(1), text, what)
    return _positive(value * scale, text, what, allow_zero=allow_zero)


def parse_count(text: str) -> int:
    """An integer count from ``61M``, ``25M``, ``1.5B`` (billion), ``4k`` or a bare integer."""
    what = "count"
    value, unit = _split(text, what)
    scale = _COUNT.get(unit.lower()) if len(unit) <= 1 else None
    if scale is None:
        raise ValueError(f"{what} {text!r}: unknown suffix {unit!r} (use K, M, G/B or T)")
    return int(round(_positive(value * scale, text, what)))


def parse_fraction(text: str, what: str = "fraction", upper: float | None = 1.0) -> float:
    """A number in [0, upper] from ``0.5`` or ``50%``."""
    value, unit = _split(text, what)
    if unit == "%":
        value /= 100.0
    elif unit:
        raise ValueError(f"{what} {text!r}: unknown unit {unit!r} (use a number or a percentage)")
    if value < 0 or (upper is not None and value > upper):
        raise ValueError(f"{what} {text!r}: must lie in [0, {upper}]" if upper is not None else f"{what} {text!r}: must be >= 0")
    return value


# How far a LOW:HIGH bound may lie from its power of two: a decimal prefix drifts further the larger it is
# (``1TB`` is ``0.91 TiB``), and this share admits every prefix up to T while refusing a bound between powers.
POWER_OF_TWO_SLACK = 0.10


def parse_size_range(text: str, require_unit: bool = False) -> list[int]:
    """Powers of two from ``'4KB:64MB'``: each bound is a power of two, or a decimal-prefixed size within
    ``POWER_OF_TWO_SLACK`` of one (4KB → 4096, 64MB → 2^26); a bound further off (``10:14``, meaning 8 to 16
    bytes) is refused, not rounded."""
    if ":" not in text:
        return [int(parse_bytes(part, require_unit=require_unit)) for part in parse_list(text)]
    exponents = []
    for bound in text.split(":", 1):
        n_bytes = parse_bytes(bound, require_unit=require_unit)
        k = round(math.log2(n_bytes))
        if abs(n_bytes / 2**k - 1) > POWER_OF_TWO_SLACK:
            below, above = 2 ** math.floor(math.log2(n_bytes)), 2 ** math.ceil(math.log2(n_bytes))
            raise ValueError(f"size range {text!r}: {bound.strip()!r} is {n_bytes:.0f} bytes, not a power of two "
                             f"(nearest: {below} or {above}); the bounds are bytes, e.g. 4KB:64MB or 1KiB:16KiB")
        exponents.append(k)
    low, high = exponents
    if high < low:
        raise ValueError(f"size range {text!r}: upper bound below lower bound")
    return [2**k for k in range(low, high + 1)]


def parse_list(text: str) -> list[str]:
    """``'2,4,8'`` → ``['2', '4', '8']``; empty items are an error."""
    items = [item.strip() for item in str(text).split(",")]
    if not items or any(not item for item in items):
        raise ValueError(f"list {text!r}: empty item (write e.g. 2,4,8)")
    return items


def format_number(value: float, digits: int = 4) -> str:
    """``digits`` significant digits in plain decimals, never e-notation: ``90180.4`` → ``'90180'``,
    ``0.0125`` → ``'0.0125'``, ``2.0`` → ``'2'``."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


# a time's unit by its size: ms up to 10 s (steps compare best in one unit), then s, min and h
_TIME_UNITS = ((36000.0, 3600.0, "h"), (600.0, 60.0, "min"), (10.0, 1.0, "s"), (1e-3, 1e-3, "ms"),
               (1e-6, 1e-6, "us"))


def format_time(seconds: float, digits: int = 4, like: float | None = None) -> str:
    """``0.12`` → ``'120 ms'``, ``90.18`` → ``'90.18 s'``, ``5e-5`` → ``'50 us'``, ``0`` → ``'0'``; with ``like``,
    in the unit ``like`` would take (one unit down a table's column)."""
    if seconds == 0 or not math.isfinite(seconds):
        return "0" if seconds == 0 else str(seconds)
    size = abs(seconds if like is None or like == 0 or not math.isfinite(like) else like)
    for above, scale, unit in _TIME_UNITS:
        if size >= above:
            return f"{format_number(seconds / scale, digits)} {unit}"
    return f"{format_number(seconds / 1e-9, digits)} ns"


def format_bytes(n_bytes: float) -> str:
    """``1e8`` → ``'100 MB'`` (decimal)."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.4g} {unit}"
    return f"{n_bytes:.4g} B"


def format_bandwidth(bytes_per_s: float) -> str:
    """``1.25e9`` → ``'10 Gbit/s'``."""
    bits = bytes_per_s * 8
    for scale, unit in ((1e12, "Tbit/s"), (1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if abs(bits) >= scale:
            return f"{bits / scale:.4g} {unit}"
    return f"{bits:.4g} bit/s"
