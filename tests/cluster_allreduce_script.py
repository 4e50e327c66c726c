"""Test fixture for tests/test_cluster.py: one gloo all_reduce across emulated nodes, launched by torchrun.

Each rank contributes rank+1 in a 1 MiB tensor (so the bytes show up in the tbf counters), checks the sum,
and prints the interface gloo was told to use.
"""
import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((1 << 18,), float(rank + 1))  # 1 MiB of fp32
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    assert torch.all(t == expected), (t[:4], expected)
    print(f"ALLREDUCE_OK rank={rank} world={world} sum={t[0].item():g} "
          f"ifname={os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
