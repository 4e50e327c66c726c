"""The chooser of one wrapper's ``width="auto"`` / ``compression="auto"`` (``AutoConfig``): when, over the wrapper's
steps, it times, takes the early look and the provisional codec, chooses at the last warm-up step, holds a width
against width 1 and re-checks every N steps after. The decisions it runs are in ``pipesgd.auto.choices``; the steps,
and why, in docs/auto.md.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipesgd.auto.allreduce_trial import MIN_STEPS, AllreduceTrial
from pipesgd.auto.choices import early_look, first_choice, probe, recheck
from pipesgd.auto.clock import StepClock
from pipesgd.auto.cores import cores_reading
from pipesgd.auto.hold import held_against_width_1, held_steps
from pipesgd.auto.knobs import Knobs
from pipesgd.auto.look import announce_provisional
from pipesgd.auto.probes import gradient as _gradient
from pipesgd.grads.buckets import Bucket
from pipesgd.init_sync import Broadcast

__all__ = ["PROVISIONAL_STEPS", "HOLDING", "AutoConfig"]

PROVISIONAL_STEPS = 2  # a provisional codec needs at least this many warm-up steps left to time it
HOLDING = "holding"  # a saved choice's mark: saved before its hold against width 1 ended


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
        self._hold_on_resume = False  # a checkpoint saved before its hold ended: hold again from the resumed step

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
        """A checkpoint's ``state_dict()["auto"]``: the choice, or the provisional codec of a warm-up saved midway. A
        choice saved while it was held is held again over the resumed steps: the steps it was measured on are gone."""
        if saved.get("provisional"):
            self.provisional = dict(saved)
            return
        self.choice = {key: value for key, value in saved.items() if key != HOLDING}
        self._hold_on_resume = bool(saved.get(HOLDING)) and self.knobs.width is None

    @property
    def saved(self) -> dict | None:
        """What ``state_dict()["auto"]`` keeps: the choice (marked ``HOLDING`` while held against width 1), else the
        provisional codec, else None."""
        if self.choice is None:
            return self.provisional
        return {**self.choice, HOLDING: True} if self._holds or self._hold_on_resume else self.choice

    def _timing(self, step: int) -> bool:
        if self.choice is None:
            return step < self._warmup
        return step >= self._warmup and (bool(self._every) or bool(self._holds))

    def begin(self, step: int) -> dict | None:
        """Before ``step()``'s work: at the probing step, the early look (docs/auto.md): the provisional codec for this
        step's own exchange when the initial broadcast says the link is clearly slow, else None (``end`` then probes
        from this step's uncompressed exchange)."""
        if self._hold_on_resume:  # the resumed steps are held as the steps after the choice were
            self._holds, self._hold_on_resume = held_steps(step - 1), False
        if not self._timing(step):
            return None
        self.clock.begin()
        if not (self._probes(step) and self.clock.gaps and self._initial is not None):
            return None
        self.provisional = early_look(self._buckets, self.knobs, self.clock, self._group, self._initial, step)
        if self.provisional is None:
            return None
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
        """After ``step()``'s work (``comm_busy_s``: the applied exchange's time on the worker, None if nothing applied;
        ``wait_s``: what ``step()`` blocked on communication; ``optimizer_s``: the wrapped optimizer's step, the
        look-ahead's price). Returns a choice to run from the next step on (the wrapper drains what is in flight first):
        a provisional codec at the probe, the warm-up's choice at its last step, a re-check's that switches."""
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
