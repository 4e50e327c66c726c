"""Speed of the GPU path (issue 13, part 4): one table per run, per model and variant, with the device name.

    python experiments/gpu_speed.py --device cuda --ranks 4 --out results/gpu          # 4 ranks share the GPU
    torchrun --nnodes 4 --nproc-per-node 1 ... experiments/gpu_speed.py --device cuda --backend nccl --out DIR
    python experiments/gpu_speed.py --device cpu --ranks 2 --models lenet --batch 8 --repeats 3 --out /tmp/s

Per model (synthetic CIFAR-shaped data, ``--batch`` per rank): compute only (forward + backward), the
all-reduce alone on a gradient-sized buffer (the backend's for none; for bf16 / q8 our two-collective exchange,
what ``allreduce="auto"`` runs but on gloo with CUDA tensors, and the paper's per-hop ring, what it runs there),
and the iteration of sync SGD (PipeSGD K = 1), DDP, DDP + fp16 hook and Pipe-SGD K = 2 with none / bf16 / q8 on
each all-reduce (look-ahead, the default, with its own work per step in "look-ahead ms"; the plain update beside it
for none and q8; the BatchNorm buffers exchanged with the gradients), all with SGD and momentum 0.9.
Overlap efficiency = max(compute, that codec's all-reduce) / the measured Pipe-SGD iteration (1.0: the
communication is hidden entirely; target >= 0.90). Every time is the slowest rank's median; an iteration is timed up
to the end of its compute-stream work, never a device-wide synchronize (that would wait for the ring in flight on
the side stream). "step() host ms" is rank 0's median host time of ``step()`` + ``zero_grad()``, what the training
thread spends in the optimizer (on a GPU: Python and launches, not kernels): the inner SGD's alone in the DDP rows,
the blocking all-reduce too in sync's; "of which wait ms" is the part PipeSGD spent waiting for communication
(its ``t_wait_s``, plus ``t_buffers_s``: the BatchNorm buffers' blocking broadcast), so the rest is its own
work. Then codec throughput on the device: encode + decode of ``--codec-mb``.
Writes ``gpu_speed.md`` and ``gpu_speed.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser  # noqa: E402
from gpu_common import (add_ab_flags, apply_ab_flags, build, check_device,  # noqa: E402
                        check_ab_flags, device_name, launch, markdown, rank_device, write_results)

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD  # noqa: E402
from pipesgd.compression import build as build_codec  # noqa: E402
from pipesgd.compression.throughput import measure_codec_gbps  # noqa: E402
from pipesgd.measure import time_collective  # noqa: E402
from pipesgd.comm.alltoall import alltoall_allreduce_  # noqa: E402
from pipesgd.comm.ring import RingTopology, ring_allreduce_  # noqa: E402
from pipesgd.train.step_timer import wait_for_compute  # noqa: E402

PIPE_CODECS = ("none", "bf16", "q8")


def iteration_time(call, device: torch.device, repeats: int) -> float:
    """Slowest rank's median seconds of ``call()`` up to the end of its compute-stream work."""

    def timed() -> None:
        call()
        wait_for_compute(device)

    return time_collective(timed, repeats, warmup=3, device=None)


