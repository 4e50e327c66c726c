"""The synchronous parameter server's round: a ps-sync training step in miniature, for the timing model's ps-sync term.

Every remote worker pushes its gradient to the server (rank 0, which also trains), which applies the update and
sends the weights back. On a shaped link each direction's token bucket refills while the other carries its half,
so the round is shorter than the α-β term says by an amount that depends on bucket, message and timing: the probe
times it as the trainer runs it. Every rank must call ``measure_ps_round``."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from pipesgd.measure.compute import model_batch
from pipesgd.measure.timing import (STEP_PROBE_MAX_STEPS, STEP_PROBE_MIN_STEPS, calls_within, gathered_rows,
                                   median_of_slowest, synchronize)
from pipesgd.train.models import grad_bytes

__all__ = ["PS_ROUND_BUDGET_S", "measure_ps_round"]

PS_ROUND_BUDGET_S = 6.0  # the probe's steps run for about this long


def measure_ps_round(compute: dict, warmup: int = 2, device: str = "cpu", budget_s: float = PS_ROUND_BUDGET_S) -> dict:
    """Steps of the model under ``--mode ps-sync`` (rank 0 serving and training), back to back with no barrier.
    Returns {'ps_round': {'load', 'nodes', 'grad_bytes', 'steps', 'period_s', 'compute_max_s', 'update_s',
    'excess_s' (median of the period less that step's slowest compute and the server's update: the round)}}."""
    from pipesgd.baselines import ParameterServer  # the trainer's baseline, as the runs use it

    model, x, y = model_batch(compute, device)
    loss_fn = torch.nn.CrossEntropyLoss()
    # a collective: the workers start from the server's weights; the tiny rate keeps them all but still
    ps = ParameterServer(torch.optim.SGD(model.parameters(), lr=1e-6), model, mode="sync", servers=0)

    def step() -> list[float]:
        start = time.perf_counter()
        loss_fn(model(x), y).backward()
        synchronize(device)
        computed = time.perf_counter() - start
        stats = ps.step()
        ps.zero_grad()
        synchronize(device)
        return [computed, time.perf_counter() - start, stats.t_update_s]

    warm = [step()[1] for _ in range(max(1, warmup))]
    steps = calls_within(budget_s, median_of_slowest(warm, device=device), STEP_PROBE_MAX_STEPS,
                         STEP_PROBE_MIN_STEPS)
    rows = [step() for _ in range(steps)]
    ps.flush()  # the remote workers say they are done; every rank receives the final weights
    per_step = gathered_rows(rows, device)  # ranks x steps x (compute, period, update)
    period, compute_max = per_step[:, :, 1].mean(dim=0), per_step[:, :, 0].max(dim=0).values
    update = per_step[:, :, 2].max(dim=0).values  # only the server's rank updates
    return {"ps_round": {"load": f"{compute['model']} forward+backward, batch {compute['batch_size']}",
                         "nodes": dist.get_world_size(), "grad_bytes": float(grad_bytes(model)), "steps": steps,
                         "period_s": period.median().item(), "compute_max_s": compute_max.median().item(),
                         "update_s": update.median().item(),
                         "excess_s": (period - compute_max - update).median().item()}}
