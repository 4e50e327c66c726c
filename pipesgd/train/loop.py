"""The training loop, top to bottom: batch -> forward/backward -> opt.step() -> opt.zero_grad() -> record.

The loop never talks to the network: gradients meet only inside the optimizer wrapper (``strategy``).
Timing of one iteration: ``t_compute`` is forward + backward (on CUDA synchronised before the clock
stops; in ``ddp`` mode it includes DDP's allreduce, which runs inside backward), ``t_wait`` and
``t_update`` come from the wrapper's ``last_stats``, ``t_iter`` spans data slicing to ``zero_grad()``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from . import checkpoint, faults
from .config import TrainConfig
from .data import Dataset, shard_batches, steps_per_epoch
from .metrics import MetricsWriter
from .progress import Progress
from .strategy import Strategy

SUMMARY_SKIP_STEPS = 5  # first iterations left out of the speed figures (allocation, thread start-up)


@dataclass(slots=True)
class Position:
    """Where training stands: the next step to run (global, and within its epoch)."""

    epoch: int = 0
    step_in_epoch: int = 0
    step: int = 0


@dataclass(slots=True)
class Timings:
    """Per-iteration times kept on the reporting rank for the summary."""

    t_iter: list[float] = field(default_factory=list)
    t_compute: list[float] = field(default_factory=list)
    t_wait: list[float] = field(default_factory=list)
    t_update: list[float] = field(default_factory=list)


@torch.no_grad()
def evaluate(model: nn.Module, ds: Dataset, device: torch.device, batch_size: int = 1024) -> tuple[float, float]:
    """Accuracy and mean cross-entropy on the held-out split."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(ds.x_test), batch_size):
        x = ds.x_test[start:start + batch_size].to(device)
        y = ds.y_test[start:start + batch_size].to(device)
        logits = model(x)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(dim=1) == y).sum())
    model.train(was_training)
    n = max(len(ds.x_test), 1)
    return correct / n, loss_sum / n


def save_checkpoint(cfg: TrainConfig, rank: int, world_size: int, model: nn.Module, strategy: Strategy,
                    pos: Position) -> None:
    checkpoint.save(cfg.checkpoint, rank, {
        "world_size": world_size, "rank": rank, "model_name": cfg.model, "mode": cfg.mode,
        "model": model.state_dict(), "optimizer": strategy.opt.state_dict(), "rng": checkpoint.capture_rng(),
        "epoch": pos.epoch, "step_in_epoch": pos.step_in_epoch, "step": pos.step,
    })


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(cfg: TrainConfig, ds: Dataset, model: nn.Module, strategy: Strategy, device: torch.device,
          metrics: MetricsWriter, rank: int, world_size: int, start: Position,
          watchdog: faults.Watchdog) -> dict | None:
    """Run the training loop from ``start``; return the summary on the reporting rank, else None."""
    opt, leader = strategy.opt, strategy.is_leader
    spe = steps_per_epoch(len(ds.x_train), strategy.num_workers, cfg.batch_size)
    total_steps = cfg.steps if cfg.steps else cfg.epochs * spe
    progress = Progress(total_steps, enabled=leader)
    timings = Timings()
    skip = SUMMARY_SKIP_STEPS if total_steps - start.step > 2 * SUMMARY_SKIP_STEPS else 0  # short runs: all
    pos = Position(start.epoch, start.step_in_epoch, start.step)
    model.train()

    while pos.step < total_steps:
        batches = shard_batches(ds, pos.epoch, cfg.seed, strategy.worker_rank, strategy.num_workers,
                                cfg.batch_size, start_step=pos.step_in_epoch)
        for x, y in batches:
            if pos.step >= total_steps:
                break
            faults.inject(rank, pos.step)
            t0, cpu0 = time.perf_counter(), time.process_time()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            # forward / backward (DDP averages gradients in here)
            t1 = time.perf_counter()
            loss = F.cross_entropy(strategy.forward_model(x), y)
            loss.backward()
            _sync(device)
            t2 = time.perf_counter()
            # the optimizer wrapper: hand off this step's gradients, apply the averaged ones that are due
            opt.step()
            opt.zero_grad()
            t3, cpu3 = time.perf_counter(), time.process_time()
            stats = opt.last_stats
            loss_value = float(loss.detach())
            record = metrics.write(
                "step", step=pos.step, epoch=pos.epoch, rank=rank, mode=cfg.mode, loss=loss_value,
                t_iter=t3 - t0, t_compute=t2 - t1, t_wait=stats.t_wait_s, t_update=stats.t_update_s,
                bytes_sent=stats.bytes_sent, applied_step=stats.applied_step,
                compression_ratio=stats.compression_ratio, residual_norm=stats.residual_norm,
                t_comm_busy=stats.t_comm_busy_s, skipped_nonfinite=stats.skipped_nonfinite, t_data=t1 - t0,
                t_cpu=cpu3 - cpu0)
            if leader and pos.step - start.step >= skip:
                for name in ("t_iter", "t_compute", "t_wait", "t_update"):
                    getattr(timings, name).append(record[name])
            progress.update(pos.step, pos.epoch, loss_value)
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"rank {rank}: loss is {loss_value} at step {pos.step}; lower --lr")

            # advance the data position, then evaluate / checkpoint at that position
            pos.step += 1
            pos.step_in_epoch += 1
            end_of_epoch = pos.step_in_epoch == spe
            if end_of_epoch:
                pos.epoch, pos.step_in_epoch = pos.epoch + 1, 0
            if leader and end_of_epoch and cfg.eval_every and pos.epoch % cfg.eval_every == 0 \
                    and pos.step < total_steps:
                accuracy, eval_loss = evaluate(model, ds, device)
                metrics.write("eval", step=pos.step, epoch=pos.epoch, accuracy=accuracy, loss=eval_loss)
                progress.message(f"epoch {pos.epoch}: test accuracy {100 * accuracy:.1f} %, loss {eval_loss:.4f}")
            if cfg.checkpoint and cfg.checkpoint_every and pos.step % cfg.checkpoint_every == 0 \
                    and pos.step < total_steps:
                save_checkpoint(cfg, rank, world_size, model, strategy, pos)
            watchdog.beat()  # evaluation and checkpoints count as progress too
    progress.close()

    # The final checkpoint is taken before flush(): it holds the in-flight gradients in the optimizer
    # state, so a resumed run continues exactly the trajectory this one would have followed.
    if cfg.checkpoint:
        save_checkpoint(cfg, rank, world_size, model, strategy, pos)
    watchdog.beat()
    opt.flush()
    if hasattr(opt, "finish"):
        opt.finish()
    if not leader:
        return None
    accuracy, eval_loss = evaluate(model, ds, device)
    metrics.write("eval", step=pos.step, epoch=pos.epoch, accuracy=accuracy, loss=eval_loss)
    return summarize(cfg, timings, pos, accuracy, eval_loss, world_size, strategy.num_workers)


