"""The DDP tutorial's loop switched to PipeSGD (the README's migration guide): a BatchNorm CNN on digits with
parameter groups, OneCycleLR on ``opt`` itself, bf16 autocast, two micro-batches per step and a clip, on 2
gloo ranks at width 2. It must learn, end with parameters and buffers bitwise identical on every rank, and
never apply a gradient whose norm exceeds the clip (slow: a few epochs)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD
from experiments.harness.rank_launch import free_port
from pipesgd.train.data import load_digits
from pipesgd.train.models import build_model
from tests.distributed import run_ranks

pytestmark = pytest.mark.slow
EPOCHS, BATCH, ACCUMULATE, CLIP = 6, 32, 2, 1.0


def _tutorial_loop(rank: int, world: int):
    ds = load_digits(seed=0)
    torch.manual_seed(rank)  # a seed per rank, as many scripts do: PipeSGD starts every rank from rank 0's model
    model = build_model("bncnn", ds.input_shape, ds.num_classes)
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    inner = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=0.05, momentum=0.9)
    # The changed lines: PipeSGD instead of DDP; the clip moves into the wrapper.
    opt = PipeSGD(inner, model, width=2, options=PipeSGDOptions(max_grad_norm=CLIP))
    applied_norms = []
    inner.register_step_pre_hook(lambda o, *_: applied_norms.append(float(torch.nn.utils.get_total_norm(
        [p.grad for p in model.parameters()]))))
    shard = torch.arange(rank, len(ds.x_train), world)
    steps_per_epoch = len(shard) // BATCH
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=EPOCHS * steps_per_epoch)
    model.train()
    for epoch in range(EPOCHS):
        order = shard[torch.randperm(len(shard), generator=torch.Generator().manual_seed(epoch))]
        for i in range(steps_per_epoch):
            idx = order[i * BATCH:(i + 1) * BATCH]
            for micro in idx.chunk(ACCUMULATE):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(ds.x_train[micro]), ds.y_train[micro]) / ACCUMULATE
                loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
    opt.flush()
    opt.close()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(ds.x_test).argmax(1) == ds.y_test).float().mean())
    assert dist.get_world_size() == world
    return accuracy, model.state_dict(), max(applied_norms), len(applied_norms)


def test_the_tutorial_loop_learns_with_identical_parameters_and_buffers():
    (accuracy, state, top_norm, applied), (_, other, other_top, _) = run_ranks(_tutorial_loop, 2, timeout_s=600)
    assert accuracy >= 0.90, accuracy
    assert state.keys() == other.keys() and any("running_mean" in k for k in state)
    for key in state:
        assert torch.equal(state[key], other[key]), key
    assert applied > 0 and top_norm <= CLIP * (1 + 1e-6) and other_top == top_norm


DDP_STYLE_SCRIPT = os.path.join(os.path.dirname(__file__), "ddp_style_script.py")


def torchrun(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
            str(free_port()), script, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)


def test_a_ddp_style_script_resumes_from_rank_zeros_checkpoint_and_exits_cleanly(ddp_style_run):
    """Per-rank seeds, a checkpoint saved by rank 0 alone (after consolidate_state_dict), an end without flush():
    both runs exit 0 under torchrun, replicas are bitwise identical, and the resumed run ends exactly where the
    uninterrupted one did (tests/conftest.py launched the uninterrupted one)."""
    tmp_path, first = ddp_style_run
    assert first.returncode == 0, first.stdout + first.stderr
    second = torchrun(DDP_STYLE_SCRIPT, str(tmp_path), "--resume", str(tmp_path / "ckpt.pt"))
    assert second.returncode == 0, second.stdout + second.stderr
    for done in (first, second):
        assert done.stderr.count("step(s) in flight that were never applied") == 2  # said, not silent
        assert "Traceback" not in done.stderr and "terminate called" not in done.stderr
    final = {(run, rank): torch.load(tmp_path / f"{run}-rank{rank}.pt") for run in ("uninterrupted", "resumed")
             for rank in (0, 1)}
    reference = final[("uninterrupted", 0)]
    for key, state in final.items():
        for name in reference:
            assert torch.equal(state[name], reference[name]), (key, name)
