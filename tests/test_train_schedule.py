"""The learning-rate schedule (``--lr-schedule``, ``--lr-warmup-steps``): its values at the warm-up's start and end
and at the last step, its one-line config errors, and that the loop sets it per step and a resumed loop continues it."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pipesgd.train import loop
from pipesgd.train.checkpoint import Position
from pipesgd.train.config import ConfigError, TrainConfig
from pipesgd.train.flags import resolve
from pipesgd.train.data import make_synthetic
from pipesgd.train.metrics import MetricsWriter
from pipesgd.train.schedule import FINAL_LR_FRACTION, LRSchedule, build_schedule
from pipesgd.train.strategy import Strategy
from tests.single_process import RecordingWrapper


def test_cosine_after_a_linear_warm_up():
    s = LRSchedule("cosine", peak_lr=2.0, warmup_steps=10, total_steps=111)  # 100 steps of decay after step 10
    assert s.lr_at(0) == pytest.approx(2.0 / 11) and s.lr_at(9) == pytest.approx(2.0 * 10 / 11)
    assert s.lr_at(10) == pytest.approx(2.0)  # the warm-up's line reaches the peak where the decay starts
    assert s.lr_at(60) == pytest.approx(2.0 * (FINAL_LR_FRACTION + 1) / 2)  # half way down the cosine
    assert s.lr_at(110) == pytest.approx(2.0 * FINAL_LR_FRACTION)  # the last step
    assert s.lr_at(111) == s.lr_at(500) == pytest.approx(2.0 * FINAL_LR_FRACTION)  # what flush() applies
    rates = [s.lr_at(step) for step in range(111)]
    assert all(a < b for a, b in zip(rates[:10], rates[1:11]))
    assert all(a > b for a, b in zip(rates[10:110], rates[11:111]))


def test_constant_keeps_the_peak_after_its_warm_up_and_without_one_leaves_lr_alone():
    s = LRSchedule("constant", peak_lr=0.5, warmup_steps=3, total_steps=20)
    assert [s.lr_at(step) for step in (0, 2, 3, 19)] == pytest.approx([0.125, 0.375, 0.5, 0.5])
    assert build_schedule("constant", 0.5, 0, 20) is None
    no_warmup = build_schedule("cosine", 0.5, 0, 3)
    assert [no_warmup.lr_at(step) for step in range(3)] == pytest.approx([0.5, 0.5 * 0.55, 0.05])
    assert LRSchedule("cosine", 1.0, 0, 1).lr_at(0) == 1.0  # a one-step run: no decay to spread
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'step'"):
        LRSchedule("step", 1.0, 0, 10)


def test_apply_sets_every_group():
    groups = [{"lr": 1.0, "params": []}, {"lr": 1.0, "params": [], "weight_decay": 0.0}]
    LRSchedule("cosine", 1.0, 4, 10).apply(groups, 1)
    assert [g["lr"] for g in groups] == [0.4, 0.4]


@pytest.mark.parametrize("argv, message", [
    (["--lr-schedule", "linear"], "unknown --lr-schedule 'linear' (valid: constant, cosine)"),
    (["--lr-warmup-steps", "-1"], "--lr-warmup-steps must not be negative (got -1)"),
    (["--lr-warmup-steps", "10", "--steps", "10"], "--lr-warmup-steps 10 must be fewer than --steps 10"),
])
def test_bad_schedule_flags_are_one_line_errors(argv, message):
    with pytest.raises(ConfigError) as info:
        resolve(argv)
    assert str(info.value) == message


class LRRecordingWrapper(RecordingWrapper):
    """Records the learning rate in force at each step() and at flush()."""

    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []

    def step(self):
        self.rates.append(self.param_groups[0]["lr"])
        return super().step()

    def flush(self):
        self.rates.append(self.param_groups[0]["lr"])
        return super().flush()


class NoWatchdog:
    def beat(self) -> None:
        pass


def _run(start: Position, **overrides) -> list[float]:
    """The rates of a loop over 80 synthetic samples (5 steps per epoch of 16), 15 steps, from ``start``."""
    cfg = TrainConfig(**{**dict(dataset="synthetic", synthetic_samples=100, synthetic_features=8, synthetic_classes=3,
                                batch_size=16, epochs=3, eval_every=0, lr=0.1), **overrides})
    ds = make_synthetic(100, 8, 3, seed=0)
    wrapper = LRRecordingWrapper()
    metrics = MetricsWriter("", 0, 1)
    model = nn.Linear(8, 3)
    loop.train(cfg, ds, model, Strategy(wrapper, model, 0, 1), torch.device("cpu"), metrics, 0, 1, start, NoWatchdog())
    return wrapper.rates


def test_the_loop_sets_each_steps_rate_and_a_resumed_loop_continues_the_schedule():
    schedule = LRSchedule("cosine", 0.1, 4, 15)
    full = _run(Position(), lr_schedule="cosine", lr_warmup_steps=4)
    assert full == pytest.approx([schedule.lr_at(step) for step in range(16)])  # 15 steps, then flush()
    resumed = _run(Position(1, 2, 7), lr_schedule="cosine", lr_warmup_steps=4)
    assert resumed == pytest.approx(full[7:])
    assert math.isclose(full[-1], 0.1 * FINAL_LR_FRACTION)


def test_the_default_leaves_the_optimizers_rate_alone():
    assert _run(Position()) == [0.1] * 16  # the fake's own lr, not --lr: nothing was written
