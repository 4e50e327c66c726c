"""The training loop, top to bottom: batch -> forward/backward (``--accumulate`` micro-batches) -> opt.step()
-> opt.zero_grad() -> the next step's learning rate (``--lr-schedule``, ``schedule``) -> record.

The loop never talks to the network: gradients meet only inside the optimizer wrapper (``strategy``). On CUDA
``t_compute`` is timed by events on the compute stream (``step_timer``), so the ring in flight is not counted;
``t_iter`` runs from the previous step's loss read to this one's, so consecutive steps add up to the run's wall
clock less evaluation and checkpoints (the fields: docs/training.md). With ``--trace`` the loop marks its spans on
the "main" row (``pipesgd.runlog.trace``) without adding a synchronisation."""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from pipesgd.runlog import trace

from . import checkpoint, faults
from .checkpoint import Position, RunIdentity
from .config import TrainConfig
from .data import Dataset, shard_batches, steps_per_epoch
from .eval_points import EvalPoints
from .metrics import MetricsWriter, StepTimes, Timings, summarize
from .precision import Precision
from .progress import Progress
from .schedule import build_schedule
from .step_timer import ComputeTimer
from .strategy import Strategy

SUMMARY_SKIP_STEPS = 5  # first iterations left out of the speed figures (allocation, thread start-up)


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of every prediction: one per sample (logits ``(B, C)``, labels ``(B,)``) or, for token
    models, one per position (logits ``(B, T, V)``, targets ``(B, T)``, flattened to ``B*T`` predictions)."""
    return F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction=reduction)


@torch.no_grad()
def evaluate(model: nn.Module, ds: Dataset, device: torch.device, batch_size: int = 1024) -> tuple[float, float]:
    """Accuracy and mean cross-entropy (nats) on the held-out split, per prediction: per sample, or per token
    (next-token accuracy) for token windows."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(ds.x_test), batch_size):
        x = ds.x_test[start:start + batch_size].to(device)
        y = ds.y_test[start:start + batch_size].to(device)
        logits = model(x)
        loss_sum += float(cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(dim=-1) == y).sum())
    model.train(was_training)
    n = max(ds.y_test.numel(), 1)
    return correct / n, loss_sum / n


def forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batches: int = 1,
                     precision: Precision | None = None) -> torch.Tensor:
    """Forward and backward over ``micro_batches`` equal slices of the batch, each loss scaled by 1/N as DDP users do,
    so ``p.grad`` holds the whole batch's mean; returns its mean loss. ``precision`` sets the autocast and, for fp16,
    scales each loss (the wrapper unscales). Accumulation is DDP's ``no_sync()`` without the context: the wrapper
    sends nothing until ``step()``."""
    precision = precision or Precision(x.device.type)
    total = torch.zeros((), device=x.device)
    for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        with precision.autocast():
            loss = cross_entropy(model(xs), ys) / micro_batches
        precision.scale(loss).backward()
        total += loss.detach().float()
    return total