def bench_model(rank: int, world: int, device: torch.device, name: str, args) -> list[dict]:
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)

    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return build(name).to(device)

    model = fresh()
    n_params = sum(p.numel() for p in model.parameters())

    def compute_only() -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        model.zero_grad()

    compute_s = iteration_time(compute_only, device, args.repeats)
    grads = torch.randn(n_params, device=device)
    topology = RingTopology(dist.group.WORLD)
    # keyed (codec, all-reduce): the backend's for none; for a codec the two-collective exchange and the
    # paper's per-hop ring
    comm_s = {("none", "backend"): time_collective(lambda: dist.all_reduce(grads), args.repeats, 2, device=device)}
    for codec_name in PIPE_CODECS[1:]:
        codec = build_codec(codec_name)
        for allreduce, run in (("alltoall", alltoall_allreduce_), ("ring", ring_allreduce_)):
            comm_s[(codec_name, allreduce)] = time_collective(lambda: run(grads, codec, topology, "mean"),
                                                              args.repeats, 2, device=device)

    def sgd(net: nn.Module) -> torch.optim.Optimizer:  # momentum: the look-ahead replay carries state, as in training
        return torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    lookahead_s: dict[str, float] = {}  # per Pipe-SGD variant: median look-ahead work per step (training thread)
    host_s: dict[str, float] = {}  # per variant: median host time of step() + zero_grad() (launches, not kernels)
    wait_s: dict[str, float] = {}  # per Pipe-SGD variant: median time step() blocked on communication (t_wait_s)

    def timed_training(forward: nn.Module, opt, variant: str) -> float:
        work: list[float] = []
        host: list[float] = []
        waits: list[float] = []

        def step() -> None:
            nn.functional.cross_entropy(forward(x), y).backward()
            start = time.perf_counter()
            stats = opt.step()
            opt.zero_grad()
            host.append(time.perf_counter() - start)
            if getattr(stats, "t_wait_s", None) is not None:  # the ring's, and the buffers' blocking sync
                waits.append(stats.t_wait_s + (stats.t_buffers_s or 0.0))
            if getattr(stats, "t_lookahead_s", None) is not None:
                work.append(stats.t_lookahead_s)

        seconds = iteration_time(step, device, args.repeats)
        if isinstance(opt, PipeSGD):
            opt.flush()
            opt.close()
        if work:
            lookahead_s[variant] = sorted(work)[len(work) // 2]
        host_s[variant] = sorted(host)[len(host) // 2]
        if waits:
            wait_s[variant] = sorted(waits)[len(waits) // 2]
        return seconds

    iters: dict[str, float] = {}
    pipe_comm: dict[str, tuple[str, str]] = {}  # Pipe-SGD variant -> the (codec, all-reduce) it ran
    for hook in ("none", "fp16"):
        net = fresh()
        ddp = DistributedDataParallel(net, device_ids=[device.index] if dist.get_backend() == "nccl" else None)
        if hook == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

            ddp.register_comm_hook(None, fp16_compress_hook)
        variant = "DDP" if hook == "none" else "DDP + fp16 hook"
        iters[variant] = timed_training(ddp, sgd(net), variant)
    net = fresh()
    iters["sync (K = 1)"] = timed_training(net, PipeSGD(sgd(net), net, width=1), "sync (K = 1)")
    # Look-ahead (the default) in every codec's row, each lossy codec with the exchange and the per-hop ring; the
    # paper's plain update beside them for none and q8; the BatchNorm buffers never synced ("none") beside the
    # default (synced where the ranks meet), which costs the step nothing.
    runs = [(c, "lookahead", "auto" if c == "none" else "alltoall", "broadcast") for c in PIPE_CODECS]
    runs += [(c, "lookahead", a, "broadcast") for a in ("ring",) for c in PIPE_CODECS[1:]]
    runs += [("none", "none", "auto", "broadcast"), ("q8", "none", "alltoall", "broadcast")]
    runs += [(c, "lookahead", a, "none") for c, a in (("none", "auto"), ("q8", "alltoall"))]
    # the shared stand-in that waits for an exchange of the step just taken: the average's part in a shared
    # low-rank subspace (pipesgd.delay.lowrank), beside the own gradient above
    runs += [("q8", "lookahead", "ring", "broadcast", "coarse-lowrank")]
    for codec_name, staleness, allreduce, buffers, *standin in runs:
        net = fresh()
        opt = PipeSGD(sgd(net), net, width=2, warmup_steps=0, compression=codec_name, staleness=staleness,
                      options=PipeSGDOptions(allreduce=allreduce, buffers=buffers,
                                             lookahead_standin=(standin or ["local"])[0]))
        variant = f"Pipe-SGD K = 2, {staleness}, {codec_name}, {opt.allreduce}" + (
            "" if buffers == "broadcast" else f", buffers {buffers}") + (f", stand-in {standin[0]}" if standin else "")
        pipe_comm[variant] = (codec_name, opt.allreduce)
        iters[variant] = timed_training(net, opt, variant)

    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    base = {"model": name, "params": f"{n_params / 1e6:.2f} M"}
    rows = [base | {"variant": "compute only", "ms / iter": ms(compute_s)}]
    rows += [base | {"variant": f"all-reduce only, {c}, {a}", "comm ms": ms(s)} for (c, a), s in comm_s.items()]
    for variant, seconds in iters.items():
        entry = base | {"variant": variant, "ms / iter": ms(seconds), "vs DDP": f"{iters['DDP'] / seconds:.2f}x",
                        "step() host ms": ms(host_s[variant])}
        if variant in pipe_comm:
            comm = comm_s[pipe_comm[variant]]
            entry["comm ms"] = ms(comm)
            entry["overlap efficiency"] = f"{max(compute_s, comm) / seconds:.2f}"
            if variant in lookahead_s:
                entry["look-ahead ms"] = ms(lookahead_s[variant])
        if variant in wait_s:
            entry["of which wait ms"] = ms(wait_s[variant])
        rows.append(entry)
    return rows


def bench_codecs(device: torch.device, codec_mb: int) -> list[dict]:
    numel = (codec_mb << 20) // 4
    rows = []
    for name in ("bf16", "q8", "q4", "sign"):
        encode_gbps, decode_gbps = measure_codec_gbps(build_codec(name), numel, repeats=5, device=device)
        n_bytes = 4 * numel
        total_ms = (n_bytes / encode_gbps + n_bytes / decode_gbps) / 1e6
        rows.append({"codec": name, "input": f"{codec_mb} MiB fp32", "encode GB/s": f"{encode_gbps:.1f}",
                     "decode GB/s": f"{decode_gbps:.1f}", "encode + decode ms": f"{total_ms:.3f}"})
    return rows


def main_rank(rank: int, world: int, args) -> None:
    interval = apply_ab_flags(args)
    device = rank_device(args.device, rank)
    rows = []
    for name in args.models.split(","):
        rows += bench_model(rank, world, device, name, args)
    if rank != 0:
        return
    codec_rows = bench_codecs(device, args.codec_mb)
    header = (f"# GPU path speed\n\ndevice: {device_name(device)}; backend {dist.get_backend()}, {world} rank(s); "
              f"batch {args.batch} per rank, synthetic 3x32x32 data; slowest rank's median of {args.repeats} "
              f"(step() host ms: rank 0's){interval}")
    table = markdown(rows, ["model", "params", "variant", "ms / iter", "comm ms", "overlap efficiency", "vs DDP",
                            "step() host ms", "of which wait ms", "look-ahead ms"])
    table += "\n\n" + markdown(codec_rows, ["codec", "input", "encode GB/s", "decode GB/s", "encode + decode ms"])
    print(f"{header}\n\n{table}", flush=True)
    write_results(args.out, "gpu_speed", header, table, {"device": device_name(device), "world": world,
                                                          "backend": dist.get_backend(), "batch": args.batch,
                                                          "rows": rows, "codecs": codec_rows})


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--ranks", type=int, default=4, help="spawned processes when not under torchrun")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--models", default="lenet,resnet20,resnet18", help="comma-separated: lenet,resnet20,resnet18")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--codec-mb", type=int, default=100, help="input size of the codec-throughput table")
    parser.add_argument("--out", required=True, help="results folder")
    add_ab_flags(parser)
    args = parser.parse_args(argv)
    check_ab_flags(parser, args)
    unknown = [m for m in args.models.split(",") if m not in ("lenet", "resnet20", "resnet18")]
    if unknown:
        parser.error(f"unknown --models {','.join(unknown)} (valid: lenet, resnet20, resnet18)")
    if args.ranks < 1 or args.batch < 1 or args.repeats < 1 or args.codec_mb < 1:
        parser.error("--ranks, --batch, --repeats and --codec-mb must be >= 1")
    check_device(parser, args.device, args.backend, args.ranks)
    launch(main_rank, args.ranks, args.backend, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
