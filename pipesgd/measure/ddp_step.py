"""The DDP probe: a DistributedDataParallel training step in miniature, for the timing model's DDP term.

DDP all-reduces from inside ``backward()``, so on shared cores its step differs from a synchronous step of the
same gradient (docs/timing-model.md, "What the calibration probes measure"). The probe times that step as
``--mode ddp`` builds it, and the model's forward + backward alone. Every rank must call it."""
from __future__ import annotations

import time

import torch

from pipesgd.baselines.ddp import DDPOptimizer
from pipesgd.measure.compute import model_batch, model_load
from pipesgd.measure.timing import (STEP_PROBE_MAX_STEPS, STEP_PROBE_MIN_STEPS, calls_within, gathered_rows,
                                   median_of_slowest, synchronize)

__all__ = ["DDP_BUDGET_S", "measure_ddp_step"]

DDP_BUDGET_S = 6.0  # the DDP steps run for about this long, and the forward + backward alone as many times


def measure_ddp_step(compute: dict, warmup: int = 2, device: str = "cpu", budget_s: float = DDP_BUDGET_S) -> dict:
    """Steps of the model wrapped as ``--mode ddp`` wraps it, back to back with no barrier, then as many forward +
    backward passes alone. Returns {'ddp_step': {'load', 'steps', 'period_s', 'compute_s'}}."""
    model, x, y = model_batch(compute, device)
    loss_fn = torch.nn.CrossEntropyLoss()
    ddp = DDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model)  # a collective: DDP syncs the weights
    alone, label, _ = model_load(compute, device)

    def step() -> float:
        start = time.perf_counter()
        loss_fn(ddp.model(x), y).backward()
        ddp.zero_grad(set_to_none=True)
        synchronize(device)
        return time.perf_counter() - start

    warm = [step() for _ in range(max(1, warmup))]
    steps = calls_within(budget_s, median_of_slowest(warm, device=device), STEP_PROBE_MAX_STEPS,
                         STEP_PROBE_MIN_STEPS)
    periods = gathered_rows([[step()] for _ in range(steps)], device)[:, :, 0].mean(dim=0)  # mean over ranks
    compute_s = median_of_slowest([alone() for _ in range(steps)], device=device)
    return {"ddp_step": {"load": label, "steps": steps, "period_s": periods.median().item(), "compute_s": compute_s}}
