"""How long a ring hop waits for the GIL beside a thread that holds it (issue 38: the codec ring loses 18-22 % beside
training on the GPU and 2.0-2.4x beside a Python loop), at several of the interpreter's switch intervals.

    python experiments/bench_gil_switch.py                       # hops of a 256 Ki-element chunk, q8 (~30 s)
    python experiments/bench_gil_switch.py --intervals-ms 5,0.1 --hops 100 --out /tmp/gil

One process, two threads, no network: the hop thread does what one hop of the per-hop ring does once its chunk has
arrived (``time.sleep`` stands for the wait on the wire, which releases the GIL; then the q8 decode of the received
chunk, the add into the partial sum and the encode of the next one, the real codec), first alone, then beside the
main thread spinning in pure Python (the GIL held but for the forced switches, as a training thread that
dispatches GPU kernels nearly holds it). CPython makes a thread that holds the GIL drop it only after the switch
interval (``sys.setswitchinterval``, 5 ms by default) once another thread asks for it, and a hop asks each time it
comes back from a call that released it (the wire, each torch op). Prints, per interval, the hop's time alone and
beside the spin and their ratio, measured side by side in one run; on two cores the two threads each have one.
Writes ``gil_switch.md`` (provenance first) under ``--out``.
"""
from __future__ import annotations

import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness
from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.provenance import markdown_header, provenance  # noqa: E402
from pipesgd.compression import build  # noqa: E402
from timing_model.atomic import write_text_atomic  # noqa: E402


def hops(count: int, wire_s: float, numel: int) -> float:
    """Seconds per hop: wait on the 'wire', decode the received chunk, add, encode the partial sum."""
    codec = build("q8")
    partial = torch.randn(numel)
    received = codec.compress(torch.randn(numel))
    start = time.perf_counter()
    for _ in range(count):
        time.sleep(wire_s)
        partial.add_(codec.decompress(*received))
        received = codec.compress(partial)
    return (time.perf_counter() - start) / count


def beside(load: str, count: int, wire_s: float, numel: int) -> float:
    """``hops`` on a thread of its own, the main thread idle ("alone") or spinning in Python ("spin")."""
    result: list[float] = []
    worker = threading.Thread(target=lambda: result.append(hops(count, wire_s, numel)))
    worker.start()
    if load == "spin":
        while worker.is_alive():
            pass
    worker.join()
    return result[0]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="bench_gil_switch.py", description=__doc__.splitlines()[0])
    parser.add_argument("--intervals-ms", default="5,1,0.5,0.1", help="switch intervals to try (ms, comma-separated)")
    parser.add_argument("--hops", type=int, default=60, help="hops per measurement (default 60)")
    parser.add_argument("--wire-ms", type=float, default=2.0, help="the wait on the wire per hop (default 2 ms)")
    parser.add_argument("--elements", type=int, default=256 * 1024, help="chunk size (default 256 Ki)")
    parser.add_argument("--out", default="experiments/results/bench_gil_switch")
    args = parser.parse_args(argv)
    try:
        intervals = [float(x) for x in args.intervals_ms.split(",") if x]
    except ValueError:
        parser.error(f"--intervals-ms: not a comma-separated list of numbers: {args.intervals_ms!r}")
    if not intervals or min(intervals) <= 0 or args.hops < 1 or args.wire_ms < 0 or args.elements < 1:
        parser.error("--intervals-ms must be positive, --hops and --elements at least 1, --wire-ms not negative")
    os.makedirs(args.out, exist_ok=True)
    origin = provenance()
    torch.set_num_threads(1)
    default = sys.getswitchinterval()
    lines = ["| switch interval ms | hop alone ms | hop beside the spin ms | beside / alone |", "|---|---|---|---|"]
    try:
        for interval in intervals:
            sys.setswitchinterval(interval / 1e3)
            alone = beside("alone", args.hops, args.wire_ms / 1e3, args.elements)
            spun = beside("spin", args.hops, args.wire_ms / 1e3, args.elements)
            lines.append(f"| {interval:g} | {alone * 1e3:.2f} | {spun * 1e3:.2f} | {spun / alone:.2f}x |")
            print(lines[-1], flush=True)
    finally:
        sys.setswitchinterval(default)
    text = markdown_header("A ring hop beside a Python spin", origin)
    text += (f"\n{args.hops} hops of {args.elements} elements (q8 decode + add + encode) after {args.wire_ms:g} ms "
             f"on the wire each; torch {torch.__version__}, Python {sys.version.split()[0]}\n\n" + "\n".join(lines)
             + "\n")
    path = os.path.join(args.out, "gil_switch.md")
    write_text_atomic(path, text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
