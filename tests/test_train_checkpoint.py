"""Checkpoint files: atomic writes, weights_only loading, RNG round trip, clear errors."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from pipesgd.train import checkpoint
from pipesgd.train.checkpoint import CheckpointError


def _payload(step=3, world_size=2, model_name="mlp", mode="pipe"):
    return {"world_size": world_size, "rank": 0, "model_name": model_name, "mode": mode,
            "model": {"w": torch.arange(4.0)}, "optimizer": {"state": {}, "in_flight": [{"step": 2}]},
            "rng": checkpoint.capture_rng(), "epoch": 0, "step_in_epoch": step, "step": step}


def test_roundtrip_and_rng(tmp_path):
    checkpoint.save(str(tmp_path), 0, _payload())
    expected = (torch.rand(3), np.random.rand(3), random.random())
    data = checkpoint.load(str(tmp_path), 0, 2, "mlp", "pipe")
    assert torch.equal(data["model"]["w"], torch.arange(4.0)) and data["step"] == 3
    checkpoint.restore_rng(data["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def test_write_is_atomic(tmp_path, monkeypatch):
    checkpoint.save(str(tmp_path), 0, _payload(step=1))

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(str(tmp_path), 0, _payload(step=2))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["rank0.pt"]  # no temp file left behind
    assert checkpoint.load(str(tmp_path), 0, 2, "mlp", "pipe")["step"] == 1  # old file intact


def test_corrupt_file_is_one_clear_error(tmp_path):
    checkpoint.save(str(tmp_path), 0, _payload())
    path = tmp_path / "rank0.pt"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="rank0.pt is corrupt or not a pipesgd checkpoint") as info:
        checkpoint.load(str(tmp_path), 0, 2, "mlp", "pipe")
    assert "\n" not in str(info.value)


def test_mismatches_are_named(tmp_path):
    checkpoint.save(str(tmp_path), 0, _payload())
    with pytest.raises(CheckpointError, match="written by 2 ranks, this run has 4"):
        checkpoint.load(str(tmp_path), 0, 4, "mlp", "pipe")
    with pytest.raises(CheckpointError, match="holds model 'mlp', this run builds 'lenet'"):
        checkpoint.load(str(tmp_path), 0, 2, "lenet", "pipe")
    with pytest.raises(CheckpointError, match="mode 'pipe', this run uses 'sync'"):
        checkpoint.load(str(tmp_path), 0, 2, "mlp", "sync")
    checkpoint.save(str(tmp_path), 3, _payload())
    assert checkpoint.extra_rank_files(str(tmp_path), 2) == [str(tmp_path / "rank3.pt")]


def test_pickled_objects_are_refused(tmp_path):
    # weights_only loading: a file holding arbitrary Python objects is rejected, not executed.
    torch.save({"format": 1, "evil": object()}, tmp_path / "rank0.pt")
    with pytest.raises(CheckpointError, match="corrupt or not a pipesgd checkpoint"):
        checkpoint.load(str(tmp_path), 0, 2, "mlp", "pipe")
