"""The life of one wrapper's ``width="auto"`` / ``compression="auto"``: ``AutoConfig`` times the warm-up's steps,
takes the early look and the provisional codec, chooses at the last warm-up step (``first_choice``, after ``probe``
when step 0 or 1 probed) and re-checks every N steps after (``recheck``). The steps, and why, are in docs/auto.md.
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from pipesgd.auto.allreduce_trial import MIN_STEPS, AllreduceTrial
from pipesgd.auto.clock import StepClock
from pipesgd.auto.cores import cores_reading
from pipesgd.auto.decision import (announce, codec_key, decide, describe, exchange_key, link_terms, run_key,
                                   uncompressed_hides)
from pipesgd.auto.hold import CONFIRM_STEPS, EARLY_HOLD_STEPS, held_against_width_1, held_steps
from pipesgd.auto.knobs import AUTO, CANDIDATES, MAX_WIDTH, SMALL_FRACTION, SWITCH_GAIN, Knobs
from pipesgd.auto.look import BYTES_SHARE, SLOW_LOOK, announce_provisional, clearly_slow, transfer_floor_s
from pipesgd.auto.probes import agreed, exchange_per_step, gradient as _gradient, measure, on_rank0
from pipesgd.grads.buckets import Bucket
from pipesgd.init_sync import Broadcast

__all__ = ["CHANGED", "PROVISIONAL_STEPS", "AutoConfig", "first_choice", "probe", "recheck"]

CHANGED = 1.5  # a re-check decides again only when compute or the exchange moved this much (either way)
PROVISIONAL_STEPS = 2  # a provisional codec needs at least this many warm-up steps left to time it
RAN = "warmup_run_"  # ``first_choice``: the warm-up's synchronous run among the measurements it agrees

log = logging.getLogger("pipesgd")


class AutoConfig:
    """A wrapper's ``width="auto"`` and/or ``compression="auto"``: times its steps, chooses at the last warm-up
    step and, with ``recheck_every``, again every that many steps (docs/auto.md)."""

    def __init__(self, buckets: list[Bucket], knobs: Knobs, warmup_steps: int, group: dist.ProcessGroup | None,
                 recheck_every: int = 0, codec_options: dict | None = None, trial_allreduce: bool = False,
                 initial: Broadcast | None = None) -> None:
        self._buckets, self.knobs, self._warmup, self._group = buckets, knobs, warmup_steps, group
        self._every, self._codec_options = recheck_every, dict(codec_options or {})
        self._trial_allreduce = trial_allreduce  # a provisional codec alternates the all-reduces (allreduce_trial)
        self._trial: AllreduceTrial | None = None
        on_cpu = _gradient(buckets)[2].type == "cpu"  # a GPU's compute leaves the cores idle: no cores' floor
        self.clock = StepClock(cores=cores_reading if on_cpu else lambda: None)
        self.choice: dict | None = None  # made, or restored from a checkpoint
        self._marks: list = []  # attach()'s hook
        self.provisional: dict | None = None  # the rest of the warm-up's codec once probed (docs/auto.md), or None
        self._initial = initial  # the wrapper's initial broadcast: the early look's link (begin)
        self._looked_at: int | None = None  # the step whose own exchange the early look gave the provisional codec
        self._holds: list[int] = []  # the steps whose end holds a chosen width against width 1 (docs/auto.md)

    def attach(self, model) -> list:
        """A forward pre-hook on ``model`` (a module) that marks where step 0's compute begins, so that a provisional
        codec can be chosen at step 0 (docs/auto.md); the handles, removed at step 0's end."""
        if not isinstance(model, torch.nn.Module) or not self._probes(0):
            return []
        self._marks = [model.register_forward_pre_hook(lambda *_: self.clock.forward())]
        return self._marks

    def _probes(self, step: int) -> bool:
        """Whether a provisional codec may be chosen at ``step``: the codec is free, nothing was probed yet (a resume
        may bring it), it is step 0 or 1, and ``PROVISIONAL_STEPS`` warm-up steps remain to time it."""
        return (self.knobs.compression is None and self.provisional is None and step <= 1
                and self._left_after(step) >= PROVISIONAL_STEPS)

    def _left_after(self, step: int) -> int:
        """Warm-up steps left after ``step`` (the provisional codec's, when it is the probed one)."""
        return self._warmup - 1 - step

    def restore(self, saved: dict) -> None:
        """A checkpoint's ``state_dict()["auto"]``: the choice, or the provisional codec of a warm-up saved midway."""
        if saved.get("provisional"):
            self.provisional = dict(saved)
        else:
            self.choice = dict(saved)

    @property
    def saved(self) -> dict | None:
        """What ``state_dict()["auto"]`` keeps: the choice, else the provisional codec, else None."""
        return self.choice if self.choice is not None else self.provisional

    def _timing(self, step: int) -> bool:
        if self.choice is None:
            return step < self._warmup
        return step >= self._warmup and (bool(self._every) or bool(self._holds))

    def begin(self, step: int) -> dict | None:
        """Before ``step()``'s work: at the probing step, the early look (docs/auto.md): the provisional codec for this
        step's own exchange when the initial broadcast says the link is clearly slow, else None (``end`` then probes
        from this step's uncompressed exchange)."""
        if not self._timing(step):
            return None
        self.clock.begin()
        if not (self._probes(step) and self.clock.gaps and self._initial is not None):
            return None
        numel, grad_bytes, device, dtype = _gradient(self._buckets)
        nodes = dist.get_world_size(self._group)
        initial = self._initial
        looked = agreed({"compute_s": self.clock.compute_s, "broadcast_s": initial.seconds,
                         "latency_s": initial.latency_s}, self._group, device)
        floor = transfer_floor_s(looked["broadcast_s"], looked["latency_s"], initial.nbytes, grad_bytes, nodes)
        if dist.get_rank(self._group) == 0:
            log.info("PipeSGD auto: early look at step %d: the initial broadcast took %.3g ms (%.3g ms of it latency): "
                     "the gradient's bytes take at least %.3g ms uncompressed; compute %.3g ms", step,
                     looked["broadcast_s"] * 1e3, looked["latency_s"] * 1e3, floor * 1e3, looked["compute_s"] * 1e3)
        if not clearly_slow(floor, looked["compute_s"]):  # from agreed numbers: the same answer on every rank
            return None
        measured = measure(numel, device, dtype, self._group, self.knobs.codecs_to_time())  # agreed by first_choice
        codec = self.knobs.fastest_codec()
        self.provisional = {"compression": codec[0], "error_feedback": codec[1], "provisional": True,
                            "measured": measured}
        if self._trial_allreduce and self._left_after(step) >= 2 * MIN_STEPS:  # from the next step on, as after a
            self._trial = AllreduceTrial()                                         # probe: this step's is a first call
            self.provisional["allreduce"] = self._trial.running
        self._looked_at = step
        announce_provisional(self.provisional, dist.get_rank(self._group))
        return self.provisional

    def switched(self) -> None:
        """The wrapper has switched to what ``end`` returned: that drain and rebuild are not compute either."""
        self.clock.skip()

    def end(self, step: int, comm_busy_s: float | None, wait_s: float = 0.0,
            optimizer_s: float | None = None) -> dict | None:
        """After ``step()``'s work (``comm_busy_s``: the applied exchange's time on the worker, None: nothing
        applied; ``wait_s``: what ``step()`` blocked on communication: that exchange and a blocking sync of the
        module buffers, which queues behind the exchange on a saturated link; ``optimizer_s``: the wrapped optimizer's
        ``step()`` when it ran, the look-ahead's price, ``Knobs.lookahead_s``). Returns a choice to run from the next
        step on (the wrapper drains what is in flight first): a provisional codec at the probe, the choice at the
        warm-up's last step, and a re-check's that switches."""
        if not self._timing(step):
            return None
        self.clock.end(comm_busy_s, wait_s, optimizer_s)
        for mark in self._marks:  # step 0's compute is timed: the hook's work is done
            mark.remove()
        self._marks = []
        if self.choice is None:
            if self._probes(step) and self.clock.gaps and self.clock.comm_busy:
                self.provisional = probe(self._buckets, self.knobs, self.clock, self._group)
                self.clock.skip()  # the probe's timings are not compute (they would count in step 1's gap)
                if self.provisional["compression"] == "none":
                    return None
                self.clock.comm_busy.clear()  # the last step's median: the provisional codec's exchanges alone
                if self._trial_allreduce and self._left_after(step) >= 2 * MIN_STEPS:  # else no verdict: the rule's
                    self._trial = AllreduceTrial()
                    self.provisional["allreduce"] = self._trial.running
                return self.provisional
            if step == self._looked_at:  # the look's step ran the codec: the trial's steps come after it
                return None
            if self._trial is not None and comm_busy_s is not None:
                self._trial.record(comm_busy_s)
            if step < self._warmup - 1:
                if self._trial is None:
                    return None
                self.provisional = {**self.provisional, "allreduce": self._trial.switch()}
                return self.provisional
            verdict = self._trial.verdict(self._group, _gradient(self._buckets)[2]) if self._trial else None
            if verdict is not None:  # the provisional codec's measured exchange: the faster all-reduce's alone
                self.clock.comm_busy = list(self._trial.times[verdict[0]])
            self.choice = first_choice(self._buckets, self.knobs, self.clock, self._group, self._codec_options,
                                       self.provisional, verdict)
            self.choice["step"] = step
            self._confirm_after(step)
            self.clock.reset()  # a re-check's window holds pipelined steps only
            return self.choice
        hold = bool(self._holds) and step >= self._holds[0]
        scheduled = bool(self._every) and (step + 1 - self._warmup) % self._every == 0
        if not (hold or scheduled) or not self.clock.comm_busy:
            return None
        if scheduled:  # a re-check of its own supersedes the hold
            self._holds = []
            new = recheck(self._buckets, self.knobs, self.choice, self.clock, self._group)
        else:
            final = len(self._holds) == 1
            self._holds.pop(0)
            new = held_against_width_1(self.choice, self.clock, self._group, _gradient(self._buckets)[2], final)
            if new is None and not final:  # held on: the same window, longer
                return None
            self._holds = []
        self.clock.reset()
        if new is not None:
            new["step"] = step
            if "allreduce" in self.choice and new["compression"] != "none":  # the warm-up's measured all-reduce
                new.setdefault("allreduce", self.choice["allreduce"])             # goes on with the next codec
            self.choice = new
        return new

    def _confirm_after(self, step: int) -> None:
        """A width chosen above 1 (by the warm-up's own choice, which then holds the warm-up's synchronous run,
        ``first_choice``): ``held_against_width_1`` holds the pipeline's measured iteration against it at the ends of
        ``held_steps`` (docs/auto.md)."""
        if self.knobs.width is None and self.choice["width"] > 1:
            self._holds = held_steps(step)


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
    # uncompressed probe its one step-0 sample, the last rank's, stands for the exchange instead (its wait is
    # start-up): with the ranks' own medians the fast links' warm-up chose bf16 or q8 in 3 of 4 runs (scratch).
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
    # its iteration alone: its exchange as an anchor would hold what the link leaves out (docs/auto.md, "Before")
    timed = {key: {k: v for k, v in run.items() if k != "comm_s"} for key, run in ran.items()}
    choice = (uncompressed_hides(measured, nodes, grad_bytes, knobs, timed) if measured_with == ("none", False)
              else None)
    if choice is None:
        if "small_allreduce_s" not in measured:  # measure()'s numbers win over the clock's (a test may give them all)
            options = codec_options if knobs.compression is not None else None  # they belong to a named codec
            measured.update(agreed(measure(numel, device, dtype, group, knobs.codecs_to_time(), options), group,
                                   device))
        choice = on_rank0(lambda: decide(measured, nodes, grad_bytes, knobs, measured_with, ran=timed), group,
                          device)
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
