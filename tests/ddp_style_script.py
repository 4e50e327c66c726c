"""Test fixture for tests/test_ddp_migration.py and tests/test_lifecycle.py: a nanoGPT-shaped DDP script switched to
PipeSGD as the README says, launched by torchrun. Per-rank seeds before building the model, AdamW on parameter
groups, a manual learning-rate schedule through ``opt.param_groups``, gradient accumulation, clipping, a checkpoint
saved by rank 0 alone, and an end without ``flush()``.

    torchrun --nproc-per-node 2 tests/ddp_style_script.py OUT_DIR [--resume CHECKPOINT]
"""
import math
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from pipesgd.options import PipeSGDOptions
import pipesgd

STEPS, SAVE_AT, ACCUMULATE = 10, 5, 2

out, resume = sys.argv[1], (sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--resume" else None)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(1337 + rank)  # nanoGPT seeds each rank differently before it builds the model
model = nn.Sequential(nn.Embedding(16, 8), nn.Flatten(), nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 16))
checkpoint = torch.load(resume, weights_only=True) if resume else None
if checkpoint is not None:
    model.load_state_dict(checkpoint["model"])
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
inner = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=1e-2, betas=(0.9, 0.95))
opt = pipesgd.PipeSGD(inner, model, width=2, warmup_steps=2, options=PipeSGDOptions(max_grad_norm=1.0))  # <- not DDP(model); wrap, then load
start = 0
if checkpoint is not None:
    opt.load_state_dict(checkpoint["optimizer"])
    start = checkpoint["step"]


def lr_at(step: int) -> float:  # nanoGPT's warm-up and cosine decay
    return 1e-2 * (step + 1) / 3 if step < 3 else 1e-3 + 0.5 * (1 + math.cos(math.pi * step / STEPS)) * 9e-3


for step in range(start, STEPS):
    if step == SAVE_AT and checkpoint is None:
        opt.consolidate_state_dict(to=0)  # <- every rank, so rank 0's file restores each rank's own state
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                       os.path.join(out, "ckpt.pt"))
    for group in opt.param_groups:
        group["lr"] = lr_at(step)
    for micro in range(ACCUMULATE):
        g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
        x, y = torch.randint(0, 16, (8, 4), generator=g), torch.randint(0, 16, (8,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y) / ACCUMULATE
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

torch.save({k: v.clone() for k, v in model.state_dict().items()},
           os.path.join(out, f"{'resumed' if resume else 'uninterrupted'}-rank{rank}.pt"))
print(f"rank {rank} done", flush=True)  # no flush(), no close(), no destroy_process_group()
