"""A width chosen above 1 held against the synchronous warm-up it was chosen after, measured against measured, and
stopped as soon as the answer is known: a held width goes back to width 1 with the warm-up's codec. The rule, and
why early and why fastest against fastest: docs/auto.md, "Held against width 1"."""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipesgd.auto.clock import StepClock
from pipesgd.auto.decision import announce, describe
from pipesgd.auto.knobs import TRIAL_GAIN
from pipesgd.auto.probes import agreed
from timing_model.recommend import WIDER_GAIN

CONFIRM_STEPS = 6  # the pipelined steps (the first fills the pipeline) held against the warm-up's
EARLY_HOLD_STEPS = 3  # at the end of this one (two iterations measured) a pipeline may go back early


def held_steps(step: int) -> list[int]:
    """The steps at whose end a width chosen at ``step``'s end is held: once early, then in full. Only twice: each
    hold agrees in a blocking all-reduce, which waits behind the exchange in flight, so a hold at every step would
    make the pipeline it measures run as slowly as width 1."""
    return [step + EARLY_HOLD_STEPS, step + CONFIRM_STEPS]


def held_against_width_1(current: dict, clock: StepClock, group: dist.ProcessGroup | None,
                         device: torch.device, final: bool = True) -> dict | None:
    """Width 1 with the warm-up's codec (``warmup_run``), unless the pipelined steps since the choice ran ``WIDER_GAIN``
    faster per iteration than the warm-up's (agreed medians), else None; before the ``final`` hold, only where even
    their fastest iteration was not ``TRIAL_GAIN`` faster than the warm-up's fastest (None: hold on): early, only a
    pipeline that gains nothing worth a trial goes back, since the first pipelined iterations hold first calls and a
    wire-bound warm-up's fastest lies far under its median."""
    window = agreed({**clock.window(), "fastest_s": clock.fastest_s}, group, device)
    key, codec, feedback = warmup_run(current)
    warmup = current["ran"][key]
    bar = WIDER_GAIN if final else TRIAL_GAIN
    if final and window["period_s"] * bar <= warmup["period_s"]:
        return None
    if final:
        verdict = (f"its synchronous steps took {warmup['period_s'] * 1e3:.3g} ms per iteration, {describe(current)} "
                   f"{window['period_s'] * 1e3:.3g} ms since")
    else:
        reference = warmup.get("fastest_s", warmup["period_s"])
        if window["fastest_s"] * bar <= reference:
            return None
        verdict = (f"its fastest synchronous iteration took {reference * 1e3:.3g} ms, {describe(current)}'s fastest "
                   f"of {len(clock.iterations)} {window['fastest_s'] * 1e3:.3g} ms")
    choice = {"width": 1, "compression": codec, "error_feedback": feedback, "measured": dict(current["measured"]),
              "ran": dict(current["ran"]), "reason": (
                  f"held against the warm-up: {verdict} (compute {window['compute_s'] * 1e3:.3g} ms per step beside "
                  f"the exchange in flight), not {bar:g}x faster: a stale gradient costs steps")}
    announce(choice, dist.get_rank(group))
    return choice


def warmup_run(current: dict) -> tuple[str, str, bool]:
    """The synchronous warm-up's run in ``current["ran"]`` (``run_key``: "1:q8+ef"): its key, codec and feedback."""
    key = next(k for k in current["ran"] if k.startswith("1:"))
    codec = key.split(":", 1)[1]
    return key, codec.removesuffix("+ef"), codec.endswith("+ef")
