"""Local look-ahead: staleness compensation for a pipeline of width K >= 2 (``staleness="lookahead"``, the default).

Before its forward pass each rank moves to the weights that the K-1 updates still in flight will produce,
replaying the wrapped optimizer's own rule (``pipesgd.delay.replay``) with a stand-in for each average not received
yet: its own gradients of those steps or the shared low-rank stand-in (``pipesgd.delay.coarse``). The gradient
computed there is averaged and applied to the master weights, which stay bitwise identical on every rank; at world
size 1 (and a constant learning rate) this is synchronous SGD bit for bit. The parameters hold the look-ahead
weights from the first forward with gradients after a ``step()`` (a forward pre-hook) until the next ``step()``;
given a list of parameters there is no hook and ``step()`` moves them. Why and what it costs: docs/wrapper.md."""
from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pipesgd.comm.handles import Work
from pipesgd.delay.replay import OptimizerReplay


@dataclass(slots=True)
class StandIn:
    """What stands in for one in-flight step's average until it is applied."""

    grads: list[torch.Tensor] | None  # parameter-shaped gradients: this rank's own copy, or the shared stand-in's
    scale: float | None  # the loss scale the step's backward used (fp16), None without loss scaling
    uses: int  # forward passes it still serves (the last one may consume it)
    shared: Work | object | None = None  # the shared stand-in: its handle while on its way, then its result

    @property
    def own(self) -> bool:
        """Whether ``grads`` is this rank's own copy (pooled by the look-ahead) rather than the shared result."""
        return self.shared is None


class Lookahead:
    """The stand-ins of the steps in flight, and the parameters moved to the look-ahead weights and back."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], width: int = 2,
                 max_grad_norm: float | None = None, skip_nonfinite: bool = False) -> None:
        self.params = list(params)
        self._replay = OptimizerReplay(optimizer, self.params, max_grad_norm)
        self._skip_nonfinite = skip_nonfinite
        self._uses = width - 1  # a step's stand-in serves the K-1 forwards until its average is applied
        self._pending: dict[int, StandIn] = {}
        self._free: list[list[torch.Tensor]] = []
        self._master: list[torch.Tensor] | None = None  # the master weights while the parameters look ahead
        self.active = False
        self.seconds = 0.0  # look-ahead work on the calling thread since the last ``end_step()``
        self.waited = 0.0  # waiting for shared stand-ins since the last ``end_step()`` (communication, not work)
        self.waited_in_forward = 0.0  # of which inside a forward pass (the pre-hook): the caller timed it as compute
        self._hooked = False  # a forward pre-hook moves the parameters; else ``end_step()`` does
        self._warned = False

    def attach(self, model_or_params) -> list:
        """Hook a model's forward (the first differentiated forward after a step moves the parameters); a list of
        parameters has no forward to hook, so ``end_step()`` moves them. Returns the hook handles."""
        if not isinstance(model_or_params, torch.nn.Module):
            return []
        self._hooked = True
        # A graph break: the parameters are moved eagerly, before a compiled forward reads them. Wrapped here, not
        # as a decorator, since torch.compiler.disable loads torch._dynamo, which costs every `import pipesgd`
        # (and `pipesgd-train --help`) seconds when it happens at import time.
        return [model_or_params.register_forward_pre_hook(torch.compiler.disable(self.before_forward))]

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
        look-ahead work since the last call, of waiting for shared stand-ins then, and of that wait the part inside a
        forward pass."""
        if not self._hooked:
            self.advance()
        taken = self.seconds, self.waited, self.waited_in_forward
        self.seconds = self.waited = self.waited_in_forward = 0.0
        return taken

    def record(self, step: int, grads: Sequence[torch.Tensor], scale: float | None = None,
               uses: int | None = None, shared: Work | None = None) -> None:
        """The stand-in for ``step``'s average until ``discard(step)``: a copy of this rank's gradients of ``step``
        (shaped like the parameters; ``scale``: the loss scale its backward used), or with ``shared`` the handle
        whose result (a ``pipesgd.delay.coarse.CoarseResult``) stands in, waited for once a forward needs it.
        ``uses``: how many forward passes it serves (K-1 from a fresh step, fewer for one restored later)."""
        start = time.perf_counter()
        copy = None
        if shared is None:
            copy = self._free.pop() if self._free else [torch.empty_like(g) for g in grads]
            torch._foreach_copy_(copy, list(grads))
        self._pending[step] = StandIn(copy, scale, self._uses if uses is None else uses, shared)
        self.seconds += time.perf_counter() - start

    def discard(self, step: int) -> None:
        """``step``'s average has been applied: its stand-in is no longer needed."""
        entry = self._pending.pop(step, None)
        if entry is None:
            return
        if entry.own:
            self._free.append(entry.grads)
        else:  # a shared stand-in never used: its set goes back only once the worker is done with it
            self._resolve(entry)
            entry.shared.release()

    def _resolve(self, entry: StandIn) -> None:
        """A shared stand-in: wait for it if it is still on its way; its gradients stand in from here."""
        if isinstance(entry.shared, Work):
            start = time.perf_counter()
            entry.shared = entry.shared.wait()
            self.waited += time.perf_counter() - start
            entry.grads = list(entry.shared.slots)

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
            for entry in entries:  # shared stand-ins first: an error leaves the master weights in place
                self._resolve(entry)
            if self._master is None:
                self._master = [p.detach().clone() for p in self.params]
            else:
                torch._foreach_copy_(self._master, self.params)
            self.active = True
            self._replay.replay_([(e.grads, e.scale, e.uses <= 1) for e in entries], self._skip_nonfinite)
            for entry in entries:
                entry.uses -= 1
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

    def before_forward(self, _module: torch.nn.Module, _args) -> None:
        """Forward pre-hook: a forward that will be differentiated runs at the look-ahead weights."""
        if torch.is_grad_enabled():
            waited = self.waited
            self.advance()
            self.waited_in_forward += self.waited - waited

    @property
    def memory_bytes(self) -> int:
        """Bytes held beside plain width K: master copy, own gradients in flight and pooled, replay state."""
        sets = [entry.grads for entry in self._pending.values() if entry.own] + self._free
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
            saved.append({"step": step, "grads": [g.clone() for g in entry.grads], "scale": entry.scale,
                          "uses": entry.uses})
        return saved

    def load_state_dict(self, entries: list[dict]) -> None:
        """Restore ``state_dict()``'s stand-ins (replacing any pending ones); the parameters must be the master's."""
        if self.active:
            raise RuntimeError("load the look-ahead state while the parameters hold the master weights")
        for step in list(self._pending):
            self.discard(step)
        for entry in entries:
            grads = [g.to(p.device) for g, p in zip(entry["grads"], self.params)]
            self.record(int(entry["step"]), grads, entry.get("scale"), int(entry.get("uses", self._uses)))
