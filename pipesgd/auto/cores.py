"""How busy the cores this process may run on are (``pipesgd.auto``: the cores' floor under any iteration).

Why: pipelining hides the exchange behind the compute only where the cores have time to spare for both. Where
several ranks share a host's cores (the emulated cluster's 4 nodes on 2 cores, or ``torchrun --nproc-per-node 4``
on a laptop) a synchronous step may already keep them busy; an exchange in flight then slows the compute beside it
instead of hiding (ResNet-20 at 100 Mbit/s on the 2-core emulated cluster: 54-58 ms per synchronous q4 iteration,
53-60 at width 2; the timing model, which does not see the cores, chose width 2 in 6 of 6 sittings, and the hold
sent it back after 3 stale steps). The work per iteration is the same at any width, so no width runs an iteration
in less than the busy core-time the synchronous steps needed per iteration over the cores: their busy share times
their iteration (``StepClock.cores``).

Read from ``/proc/stat`` (Linux; elsewhere nothing is read and no floor applies): every process's time on the CPUs
in this process's affinity mask, in clock ticks (10 ms), so a window of a few steps reads the share to a few per
cent. Counted as busy: user, nice, system, irq, softirq and steal (time the hypervisor gave elsewhere is not
available either); idle and iowait are not. A container limited by a CPU quota, not by an affinity mask, reads
its host's cores, so its share reads low and the floor binds less: the choice is then as without it.
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
