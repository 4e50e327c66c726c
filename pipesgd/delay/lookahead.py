"""Local look-ahead: staleness compensation for a pipeline of width K >= 2 (``staleness="lookahead"``, the default).

Why: under a delayed update the gradient applied at step t was computed at weights K-1 updates old. With momentum
0.9 that shrinks the stable range of lr x curvature from 3.8 (synchronous) to 0.10 (one step late), and plain
width 2 lost 21-27 accuracy points in the README's study. What: before its forward pass each rank moves to the
weights that the K-1 updates still in flight will produce, computed with the wrapped optimizer's own rule
(``pipesgd.delay.replay``) and with its own local gradients of those steps standing in for the averages it has not
received yet (it holds them already, so nothing waits). The gradient computed there is exchanged as usual and
the averaged, delayed gradient is applied to the master weights, which, with the optimizer's state, stay bitwise
identical on every rank. At world size 1 the stand-in is the average itself: look-ahead at width K is then
synchronous SGD, the same losses bit for bit, with a constant learning rate. (Under a scheduler every delayed
update, with or without look-ahead, is applied with the learning rate of the step that applies it, K-1 steps of
schedule later than synchronous SGD would; the replay uses the rate the next ``step()`` applies with, which is
the current one once the scheduler has stepped, for all K-1 pending updates: later rates are not known yet.)

When the parameters hold the look-ahead weights: from the first forward pass with gradients enabled after a
``step()`` (a forward pre-hook on the model; ``torch.no_grad()`` evaluation sees the master weights) until the
next ``step()``, which restores the master weights before it applies anything. Given a list of parameters
instead of a model there is no hook: ``step()`` moves them at its end. Memory: one copy of the weights (the
master's, while the look-ahead ones are in the parameters), the local gradients of the K-1 steps in flight, the
replay's copy of the optimizer state, and scratch gradients when clipping or loss scaling must not write the
saved ones. Time per step: one gradient copy in ``step()``, one weight copy each way, and K-1 steps of the
optimizer's rule: SGD's, Adam's and AdamW's written out in foreach operations (``pipesgd.delay.sgd_rule``,
``pipesgd.delay.adam_rule``), any other optimizer's as a copy of its state and a step of a replica (reported as
``StepStats.t_lookahead_s``).

Stand-in (``PipeSGD(lookahead_standin=...)``; "auto", the default, is "coarse-lowrank" under Adam and AdamW and
"local" otherwise): "local", this rank's own gradients, as above; "coarse-lowrank" (``pipesgd.delay.lowrank``), the
own gradients with every rank's average in a shared low-rank subspace; "coarse-q8" or
"coarse-q4", every rank's gradients averaged with that codec on the channel's worker before the exact exchange
(``pipesgd.delay.coarse``), recorded as a handle and used in place once the next forward needs it (its wait is
reported as communication, ``StepStats.t_wait_s``): it removes what the own gradient leaves, each rank's reaction to
its own look-ahead error. "local-then-q8": the own copy serves a step's first forward pass, the q8 average (a handle
marked ``late``) the later ones, swapped in by the next ``record()``.

Reach (``reach``, ``PipeSGD(lookahead_reach=...)``; 1.0 by default): the parameters move ``reach`` times the
replayed displacement, ``master + reach * (look-ahead - master)``. Opt-in and measured on one kind of task: a reach
of 1.2 ended the gap of AdamW on the character GPT at width 2 (validation loss +1.8 % at reach 1, -0.5 % at 1.2, six
seeds, the trainer and the simulation alike) and cost nothing with momentum SGD (digits, MNIST-1D, ResNet-20), but
did not close the gap at width 3. Most of the gain is the optimizer's, not the staleness's: synchronous AdamW with
its gradients taken that far ahead ends at -1.3 % (``experiments/results/accuracy/report.md``). Any reach but 1
gives up the exactness at world size 1 (the parameters pass the weights synchronous SGD would have).
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Sequence

import torch

from pipesgd.comm.handles import CompletedWork, Work
from pipesgd.delay.replay import OptimizerReplay


class Lookahead:
    """The local gradients of the steps in flight, and the parameters moved to the look-ahead weights and back."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], width: int = 2,
                 max_grad_norm: float | None = None, skip_nonfinite: bool = False, reach: float = 1.0) -> None:
        self.params = list(params)
        self.reach = reach  # the look-ahead's displacement, in replayed updates (module doc)
        self._replay = OptimizerReplay(optimizer, self.params, max_grad_norm)
        self._skip_nonfinite = skip_nonfinite
        # A step's stand-in serves the K-1 forwards until its average is applied; the last may consume it.
        self._uses = width - 1
        # step -> [grads, loss scale, forwards left that use it, the coarse stand-in (its handle while on its way,
        # then its result) or None, whether it is a late one not swapped in yet (the own copy in grads meanwhile)]
        self._pending: dict[int, list] = {}
        self._free: list[list[torch.Tensor]] = []
        self._master: list[torch.Tensor] | None = None  # the master weights while the parameters look ahead
        self.active = False
        self.seconds = 0.0  # look-ahead work on the calling thread since the last ``end_step()``
        self.waited = 0.0  # waiting for coarse stand-ins since the last ``end_step()`` (communication, not work)
        self.waited_in_forward = 0.0  # of which inside a forward pass (the pre-hook): the caller timed it as compute
        self._hooked = False  # a forward pre-hook moves the parameters; else ``end_step()`` does
        self._warned = False

    def attach(self, model_or_params) -> list:
        """Hook a model's forward (the first differentiated forward after a step moves the parameters); a list of
        parameters has no forward to hook, so ``end_step()`` moves them. Returns the hook handles."""
        if not isinstance(model_or_params, torch.nn.Module):
            return []
        self._hooked = True
        return [model_or_params.register_forward_pre_hook(self.before_forward)]

    def begin_step(self) -> None:
        """At the start of ``step()``: the master weights back (warning once if a forward that should have looked
        ahead bypassed the hooked model: its gradient was computed at the stale weights)."""
        if self._hooked and not self.active and self._pending and not self._warned:
            self._warned = True
            warnings.warn("PipeSGD(staleness='lookahead'): the forward pass did not call the wrapped model (whose "
                          "forward pre-hook moves the parameters), so this gradient was computed at the stale "
                          "weights; wrap the module you call, or pass staleness='none'", RuntimeWarning,
                          stacklevel=3)
        self.restore()

    def end_step(self) -> tuple[float, float, float]:
        """At the end of ``step()``: without a hook the parameters look ahead from here. Returns the seconds of
        look-ahead work since the last call, of waiting for coarse stand-ins (``pipesgd.delay.coarse``) then, and of
        that wait the part inside a forward pass."""
        if not self._hooked:
            self.advance()
        taken = self.seconds, self.waited, self.waited_in_forward
        self.seconds = self.waited = self.waited_in_forward = 0.0
        return taken

    def record(self, step: int, grads: Sequence[torch.Tensor], scale: float | None = None,
               uses: int | None = None, later: Work | None = None) -> None:
        """Keep a copy of this rank's gradients of ``step`` (shaped like the parameters; ``scale``: the loss
        scale its backward used), the stand-in for its average until ``discard(step)``; ``uses``: how many forward
        passes it serves (K-1 from a fresh step, fewer for one restored later). ``later``: a handle whose result
        (a ``pipesgd.delay.coarse.CoarseResult``) stands in instead, used in place once the next forward needs it;
        a handle marked ``late`` stands in only from the next ``record()`` on (the own copy serves the first forward).
        The late stand-ins recorded before are swapped in first: a forward pass has used them once since."""
        start = time.perf_counter()
        for entry in self._pending.values():
            self._swap(entry)
        late = bool(getattr(later, "late", False))
        copy = None
        if later is None or late:
            copy = self._free.pop() if self._free else [torch.empty_like(g) for g in grads]
            torch._foreach_copy_(copy, list(grads))
        self._pending[step] = [copy, scale, self._uses if uses is None else uses, later, late]
        self.seconds += time.perf_counter() - start

    def discard(self, step: int) -> None:
        """``step``'s average has been applied: its stand-in is no longer needed."""
        entry = self._pending.pop(step, None)
        if entry is None:
            return
        self._take(entry)  # a coarse average never used: its set goes back only once the worker is done with it
        if entry[4]:  # a late one never swapped in: the own copy goes back too
            self._free.append(entry[0])
        if entry[3] is not None:
            entry[3].release()
        else:
            self._free.append(entry[0])

    def _take(self, entry: list) -> None:
        """Wait for a coarse stand-in still on its way (``record(later=...)``)."""
        if isinstance(entry[3], Work):
            start = time.perf_counter()
            entry[3] = entry[3].wait()
            self.waited += time.perf_counter() - start

    def _resolve(self, entry: list) -> None:
        """A coarse stand-in (not a late one): wait for it; its gradients stand in from here."""
        if entry[3] is not None and not entry[4]:
            self._take(entry)
            entry[0] = list(entry[3].slots)

    def _swap(self, entry: list) -> None:
        """A late stand-in: from here the coarse average stands in, not the own copy."""
        if entry[4]:
            self._take(entry)
            self._free.append(entry[0])
            entry[0], entry[4] = list(entry[3].slots), False

    @property
    def pending_steps(self) -> list[int]:
        return sorted(self._pending)

    def advance(self) -> None:
        """Move the parameters to the look-ahead weights (a no-op if they are there or nothing is pending)."""
        if self.active or not self._pending:
            return
        entries = [self._pending[s] for s in sorted(self._pending)]
        waited = self.waited
        start = time.perf_counter()
        with torch.no_grad():
            for entry in entries:  # coarse stand-ins first: an error leaves the master weights in place
                self._resolve(entry)
            if self._master is None:
                self._master = [p.detach().clone() for p in self.params]
            else:
                torch._foreach_copy_(self._master, self.params)
            self.active = True
            self._replay.replay_([(grads, scale, uses <= 1) for grads, scale, uses, *_ in entries],
                                 self._skip_nonfinite)
            for entry in entries:
                entry[2] -= 1
            if self.reach != 1.0:  # params = master + reach * (look-ahead - master)
                torch._foreach_lerp_(self.params, self._master, 1.0 - self.reach)
        self.seconds += time.perf_counter() - start - (self.waited - waited)  # the wait is not look-ahead work

    def restore(self) -> None:
        """Put the master weights back into the parameters (a no-op if they are there)."""
        if not self.active:
            return
        start = time.perf_counter()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self._master)
        self.active = False
        self.seconds += time.perf_counter() - start

    def master_params(self) -> list[torch.Tensor]:
        """The master weights, wherever they are now."""
        return list(self._master) if self.active else self.params

    @torch.compiler.disable  # a graph break: the parameters are moved eagerly, before a compiled forward reads them
    def before_forward(self, _module: torch.nn.Module, _args) -> None:
        """Forward pre-hook: a forward that will be differentiated runs at the look-ahead weights."""
        if torch.is_grad_enabled():
            waited = self.waited
            self.advance()
            self.waited_in_forward += self.waited - waited

    @property
    def memory_bytes(self) -> int:
        """Bytes held beside plain width K: master copy, local gradients in flight and pooled, replay state."""
        own = [entry[0] for entry in self._pending.values() if entry[3] is None or entry[4]]  # coarse: its own
        sets = own + self._free
        grad_bytes = sum(g.numel() * g.element_size() for grads in sets for g in grads)
        master = sum(t.numel() * t.element_size() for t in self._master) if self._master is not None else 0
        return grad_bytes + master + self._replay.state_bytes

    def state_dict(self) -> list[dict]:
        """This rank's stand-ins still pending, oldest first (copies)."""
        if self.active:
            raise RuntimeError("save the look-ahead state while the parameters hold the master weights (after "
                               "step(), before the next forward pass): a stand-in may have been used up since")
        saved = []
        for step, entry in sorted(self._pending.items()):
            self._resolve(entry)
            self._take(entry)
            kept = {"step": step, "grads": [g.clone() for g in entry[0]], "scale": entry[1], "uses": entry[2]}
            if entry[4]:  # a late stand-in not swapped in yet: the coarse average that replaces the own copy
                kept["coarse"] = [g.clone() for g in entry[3].slots]
            saved.append(kept)
        return saved

    def load_state_dict(self, entries: list[dict]) -> None:
        """Restore ``state_dict()``'s stand-ins (replacing any pending ones); the parameters must be the master's."""
        if self.active:
            raise RuntimeError("load the look-ahead state while the parameters hold the master weights")
        for step in list(self._pending):
            self.discard(step)
        for entry in entries:
            grads = [g.to(p.device) for g, p in zip(entry["grads"], self.params)]
            coarse = [g.to(p.device) for g, p in zip(entry.get("coarse", ()), self.params)]
            later = CompletedWork(_Kept(coarse)) if coarse else None
            if later is not None:
                later.late = True
            self.record(int(entry["step"]), grads, entry.get("scale"), int(entry.get("uses", self._uses)), later)


class _Kept:
    """A late coarse stand-in restored from a checkpoint (``record(later=...)`` takes it as the worker's result)."""

    def __init__(self, slots: list[torch.Tensor]) -> None:
        self.slots = slots

    def release(self) -> None:
        """Nothing to give back: no worker's pool owns it."""
