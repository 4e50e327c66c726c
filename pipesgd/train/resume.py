"""``--resume``: agree across ranks on whether a checkpoint exists, load it, and check every rank got the same step.

With no checkpoint in the directory yet the run starts fresh, so one command line serves both the first
launch and ``torchrun --max-restarts`` relaunches. A checkpoint that exists for only some ranks, fails
to load on one, or holds different steps on different ranks stops every rank with one clear line.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from . import checkpoint
from .checkpoint import CheckpointError
from .config import TrainConfig
from .loop import Position
from .strategy import Strategy


def _all_reduce(values: list[int], op, device: torch.device) -> list[int]:
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=op)
    return [int(v) for v in t.tolist()]


def restore(cfg: TrainConfig, rank: int, world_size: int, model: nn.Module, strategy: Strategy,
            device: torch.device) -> tuple[Position, bool]:
    """Load this rank's checkpoint if the run has one; return (start position, whether it resumed)."""
    directory = cfg.checkpoint
    # Step 1: every rank must agree whether there is a checkpoint at all.
    have = _all_reduce([int(checkpoint.exists(directory, rank))], dist.ReduceOp.SUM, device)[0]
    if have == 0:
        return Position(), False
    if have != world_size:
        raise CheckpointError(f"checkpoint {directory} has files for {have} of this run's {world_size} ranks")
    extra = checkpoint.extra_rank_files(directory, world_size)
    if extra:
        raise CheckpointError(f"checkpoint {directory} was written by more ranks than this run's {world_size} "
                              f"({extra[-1]} exists)")
    # Step 2: load and check; a failure on one rank is reported there and named on the others.
    error, data = None, None
    try:
        data = checkpoint.load(directory, rank, world_size, cfg.model, cfg.mode)
        model.load_state_dict(data["model"])
        strategy.opt.load_state_dict(data["optimizer"])
    except CheckpointError as exc:
        error = exc
    except (ValueError, RuntimeError, KeyError) as exc:  # shape or wrapper-state mismatch
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        error = CheckpointError(f"checkpoint {checkpoint.rank_file(directory, rank)} does not fit this run: {first}")
    first_failed = _all_reduce([rank if error else world_size], dist.ReduceOp.MIN, device)[0]
    if error is not None:
        raise error
    if first_failed < world_size:
        raise CheckpointError(f"checkpoint {directory} failed to load on rank {first_failed}")
    # Step 3: all ranks must resume at the same step (one may have died between two saves).
    step = int(data["step"])
    low, neg_high = _all_reduce([step, -step], dist.ReduceOp.MIN, device)
    if low != -neg_high:
        raise CheckpointError(f"checkpoint {directory} is inconsistent: ranks hold steps {low} to {-neg_high}")
    checkpoint.restore_rng(data["rng"])
    return Position(int(data["epoch"]), int(data["step_in_epoch"]), step), True
