"""The parameter server's service time: a short ``--mode ps-async`` job of the trainer's model (rank 0 serves on a
thread and trains), timed per step on every worker.

A remote worker's push and pull wait for the server, which answers one request at a time, slower while rank 0
also trains; rank 0's own updates never cross the link, so it finishes first and the job has two phases (busy,
idle). The fitting inverts the queue from what the workers see (``timing_model.empirical.host_terms``). The phases
are told apart by wall clock: exact on one machine, off by the clocks' offset across machines."""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from pipesgd.measure.timing import calls_within
from pipesgd.train.models import build_model

__all__ = ["PS_BUDGET_S", "PS_MIN_STEPS", "PS_MAX_STEPS", "measure_ps_service", "phase_means"]

PS_BUDGET_S = 15.0  # the probe's steps are sized so a remote worker's share takes about this long
PS_MIN_STEPS = 5
PS_MAX_STEPS = 200
PS_WARMUP = 2  # steps each worker runs and drops first (connections, allocator)


def phase_means(rows: list[tuple[float, float, float]], boundary: float) -> dict:
    """Per phase (steps that ended before ``boundary``, and after) of the remote workers' ``rows`` (end wall clock,
    step seconds, push + pull seconds): {'steps', 'think_s', 'response_s'}. Means, not medians: the queue the fitting
    inverts is a mean-value analysis, and medians drop the slow steps that cores shared with the server give."""
    out = {}
    for phase, keep in (("busy", lambda end: end <= boundary), ("idle", lambda end: end > boundary)):
        mine = [(step, wait) for end, step, wait in rows if keep(end)]
        out[phase] = {"steps": len(mine),
                      "think_s": statistics.fmean(s - w for s, w in mine) if mine else None,
                      "response_s": statistics.fmean(w for _, w in mine) if mine else None}
    return out


def measure_ps_service(compute: dict, device: str = "cpu", budget_s: float = PS_BUDGET_S) -> dict:
    """Run the trainer's model as an asynchronous parameter-server job and time every worker's steps.

    Step 1: ``PS_WARMUP`` timed steps size the job to about ``budget_s`` (``PS_MIN_STEPS`` to ``PS_MAX_STEPS``).
    Step 2: that many steps, each timed.
    Step 3: rank 0's end of training (wall clock) and the remote workers' steps, gathered.
    Returns {'ps_service': {'load', 'workers', 'steps', 'statistic', 'rank0_step_s', 'busy', 'idle'}} on every rank."""
    from pipesgd.baselines import ParameterServer  # the trainer's baseline, as the runs use it

    opts = {"hidden": compute["hidden"]} if compute.get("hidden") else {}
    model = build_model(compute["model"], tuple(compute["input_shape"]), compute["num_classes"], **opts).to(device)
    x = torch.randn(compute["batch_size"], *compute["input_shape"], device=device)
    y = torch.randint(0, compute["num_classes"], (compute["batch_size"],), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    ps = ParameterServer(torch.optim.SGD(model.parameters(), lr=1e-6), model, mode="async", servers=0)

    def step() -> tuple[float, float, float]:
        start = time.perf_counter()
        loss_fn(model(x), y).backward()
        stats = ps.step()
        ps.zero_grad()
        return time.time(), time.perf_counter() - start, stats.t_wait_s

    warm = torch.tensor([max(step()[1] for _ in range(PS_WARMUP))], dtype=torch.float64)
    dist.all_reduce(warm, op=dist.ReduceOp.MAX)  # every worker runs the same steps: size them alike
    steps = calls_within(budget_s, warm.item(), PS_MAX_STEPS, PS_MIN_STEPS)
    rows = [step() for _ in range(steps)]
    trained_until = time.time()
    ps.flush()  # rank 0's server thread serves until every remote worker has flushed
    mine = torch.tensor(rows, dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    boundary = torch.tensor([trained_until], dtype=torch.float64)
    dist.broadcast(boundary, src=0)
    remote = [tuple(row) for rank_rows in every[1:] for row in rank_rows.tolist()]
    return {"ps_service": {"load": f"{compute['model']} forward+backward, batch {compute['batch_size']}",
                           "workers": dist.get_world_size() - 1, "steps": steps,
                           "statistic": "mean", "rank0_step_s": statistics.fmean(r[1] for r in every[0].tolist()),
                           **phase_means(remote, boundary.item())}}