def train(cfg: TrainConfig, ds: Dataset, model: nn.Module, strategy: Strategy, device: torch.device,
          metrics: MetricsWriter, rank: int, world_size: int, start: Position,
          watchdog: faults.Watchdog) -> dict | None:
    """Run the training loop from ``start`` and flush the wrapper; return the summary on the reporting rank,
    else None. Closing the wrapper is the caller's (it must happen after a failure too)."""
    opt, leader = strategy.opt, strategy.is_leader
    run = RunIdentity(world_size, cfg.model, cfg.mode)
    spe = steps_per_epoch(len(ds.x_train), strategy.num_workers, cfg.batch_size)
    total_steps = cfg.steps if cfg.steps else cfg.epochs * spe
    progress = Progress(total_steps, enabled=leader, start_step=start.step)
    timings = Timings()
    skip = SUMMARY_SKIP_STEPS if total_steps - start.step > 2 * SUMMARY_SKIP_STEPS else 0  # short runs: all
    pos = Position(start.epoch, start.step_in_epoch, start.step)
    compute = ComputeTimer(device)
    evals = EvalPoints(cfg.eval_every, cfg.eval_steps, total_steps, cfg.eval_deferred)
    evaluate_now = lambda: evaluate(model, ds, device)  # noqa: E731 - the held-out split at the model's weights
    schedule = build_schedule(cfg.lr_schedule, cfg.lr, cfg.lr_warmup_steps, total_steps)
    if schedule is not None:
        schedule.apply(opt.param_groups, pos.step)  # a resumed run continues the schedule where it stopped
    model.train()

    fetch_ns = time.time_ns()  # when the next batch was asked for (the traced data span starts there)
    fetch_s = time.perf_counter()
    # where the next step's t_iter / t_cpu start: the previous step's end, moved on past evaluation and checkpoints
    iter_mark, cpu_mark = fetch_s, time.process_time()
    while pos.step < total_steps:
        batches = shard_batches(ds, pos.epoch, cfg.seed, strategy.worker_rank, strategy.num_workers,
                                cfg.batch_size, start_step=pos.step_in_epoch)
        for x, y in batches:
            if pos.step >= total_steps:
                break
            trace.set_step(pos.step)
            step_arg = {"step": pos.step}
            faults.inject(rank, pos.step)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            trace.record("data", fetch_ns, time.time_ns(), "data", args=step_arg)
            # forward / backward (DDP averages gradients in here)
            t1 = time.perf_counter()
            with trace.span("compute", "compute", step_arg, cpu=True):
                compute.start()
                loss = forward_backward(strategy.forward_model, x, y, cfg.accumulate, strategy.precision)
                t_compute = compute.stop()
            # the optimizer wrapper: hand off this step's gradients, apply the averaged ones that are due
            with trace.span("opt.step", "step", step_arg, cpu=True):
                stats = opt.step()
                opt.zero_grad()
            if schedule is not None:
                schedule.apply(opt.param_groups, pos.step + 1)  # the next step's rate (flush() applies the last)
            loss_value = float(loss.detach())
            t3, cpu3 = time.perf_counter(), time.process_time()
            # a coarse stand-in's wait inside the forward pass is communication (in stats.t_wait), not compute
            t_compute -= stats.t_standin_wait_s or 0.0
            times = StepTimes(t_iter_s=t3 - iter_mark, t_compute_s=t_compute, t_data_s=t1 - fetch_s,
                              t_cpu_s=cpu3 - cpu_mark)
            iter_mark, cpu_mark = t3, cpu3
            record = metrics.write_step(pos, rank, cfg.mode, loss_value, times, stats)
            if leader and pos.step - start.step >= skip:
                timings.add(record)
            progress.update(pos.step, pos.epoch, loss_value)
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"rank {rank}: loss is {loss_value} at step {pos.step}; lower --lr")

            # advance the data position, then evaluate / checkpoint at that position (left out of t_iter)
            end_of_epoch = pos.advance(spe)
            pause_s, pause_cpu = time.perf_counter(), time.process_time()
            due = evals.due(pos, end_of_epoch)
            if due and cfg.buffers == "average" and hasattr(opt, "sync_buffers"):
                opt.sync_buffers()  # every rank: the leader evaluates the ranks' mean (pipesgd.grads.buffers)
            if leader and due:
                with trace.span("eval", "eval"):
                    result = evals.run(model, pos, metrics.wall(), evaluate_now)
                if result is not None:
                    metrics.write_eval(pos, *result)
                    progress.message(f"{_point(pos, end_of_epoch)}: test accuracy {100 * result[0]:.1f} %, "
                                     f"loss {result[1]:.4f}")
            if cfg.checkpoint and cfg.checkpoint_every and pos.step % cfg.checkpoint_every == 0 \
                    and pos.step < total_steps:
                checkpoint.save_run(cfg.checkpoint, rank, run, model, opt, pos)
            watchdog.beat()  # evaluation and checkpoints count as progress too
            iter_mark += time.perf_counter() - pause_s
            cpu_mark += time.process_time() - pause_cpu
            fetch_ns, fetch_s = time.time_ns(), time.perf_counter()
    progress.close()

    # The final checkpoint is taken before flush(): it holds the in-flight gradients in the optimizer
    # state, so a resumed run continues exactly the trajectory this one would have followed.
    if cfg.checkpoint:
        checkpoint.save_run(cfg.checkpoint, rank, run, model, opt, pos)
    watchdog.beat()
    opt.flush()  # the parameter server ends its protocol here and leaves every rank with the final weights
    if not leader:
        return None
    trained_s = metrics.wall()  # the final weights' clock: with deferred points, the final record carries it
    accuracy, eval_loss = evaluate_now()
    for point, wall_s, point_accuracy, point_loss in evals.finish(model, evaluate_now):
        metrics.write_eval(point, point_accuracy, point_loss, wall=wall_s, deferred=True)
    # Written after the deferred points (in order), but at its own clock, not after their evaluations
    metrics.write_eval(pos, accuracy, eval_loss, wall=trained_s if evals.deferred else None)
    return summarize(cfg, timings, pos, accuracy, eval_loss, world_size, strategy.num_workers)


def _point(pos: Position, end_of_epoch: bool) -> str:
    """How the progress line names an evaluation point: its epoch at an epoch's end, else its step."""
    return f"epoch {pos.epoch}" if end_of_epoch else f"step {pos.step}"
