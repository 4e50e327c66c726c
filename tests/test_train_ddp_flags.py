"""The trainer's flags for DDP users (--clip-grad-norm, --accumulate, --buffers): one-line errors, and a real
PipeSGD run at world size 1 whose records carry what the flags promise."""
from __future__ import annotations

import json

import pytest

from pipesgd.train import cli
from pipesgd.train.cli import main
from pipesgd.train.config import TrainConfig
from pipesgd.train.data import build_dataset
from tests.single_process import process_group  # noqa: F401 - a fixture

BAD_INPUTS = [
    (["--clip-grad-norm", "-1"], "--clip-grad-norm must not be negative"),
    (["--mode", "ddp", "--clip-grad-norm", "1"], "--clip-grad-norm applies to --mode pipe|sync only"),
    (["--accumulate", "0"], "--accumulate must be at least 1"),
    (["--accumulate", "3"], "--batch-size 32 must be divisible by --accumulate 3"),
    (["--buffers", "sum"], "unknown --buffers 'sum' (valid: broadcast, average, none)"),
    (["--mode", "ddp", "--buffers", "average"], "--buffers applies to --mode pipe|sync only, not ddp"),
]


@pytest.mark.parametrize("argv,message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesgd-train: error: ") and message in err, err


ARGS = dict(dataset="synthetic", synthetic_samples=200, synthetic_features=8, synthetic_classes=3, batch_size=16,
            steps=12, eval_every=0, timeout=30.0, model="bncnn")


def _steps(cfg: TrainConfig) -> list[dict]:
    cli.run(cfg, build_dataset(cfg), rank=0, world_size=1, local_rank=0)
    with open(cfg.metrics) as handle:
        return [r for r in map(json.loads, handle) if r["type"] == "step"]


def test_records_carry_the_grad_norm_and_accumulation_keeps_the_update(tmp_path, process_group):  # noqa: F811
    """With an MLP (no BatchNorm) two micro-batches of 8 give the batch-of-16 update up to rounding."""
    base = dict(ARGS, model="mlp", hidden=16)
    whole = _steps(TrainConfig(**base, metrics=str(tmp_path / "a.jsonl")))
    halves = _steps(TrainConfig(**base, accumulate=2, metrics=str(tmp_path / "b.jsonl")))
    assert [r["loss"] for r in halves] == pytest.approx([r["loss"] for r in whole], rel=1e-5)
    assert all("grad_norm" not in r for r in whole)
    clipped = _steps(TrainConfig(**base, clip_grad_norm=0.05, metrics=str(tmp_path / "c.jsonl")))
    norms = [r["grad_norm"] for r in clipped if r["applied_step"] is not None]
    assert len(norms) == 11 and min(norms) > 0.05  # reported before the clip, which acted on every step
    assert clipped[-1]["loss"] != pytest.approx(whole[-1]["loss"], rel=1e-3)


def test_a_batchnorm_model_runs_with_every_buffer_mode(tmp_path, process_group):  # noqa: F811
    for mode in ("broadcast", "average", "none"):
        steps = _steps(TrainConfig(**ARGS, buffers=mode, metrics=str(tmp_path / f"{mode}.jsonl")))
        assert len(steps) == 12 and all("t_buffers" not in r for r in steps)  # world size 1: nothing to sync
