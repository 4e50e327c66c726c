"""The training loop against a recording wrapper (no processes): call order, records, positions, checkpoints."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from pipesgd.train import checkpoint, loop
from pipesgd.train.checkpoint import Position
from pipesgd.train.config import TrainConfig
from pipesgd.train.data import make_synthetic, steps_per_epoch
from pipesgd.train.metrics import STEP_FIELDS, MetricsWriter
from pipesgd.train.strategy import Strategy
from pipesgd.wrapper import OptimizerWrapper
from tests.single_process import RecordingWrapper

BATCH = 16


class Beats:
    def __init__(self) -> None:
        self.count = 0

    def beat(self) -> None:
        self.count += 1


def _setup(tmp_path, monkeypatch, worker_rank=0, num_workers=1, **overrides):
    """A loop over 100 synthetic samples (80 train: 5 steps/epoch of 16 at one worker), checkpoints recorded."""
    ds = make_synthetic(100, 8, 3, seed=0)
    options = dict(dataset="synthetic", synthetic_samples=100, synthetic_features=8, synthetic_classes=3,
                   batch_size=BATCH, epochs=3, eval_every=1, metrics=str(tmp_path / "m.jsonl"))
    cfg = TrainConfig(**{**options, **overrides})
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    opt = RecordingWrapper()
    saved = []
    real_save = checkpoint.save_run

    def recording_save(directory, rank, run, model, opt_, pos):
        saved.append((pos.step, pos.epoch, pos.step_in_epoch, len(opt.calls)))
        return real_save(directory, rank, run, model, opt_, pos)

    monkeypatch.setattr(checkpoint, "save_run", recording_save)
    strategy = Strategy(opt, model, worker_rank, num_workers)
    return cfg, ds, model, strategy, opt, saved


def _records(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def test_the_fake_is_a_wrapper():
    assert isinstance(RecordingWrapper(), OptimizerWrapper)


def test_step_zero_grad_per_iteration_then_one_flush_and_no_close(tmp_path, monkeypatch):
    cfg, ds, model, strategy, opt, _ = _setup(tmp_path, monkeypatch)
    spe = steps_per_epoch(len(ds.x_train), 1, BATCH)
    metrics = MetricsWriter(cfg.metrics, 0, 1)
    beats = Beats()
    summary = loop.train(cfg, ds, model, strategy, torch.device("cpu"), metrics, 0, 1, Position(), beats)
    metrics.close()
    total = 3 * spe
    assert opt.calls == ["step", "zero_grad"] * total + ["flush"]  # closing is the caller's
    assert beats.count == total + 1
    assert summary["steps"] == total and summary["epochs"] == 3 and summary["num_workers"] == 1

    records = _records(cfg.metrics)
    steps = [r for r in records if r["type"] == "step"]
    assert [(r["step"], r["epoch"]) for r in steps] == [(s, s // spe) for s in range(total)]
    assert all(set(STEP_FIELDS) - {"wall"} <= set(r) for r in steps)
    # the wrapper's stats under the metrics' names, straight from what step() returned
    assert {(r["t_wait"], r["t_update"], r["bytes_sent"]) for r in steps} == {(0.25, 0.125, 64)}
    assert [r["applied_step"] for r in steps] == [None, *range(total - 1)]
    # an evaluation at the end of every epoch but the last, then the final one at the end
    assert [(r["step"], r["epoch"]) for r in records if r["type"] == "eval"] == [(spe, 1), (2 * spe, 2), (total, 3)]


def test_checkpoints_at_every_nth_step_and_before_the_flush(tmp_path, monkeypatch):
    cfg, ds, model, strategy, opt, saved = _setup(tmp_path, monkeypatch, checkpoint=str(tmp_path / "ck"),
                                                  checkpoint_every=4, eval_every=0)
    metrics = MetricsWriter("", 0, 1)
    loop.train(cfg, ds, model, strategy, torch.device("cpu"), metrics, 0, 1, Position(), Beats())
    total = len(opt.calls) // 2  # step + zero_grad per iteration, then flush
    assert total == 15
    # (step, epoch, step in epoch, wrapper calls so far): every 4th step, the last one before flush()
    assert saved == [(4, 0, 4, 8), (8, 1, 3, 16), (12, 2, 2, 24), (15, 3, 0, 30)]
    assert opt.calls[30:] == ["flush"]
    assert torch.load(tmp_path / "ck" / "rank0.pt", weights_only=True)["optimizer"] == {"steps": 15}


def test_a_resumed_loop_continues_at_its_position(tmp_path, monkeypatch):
    cfg, ds, model, strategy, opt, _ = _setup(tmp_path, monkeypatch, eval_every=0)
    metrics = MetricsWriter(cfg.metrics, 0, 1)
    loop.train(cfg, ds, model, strategy, torch.device("cpu"), metrics, 0, 1, Position(1, 2, 7), Beats())
    metrics.close()
    steps = [r for r in _records(cfg.metrics) if r["type"] == "step"]
    assert [(r["step"], r["epoch"]) for r in steps] == [(s, s // 5) for s in range(7, 15)]


def test_a_worker_that_does_not_report_writes_steps_only(tmp_path, monkeypatch):
    cfg, ds, model, strategy, opt, _ = _setup(tmp_path, monkeypatch, worker_rank=1, num_workers=2, epochs=1)
    metrics = MetricsWriter(cfg.metrics, 1, 2)
    summary = loop.train(cfg, ds, model, strategy, torch.device("cpu"), metrics, 1, 2, Position(), Beats())
    metrics.close()
    assert summary is None
    records = _records(tmp_path / "m.rank1.jsonl")
    assert {r["type"] for r in records} == {"step"} and len(records) == 2  # 40 samples per worker, batch 16


def test_a_non_finite_loss_stops_the_run_after_recording_it(tmp_path, monkeypatch):
    cfg, ds, model, strategy, opt, _ = _setup(tmp_path, monkeypatch)
    with torch.no_grad():
        model.weight.fill_(float("nan"))
    metrics = MetricsWriter(cfg.metrics, 0, 1)
    with pytest.raises(FloatingPointError, match="loss is nan at step 0"):
        loop.train(cfg, ds, model, strategy, torch.device("cpu"), metrics, 0, 1, Position(), Beats())
    metrics.close()
    (record,) = _records(cfg.metrics)
    assert record["type"] == "step" and record["loss"] is None and opt.calls == ["step", "zero_grad"]


def test_position_advances_through_epochs():
    pos = Position()
    ends = [pos.advance(3) for _ in range(7)]
    assert ends == [False, False, True, False, False, True, False]
    assert (pos.epoch, pos.step_in_epoch, pos.step) == (2, 1, 7)
