"""The parameter server's service time: a short asynchronous parameter-server job of the trainer's model, timed
per step on every worker, as ``pipesgd-train --mode ps-async`` runs it (rank 0 serves on a thread and trains).

Why a probe: a remote worker's push and pull wait for the server, which answers one request at a time on a
thread of rank 0's process. Each answer is more than the bytes on the wire (the receive handshake, the update,
the reply's send, the thread's turn on cores the nodes share), and while rank 0 also trains it is slower still.
Rank 0's own updates never cross the link, so it finishes its steps first and the job has two phases: the
remote workers' steps while rank 0 trains, and after. The model (``timing_model.empirical.server``) needs the server's
time per request in each phase; this probe measures what the workers see, the fitting inverts the queue
(``timing_model.empirical.host_terms.service_from_timings``).

Every rank must call ``measure_ps_service``; the phases are told apart by wall clock (``time.time``): exact on
one machine (the emulated cluster), off by the clocks' offset across machines, which moves only the steps at
the boundary.
"""
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
    """Per phase of the remote workers' steps (``rows``: (step end wall clock, step seconds, seconds in the
    push + pull)): the steps that ended before ``boundary`` (rank 0 still training) and after; each phase's
    {'steps', 'think_s' (mean of step − push/pull: compute and host work), 'response_s' (mean push + pull)}.

    Means, not medians: the queue the fitting inverts (``timing_model.empirical.server.closed_queue_response``) is a
    mean-value analysis, and the job's pace it predicts is a mean step. Medians drop the tail of slow steps
    that cores shared with the server give, so a pace predicted from them runs short of the run's."""
    out = {}
    for phase, keep in (("busy", lambda end: end <= boundary), ("idle", lambda end: end > boundary)):
        mine = [(step, wait) for end, step, wait in rows if keep(end)]
        out[phase] = {"steps": len(mine),
                      "think_s": statistics.fmean(s - w for s, w in mine) if mine else None,
                      "response_s": statistics.fmean(w for _, w in mine) if mine else None}
    return out


def measure_ps_service(compute: dict, device: str = "cpu", budget_s: float = PS_BUDGET_S) -> dict:
    """Run the trainer's model as an asynchronous parameter-server job (``servers=0``: rank 0 serves on a thread
    and trains) and time every worker's steps.

    Step 1: ``PS_WARMUP`` steps on every worker, timed; the slowest worker's step sizes the job to about
            ``budget_s`` (``PS_MIN_STEPS`` to ``PS_MAX_STEPS`` steps per worker).
    Step 2: that many steps: forward + backward, ``step()`` (push, pull), zero_grad, each timed.
    Step 3: rank 0's end of training (wall clock) and the remote workers' steps, gathered.
    Returns {'ps_service': {'load', 'workers' (remote workers), 'steps', 'statistic' ('mean'), 'rank0_step_s'
    (mean), 'busy' and 'idle' phases (``phase_means``)}} on every rank.
    """
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
