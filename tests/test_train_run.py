"""``pipesgd-train``'s run in this process (world size 1, a recording wrapper): what a run writes, that the
wrapper is always closed, dedicated servers, and resuming from the run's own checkpoint."""
from __future__ import annotations

import json
import re

import pytest

from pipesgd.train import cli, loop
from pipesgd.train.config import TrainConfig
from pipesgd.train.data import build_dataset
from pipesgd.train.strategy import Strategy
from tests.single_process import RecordingWrapper, process_group  # noqa: F401 - a fixture

ARGS = dict(dataset="synthetic", synthetic_samples=100, synthetic_features=8, synthetic_classes=3,
            batch_size=16, steps=7, eval_every=0, timeout=30.0)


def _run(monkeypatch, cfg: TrainConfig, wrapper: RecordingWrapper, serve=None) -> None:
    """cli.run with ``wrapper`` in place of the mode's own."""
    monkeypatch.setattr(cli, "build_strategy", lambda cfg, model, device: Strategy(wrapper, model, 0, 1, serve))
    cli.run(cfg, build_dataset(cfg), rank=0, world_size=1, local_rank=0)


def _records(path) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def test_a_run_writes_its_record_and_closes_after_flush(tmp_path, monkeypatch, capsys, process_group):  # noqa: F811
    cfg = TrainConfig(**ARGS, metrics=str(tmp_path / "m.jsonl"), checkpoint=str(tmp_path / "ck"))
    wrapper = RecordingWrapper()
    _run(monkeypatch, cfg, wrapper)
    assert wrapper.calls == ["step", "zero_grad"] * 7 + ["flush", "close"]
    records = _records(cfg.metrics)
    assert [r["type"] for r in records] == ["config"] + ["step"] * 7 + ["eval", "summary"]
    config = records[0]
    assert config["world_size"] == 1 and config["num_workers"] == 1 and config["resumed_at_step"] is None
    assert config["width"] == 2 and config["backend"] == "gloo" and config["steps_per_epoch"] == 5
    assert records[-1]["steps"] == 7 and "done: mlp on synthetic" in capsys.readouterr().out
    for copy in (tmp_path / "m.config.json", tmp_path / "ck" / "config.json"):
        assert TrainConfig(**json.loads(copy.read_text())) == cfg


def test_one_final_result_evaluated_after_the_last_update(tmp_path, monkeypatch, capsys,
                                                         process_group):  # noqa: F811
    """Two epochs evaluated every epoch: the first epoch's line, then one final result (no line for the last epoch
    before it), evaluated after flush() and printed as the summary's accuracy."""
    cfg = TrainConfig(**{**ARGS, "steps": 10, "eval_every": 1}, metrics=str(tmp_path / "m.jsonl"))
    wrapper = RecordingWrapper()
    real_evaluate = loop.evaluate

    def evaluate(*args, **kwargs):
        wrapper.calls.append("evaluate")
        return real_evaluate(*args, **kwargs)
    monkeypatch.setattr(loop, "evaluate", evaluate)
    _run(monkeypatch, cfg, wrapper)
    assert wrapper.calls[-3:] == ["flush", "evaluate", "close"]  # the final evaluation sees every update
    out = capsys.readouterr().out
    summary = _records(cfg.metrics)[-1]
    assert summary["type"] == "summary" and summary["steps"] == 10 and summary["epochs"] == 2
    assert re.findall(r"^epoch \d+", out, re.M) == ["epoch 1"]  # epoch 2 is the final result's, printed once
    finals = [line for line in out.splitlines() if line.startswith("done:")]
    assert len(finals) == 1, out
    printed = re.findall(r"test accuracy ([\d.]+) %", out)
    assert printed[-1] == f"{100 * summary['accuracy']:.1f}" and finals[0].endswith(
        f"test accuracy {printed[-1]} % (loss {summary['test_loss']:.4f})")


def test_the_wrapper_is_closed_after_a_failure(tmp_path, monkeypatch, process_group):  # noqa: F811
    wrapper = RecordingWrapper(fail_at=2)
    with pytest.raises(RuntimeError, match="step 2 failed on purpose"):
        _run(monkeypatch, TrainConfig(**ARGS), wrapper)
    assert wrapper.calls[-1] == "close" and "flush" not in wrapper.calls


def test_a_dedicated_server_serves_writes_nothing_and_closes(tmp_path, monkeypatch, process_group):  # noqa: F811
    served = []
    wrapper = RecordingWrapper()
    _run(monkeypatch, TrainConfig(**ARGS, metrics=str(tmp_path / "m.jsonl")), wrapper, serve=lambda: served.append(1))
    assert served == [1] and wrapper.calls == ["close"] and list(tmp_path.iterdir()) == []


def test_resume_appends_to_the_same_record(tmp_path, monkeypatch, capsys, process_group):  # noqa: F811
    args = dict(ARGS, metrics=str(tmp_path / "m.jsonl"), checkpoint=str(tmp_path / "ck"), resume=True)
    first = RecordingWrapper()
    _run(monkeypatch, TrainConfig(**args), first)  # no checkpoint yet: a fresh start, said in one line
    assert "load_state_dict" not in first.calls
    assert f"pipesgd-train: --resume: no checkpoint in {tmp_path / 'ck'} yet; starting from step 0\n" in \
        capsys.readouterr().out
    second = RecordingWrapper()
    _run(monkeypatch, TrainConfig(**{**args, "steps": 10}), second)
    assert second.calls[0] == "load_state_dict" and second.steps == 10  # 7 restored + 3 run
    assert "resumed from" in capsys.readouterr().out
    records = _records(tmp_path / "m.jsonl")
    assert [r["resumed_at_step"] for r in records if r["type"] == "config"] == [None, 7]
    assert [r["step"] for r in records if r["type"] == "step"] == [*range(7), *range(7, 10)]


def test_a_trace_that_cannot_be_written_costs_no_summary(tmp_path, monkeypatch, process_group):  # noqa: F811
    """The summary is written first; the trace's failure then ends the run (as one line: the next test)."""
    def full_disk(path, rank, world_size):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(cli.trace, "write", full_disk)
    monkeypatch.setattr(cli.trace, "enable", lambda rank, steps: None)  # leave the recorder off for later tests
    cfg = TrainConfig(**ARGS, metrics=str(tmp_path / "m.jsonl"), trace=str(tmp_path / "t.json"))
    with pytest.raises(OSError, match="No space left"):
        _run(monkeypatch, cfg, RecordingWrapper())
    assert [r["type"] for r in _records(cfg.metrics)][-1] == "summary"


def test_an_os_error_during_the_run_is_one_line_and_exit_1(monkeypatch, capsys):
    exits = []

    def leave(code):
        exits.append(code)
        raise SystemExit(code)
    monkeypatch.setattr(cli.os, "_exit", leave)
    try:
        with pytest.raises(SystemExit):
            cli.fail(OSError(28, "No space left on device"), TrainConfig(**ARGS), 0, 1, debug=False)
    finally:
        cli._fail_lock.release()  # os._exit would have ended the process holding it
    err = capsys.readouterr().err
    assert exits == [1] and err == "pipesgd-train: error: rank 0: [Errno 28] No space left on device\n"
