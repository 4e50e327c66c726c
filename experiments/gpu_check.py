"""Correctness of the GPU path (issue 13, part 3): one table of checks, each PASS / FAIL / info / skip.

    python experiments/gpu_check.py --device cuda --ranks 4 --out results/gpu     # 4 ranks share the GPU, gloo
    python experiments/gpu_check.py --device cuda --ranks 1 --backend nccl --out results/gpu-nccl
    torchrun --nproc-per-node 2 experiments/gpu_check.py --device cuda --backend nccl --out results/gpu-nccl2
    python experiments/gpu_check.py --device cpu --ranks 2 --hidden 32 --out /tmp/check   # CPU smoke run

Checks: K = 1 against single-process SGD and K = 2 against the delayed reference, plain and with look-ahead
(float64 references on the CPU); width and compression "auto" the same choice on every rank; replicas bitwise
identical for every codec and with error feedback, on the two-collective exchange and on the per-hop ring; the same
results with the side stream and the compute stream stalled (``torch.cuda._sleep``: the stream order must hold);
no host sync from ``step()`` on the caller's thread (``torch.cuda.set_sync_debug_mode("warn")``); codec kernels on
CUDA against the CPU ones on random non-zero inputs; steady-state ``torch.cuda.memory_allocated()`` for DDP and
PipeSGD K = 1, K = 2 plain and with look-ahead, K = 2 + error feedback, in gradient copies, and its growth over steps; a
SyncBatchNorm model under K = 2 keeps parameters and buffers identical on every rank (issue 10; GPU only).
Writes ``gpu_check.md`` and ``gpu_check.json`` under ``--out``; exits 1 if a check fails.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import threading
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser  # noqa: E402
from gpu_common import check_device, device_name, launch, markdown, rank_device, stall, write_results  # noqa: E402

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD  # noqa: E402
from pipesgd.auto import CONFIRM_STEPS, describe  # noqa: E402
from pipesgd.compression import build  # noqa: E402
from pipesgd.comm.exchange import GradientExchange  # noqa: E402

LOSSY = [("fp16", False), ("bf16", False), ("q8", False), ("q4", False), ("q8", True), ("sign", True)]
EXACT_RTOL = 1e-4  # float32 on the device against a float64 reference on the CPU
STALL_S = 0.02
AUTO_WARMUP = 3  # width and compression "auto": the warm-up's steps, then the held width's CONFIRM_STEPS


def make_model(hidden: int, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, 4)).to(dtype)


def batch(step: int, rank: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(8, 16, generator=g, dtype=torch.float64) * (1 + rank)
    return x.to(dtype), torch.randn(8, 4, generator=g, dtype=torch.float64).to(dtype)


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()])


def reference(world: int, width: int, steps: int, hidden: int, staleness: str = "none") -> torch.Tensor:
    """Single process, float64: the mean over ranks of each step's gradient, applied K-1 steps late; with
    ``staleness="lookahead"`` each rank's gradient is taken at the weights its own gradients of the steps in
    flight lead to (a copy of the model stepped by a copy of the optimizer)."""
    model = make_model(hidden, torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    grads, local = [], {}
    for t in range(steps):
        per_rank = []
        for rank in range(world):
            ahead, ahead_opt = copy.deepcopy((model, opt))
            for s in range(max(0, t - width + 1), t) if staleness == "lookahead" else ():
                for p, g in zip(ahead.parameters(), local[(rank, s)]):
                    p.grad = g.clone()
                ahead_opt.step()
            ahead.zero_grad()
            x, y = batch(t, rank, torch.float64)
            nn.functional.mse_loss(ahead(x), y).backward()
            local[(rank, t)] = [p.grad.clone() for p in ahead.parameters()]
            per_rank.append(local[(rank, t)])
        grads.append([torch.stack(g).mean(0) for g in zip(*per_rank)])
        due = [t - width + 1] if t >= width - 1 else []
        for s in due + ([s for s in range(steps - width + 1, steps)] if t == steps - 1 else []):
            for p, g in zip(model.parameters(), grads[s]):
                p.grad = g.clone()
            opt.step()
    return flat(model)


def train(rank: int, device: torch.device, hidden: int, steps: int, width: int, compression: str = "none",
          feedback: bool = False, stall_compute: bool = False, count_syncs: bool = False, staleness: str = "lookahead",
          allreduce: str = "auto", standin: str = "local"):
    """Final weights (float64, CPU) after ``steps`` steps and a flush; with ``count_syncs`` also where ``step()``
    synchronised on the calling thread (one ``file:line`` per sync warning)."""
    model = make_model(hidden).to(device)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width=width, warmup_steps=0,
                  compression=compression, error_feedback=feedback, staleness=staleness,
                  options=PipeSGDOptions(allreduce=allreduce, lookahead_standin=standin))
    main_thread_syncs: list[str] = []
    for t in range(steps):
        x, y = (v.to(device) for v in batch(t, rank))
        nn.functional.mse_loss(model(x), y).backward()
        if stall_compute:
            stall(device, STALL_S)  # the gradients are late on the compute stream: the ring must wait for them
        if count_syncs and device.type == "cuda":
            main_thread_syncs += _syncs_on_this_thread(opt.step)
        else:
            opt.step()
        opt.zero_grad()
    opt.flush()
    opt.close()
    return flat(model), main_thread_syncs


def _syncs_on_this_thread(call) -> list[str]:
    """Where (``file:line``) ``call()`` synchronised on the calling thread under ``set_sync_debug_mode("warn")``,
    once per sync; the worker thread's own syncs (gloo staging, the finiteness check) are its business."""
    caller, seen = threading.current_thread(), []

    def show(message, category, filename, lineno, file=None, line=None):
        # "called a synchronizing CUDA operation"; not the notice that enabling the mode prints once per process
        # ("Synchronization debug mode is a prototype feature ...", which the first count took for a sync).
        if threading.current_thread() is caller and "called a synchronizing" in str(message):
            # The innermost frame of our own code: a torch wrapper's line says nothing about who called it.
            ours = [f for f in traceback.extract_stack() if f"{os.sep}pipesgd{os.sep}" in f.filename]
            seen.append(f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours
                        else f"{Path(filename).name}:{lineno}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return seen


def _gatherable(t: torch.Tensor) -> torch.Tensor:
    """NCCL gathers device tensors only."""
    return t.cuda() if dist.get_backend() == "nccl" else t


def identical_across_ranks(weights: torch.Tensor) -> bool:
    weights = _gatherable(weights)
    gathered = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def row(check: str, detail: str, value: str, ok: bool | None) -> dict:
    return {"check": check, "detail": detail, "value": value,
            "result": "info" if ok is None else ("PASS" if ok else "FAIL")}


def check_training(rank: int, world: int, device: torch.device, args) -> list[dict]:
    rows = []
    for width, staleness in ((1, "none"), (2, "none"), (2, "lookahead")):
        want = reference(world, width, args.steps, args.hidden, staleness)
        got, _ = train(rank, device, args.hidden, args.steps, width, staleness=staleness)
        err = rel_error(got, want)
        check = f"K = {width} vs reference" + (", look-ahead" if staleness == "lookahead" else "")
        rows.append(row(check, "none, float64 reference on CPU", f"rel err {err:.1e}",
                        err <= EXACT_RTOL and identical_across_ranks(got)))
    want = reference(world, 2, args.steps, args.hidden, "lookahead")
    for allreduce in ("alltoall", "ring"):  # the two-collective exchange, the per-hop ring
        for name, feedback in LOSSY:
            got, _ = train(rank, device, args.hidden, args.steps, 2, name, feedback, allreduce=allreduce)
            same = identical_across_ranks(got)
            label = name + (" + EF" if feedback else "") + f", {allreduce}"
            rows.append(row(f"K = 2, {label}", "replicas bitwise identical, finite",
                            f"identical {same}, rel dev from exact {rel_error(got, want):.1e}",
                            same and bool(torch.isfinite(got).all())))
    for standin in ("coarse-lowrank",):  # the stand-in from an exchange of the step just taken
        got, _ = train(rank, device, args.hidden, args.steps, 2, "q8", True, allreduce="ring", standin=standin)
        same = identical_across_ranks(got)
        rows.append(row(f"K = 2, q8 + EF, ring, stand-in {standin}", "replicas bitwise identical, finite",
                        f"identical {same}, rel dev from exact {rel_error(got, want):.1e}",
                        same and bool(torch.isfinite(got).all())))
    return rows


def check_auto(rank: int, world: int, device: torch.device, args) -> list[dict]:
    """``width="auto"``, ``compression="auto"`` (issue 39): the early look's timed broadcasts, the warm-up's agreed
    measurements and rank 0's broadcast decision all run on the buckets' device; every rank must hold rank 0's
    choice, past the held width's check, with replicas bitwise identical."""
    model = make_model(args.hidden).to(device)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width="auto", compression="auto",
                  warmup_steps=AUTO_WARMUP)
    for t in range(AUTO_WARMUP + CONFIRM_STEPS + 2):
        x, y = (v.to(device) for v in batch(t, rank))
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    opt.flush()
    choice = describe(opt.auto_choice) if opt.auto_choice else "none made"
    opt.close()
    got, choices = flat(model), [None] * world
    dist.all_gather_object(choices, choice)
    same = identical_across_ranks(got)
    return [row("width and compression auto", "every rank holds the same choice, replicas bitwise identical",
                f"chose {choice}; same choice {len(set(choices)) == 1}, identical {same}",
                len(set(choices)) == 1 and same and bool(torch.isfinite(got).all()))]


