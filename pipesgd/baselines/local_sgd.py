"""PyTorch's own post-local SGD behind the trainer's optimizer-wrapper seam, built from torch's parts: DDP with
``post_localSGD_hook`` (synchronous for ``warmup_steps``, then no collective in backward) and
``PostLocalSGDOptimizer`` with ``PeriodicModelAverager`` (parameters averaged on torch's schedule). Optimizer state
and buffers stay each rank's own; ``flush()`` averages once more if local steps ran since the last average.
``bytes_sent`` is ring-equivalent. The trainer's flags: docs/training.md, "Periodic averaging"."""
from __future__ import annotations

import inspect
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import average_parameters
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel

from pipesgd.accounting import StepStats
from pipesgd.baselines.ddp_hooks import ring_allreduce_bytes

__all__ = ["LocalSGD"]

# Rank 0's buffers at construction, none broadcast before each forward: newer torch names this
# forward_sync_buffers=False and deprecates broadcast_buffers, which older torch (the floor we support) only has.
_NO_FORWARD_BUFFER_SYNC = ({"forward_sync_buffers": False}
                           if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                           else {"broadcast_buffers": False})


class LocalSGD:
    """Post-local SGD (``pipesgd.wrapper.OptimizerWrapper``): forward through ``.model`` (DDP's module).

    ``sync_every`` is torch's averaging ``period`` (at least 2: for 1 torch says plain DDP is the tool).
    ``accumulate``: backward passes per step, so that the hook (counting backward passes) ends its warm-up at the
    same step as the averager (counting optimizer steps)."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, sync_every: int, warmup_steps: int = 0,
                 accumulate: int = 1, process_group: dist.ProcessGroup | None = None,
                 device_ids: list[int] | None = None) -> None:
        if sync_every < 2:
            raise ValueError(f"sync_every must be at least 2 (got {sync_every}); every step is plain DDP")
        if warmup_steps < 0 or accumulate < 1:
            raise ValueError(f"warmup_steps must be >= 0 and accumulate >= 1 (got {warmup_steps}, {accumulate})")
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.sync_every, self.warmup_steps = sync_every, warmup_steps
        self.model = DistributedDataParallel(model, device_ids=device_ids, process_group=process_group,
                                             **_NO_FORWARD_BUFFER_SYNC)
        self.hook_state = PostLocalSGDState(process_group=process_group, subgroup=None,
                                            start_localSGD_iter=warmup_steps * accumulate,
                                            post_local_gradient_allreduce=False)
        self.model.register_comm_hook(self.hook_state, post_localSGD_hook)
        self.averager = PeriodicModelAverager(period=sync_every, warmup_steps=warmup_steps,
                                              process_group=process_group)
        self.optimizer = PostLocalSGDOptimizer(optim=optimizer, averager=self.averager)
        n_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        self._bytes = ring_allreduce_bytes(n_bytes, self.world_size)  # a gradient or the parameters, once
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._accumulate = accumulate
        self._local_since_average = False  # local steps ran since the last average (flush() averages then)
        self.last_stats: StepStats | None = None

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def _averages_now(self) -> bool:
        """Whether the averager's next call averages (torch's rule, read before the call moves its counter)."""
        step = self.averager.step
        return step >= self.warmup_steps and (step - self.warmup_steps) % self.sync_every == 0

    def step(self) -> StepStats:
        """The inner step on this rank's gradient (averaged in backward during the warm-up), then torch's
        averager, which averages the parameters when the period is due."""
        step = self.averager.step
        warm = step < self.warmup_steps
        averages = self._averages_now()
        start = time.perf_counter()
        self.optimizer.optim.step()
        t_update = time.perf_counter() - start
        start = time.perf_counter()
        self.averager.average_parameters(params=self.param_groups)
        t_wait = time.perf_counter() - start
        self._local_since_average = not warm and not averages
        sent = self._bytes * self._accumulate if warm else 0
        sent += self._bytes if averages else 0
        self.last_stats = StepStats(step=step, applied_step=step, t_wait_s=t_wait if averages else 0.0,
                                    t_update_s=t_update, bytes_sent=sent)
        return self.last_stats

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def flush(self) -> list[StepStats]:
        """End of training: average the parameters if local steps ran since the last average."""
        if not self._local_since_average:
            return []
        start = time.perf_counter()
        # torch's averaging of every trained parameter (its optimizer-side call skips those without a gradient,
        # which zero_grad has just cleared)
        average_parameters(iter(self._params), self.process_group)
        self._local_since_average = False
        stats = StepStats(step=self.averager.step, applied_step=None, t_wait_s=time.perf_counter() - start,
                          bytes_sent=self._bytes)
        self.last_stats = stats
        return [stats]

    def close(self) -> None:
        pass

    def state_dict(self) -> dict:
        # PostLocalSGDOptimizer's own state: the inner optimizer's plus the averager's step.
        return {"optimizer": self.optimizer.state_dict(), "hook_iter": self.hook_state.iter,
                "local_since_average": self._local_since_average, "sync_every": self.sync_every,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (("sync_every", self.sync_every), ("world_size", self.world_size)):
            if state.get(key) != mine:
                raise ValueError(f"local SGD state does not match: {key} is {state.get(key)!r}, expected {mine!r}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.hook_state.iter = int(state["hook_iter"])
        self._local_since_average = bool(state["local_since_average"])
