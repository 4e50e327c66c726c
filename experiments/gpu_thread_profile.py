"""Where one Pipe-SGD step's host time goes, thread by thread (issue 38's lead from the fifth GPU session: LeNet's
compressed all-reduce takes 2.5-4.7 ms alone and about 4 ms of wait per step in training; take apart the launches,
host copies and waits of the all-reduce on the communication thread against the training thread's).

    python experiments/gpu_thread_profile.py --device cuda --ranks 4 --out DIR          # under MPS
    python experiments/gpu_thread_profile.py --device cpu --ranks 2 --steps 3 --out /tmp/p

Per model and variant (Pipe-SGD K = 2, look-ahead, SGD with momentum 0.9, batch 64 of 3x32x32): ``--steps`` steps
after ``--warmup`` under ``torch.profiler`` on every rank (CPU activity, and CUDA's on a GPU), rank 0's events split by
thread: the training thread (forward, backward, ``step()``) and the communication thread (the jobs, each inside its
``pipesgd::allreduce`` span). Per thread and step: its span's time, the time of the torch operators it ran (their own
time: the rest of a span is Python and waiting outside an operator), CUDA runtime calls (kernel launches, memory
copies, synchronizations: count and host time), and the operators with the most own time. Unlike ``cProfile``
(one profiler per process on Python 3.12, all threads at once) the split is by the thread each event ran on.
Writes ``thread_profile.md`` and ``.json`` and, for the first model's first variant, rank 0's trace
``trace-<model>.json.gz`` (Perfetto).
"""
from __future__ import annotations

import bisect
import gzip
import json
import math
import shutil
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import (add_profile_flags, build, check_device, check_profile_flags, device_name, launch,  # noqa: E402
                        rank_device)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser  # noqa: E402
from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD  # noqa: E402
from timing_model.atomic import write_text_atomic  # noqa: E402

ALLREDUCES = ("alltoall", "ring")
_NESTING_SLACK_US = 1.0  # trace timestamps are rounded: a child may seem to end a hair after its parent
STEP_SPAN, JOB_SPAN = "pipesgd::train_step", "pipesgd::allreduce"
# CUDA runtime calls by what they cost the calling thread: kernel launches, memory copies, waits for the device.
RUNTIME_KINDS = {"launch": ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"),
                 "copy": ("cudaMemcpyAsync", "cudaMemcpy", "cudaMemsetAsync"),
                 "sync": ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
                          "cudaStreamWaitEvent", "cudaEventQuery", "cudaStreamQuery")}


def runtime_kind(name: str) -> str | None:
    return next((kind for kind, names in RUNTIME_KINDS.items() if name in names), None)


def self_times(events: list[dict]) -> dict[int, float]:
    """Own time (us) of each of one thread's nested events, by index: its duration less its direct children's. An
    event that outlasts its parent is asynchronous (gloo's ``gloo:send`` spans end when the transfer does) and is
    left out: it is neither host time of the thread nor a child."""
    own: dict[int, float] = {}
    stack: list[tuple[int, float]] = []  # (index, end)
    for i in sorted(range(len(events)), key=lambda j: (events[j]["ts"], -events[j]["dur"])):
        start, end = events[i]["ts"], events[i]["ts"] + events[i]["dur"]
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack and end > stack[-1][1] + _NESTING_SLACK_US:
            continue
        if stack:
            own[stack[-1][0]] -= events[i]["dur"]
        own[i] = events[i]["dur"]
        stack.append((i, end))
    return own


def inside(spans: list[tuple[float, float]], event: dict) -> bool:
    """Whether ``event`` lies within one of ``spans`` (sorted, not overlapping)."""
    k = bisect.bisect_right(spans, (event["ts"], math.inf)) - 1
    return k >= 0 and event["ts"] + event["dur"] <= spans[k][1] + _NESTING_SLACK_US


