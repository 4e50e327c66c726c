"""Test fixture for tests/test_lifecycle.py: a torchrun script that trains with PipeSGD and ends without flush() or
close(), leaving a step in flight (the interpreter's exit must neither abort nor hang)."""
import torch
import torch.distributed as dist

import pipesgd

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = torch.nn.Linear(10, 2)
opt = pipesgd.PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
for _ in range(5):
    model(torch.randn(4, 10)).sum().backward()
    opt.step()
    opt.zero_grad()
print(f"rank {dist.get_rank()} trained", flush=True)
