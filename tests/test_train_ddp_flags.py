"""The trainer's flags for DDP users (--clip-grad-norm, --accumulate, --buffers, --amp, --compile): one-line
errors, and a real PipeSGD run at world size 1 whose records carry what the flags promise."""
from __future__ import annotations

import json

import pytest
import torch

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
    (["--amp", "fp8"], "unknown --amp 'fp8' (valid: none, bf16, fp16)"),
    (["--mode", "ddp", "--amp", "fp16"], "--amp fp16 applies to --mode pipe|sync only"),
    (["--mode", "ps-sync", "--amp", "fp16"], "--amp bf16 needs no scaler and works with every mode"),
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


def test_mixed_precision_runs_track_the_fp32_losses(tmp_path, process_group):  # noqa: F811
    """bf16 autocast and fp16 with PipeSGD's loss scaler, 12 steps of an MLP: losses within 1e-3 of fp32
    (measured 1.8e-4 for bf16, 2.4e-5 for fp16), and not equal to them (the autocast did run)."""
    base = dict(ARGS, model="mlp", hidden=16)
    fp32 = [r["loss"] for r in _steps(TrainConfig(**base, metrics=str(tmp_path / "fp32.jsonl")))]
    for amp in ("bf16", "fp16"):
        steps = _steps(TrainConfig(**base, amp=amp, metrics=str(tmp_path / f"{amp}.jsonl")))
        losses = [r["loss"] for r in steps]
        assert losses == pytest.approx(fp32, abs=1e-3) and losses != fp32, amp
        assert not any(r["skipped_nonfinite"] for r in steps)


def test_fp16_scales_each_micro_batch_loss_before_backward():
    """The loop's forward/backward with an fp16 scaler leaves scale x the gradient in p.grad, for the wrapper to
    unscale (not bit for bit: unscaled, small fp16 intermediate gradients lose digits, which is why one scales)."""
    from pipesgd.train.loop import forward_backward
    from pipesgd.train.precision import Precision

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    grads = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=1024.0)):
        model.zero_grad()
        loss = forward_backward(model, x, y, 2, Precision("cpu", torch.float16, scaler))
        grads.append([p.grad.clone() for p in model.parameters()])
    assert float(loss) > 0
    for unscaled, scaled in zip(*grads):
        torch.testing.assert_close(scaled / 1024.0, unscaled, rtol=1e-2, atol=1e-5)


@pytest.mark.slow
def test_compiled_forward_gives_the_eager_losses(tmp_path, process_group):  # noqa: F811
    from tests.test_compile import _compile_works

    reason = _compile_works()
    if reason is not None:
        pytest.skip(reason)
    base = dict(ARGS, model="mlp", hidden=16)
    eager = [r["loss"] for r in _steps(TrainConfig(**base, metrics=str(tmp_path / "eager.jsonl")))]
    compiled = [r["loss"] for r in _steps(TrainConfig(**base, compile=True, metrics=str(tmp_path / "c.jsonl")))]
    assert compiled == pytest.approx(eager, rel=1e-4)
