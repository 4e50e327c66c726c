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


class FakeClock:
    """``loop.time`` on a clock that moves only when the test says: every span of a step is known exactly."""

    def __init__(self) -> None:
        self.now = 100.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def perf_counter(self) -> float:
        return self.now

    def process_time(self) -> float:
        return self.now / 2  # as if one core of two did the work

    def time_ns(self) -> int:
        return int(self.now * 1e9)


def test_t_iter_is_the_whole_iteration_less_evaluation_and_checkpoints(tmp_path, monkeypatch):
    """The record's write, the batch fetch and the loss read belong to an iteration (the previous step's write is
    in the next step's t_iter); evaluation and checkpoints are left out, so the steps add up to the run's clock
    less those."""
    cfg, ds, model, strategy, _, saved = _setup(tmp_path, monkeypatch, checkpoint=str(tmp_path / "ckpt"),
                                                checkpoint_every=2)
    clock = FakeClock()
    monkeypatch.setattr(loop, "time", clock)
    compute_s, write_s, fetch_s, eval_s, save_s = 0.003, 0.010, 0.0005, 1.0, 2.0

    def timed(seconds, fn):
        def run(*args, **kwargs):
            clock.advance(seconds)
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(loop, "forward_backward", timed(compute_s, loop.forward_backward))
    monkeypatch.setattr(loop, "evaluate", timed(eval_s, loop.evaluate))
    monkeypatch.setattr(checkpoint, "save_run", timed(save_s, checkpoint.save_run))
    monkeypatch.setattr(MetricsWriter, "write_step", timed(write_s, MetricsWriter.write_step))
    real_batches = loop.shard_batches

    def slow_batches(*args, **kwargs):
        for batch in real_batches(*args, **kwargs):
            clock.advance(fetch_s)
            yield batch

    monkeypatch.setattr(loop, "shard_batches", slow_batches)
    metrics = MetricsWriter(cfg.metrics, 0, 1)
    start = clock.now
    loop.train(cfg, ds, model, strategy, torch.device("cpu"), metrics, 0, 1, Position(), Beats())
    metrics.close()
    steps = [r for r in _records(cfg.metrics) if r["type"] == "step"]
    evals = [r for r in _records(cfg.metrics) if r["type"] == "eval"]
    assert len(saved) > 2 and len(evals) > 2  # both pauses happened between steps
    assert steps[0]["t_iter"] == pytest.approx(fetch_s + compute_s)
    assert [r["t_iter"] for r in steps[1:]] == pytest.approx([write_s + fetch_s + compute_s] * (len(steps) - 1))
    assert all(r["t_data"] == pytest.approx(fetch_s) for r in steps)
    assert all(r["t_cpu"] == pytest.approx(r["t_iter"] / 2) for r in steps)
    # the final evaluation and checkpoint come after the last step; the last write is in no step
    paused = eval_s * len(evals) + save_s * len(saved)
    assert sum(r["t_iter"] for r in steps) == pytest.approx(clock.now - start - paused - write_s)
