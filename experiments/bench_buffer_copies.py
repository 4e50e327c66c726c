"""The training thread's copies of the BatchNorm buffers each step (issue 38 part 3), the per-buffer loop against
``pipesgd.grads.buffers.FlatGroup``, side by side in one run.

    python experiments/bench_buffer_copies.py                          # CPU, ResNet-20 and ResNet-18 (~10 s)
    python experiments/bench_buffer_copies.py --device cuda --out DIR  # on the GPU machine

Every step under ``buffers="broadcast"`` (the default) or ``"average"`` packs each dtype group of the model's
buffers into one flat tensor for the collective and writes the result back; the delayed modes pack a snapshot and
later write the reduced one back. What the training thread spends on that, without the collective: per model and
way, the median over ``--repeats`` round trips (pack, then write back) of the host time, interleaved round by round;
on CUDA also the device time (one synchronize after ``--calls`` round trips, divided by them). "loop" is how
``BufferSync`` did it before (a concatenation of one reshape per buffer, then a view, slice and copy per buffer);
"flat group" the library's now (the 1-D views made once: one concatenation, one split, one multi-tensor copy).
Writes ``buffer_copies.md`` (provenance first) under ``--out``.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.gpu_common import build, check_device  # noqa: E402
from experiments.harness.one_line import OneLineParser, known_names  # noqa: E402
from experiments.harness.provenance import markdown_header, provenance  # noqa: E402
from pipesgd.grads.buffers import FlatGroup, copy_into, flat_groups  # noqa: E402
from timing_model.atomic import write_text_atomic  # noqa: E402

MODELS = ("resnet20", "resnet18")


def loop_round_trip(groups: list[FlatGroup]) -> None:
    for group in groups:
        copy_into(group.tensors, torch.cat([t.reshape(-1) for t in group.tensors]))


def flat_round_trip(groups: list[FlatGroup]) -> None:
    for group in groups:
        group.unflatten_(group.flatten())


def timed(way, groups: list[FlatGroup], calls: int, device: torch.device) -> tuple[float, float]:
    """(host seconds per round trip, seconds per round trip until the device is done)."""
    start = time.perf_counter()
    for _ in range(calls):
        way(groups)
    issued = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return issued / calls, (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="bench_buffer_copies", description=__doc__)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of resnet20, resnet18")
    parser.add_argument("--repeats", type=int, default=30, help="interleaved rounds per way (default 30)")
    parser.add_argument("--calls", type=int, default=20, help="round trips per round (default 20)")
    parser.add_argument("--out", default="experiments/results/bench_buffer_copies")
    args = parser.parse_args(argv)
    models = known_names(parser, args.models, MODELS, "model")
    if args.repeats < 1 or args.calls < 1:
        parser.error("--repeats and --calls must be >= 1")
    check_device(parser, args.device)
    device = torch.device(args.device)
    origin = provenance()
    torch.set_num_threads(1)
    ways = {"loop": loop_round_trip, "flat group": flat_round_trip}
    lines = ["| model | buffers | way | host us per round trip | until done us | loop / flat group (host) |",
             "|---|---|---|---|---|---|"]
    with torch.no_grad():
        for name in models:
            buffers = list(build(name).to(device).buffers())
            groups = list(flat_groups(buffers).values())  # as BufferSync groups them
            times: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
            for way in ways.values():  # warm-up: allocator, first kernels
                timed(way, groups, 2, device)
            for _ in range(args.repeats):
                for label, way in ways.items():
                    times[label].append(timed(way, groups, args.calls, device))
            host = {label: statistics.median(t[0] for t in rows) for label, rows in times.items()}
            done = {label: statistics.median(t[1] for t in rows) for label, rows in times.items()}
            for label in ways:
                ratio = f"{host['loop'] / host['flat group']:.1f}x" if label == "flat group" else ""
                lines.append(f"| {name} | {len(buffers)} | {label} | {host[label] * 1e6:.1f} | "
                             f"{done[label] * 1e6:.1f} | {ratio} |")
                print(lines[-1], flush=True)
    where = (torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU") + f", torch {torch.__version__}"
    text = markdown_header("BatchNorm buffers packed and written back: per-buffer loop against one flat group", origin)
    text += (f"\n{where}; one thread; medians of {args.repeats} interleaved rounds of {args.calls} round trips "
             "(pack, then write back; no collective)\n\n" + "\n".join(lines) + "\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(str(out / "buffer_copies.md"), text)
    print(f"wrote {out / 'buffer_copies.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
