"""What the GPU scripts (gpu_check.py, gpu_speed.py) share: the launch (spawned ranks or torchrun, gloo or
NCCL), each rank's device, the models, a stand-in for ``torch.cuda._sleep`` on CPU, and the results folder.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from experiments.harness.rank_launch import free_port
from pipesgd.launch import exit_process
from pipesgd.train.models import BasicBlock, build_model

CIFAR_SHAPE, CLASSES = (3, 32, 32), 10


def rank_device(kind: str, rank: int) -> torch.device:
    """``cuda:rank % GPUs`` (ranks beyond the GPU count share them, over gloo) or the CPU."""
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is available (use --device cpu for a smoke run)")
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores (torch {torch.__version__})"


def add_ab_flags(parser) -> None:
    """The A/B flags of the speed scripts, each applied on every rank before anything is built:

    ``--switch-interval-ms``: the GIL's switch interval (``sys.setswitchinterval``; Python's default 5 ms). A thread
    that wants the GIL while another runs Python waits up to that long before the holder is made to drop it, so a ring
    hop that wakes from the wire beside a training thread dispatching kernels may wait that long at each of its GIL
    acquisitions (issue 38: the ring loses 18-22 % beside training, 2.0-2.4x beside a Python loop).
    ``--side-stream-priority``: the communication worker's CUDA stream priority (patched in by
    ``experiments/harness/switches.py``; negative is more urgent than the training step's kernels).
    ``--gather-through-device``: the compressed ring's all-gather copies each received payload to the GPU and back
    before forwarding it, where the library forwards it from host memory (patched in the same way)."""
    parser.add_argument("--switch-interval-ms", type=float, default=None, dest="switch_interval_ms",
                        help="the interpreter's GIL switch interval on every rank (default: Python's, 5 ms)")
    parser.add_argument("--side-stream-priority", type=int, default=None,
                        help="CUDA priority of the communication side stream (default 0; -1 is more urgent)")
    parser.add_argument("--gather-through-device", action="store_true",
                        help="forward the compressed ring's all-gather payloads through the GPU, not from host memory")


def apply_ab_flags(args) -> str:
    """Set the A/B flags on this rank (none given: the library's defaults); the header's note of them."""
    from experiments.harness.switches import forward_through_device, side_stream_priority

    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    note = f"; GIL switch interval {sys.getswitchinterval() * 1e3:g} ms"
    if args.side_stream_priority is not None:
        side_stream_priority(args.side_stream_priority)
        note += f"; side stream priority {args.side_stream_priority}"
    if args.gather_through_device:
        forward_through_device()
        note += "; ring all-gather through the device"
    return note


def check_ab_flags(parser, args) -> None:
    if args.switch_interval_ms is not None and not args.switch_interval_ms > 0:
        parser.error(f"--switch-interval-ms must be positive (got {args.switch_interval_ms})")


def check_device(parser, device_kind: str, backend: str = "gloo", ranks: int = 1) -> None:
    """Before any rank starts: CUDA asked for and present; NCCL with CUDA and one GPU per rank (in one line instead
    of every spawned rank's traceback, or NCCL's "Duplicate GPU detected"). ``parser.error``: exit status 2."""
    if device_kind == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but no CUDA device is available (use --device cpu for a smoke run)")
    if backend == "nccl" and device_kind != "cuda":
        parser.error("--backend nccl needs --device cuda")
    if backend == "nccl" and "RANK" not in os.environ and ranks > torch.cuda.device_count():
        parser.error(f"{ranks} ranks but {torch.cuda.device_count()} GPU(s): NCCL needs one GPU per rank; "
                     "use --backend gloo (ranks then share the GPU) or fewer --ranks")


def _entry(rank: int, world: int, port: int, backend: str, fn: Callable, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _run(fn, backend, args)
    exit_process(0)  # no interpreter teardown racing gloo's threads (see pipesgd.launch.exit_process)


def _run(fn: Callable, backend: str, args: tuple) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["WORLD_SIZE"])))
    dist.init_process_group(backend, timeout=timedelta(seconds=300))
    try:
        fn(dist.get_rank(), dist.get_world_size(), *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(fn: Callable, ranks: int, backend: str, *args: Any) -> None:
    """``fn(rank, world, *args)`` on every rank: under torchrun as launched, else ``ranks`` spawned processes."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _run(fn, backend, args)
    else:
        mp.spawn(_entry, args=(ranks, free_port(), backend, fn, args), nprocs=ranks, join=True)


def build_resnet18(num_classes: int = CLASSES) -> nn.Module:
    """ResNet-18 for CIFAR-shaped input (4 stages x 2 basic blocks, 64-512 channels; 11.2 M parameters)."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    c_in = 64
    for stage, c_out in enumerate((64, 128, 256, 512)):
        for block in range(2):
            layers.append(BasicBlock(c_in, c_out, stride=2 if stage > 0 and block == 0 else 1))
            c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def build(name: str) -> nn.Module:
    """``lenet``, ``resnet20`` (the trainer's) or ``resnet18``, for 3x32x32 inputs and 10 classes."""
    return build_resnet18() if name == "resnet18" else build_model(name, CIFAR_SHAPE, CLASSES)


def stall(device: torch.device, seconds: float) -> None:
    """Delay the current stream by about ``seconds`` (``torch.cuda._sleep``); on CPU, the calling thread."""
    if device.type == "cuda":
        torch.cuda._sleep(int(seconds * 1.5e9))  # cycles at ~1.5 GHz: only the order matters, not the length
    else:
        time.sleep(seconds)


def write_results(out: str, name: str, header: str, table: str, data: Any) -> Path:
    """``out/name.md`` (the header and the table as printed) and ``out/name.json``; returns the folder."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(f"{header}\n\n{table}\n")
    (folder / f"{name}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    return folder


def markdown(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
