"""DDP's byte count per optimizer step: one gradient allreduce per synced backward pass, so accumulated micro-batches
(``--accumulate``) multiply it, and passes under ``no_sync()`` or without gradients add nothing."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd.baselines.ddp import DDPOptimizer, ring_allreduce_bytes
from tests.distributed import run_ranks


def _sent(rank: int, world: int, hook: str) -> list[int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    opt = DDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, hook=hook)
    gen = torch.Generator().manual_seed(rank)
    sent = []
    for passes, unsynced in ((1, 0), (2, 0), (3, 0), (1, 1)):
        with opt.model.no_sync():
            for _ in range(unsynced):  # DDP's own accumulation: no allreduce in these
                opt.model(torch.randn(4, 6, generator=gen)).sum().backward()
        for _ in range(passes):
            opt.model(torch.randn(4, 6, generator=gen)).sum().backward()
        with torch.no_grad():
            opt.model(torch.randn(4, 6, generator=gen))  # an evaluation forward sends nothing
        sent.append(opt.step().bytes_sent)
        opt.zero_grad()
    return sent


@pytest.mark.parametrize("hook,payload", [("none", 4), ("fp16", 2)])
@pytest.mark.slow
def test_bytes_count_each_synced_backward_pass(hook, payload):
    one = ring_allreduce_bytes((6 * 5 + 5 + 5 * 3 + 3) * payload, 2)
    assert run_ranks(_sent, 2, hook, timeout_s=120) == [[one, 2 * one, 3 * one, one]] * 2