def split_by_thread(trace: dict, steps: int) -> dict[str, dict]:
    """Per thread that ran a training step or a communication job: its spans, operators and CUDA runtime calls, per
    step, from a Chrome trace's complete events (kineto puts an operator's runtime calls on its thread)."""
    by_tid: dict[object, list[dict]] = defaultdict(list)
    for event in trace.get("traceEvents", []):
        if event.get("ph") == "X" and "dur" in event:
            by_tid[(event.get("pid"), event.get("tid"))].append(event)
    threads = {}
    for events in by_tid.values():
        names = {e["name"] for e in events}
        role = "training" if STEP_SPAN in names else "communication" if JOB_SPAN in names else None
        if role is None:
            continue
        span = STEP_SPAN if role == "training" else JOB_SPAN
        own = self_times(events)
        # Only what ran inside a whole span: a job in flight when the profile started or stopped left its operators
        # in the trace without its span.
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == span)
        ops: dict[str, float] = defaultdict(float)
        runtime = {kind: [0, 0.0] for kind in RUNTIME_KINDS}
        for i, event in enumerate(events):
            if not inside(spans, event):
                continue
            kind = runtime_kind(event["name"])
            if kind is not None:
                runtime[kind][0] += 1
                runtime[kind][1] += event["dur"]
            elif event.get("cat") == "cpu_op" and i in own:
                ops[event["name"]] += own[i]
        threads[role] = {
            "span_ms": sum(end - start for start, end in spans) / steps / 1e3,
            "op_own_ms": sum(ops.values()) / steps / 1e3,
            "runtime": {kind: [n / steps, us / steps / 1e3] for kind, (n, us) in runtime.items()},
            "top_ops": sorted(((name, us / steps / 1e3) for name, us in ops.items()), key=lambda t: -t[1]),
        }
    return threads


