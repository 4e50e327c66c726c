"""DiLoCo (Douillard et al., arXiv 2311.08105) behind the trainer's optimizer-wrapper seam, with torchft's names and
one fragment (the whole model); ``sync_delay`` >= 1 is Streaming DiLoCo's overlap (arXiv 2501.18512). The steps:
``DiLoCo``; the trainer's flags: docs/training.md, "Periodic averaging"."""
from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist
from torch import nn

from pipesgd.accounting import StepStats
from pipesgd.baselines.ddp_hooks import ring_allreduce_bytes
from pipesgd.comm.handles import CompletedWork
from pipesgd.defaults import OUTER_LR, OUTER_MOMENTUM
from pipesgd.init_sync import sync_initial_state

__all__ = ["DiLoCo"]


class DiLoCo:
    """Inner optimizer every step, outer Nesterov step every ``sync_every`` (``pipesgd.wrapper.OptimizerWrapper``).

    Per period of ``sync_every`` inner steps, counted by ``local_step`` from 1:

    1. After inner step ``sync_every - sync_delay``: the pseudo-gradient ``delta = global - local`` (``global``: the
       weights of the last sync) starts its all-reduce (a sum).
    2. After inner step ``sync_every``: wait for it; ``delta`` = that sum / world size.
    3. The outer optimizer (SGD, Nesterov momentum) steps ``global`` with ``delta`` as its gradient.
    4. Every rank continues from the new ``global``; the inner optimizer's state is each rank's own and is kept.

    ``sync_delay = 0`` is the blocking original. With ``tau >= 1`` the ``tau`` overlapped steps' progress is dropped
    at step 4 (torchft's ``fragment_update_alpha = 0``). ``flush()`` completes a sync in flight or syncs the partial
    period. Every rank starts from rank 0's parameters and buffers; buffers are not synced afterwards."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, sync_every: int,
                 outer_lr: float = OUTER_LR, outer_momentum: float = OUTER_MOMENTUM, sync_delay: int = 0,
                 process_group: dist.ProcessGroup | None = None) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be at least 1 (got {sync_every})")
        if not 0 <= sync_delay < sync_every:
            raise ValueError(f"sync_delay must be in [0, sync_every) = [0, {sync_every}) (got {sync_delay}): "
                             "a pseudo-gradient is applied before the next one is taken")
        if not outer_lr > 0 or not 0 <= outer_momentum < 1:
            raise ValueError(f"outer_lr must be positive and outer_momentum in [0, 1) (got {outer_lr}, "
                             f"{outer_momentum})")
        self.optimizer = optimizer
        self.group = process_group or dist.group.WORLD
        self.world_size = dist.get_world_size(self.group)
        self.sync_every, self.sync_delay = sync_every, sync_delay
        sync_initial_state(model, self.group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        # The pseudo-gradient's precision: at least float32 (a low-precision model's deltas would round away).
        self._dtype = functools.reduce(torch.promote_types, [p.dtype for p in self.params], torch.float32)
        with torch.no_grad():
            # the weights of the last sync, the outer optimizer's parameters
            self.global_params = [p.detach().to(self._dtype, copy=True) for p in self.params]
        # (torch refuses Nesterov without momentum; with momentum 0 both are plain SGD)
        self.outer = torch.optim.SGD(self.global_params, lr=outer_lr, momentum=outer_momentum,
                                     nesterov=outer_momentum > 0)
        self._numel = sum(p.numel() for p in self.params)
        self._bytes = ring_allreduce_bytes(self._numel * self._dtype.itemsize, self.world_size)
        self.local_step = 0  # inner steps since the last sync
        self._step = 0  # step() calls so far
        self._delta: torch.Tensor | None = None  # the pseudo-gradient sum, in flight between steps 1 and 2
        self._work = None  # its all-reduce
        self.last_stats: StepStats | None = None

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def outer_lr(self) -> float:
        return self.outer.param_groups[0]["lr"]

    def step(self) -> StepStats:
        """One inner step on this rank's gradient; the period's sync where it is due."""
        start = time.perf_counter()
        self.optimizer.step()
        t_update = time.perf_counter() - start
        self.local_step += 1
        sent, t_wait = 0, 0.0
        if self.local_step == self.sync_every - self.sync_delay:
            sent = self._start_sync()
        if self.local_step == self.sync_every:
            t_wait, t_outer = self._finish_sync()
            t_update += t_outer
        self.last_stats = StepStats(step=self._step, applied_step=self._step, t_wait_s=t_wait,
                                    t_update_s=t_update, bytes_sent=sent)
        self._step += 1
        return self.last_stats

    @torch.no_grad()
    def _start_sync(self) -> int:
        # Step 1: this rank's pseudo-gradient, its sum over the ranks started (not waited for).
        if self._work is not None:
            raise RuntimeError("a pseudo-gradient is already in flight")
        local = torch.cat([p.detach().reshape(-1).to(self._dtype) for p in self.params])
        self._delta = torch.cat([g.reshape(-1) for g in self.global_params]).sub_(local)
        with torch.profiler.record_function("pipesgd::diloco::allreduce"):
            self._work = dist.all_reduce(self._delta, group=self.group, async_op=True)
        return self._bytes

    @torch.no_grad()
    def _finish_sync(self) -> tuple[float, float]:
        """Steps 2-4; returns the seconds waited for the all-reduce and the seconds of the outer step."""
        # Step 2: the mean pseudo-gradient.
        start = time.perf_counter()
        self._work.wait()
        t_wait = time.perf_counter() - start
        start = time.perf_counter()
        delta = self._delta.div_(self.world_size)
        self._work = self._delta = None
        # Step 3: the outer Nesterov step on the weights of the last sync.
        offset = 0
        for g in self.global_params:
            g.grad = delta[offset:offset + g.numel()].view_as(g)
            offset += g.numel()
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)
        # Step 4: every rank continues from the new global weights.
        for p, g in zip(self.params, self.global_params):
            p.copy_(g)
        self.local_step = 0
        return t_wait, time.perf_counter() - start

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def flush(self) -> list[StepStats]:
        """End of training: complete the sync in flight, or sync the local steps since the last one."""
        if self._work is None and self.local_step == 0:
            return []
        sent = self._start_sync() if self._work is None else 0
        t_wait, t_outer = self._finish_sync()
        self.last_stats = StepStats(step=self._step, applied_step=None, t_wait_s=t_wait, t_update_s=t_outer,
                                    bytes_sent=sent)
        return [self.last_stats]

    def close(self) -> None:
        if self._work is not None:  # no collective may be left running when the group goes
            self._work.wait()
            self._work = self._delta = None

    def state_dict(self) -> dict:
        """Inner and outer optimizer state, the last sync's weights, and a pseudo-gradient in flight (waited
        for and saved as its sum, so a resumed run applies the same one)."""
        pending = None
        if self._work is not None:
            self._work.wait()
            self._work = CompletedWork(None)
            pending = self._delta.clone()
        return {"optimizer": self.optimizer.state_dict(), "outer": self.outer.state_dict(),
                "global_params": [g.clone() for g in self.global_params], "pending_delta": pending,
                "local_step": self.local_step, "step": self._step, "sync_every": self.sync_every,
                "sync_delay": self.sync_delay, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (("sync_every", self.sync_every), ("sync_delay", self.sync_delay),
                          ("world_size", self.world_size)):
            if state.get(key) != mine:
                raise ValueError(f"DiLoCo state does not match: {key} is {state.get(key)!r}, expected {mine!r}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.outer.load_state_dict(state["outer"])
        with torch.no_grad():
            for g, saved in zip(self.global_params, state["global_params"], strict=True):
                g.copy_(saved)
        self.local_step, self._step = int(state["local_step"]), int(state["step"])
        pending = state["pending_delta"]
        self._delta = None if pending is None else pending.clone()
        self._work = None if pending is None else CompletedWork(None)
