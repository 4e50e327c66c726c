"""How busy the cores this process may run on are (``pipesgd.auto``: the cores' floor under any iteration).

Why: pipelining hides the exchange behind the compute only where the cores have time to spare for both. Where
several ranks share a host's cores (an emulated cluster with more nodes than cores, or ``torchrun --nproc-per-node 4``
on a laptop) a synchronous step may already keep them busy; an exchange in flight then slows the compute beside it
instead of hiding, and the timing model, which does not see the cores, would choose a width that gains nothing
(experiments/results/auto_choice/report.md). The work per iteration is the same at any width, so no width runs an
iteration in less than the busy core-time the synchronous steps needed per iteration over the cores: their busy
share times their iteration (``StepClock.cores``).

Read from ``/proc/stat`` (Linux; elsewhere no floor applies) over the CPUs in this process's affinity mask; what
counts as busy, and a container's CPU quota: docs/auto.md, "The cores' floor".
"""
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
