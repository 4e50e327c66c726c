"""Checkpoints: one file per rank, written atomically, loaded with ``torch.load(weights_only=True)``.

Each rank saves its own file (``DIR/rank{N}.pt``) because Pipe-SGD state differs per rank (error-feedback
residuals, in-flight gradients). A file holds the model, the optimizer wrapper's state, the RNG states
(torch, numpy, python; as tensors and lists) and the data position, so ``--resume`` continues the exact
trajectory of an uninterrupted run. Only tensors and primitive containers are stored.
"""
from __future__ import annotations

import glob
import os
import random
import re

import numpy as np
import torch
from pipesgd.atomic import atomic_open

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message is the one line shown to the user."""


def rank_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.pt")


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


def save(directory: str, rank: int, payload: dict) -> str:
    """Write ``payload`` to this rank's file atomically: a temp file in the same directory, then os.replace."""
    path = rank_file(directory, rank)
    with atomic_open(path, "wb") as f:
        torch.save({"format": FORMAT_VERSION, **payload}, f)
    return path


def exists(directory: str, rank: int) -> bool:
    return os.path.isfile(rank_file(directory, rank))


def load(directory: str, rank: int, world_size: int, model_name: str, mode: str) -> dict:
    """Load and check this rank's checkpoint; raise CheckpointError naming what does not match."""
    path = rank_file(directory, rank)
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
    files = []
    for path in glob.glob(os.path.join(directory, "rank*.pt")):
        match = re.fullmatch(r"rank(\d+)\.pt", os.path.basename(path))
        if match and int(match.group(1)) >= world_size:
            files.append(path)
    return sorted(files)
