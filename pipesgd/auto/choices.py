"""The decisions ``AutoConfig`` runs (``pipesgd.auto.config``): the early look at a slow link (``early_look``), the
probe at step 0 or 1 (``probe``), the warm-up's choice (``first_choice``) and a re-check's (``recheck``). The steps,
and why, are in docs/auto.md.
"""
from __future__ import annotations

import logging

import torch.distributed as dist

from pipesgd.auto.allreduce_trial import AllreduceTrial
from pipesgd.auto.clock import StepClock
from pipesgd.auto.decision import announce, decide, exchange_key, run_key, uncompressed_hides
from pipesgd.auto.knobs import SWITCH_GAIN, TRIAL_GAIN, Knobs
from pipesgd.auto.look import announce_provisional, clearly_slow, transfer_floor_s
from pipesgd.auto.probes import agreed, exchange_per_step, gradient as _gradient, measure, on_rank0
from pipesgd.grads.buckets import Bucket
from pipesgd.init_sync import Broadcast

__all__ = ["CHANGED", "early_look", "first_choice", "probe", "recheck"]

CHANGED = 1.5  # a re-check decides again only when compute or the exchange moved this much (either way)
RAN = "warmup_run_"  # ``first_choice``: the warm-up's synchronous run among the measurements it agrees

log = logging.getLogger("pipesgd")


def early_look(buckets: list[Bucket], knobs: Knobs, clock: StepClock, group: dist.ProcessGroup | None,
               initial: Broadcast, step: int) -> dict | None:
    """Before ``step``'s exchange: the provisional codec for it when the initial broadcast says the link is clearly
    slow beside the compute timed so far ({"compression", "error_feedback", "provisional", "measured": Step 2's
    numbers on this rank, agreed by ``first_choice``}), else None (docs/auto.md, "The early look")."""
    numel, grad_bytes, device, dtype = _gradient(buckets)
    nodes = dist.get_world_size(group)
    looked = agreed({"compute_s": clock.compute_s, "broadcast_s": initial.seconds,
                     "latency_s": initial.latency_s}, group, device)
    floor = transfer_floor_s(looked["broadcast_s"], looked["latency_s"], initial.nbytes, grad_bytes, nodes)
    if dist.get_rank(group) == 0:
        log.info("PipeSGD auto: early look at step %d: the initial broadcast took %.3g ms (%.3g ms of it latency): "
                 "the gradient's bytes take at least %.3g ms uncompressed; compute %.3g ms", step,
                 looked["broadcast_s"] * 1e3, looked["latency_s"] * 1e3, floor * 1e3, looked["compute_s"] * 1e3)
    if not clearly_slow(floor, looked["compute_s"]):  # from agreed numbers: the same answer on every rank
        return None
    measured = measure(numel, device, dtype, group, knobs.codecs_to_time())
    codec = knobs.fastest_codec()
    return {"compression": codec[0], "error_feedback": codec[1], "provisional": True, "measured": measured}


def first_choice(buckets: list[Bucket], knobs: Knobs, clock: StepClock, group: dist.ProcessGroup | None,
                 codec_options: dict | None = None, provisional: dict | None = None,
                 allreduce: tuple[str, dict[str, float]] | None = None) -> dict:
    """Steps 2 and 3 at the last warm-up step (step 2's numbers from ``probe`` when it ran: ``provisional``, with
    the uncompressed exchange it saw; the exchanges since, with its codec, count as that codec's measured time,
    ``decision._predictor``; ``allreduce``: the trial's verdict on them, kept when the choice keeps that codec);
    logs the choice once (on rank 0)."""
    numel, grad_bytes, device, dtype = _gradient(buckets)
    nodes = dist.get_world_size(group)
    # Each rank's own exchange times here, waits for its peers included: a pipelined exchange also waits for the
    # last rank to hand its gradient off, and that whole time must hide behind the rank's compute. After an
    # uncompressed probe its one step-0 sample, the last rank's, stands for the exchange instead: at step 0 the wait
    # is start-up, and the ranks' own times would make a fast link look slow enough to need a codec.
    measured_with = knobs.measured_with()
    links = dict(provisional["measured"]) if provisional is not None else {}  # the probe's win over the clock's
    if provisional is not None and provisional["compression"] != "none":  # the link as its codec's exchanges found it
        measured_with = (provisional["compression"], bool(provisional["error_feedback"]))
        if "comm_s" in links:  # step 0's, uncompressed: none's own time (none ran when the early look chose)
            links[exchange_key("none", False)] = links.pop("comm_s")
    # The warm-up's synchronous steps ran width 1 with its codec (none, the user's or the provisional one): they
    # count as measured (``StepClock.synchronous``), agreed with the rest in one all-reduce.
    synchronous = clock.synchronous()
    measured = agreed({"compute_s": clock.compute_s, "update_s": clock.update_s, "comm_s": clock.comm_s,
                       "lookahead_s": knobs.lookahead_s(clock.optimizer_s), **clock.spreads(), **links,
                       **clock.cores(synchronous["period_s"]), **{RAN + k: v for k, v in synchronous.items()}},
                      group, device)
    ran = {run_key(1, *measured_with): {k: measured.pop(RAN + k) for k in synchronous}}
    # its iteration alone: its exchange as an anchor would hold what the link leaves out, such as the codec's share
    # of cores the ranks share, and make the codecs not measured look better than they run
    timed = {key: {k: v for k, v in run.items() if k != "comm_s"} for key, run in ran.items()}
    # a wider pipeline is tried on a smaller predicted gain than a re-check's, since the hold measures it
    choice = (uncompressed_hides(measured, nodes, grad_bytes, knobs, timed, TRIAL_GAIN)
              if measured_with == ("none", False) else None)
    if choice is None:
        if "small_allreduce_s" not in measured:  # measure()'s numbers win over the clock's (a test may give them all)
            options = codec_options if knobs.compression is not None else None  # they belong to a named codec
            measured.update(agreed(measure(numel, device, dtype, group, knobs.codecs_to_time(), options), group,
                                   device))
        choice = on_rank0(lambda: decide(measured, nodes, grad_bytes, knobs, measured_with, ran=timed,
                                         wider_gain=TRIAL_GAIN), group, device)
    if knobs.width is None and choice["width"] > 1:  # held against the warm-up (``_confirm_after``)
        choice["ran"] = ran
    if allreduce is not None and choice["compression"] != "none" and all(
            choice[k] == provisional[k] for k in ("compression", "error_feedback")):
        choice["allreduce"] = allreduce[0]
        choice["reason"] += "; " + AllreduceTrial.reason(*allreduce)
    announce(choice, dist.get_rank(group))
    return choice


