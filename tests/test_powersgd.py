"""``--ddp-hook powersgd``: PyTorch's powerSGD_hook as a DDP peer. Its byte count against a hand computation,
replicas that stay identical on two gloo ranks, a run that learns digits, and one-line errors for bad combos."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd.baselines.ddp import DDPOptimizer
from pipesgd.baselines.ddp_hooks import powersgd_bucket_elements
from pipesgd.train.cli import main
from tests.distributed import run_ranks
from tests.test_train_e2e import launch, records

# Linear(20, 16) + Linear(16, 4) at rank 2, by hand (PowerSGD compresses an n x m matrix iff
# (n + m) * r * 2 < n * m, r = min(n, m, rank)):
#   W1 16x20: (16 + 20) * 2 * 2 = 144 < 320 -> compressed: P 16 * 2 = 32, Q 20 * 2 = 40 elements
#   b1 16 (viewed 16x1, r = 1): 17 * 2 = 34 >= 16 -> uncompressed 16
#   W2 4x16: (4 + 16) * 2 * 2 = 80 >= 64 -> uncompressed 64;  b2 4 -> uncompressed 4
SHAPES = [(16, 20), (16,), (4, 16), (4,)]
HAND = (16 + 64 + 4, 32, 40)
RAW_BYTES = (320 + 16 + 64 + 4) * 4  # fp32; at 2 ranks a ring allreduce sends 2(p-1)/p = 1 x the message
COMPRESSED_BYTES = sum(HAND) * 4  # three allreduces: uncompressed tensors, P, Q
START = 3


def test_bucket_split_matches_the_hand_computation():
    assert powersgd_bucket_elements(SHAPES, rank=2) == HAND
    # rank 1 compresses W2 too: (4 + 16) * 1 * 2 = 40 < 64
    assert powersgd_bucket_elements(SHAPES, rank=1) == (16 + 4, 16 + 4, 20 + 16)
    # a conv weight is viewed as (out, in * k * k)
    assert powersgd_bucket_elements([(8, 3, 3, 3)], rank=2) == (0, 16, 54)  # 8 x 27: (8 + 27) * 4 = 140 < 216
    assert powersgd_bucket_elements([(32, 16, 3, 3)], rank=2) == (0, 64, 288)


def _train(rank: int, world: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = DDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, hook="powersgd", powersgd_rank=2,
                       powersgd_start=START, seed=7)
    gen = torch.Generator().manual_seed(100 + rank)  # rank-dependent data
    sent = []
    for _ in range(steps):
        x, y = torch.randn(32, 20, generator=gen), torch.randint(0, 4, (32,), generator=gen)
        nn.functional.cross_entropy(opt.model(x), y).backward()
        sent.append(opt.step().bytes_sent)
        opt.zero_grad()
    return {"sent": sent, "params": [p.detach().clone() for p in model.parameters()],
            "compressed": opt.hook_state.iter >= START}


def test_two_ranks_stay_identical_and_count_the_hook_bytes():
    steps = 8
    out = run_ranks(_train, 2, steps, timeout_s=150)
    assert out[0]["compressed"]
    assert out[0]["sent"] == [RAW_BYTES] * START + [COMPRESSED_BYTES] * (steps - START)
    for a, b in zip(out[0]["params"], out[1]["params"]):
        assert torch.equal(a, b)


def _step_bytes(path: str) -> list[int]:
    return [r["bytes_sent"] for r in records(path) if r["type"] == "step"]


@pytest.mark.slow
def test_trainer_with_powersgd_learns_digits(tmp_path):
    metrics = str(tmp_path / "m.jsonl")
    logs = launch(["--mode", "ddp", "--ddp-hook", "powersgd", "--powersgd-rank", "1", "--epochs", "6",
                   "--eval-every", "0", "--timeout", "60", "--metrics", metrics])
    assert all(code == 0 for code, _, _ in logs), logs
    rank0 = str(tmp_path / "m.rank0.jsonl")
    steps = [r for r in records(rank0) if r["type"] == "step"]
    first = sum(r["loss"] for r in steps[:10]) / 10
    last = sum(r["loss"] for r in steps[-10:]) / 10
    assert last < 0.5 * first, (first, last)
    evals = [r for r in records(rank0) if r["type"] == "eval"]
    assert evals[-1]["accuracy"] > 0.85
    sent = _step_bytes(rank0)
    # plain allreduce for the warm-up (default 10 steps), then far fewer bytes at rank 1
    assert len(set(sent[:10])) == 1 and max(sent[12:]) < sent[0] / 4
    assert sent == _step_bytes(str(tmp_path / "m.rank1.jsonl"))


BAD = [
    (["--mode", "ddp", "--ddp-hook", "powersgd", "--powersgd-rank", "0"], "--powersgd-rank must be at least 1"),
    (["--powersgd-rank", "3"], "--powersgd-rank applies to --mode ddp --ddp-hook powersgd only"),
    (["--mode", "ddp", "--powersgd-rank", "3"], "--powersgd-rank applies to --mode ddp --ddp-hook powersgd only"),
    (["--ddp-hook", "powersgd"], "--ddp-hook applies to --mode ddp only"),
    (["--mode", "ddp", "--ddp-hook", "powersgd", "--checkpoint", "ck", "--resume"],
     "--resume with --ddp-hook powersgd is not supported"),
    (["--mode", "ddp", "--ddp-hook", "lowrank"], "unknown --ddp-hook 'lowrank' (valid: none, fp16, powersgd)"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_combos_are_one_line_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesgd-train: error: ") and message in err, err


def _refuses_resume(rank: int, world: int) -> str:
    model = nn.Linear(4, 2)
    opt = DDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, hook="powersgd")
    try:
        opt.load_state_dict(opt.state_dict())
    except ValueError as exc:
        return str(exc)
    return ""


def test_the_wrapper_refuses_to_load_powersgd_state():
    assert "not supported" in run_ranks(_refuses_resume, 1, timeout_s=100)[0]


def _bucket_caps(rank: int, world: int) -> tuple[float, float, int]:
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])  # ~1 MiB of gradient
    powersgd = DDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, hook="powersgd",
                            bucket_mb=0.25, powersgd_start=2)
    plain = DDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, hook="none", bucket_mb=0.25)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(4):  # past PowerSGD's start: P and Q allreduces chained per bucket
        nn.functional.mse_loss(powersgd.model(torch.randn(8, 256, generator=gen)), torch.zeros(8, 256)).backward()
        powersgd.step()
        powersgd.zero_grad()
    return powersgd.bucket_mb, plain.bucket_mb, powersgd.hook_state.iter


def test_powersgd_on_gloo_gets_one_bucket_and_trains():
    (one, plain, iters), _ = run_ranks(_bucket_caps, 2, timeout_s=150)
    grad_mb = 4 * (256 * 256 + 256) * 4 / 2**20
    assert one == pytest.approx(grad_mb + 1.0) and plain == 0.25 and iters >= 4