def check_ordering(rank: int, world: int, device: torch.device, args) -> list[dict]:
    """The stalled runs must give exactly the bits of the unstalled one."""
    rows = []
    original = GradientExchange.__call__

    def stalled(self, buffers):
        stall(device, STALL_S)  # on the worker's side stream (CUDA) or thread (CPU)
        return original(self, buffers)

    for name, feedback, allreduce in (("none", False, "auto"), ("q8", True, "alltoall"), ("q8", True, "ring")):
        plain, _ = train(rank, device, args.hidden, args.steps, 2, name, feedback, allreduce=allreduce)
        GradientExchange.__call__ = stalled
        try:
            side, _ = train(rank, device, args.hidden, args.steps, 2, name, feedback, allreduce=allreduce)
        finally:
            GradientExchange.__call__ = original
        compute, _ = train(rank, device, args.hidden, args.steps, 2, name, feedback, stall_compute=True,
                           allreduce=allreduce)
        label = name + (" + EF" if feedback else "") + ("" if allreduce == "auto" else f", {allreduce}")
        rows.append(row("stalled side stream", f"K = 2, {label}", f"same bits {torch.equal(side, plain)}",
                        torch.equal(side, plain)))
        rows.append(row("stalled compute stream", f"K = 2, {label}", f"same bits {torch.equal(compute, plain)}",
                        torch.equal(compute, plain)))
    return rows


