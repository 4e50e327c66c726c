"""Where a run stands and how it is saved and resumed: ``Position``, the checkpoint layout, ``--resume``.

Each rank saves its own file (``DIR/rankN.pt``), since Pipe-SGD state differs per rank; it holds the model, the
wrapper's state, the RNG states and the position, so ``--resume`` continues the exact trajectory. Written
atomically, loaded with ``torch.load(weights_only=True)``: only tensors and primitive containers are stored."""
from __future__ import annotations

import glob
import os
import random
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from timing_model.atomic import atomic_open
from pipesgd.wrapper import OptimizerWrapper

FORMAT_VERSION = 2  # 2: PipeSGD's state shaped like a torch optimizer's
_CHECKPOINT_NAME = re.compile(r"rank(\d+)\.pt")


def checkpoint_path(directory: str, rank: int) -> str:
    """This rank's checkpoint file in ``directory``."""
    return os.path.join(directory, f"rank{rank}.pt")


def checkpoint_ranks(directory: str) -> list[int]:
    """The ranks that have a checkpoint file in ``directory``, sorted."""
    names = (_CHECKPOINT_NAME.fullmatch(os.path.basename(path))
             for path in glob.glob(os.path.join(glob.escape(directory), "rank*.pt")))
    return sorted(int(match.group(1)) for match in names if match)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message is the one line shown to the user."""


@dataclass(slots=True)
class Position:
    """Where training stands: the next step to run (global, and within its epoch)."""

    epoch: int = 0
    step_in_epoch: int = 0
    step: int = 0

    def advance(self, steps_per_epoch: int) -> bool:
        """Count one finished step; True if it ended an epoch (the position is then at the next one's start)."""
        self.step += 1
        self.step_in_epoch += 1
        if self.step_in_epoch != steps_per_epoch:
            return False
        self.epoch, self.step_in_epoch = self.epoch + 1, 0
        return True


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """What a checkpoint must share with the run that loads it."""

    world_size: int
    model_name: str
    mode: str


# -- RNG states as tensors and lists (weights_only loading accepts nothing else) -------------------------
def capture_rng() -> dict:
    """The RNG states of torch (CPU and CUDA), numpy and python as tensors, lists and numbers."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": str(np_state[0]), "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": py_version, "internal": list(py_internal), "gauss_next": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state((np_state["name"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# -- one rank's file --------------------------------------------------------------------------------------
def save(directory: str, rank: int, payload: dict) -> str:
    """Write ``payload`` to this rank's file atomically: a temp file in the same directory, then os.replace."""
    path = checkpoint_path(directory, rank)
    with atomic_open(path, "wb") as f:
        torch.save({"format": FORMAT_VERSION, **payload}, f)
    return path


def exists(directory: str, rank: int) -> bool:
    return os.path.isfile(checkpoint_path(directory, rank))


def load(directory: str, rank: int, world_size: int, model_name: str, mode: str) -> dict:
    """Load and check this rank's checkpoint; raise CheckpointError naming what does not match."""
    path = checkpoint_path(directory, rank)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} not found") from None
    except Exception as exc:  # noqa: BLE001 - zip, unpickling and EOF errors all mean "unreadable"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint {path} is corrupt or not a pipesgd checkpoint ({reason[:120]})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} is not a pipesgd checkpoint (format {FORMAT_VERSION})")
    if data["world_size"] != world_size:
        raise CheckpointError(f"checkpoint {path} was written by {data['world_size']} ranks, this run has {world_size}")
    if data["model_name"] != model_name:
        raise CheckpointError(f"checkpoint {path} holds model {data['model_name']!r}, this run builds {model_name!r}")
    if data["mode"] != mode:
        raise CheckpointError(f"checkpoint {path} was written in mode {data['mode']!r}, this run uses {mode!r}")
    return data


def extra_rank_files(directory: str, world_size: int) -> list[str]:
    """Rank files beyond this world size (a checkpoint written by a larger run)."""
    return [checkpoint_path(directory, r) for r in checkpoint_ranks(directory) if r >= world_size]


# -- the run's layout: what a checkpoint holds, written and read back in one place ------------------------
def save_run(directory: str, rank: int, run: RunIdentity, model: nn.Module, opt: OptimizerWrapper,
             pos: Position) -> str:
    """Checkpoint this rank of the run at ``pos``."""
    return save(directory, rank, {
        "world_size": run.world_size, "rank": rank, "model_name": run.model_name, "mode": run.mode,
        "model": model.state_dict(), "optimizer": opt.state_dict(), "rng": capture_rng(),
        "epoch": pos.epoch, "step_in_epoch": pos.step_in_epoch, "step": pos.step,
    })


def _all_reduce(values: list[int], op, device: torch.device) -> list[int]:
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=op)
    return [int(v) for v in t.tolist()]


def restore(directory: str, rank: int, run: RunIdentity, model: nn.Module, opt: OptimizerWrapper,
            device: torch.device) -> Position | None:
    """``--resume``: load this rank's checkpoint into ``model`` and ``opt`` if the run has one (a collective).

    Returns the position to continue from, or None when the directory holds no checkpoint yet (so one command line
    serves the first launch and torchrun's restarts). A checkpoint missing on some ranks, failing to load on one, or
    holding different steps stops every rank with one clear line."""
    world_size = run.world_size
    # Step 1: every rank must agree whether there is a checkpoint at all.
    have = _all_reduce([int(exists(directory, rank))], dist.ReduceOp.SUM, device)[0]
    if have == 0:
        return None
    if have != world_size:
        raise CheckpointError(f"checkpoint {directory} has files for {have} of this run's {world_size} ranks")
    extra = extra_rank_files(directory, world_size)
    if extra:
        raise CheckpointError(f"checkpoint {directory} was written by more ranks than this run's {world_size} "
                              f"({extra[-1]} exists)")
    # Step 2: load and check; a failure on one rank is reported there and named on the others.
    error, data = None, None
    try:
        data = load(directory, rank, world_size, run.model_name, run.mode)
        model.load_state_dict(data["model"])
        opt.load_state_dict(data["optimizer"])
    except CheckpointError as exc:
        error = exc
    except (ValueError, RuntimeError, KeyError) as exc:  # shape or wrapper-state mismatch
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        error = CheckpointError(f"checkpoint {checkpoint_path(directory, rank)} does not fit this run: {first}")
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
    restore_rng(data["rng"])
    return Position(int(data["epoch"]), int(data["step_in_epoch"]), step)