def summarize(cfg: TrainConfig, timings: Timings, pos: Position, accuracy: float, eval_loss: float,
              world_size: int, num_workers: int) -> dict:
    """The end-of-run figures: accuracy, iterations/s and where an iteration's time went (means, seconds)."""
    n = len(timings.t_iter)

    def mean(values):
        return sum(values) / len(values) if values else 0.0

    t_iter, t_compute = mean(timings.t_iter), mean(timings.t_compute)
    t_wait, t_update = mean(timings.t_wait), mean(timings.t_update)
    return {
        "steps": pos.step, "epochs": pos.epoch, "world_size": world_size, "num_workers": num_workers,
        "mode": cfg.mode,
        "accuracy": accuracy, "test_loss": eval_loss, "measured_steps": n, "skipped_steps": pos.step - n,
        "iters_per_s": 1.0 / t_iter if t_iter > 0 else 0.0,
        "t_iter": t_iter, "t_compute": t_compute, "t_wait": t_wait, "t_update": t_update,
        "t_other": max(t_iter - t_compute - t_wait - t_update, 0.0),
    }


def format_summary(cfg: TrainConfig, s: dict) -> str:
    def part(name, seconds):
        share = 100 * seconds / s["t_iter"] if s["t_iter"] > 0 else 0.0
        return f"{name} {1000 * seconds:.2f} ms ({share:.0f} %)"

    mode = f"{cfg.mode} (width {cfg.effective_width})" if cfg.mode == "pipe" else cfg.mode
    comm = "waiting for communication" if cfg.mode != "ddp" else "waiting for communication (inside compute for ddp)"
    ranks = f"{s['world_size']} ranks"
    if s["num_workers"] != s["world_size"]:
        servers = s["world_size"] - s["num_workers"]
        ranks += f" ({servers} server{'s' if servers > 1 else ''}, {s['num_workers']} workers)"
    lines = [
        f"done: {cfg.model} on {cfg.dataset_name}, mode {mode}, {ranks}, {s['steps']} steps: "
        f"test accuracy {100 * s['accuracy']:.1f} % (loss {s['test_loss']:.4f})",
        f"speed: {s['iters_per_s']:.1f} iterations/s, {1000 * s['t_iter']:.2f} ms per iteration "
        f"(mean of the last {s['measured_steps']} of this run)",
        "time per iteration: " + ", ".join([part("compute", s["t_compute"]), part(comm, s["t_wait"]),
                                            part("optimizer", s["t_update"]), part("other", s["t_other"])]),
    ]
    return "\n".join(lines)