def check_syncs(rank: int, world: int, device: torch.device, args) -> list[dict]:
    if device.type != "cuda":
        return [row("no sync from step()", "set_sync_debug_mode('warn')", "skip (CPU)", None) | {"result": "skip"}]
    rows = []
    for name, feedback in (("none", False), ("q8", True)):
        _, syncs = train(rank, device, args.hidden, args.steps, 2, name, feedback, count_syncs=True)
        gathered: list[list[str]] = [[] for _ in range(world)]
        dist.all_gather_object(gathered, syncs)
        every = [where for rank_syncs in gathered for where in rank_syncs]
        total = len(every)
        where = f" at {', '.join(sorted(set(every))[:3])}" if every else ""
        # At world size 1 the exchange runs inline: its finiteness check is a sync by design.
        rows.append(row("no sync from step()", f"K = 2, {name}{' + EF' if feedback else ''}, caller's thread",
                        f"{total} sync warnings over {args.steps} steps x {world} ranks{where}",
                        total == 0 if world > 1 else None))
    return rows


def check_sync_batchnorm(rank: int, world: int, device: torch.device, args) -> list[dict]:
    """Issue 10: a SyncBatchNorm model under PipeSGD K = 2 ends with parameters and buffers (running statistics)
    bitwise identical on every rank, with the default buffer broadcast and with none (SyncBatchNorm's own
    statistics are global). SyncBatchNorm runs on GPU tensors only."""
    if device.type != "cuda":
        return [row("SyncBatchNorm, K = 2", "GPU tensors only", "-", None) | {"result": "skip"}]
    rows = []
    for buffers in ("broadcast", "none"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 4))
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
        opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width=2, warmup_steps=0,
                      options=PipeSGDOptions(buffers=buffers))
        try:
            for t in range(args.steps):
                x, y = (v.to(device) for v in batch(t, rank))
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
            opt.flush()
            state = torch.cat([v.detach().double().reshape(-1).cpu() for v in (*model.parameters(), *model.buffers())])
            same = identical_across_ranks(state)
            rows.append(row("SyncBatchNorm, K = 2", f"buffers={buffers}: parameters and buffers bitwise identical",
                            f"identical {same}", same and bool(torch.isfinite(state).all())))
        except RuntimeError as error:  # e.g. a collective SyncBatchNorm needs that the backend lacks
            rows.append(row("SyncBatchNorm, K = 2", f"buffers={buffers}", str(error).splitlines()[0][:120], False))
        finally:
            opt.close()
    return rows


def check_codec_kernels(device: torch.device) -> list[dict]:
    if device.type != "cuda":
        return [row("codec kernels CUDA vs CPU", "", "skip (CPU)", None) | {"result": "skip"}]
    rows = []
    x = torch.randn(1_000_003, generator=torch.Generator().manual_seed(1))
    x = torch.where(x.abs() < 1e-3, x.sign() * 1e-3 + x, x)  # random and never zero
    for name in ("fp16", "bf16", "q8", "q4", "sign"):
        codec = build(name)
        cpu_payload, ctx = codec.compress(x)
        gpu_payload, gpu_ctx = codec.compress(x.to(device))
        decoded = codec.decompress(gpu_payload, gpu_ctx).cpu()
        bitwise = torch.equal(gpu_payload.cpu(), cpu_payload)
        err = float((decoded - codec.decompress(cpu_payload, ctx)).abs().max() / x.abs().max())
        rows.append(row("codec kernels CUDA vs CPU", name, f"payload bitwise {bitwise}, decoded rel diff {err:.1e}",
                        err <= 1e-6))  # sign's mean|x| may differ by an ulp (summation order)
    return rows