def profile_variant(device: torch.device, name: str, codec: str, allreduce: str, args, trace_path: Path | None):
    torch.manual_seed(0)
    net = build(name).to(device)
    x = torch.randn(64, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    opt = PipeSGD(torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), net, width=2, warmup_steps=0,
                  compression=codec, options=PipeSGDOptions(allreduce=allreduce))

    def iteration() -> None:
        with record_function(STEP_SPAN):
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()

    for _ in range(args.warmup):
        iteration()
    unprofiled = cpu_per_step(iteration, device, args.steps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # Every thread's events, the communication worker's too (without it the profiler sees only the thread that
    # started it: the worker was started before, so its events would be missing).
    with profile(activities=activities, experimental_config=all_threads_config()) as prof:
        for _ in range(args.steps):
            iteration()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the side stream's last kernels inside the profile
    opt.flush()
    opt.close()
    raw = Path(args.out) / f".trace-rank{torch.distributed.get_rank()}.json"
    prof.export_chrome_trace(str(raw))
    threads = split_by_thread(json.loads(raw.read_text()), args.steps)
    if trace_path is not None:
        with raw.open("rb") as src, gzip.open(trace_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    raw.unlink()
    for role, numbers in unprofiled.items():
        threads.setdefault(role, {}).update(numbers)
    return threads


def all_threads_config() -> _ExperimentalConfig | None:
    try:
        return _ExperimentalConfig(profile_all_threads=True)
    except TypeError:  # a torch without the option: the communication thread's rows say "(no events)"
        print("gpu_thread_profile: this torch profiles only the thread that starts the profiler", file=sys.stderr)
        return None


def cpu_per_step(iteration, device: torch.device, steps: int) -> dict[str, dict[str, float]]:
    """Without the profiler: the iterations' wall time and each thread's CPU time, per step (a thread's CPU clock,
    ``pthread_getcpuclockid``; a thread off its CPU, blocked on the wire or descheduled, does not count)."""
    comm = [t for t in threading.enumerate() if t.name.startswith("pipesgd-comm")]
    clocks = {"training": time.pthread_getcpuclockid(threading.get_ident())}
    if len(comm) == 1:
        clocks["communication"] = time.pthread_getcpuclockid(comm[0].ident)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    sync(device)
    clocks["process"] = time.CLOCK_PROCESS_CPUTIME_ID
    cpu0, wall0 = {role: time.clock_gettime(c) for role, c in clocks.items()}, time.perf_counter()
    for _ in range(steps):
        iteration()
    sync(device)
    wall = (time.perf_counter() - wall0) / steps * 1e3
    numbers = {role: {"wall_ms": wall, "cpu_ms": (time.clock_gettime(c) - cpu0[role]) / steps * 1e3}
               for role, c in clocks.items()}
    process = numbers.pop("process")["cpu_ms"]  # the rest: gloo's I/O threads, autograd's, the CUDA driver's
    numbers["other threads"] = {"wall_ms": wall, "cpu_ms": process - sum(n["cpu_ms"] for n in numbers.values())}
    return numbers


def section(title: str, threads: dict[str, dict], top: int) -> str:
    rows = ["| thread | iteration ms | CPU ms | span ms | operators' own ms | launches (ms) | copies (ms) | syncs (ms) "
            "| top operators, own ms |",
            "|---|---|---|---|---|---|---|---|---|"]
    for role in ("training", "communication", "other threads"):
        t = threads.get(role, {})
        clock = f"{t['wall_ms']:.3f} | {t['cpu_ms']:.3f}" if "cpu_ms" in t else " | "
        if role == "other threads":
            rows.append(f"| {role} | {clock} | | | | | | |")
        elif "span_ms" not in t:
            rows.append(f"| {role} | {clock} | (no events) | | | | | |")
        else:
            calls = [f"{t['runtime'][k][0]:.1f} ({t['runtime'][k][1]:.3f})" for k in RUNTIME_KINDS]
            tops = ", ".join(f"{n} {ms:.3f}" for n, ms in t["top_ops"][:top])
            rows.append(f"| {role} | {clock} | {t['span_ms']:.3f} | {t['op_own_ms']:.3f} | {' | '.join(calls)} | "
                        f"{tops} |")
    return f"## {title}\n\n" + "\n".join(rows)


def main_rank(rank: int, world: int, args) -> None:
    device = rank_device(args.device, rank)
    sections, data = [], {}
    for m, name in enumerate(args.models.split(",")):
        for i, (codec, allreduce) in enumerate(args.variants):
            # One trace: the first model's first variant (a ResNet-18 trace with CUDA events runs to megabytes).
            trace = Path(args.out) / f"trace-{name}.json.gz" if rank == 0 and m == 0 and i == 0 else None
            threads = profile_variant(device, name, codec, allreduce, args, trace)
            title = f"{name}, Pipe-SGD K = 2, {codec} on {allreduce}"
            data[title] = threads
            sections.append(section(title, threads, args.top))
            if rank == 0:
                print(sections[-1] + "\n", flush=True)
    if rank == 0:
        header = (f"# One Pipe-SGD step's host time, thread by thread\n\ncommand: `python "
                  f"experiments/gpu_thread_profile.py {' '.join(sys.argv[1:])}`\n\ndate: "
                  f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; device: {device_name(device)}; "
                  f"gloo, {world} rank(s); rank 0, per step over {args.steps} steps after {args.warmup}. iteration "
                  f"ms and CPU ms: "
                  f"without the profiler, the wall time of an iteration and each thread's CPU time (its clock); the "
                  f"rest under the profiler: span, the training thread's iterations (forward, backward, step(), "
                  f"zero_grad()) or the communication thread's jobs; operators' own ms, the time inside torch "
                  f"operators (the rest of a span is Python and waits outside them); launches, copies, syncs: CUDA "
                  f"runtime calls per step (their host ms)")
        text = header + "\n\n" + "\n\n".join(sections) + "\n"
        write_text_atomic(Path(args.out) / "thread_profile.md", text)
        write_text_atomic(Path(args.out) / "thread_profile.json", json.dumps(data, indent=1) + "\n")


def parse_variants(parser, text: str) -> list[tuple[str, str]]:
    """'q8:alltoall,none:ring' -> [(codec, allreduce), ...]."""
    variants = []
    for item in text.split(","):
        codec, _, allreduce = item.partition(":")
        if allreduce not in ALLREDUCES or not codec:
            parser.error(f"a variant is CODEC:ALLREDUCE with ALLREDUCE one of {', '.join(ALLREDUCES)}; got {item!r}")
        variants.append((codec, allreduce))
    return variants


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="gpu_thread_profile", description=__doc__)
    add_profile_flags(parser, models="lenet,resnet18", steps=10, top=6)
    parser.add_argument("--variants", default="q8:alltoall,q8:ring,none:alltoall",
                        help="CODEC:ALLREDUCE, comma-separated (default: %(default)s)")
    args = parser.parse_args(argv)
    check_profile_flags(parser, args)
    args.variants = parse_variants(parser, args.variants)
    from pipesgd.compression import available
    bad = [c for c, _ in args.variants if c not in available()]
    if bad:
        parser.error(f"unknown codec {', '.join(bad)}; valid: {', '.join(available())}")
    check_device(parser, args.device)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    launch(main_rank, args.ranks, "gloo", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
