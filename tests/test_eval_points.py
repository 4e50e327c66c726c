"""Evaluation points of ``pipesgd-train``: ``--eval-steps`` beside ``--eval-every``, and ``--eval-deferred`` (the
weights copied at each point, evaluated after training: the same results, none of the run's time)."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from pipesgd.train import cli, loop
from pipesgd.train import metrics as metrics_module
from pipesgd.train.checkpoint import Position
from pipesgd.train.config import ConfigError, TrainConfig
from pipesgd.train.data import build_dataset
from pipesgd.train.eval_points import EvalPoints
from pipesgd.train.metrics import MetricsWriter
from pipesgd.train.strategy import Strategy
from tests.single_process import RecordingWrapper, process_group  # noqa: F401 - a fixture

ARGS = dict(dataset="synthetic", synthetic_samples=100, synthetic_features=8, synthetic_classes=3, batch_size=16,
            steps=12, eval_every=1, eval_steps=3, timeout=30.0, mode="pipe", width=2, lr=0.5)


def _evals(path) -> list[dict]:
    with open(path) as handle:
        return [r for r in map(json.loads, handle) if r["type"] == "eval"]


def test_points_are_every_n_steps_and_epoch_ends_but_never_the_last_step():
    points = EvalPoints(every_epochs=2, every_steps=3, total_steps=12)
    due = [step for step in range(1, 13) if points.due(Position(step // 5, step % 5, step), step % 5 == 0)]
    assert due == [3, 6, 9, 10]  # 12 is left to the final evaluation; epoch 1 (step 5) is not a 2nd epoch
    assert not EvalPoints(0, 0, 12).due(Position(1, 0, 5), True)


def test_deferred_evaluation_gives_the_online_results_with_the_copies_clock(tmp_path, process_group):  # noqa: F811
    """Pipe-SGD with look-ahead at world size 1: each copy holds the weights the online evaluation saw (the
    applied ones, not the look-ahead's), so every point's accuracy and loss are the same; the records come after
    training, at the copies' wall clock, in order."""
    runs = {}
    for deferred in (False, True):
        cfg = TrainConfig(**ARGS, eval_deferred=deferred, metrics=str(tmp_path / f"{deferred}.jsonl"))
        cli.run(cfg, build_dataset(cfg), rank=0, world_size=1, local_rank=0)
        runs[deferred] = _evals(cfg.metrics)
    online, deferred = runs[False], runs[True]
    assert [r["step"] for r in online] == [3, 5, 6, 9, 10, 12]  # 5 steps per epoch here
    assert [(r["step"], r["accuracy"], r["loss"]) for r in deferred] == \
        [(r["step"], r["accuracy"], r["loss"]) for r in online]
    assert len({r["loss"] for r in online}) == len(online)  # the weights moved between points
    assert [r.get("deferred", False) for r in deferred] == [True] * 5 + [False]  # the final one is live
    walls = [r["wall"] for r in deferred]
    assert walls == sorted(walls)


def test_deferred_points_cost_the_run_no_evaluation_time(tmp_path, monkeypatch):
    """On a clock that moves 1 s per evaluation, online points are 1 s later for each point before them; deferred
    points are not (their evaluations run after the last step)."""
    clock = {"now": 100.0}

    class Clock:
        perf_counter = staticmethod(lambda: clock["now"])
        process_time = staticmethod(lambda: clock["now"])
        time_ns = staticmethod(lambda: int(clock["now"] * 1e9))

    def slow_evaluate(*args, **kwargs):
        clock["now"] += 1.0
        return 0.5, 1.0

    def forward_backward(model, x, y, *rest):
        clock["now"] += 0.01
        return torch.zeros(())

    monkeypatch.setattr(loop, "time", Clock)
    monkeypatch.setattr(loop, "evaluate", slow_evaluate)
    monkeypatch.setattr(loop, "forward_backward", forward_backward)
    monkeypatch.setattr(metrics_module, "time", Clock)

    gaps = {}
    for deferred in (False, True):
        cfg = TrainConfig(**{**ARGS, "mode": "sync", "width": 1}, eval_deferred=deferred,
                          metrics=str(tmp_path / f"{deferred}.jsonl"))
        writer = MetricsWriter(cfg.metrics, 0, 1)
        loop.train(cfg, build_dataset(cfg), nn.Linear(8, 3), Strategy(RecordingWrapper(), nn.Linear(8, 3), 0, 1),
                   torch.device("cpu"), writer, 0, 1, Position(), type("W", (), {"beat": lambda self: None})())
        writer.close()
        walls = [r["wall"] for r in _evals(cfg.metrics)]
        gaps[deferred] = [later - earlier for earlier, later in zip(walls, walls[1:])]
    # points 3, 5, 6, 9, 10 and the final 12: online, each gap holds the evaluation before it (1 s); deferred, the
    # steps alone (the final point too: not the deferred points' evaluations, which run after it)
    assert len(gaps[False]) == len(gaps[True]) == 5
    assert all(gap > 1.0 for gap in gaps[False])
    assert all(gap < 0.1 for gap in gaps[True])


@pytest.mark.parametrize("flags, message", [
    (dict(eval_steps=-1), "--eval-steps must not be negative"),
    (dict(eval_every=0, eval_steps=0, eval_deferred=True), "--eval-deferred needs evaluation points"),
])
def test_bad_evaluation_flags_are_one_clear_error(flags, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{**ARGS, **flags})