def check_memory(rank: int, world: int, device: torch.device, args) -> list[dict]:
    if device.type != "cuda":
        return [row("memory_allocated", "DDP vs PipeSGD", "skip (CPU)", None) | {"result": "skip"}]
    from torch.nn.parallel import DistributedDataParallel

    rows = []
    for label, width, compression, feedback, staleness in (
            ("DDP", 0, "", False, "none"), ("K = 1", 1, "none", False, "none"),
            ("K = 2, plain", 2, "none", False, "none"), ("K = 2, look-ahead", 2, "none", False, "lookahead"),
            ("K = 2 + EF q8, look-ahead", 2, "q8", True, "lookahead")):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        model = make_model(args.memory_hidden).to(device)
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if width == 0:
            ddp = DistributedDataParallel(model, device_ids=[device.index] if dist.get_backend() == "nccl" else None)
            forward, opt = ddp, torch.optim.SGD(model.parameters(), lr=1e-3)
        else:
            forward = model
            opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=1e-3), model, width=width, warmup_steps=0,
                          compression=compression, error_feedback=feedback, staleness=staleness)
        seen = {}
        for t in range(30):
            x, y = (v.to(device) for v in batch(t, rank))
            nn.functional.mse_loss(forward(x), y).backward()
            opt.step()
            opt.zero_grad()
            if t + 1 in (10, 30):
                if width:
                    # Read between rings: a ring in flight holds its hop buffers (q8 pieces read as +1 MiB of
                    # "growth" once). The worker runs jobs in order, so a no-op job returns after the ring.
                    opt._parts.channel.submit(lambda: None).wait()
                torch.cuda.synchronize()
                seen[t + 1] = torch.cuda.memory_allocated(device) - base - grad_bytes  # beyond the weights
        if width:
            opt.flush()
            opt.close()
        # A leak grows; a fall is memory freed late (DDP on NCCL at world size 1 once held a second gradient copy
        # at step 10 and had freed it by step 30), so only growth fails.
        growth = seen[30] - seen[10]
        rows.append(row("memory_allocated", label, f"{seen[30] / 2**20:.1f} MiB = {seen[30] / grad_bytes:.2f} "
                        f"gradient copies; growth steps 10->30 {growth / 2**20:+.2f} MiB",
                        growth <= 0.01 * grad_bytes))
        del model, forward, opt
    return rows


def main_rank(rank: int, world: int, args) -> None:
    device = rank_device(args.device, rank)
    rows = check_training(rank, world, device, args) + check_auto(rank, world, device, args)
    rows += check_ordering(rank, world, device, args)
    rows += check_syncs(rank, world, device, args) + check_memory(rank, world, device, args)
    rows += check_sync_batchnorm(rank, world, device, args)
    if rank == 0:
        rows += check_codec_kernels(device)
        header = (f"# GPU path correctness\n\ndevice: {device_name(device)}; backend {dist.get_backend()}, "
                  f"{world} rank(s); MLP hidden {args.hidden}, {args.steps} steps")
        table = markdown(rows, ["check", "detail", "value", "result"])
        print(f"{header}\n\n{table}", flush=True)
        write_results(args.out, "gpu_check", header, table, {"device": device_name(device), "world": world,
                                                              "backend": dist.get_backend(), "rows": rows})


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--ranks", type=int, default=4, help="spawned processes when not under torchrun")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024, help="MLP width (1024: several pieces per hop)")
    parser.add_argument("--memory-hidden", type=int, default=2048, help="MLP width of the memory check")
    parser.add_argument("--out", required=True, help="results folder")
    args = parser.parse_args(argv)
    if args.ranks < 1 or args.steps < 3 or args.hidden < 1:
        parser.error("--ranks and --hidden must be >= 1 and --steps >= 3")
    check_device(parser, args.device, args.backend, args.ranks)
    launch(main_rank, args.ranks, args.backend, args)
    results = Path(args.out) / "gpu_check.json"
    failed = [r for r in json.loads(results.read_text())["rows"] if r["result"] == "FAIL"]
    if failed:
        print(f"gpu_check: error: {len(failed)} check(s) failed: " + "; ".join(
            f"{r['check']} ({r['detail']})" for r in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
