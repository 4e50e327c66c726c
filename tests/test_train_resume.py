"""Checkpoint and ``--resume`` in one process (a world-size-1 gloo group): the saved layout restores the exact
trajectory, and each way a checkpoint can be unusable is one clear CheckpointError."""
from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from pipesgd import PipeSGD
from pipesgd.train import checkpoint
from pipesgd.train.checkpoint import CheckpointError, Position, RunIdentity
from tests.single_process import process_group  # noqa: F401 - a fixture

CPU = torch.device("cpu")
RUN = RunIdentity(world_size=1, model_name="mlp", mode="pipe")


def _build(seed: int, hidden: int = 8):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=2, warmup_steps=2)
    return model, opt


def _train(model, opt, steps) -> None:
    for t in steps:
        g = torch.Generator().manual_seed(t)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        nn.functional.mse_loss(model(x) + 0.01 * torch.randn(8, 2), y).backward()  # draws from torch's RNG
        opt.step()
        opt.zero_grad()


def test_resume_continues_the_identical_trajectory(tmp_path, process_group):  # noqa: F811
    model, opt = _build(0)
    _train(model, opt, range(5))  # past warm-up: one step's gradient is in flight when saving
    assert opt.in_flight == 1
    checkpoint.save_run(str(tmp_path), 0, RUN, model, opt, Position(1, 2, 5))
    _train(model, opt, range(5, 9))
    opt.flush()
    reference = [p.detach().clone() for p in model.parameters()]
    opt.close()

    model2, opt2 = _build(1)  # other initial weights: everything must come from the checkpoint
    assert checkpoint.restore(str(tmp_path), 0, RUN, model2, opt2, CPU) == Position(1, 2, 5)
    assert opt2.in_flight == 1
    _train(model2, opt2, range(5, 9))
    opt2.flush()
    for got, want in zip(model2.parameters(), reference, strict=True):
        assert torch.equal(got, want)
    opt2.close()


def test_no_checkpoint_is_a_fresh_start(tmp_path, process_group):  # noqa: F811
    model, opt = _build(0)
    before = [p.detach().clone() for p in model.parameters()]
    assert checkpoint.restore(str(tmp_path / "empty"), 0, RUN, model, opt, CPU) is None
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    opt.close()


def test_unusable_checkpoints_are_named(tmp_path, process_group):  # noqa: F811
    model, opt = _build(0)
    checkpoint.save_run(str(tmp_path), 0, RUN, model, opt, Position())
    with pytest.raises(CheckpointError, match="mode 'pipe', this run uses 'sync'"):
        checkpoint.restore(str(tmp_path), 0, RunIdentity(1, "mlp", "sync"), model, opt, CPU)
    wider, wider_opt = _build(0, hidden=16)
    with pytest.raises(CheckpointError, match="rank0.pt does not fit this run"):
        checkpoint.restore(str(tmp_path), 0, RUN, wider, wider_opt, CPU)
    shutil.copy(tmp_path / "rank0.pt", tmp_path / "rank1.pt")
    with pytest.raises(CheckpointError, match=r"written by more ranks than this run's 1 \(.*rank1.pt exists\)"):
        checkpoint.restore(str(tmp_path), 0, RUN, model, opt, CPU)
    opt.close()
    wider_opt.close()
