"""How busy the cores this process may run on are (``pipesgd.auto``: the cores' floor under any iteration).

Pipelining hides the exchange only where the cores have time to spare: where ranks share a host's cores an exchange
in flight slows the compute beside it, which the timing model does not see. The work per iteration is the same at
any width, so no width runs an iteration in less than the synchronous steps' busy core-time (``StepClock.cores``).
Read from ``/proc/stat`` over this process's affinity mask: docs/auto.md, "The cores' floor"."""
from __future__ import annotations

import os

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (guest time is inside user already)
ALL_FIELDS = 8  # ... with idle (3) and iowait (4): the CPU's whole time


def cores_reading(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy ticks, all ticks) summed over the CPUs this process may run on since boot; None where unreadable."""
    try:
        allowed = {f"cpu{n}" for n in os.sched_getaffinity(0)}
        with open(path, encoding="ascii") as stat:
            lines = [line.split() for line in stat if line.startswith("cpu")]
    except (OSError, AttributeError, ValueError):  # no /proc (macOS, Windows) or no sched_getaffinity
        return None
    busy = total = 0
    for fields in lines:
        if fields[0] in allowed and len(fields) > ALL_FIELDS:
            ticks = [int(value) for value in fields[1:ALL_FIELDS + 1]]
            busy, total = busy + sum(ticks[i] for i in BUSY_FIELDS), total + sum(ticks)
    return (busy, total) if total > 0 else None