def probe(buckets: list[Bucket], knobs: Knobs, clock: StepClock, group: dist.ProcessGroup | None) -> dict:
    """Steps 2 and 3 early, at step 0 or 1, from its uncompressed exchange (docs/auto.md): the codec the rest of the
    warm-up runs with ({"compression", "error_feedback", "provisional", "measured": step 2's numbers and that
    exchange, or that exchange alone where it hides, ``uncompressed_hides``}): "none" when the early decision needs
    no codec, else the most compressed one the choice may take (``Knobs.fastest_codec``)."""
    numel, grad_bytes, device, dtype = _gradient(buckets)
    exchange = exchange_per_step(clock, group, device).comm_busy[-1]
    seen = agreed({"compute_s": clock.compute_s, "comm_s": exchange}, group, device)
    if uncompressed_hides(seen, dist.get_world_size(group), grad_bytes, knobs) is not None:  # nothing to time
        return {"compression": "none", "error_feedback": False, "provisional": True,
                "measured": {"comm_s": seen["comm_s"]}}
    raw = agreed(measure(numel, device, dtype, group, knobs.codecs_to_time()), group, device)
    measured = {**seen, **raw}
    links = {name: measured[name] for name in ("comm_s", *raw)}
    guess = on_rank0(lambda: decide(measured, dist.get_world_size(group), grad_bytes, knobs), group, device)
    codec = ("none", False) if guess["compression"] == "none" else knobs.fastest_codec()
    provisional = {"compression": codec[0], "error_feedback": codec[1], "provisional": True, "measured": links}
    announce_provisional(provisional, dist.get_rank(group))
    return provisional


def recheck(buckets: list[Bucket], knobs: Knobs, current: dict, clock: StepClock,
            group: dist.ProcessGroup | None) -> dict | None:
    """The re-check: the last window's times (agreed) with the warm-up's latency and codec speeds; a new choice when
    it switches (docs/auto.md), else None. It decides only in a running configuration's first window or when a
    window moved ``CHANGED``-fold from that configuration's reference (its first window). What each configuration
    measured while it ran (``current["ran"]``, updated in place) stands in for the model's prediction of it."""
    numel, grad_bytes, device, dtype = _gradient(buckets)
    window = agreed(clock.window(), group, device)
    running = (current["compression"], bool(current["error_feedback"]))
    now = (current.get("width"), *running)
    key, ran = run_key(*now), current.setdefault("ran", {})
    reference = current.get("reference") or ({**window, "comm_s": ran[key]["comm_s"]} if key in ran else None)
    if reference is not None and not _moved(window, reference):
        current["reference"] = reference
        return None
    if reference is not None:  # the cluster moved: what the other configurations measured was of another cluster
        for other in [k for k in ran if k != key]:
            del ran[other]
    current["reference"], ran[key] = window, {k: window[k] for k in ("comm_s", "period_s", "wait_s")}
    if "small_allreduce_s" not in current["measured"]:  # a warm-up that needed no codec timed none (uncompressed_hides)
        current["measured"].update(agreed(measure(numel, device, dtype, group, knobs.codecs_to_time()), group, device))
    # the warm-up's exchange times (step 0's uncompressed one) may be of another cluster: what ran since is in ``ran``
    warmup = {k: v for k, v in current["measured"].items() if not k.endswith("_exchange_s")}
    measured = {**warmup, **{k: window[k] for k in ("compute_s", "update_s", "comm_s", "cores_busy", "cores_floor_s")},
                "lookahead_s": knobs.lookahead_s(window["optimizer_s"])}
    nodes = dist.get_world_size(group)
    choice = on_rank0(lambda: decide(measured, nodes, grad_bytes, knobs, running, now=now, ran=ran), group, device)
    if choice is None:
        return None
    choice["reason"], choice["ran"] = f"re-check: {choice['reason']}", dict(ran)
    announce(choice, dist.get_rank(group))
    return choice


def _moved(window: dict[str, float], reference: dict[str, float]) -> bool:
    """A window's compute or exchange time ``CHANGED``-fold (either way) from the reference's, by a margin that could
    pay for a switch (at least ``SWITCH_GAIN`` - 1 of the iteration: a change that small is a
    host's noise, not a cluster that changed)."""
    floor = (SWITCH_GAIN - 1) * max(window.get("period_s", 0.0), reference.get("period_s", 0.0))
    return any(max(window[k], reference[k]) > CHANGED * max(min(window[k], reference[k]), 1e-9)
               and abs(window[k] - reference[k]) >= floor for k in ("compute_s", "comm_s"))
