"""Codec kernels, new against old (issue 11, part 4): encode and decode GB/s of q8, q4 and sign as they are now
and as they were (the frozen copy in ``tests/codec_reference.py``), bf16 and fp16 beside them as a control (one
implementation timed twice: its ratio shows the noise), in one process with one thread.

    python experiments/bench_codecs.py                        # 64 KB, 1.05 MB, 6.3 MB of fp32
    python experiments/bench_codecs.py --sizes 6.3MB --repeats 31 --codecs q8,q8-stochastic

Each repeat times new and old back to back, in alternating order; the table shows medians and new / old.
6.3 MB is one ring chunk of the 6.3 M-parameter MLP over 4 ranks, and 1.05 MB one of the six pieces the ring encodes
it in (``pipesgd.comm.ring.piece_bounds``), which is what a codec sees there.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

# The old codecs live in this checkout's tests/; the new ones must come from the same checkout, wherever it runs from.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.codec_ab import CodecPair, markdown, measure_ab  # noqa: E402
from experiments.harness.one_line import OneLineParser  # noqa: E402
from pipesgd.compression import build  # noqa: E402

_UNITS = {"": 1, "B": 1, "KB": 1_000, "MB": 1_000_000, "GB": 1_000_000_000, "KIB": 1 << 10, "MIB": 1 << 20,
          "GIB": 1 << 30}


def _pairs() -> dict[str, CodecPair]:
    try:
        from tests.codec_reference import ReferenceScalarQuantizer, ReferenceSignCompressor
    except ImportError as err:
        print(f"bench_codecs: error: the old codecs (tests/codec_reference.py) are not in this checkout ({err})",
              file=sys.stderr)
        sys.exit(2)
    return {
        "q8": CodecPair("q8", lambda: build("q8"), lambda: ReferenceScalarQuantizer(8)),
        "q8-stochastic": CodecPair("q8-stochastic", lambda: build("q8", stochastic=True),
                                   lambda: ReferenceScalarQuantizer(8, stochastic=True)),
        "q4": CodecPair("q4", lambda: build("q4"), lambda: ReferenceScalarQuantizer(4)),
        "q4-stochastic": CodecPair("q4-stochastic", lambda: build("q4", stochastic=True),
                                   lambda: ReferenceScalarQuantizer(4, stochastic=True)),
        "sign": CodecPair("sign", lambda: build("sign"), ReferenceSignCompressor),
        "bf16": CodecPair("bf16", lambda: build("bf16"), lambda: build("bf16")),
        "fp16": CodecPair("fp16", lambda: build("fp16"), lambda: build("fp16")),
    }


def _size(text: str) -> int:
    """'6.3MB' (decimal) or '64KiB' (binary) -> fp32 elements (bytes / 4)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*((?:[KMG]I?)?B?)\s*", text.upper())
    if not match or match.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size like 64KB, 64KiB or 6.3MB: {text!r}")
    n_bytes = float(match.group(1)) * _UNITS[match.group(2)]
    if n_bytes < 4:
        raise argparse.ArgumentTypeError(f"a size must hold at least one fp32 element (4 B): {text!r}")
    return int(n_bytes) // 4


def main(argv: list[str] | None = None) -> int:
    pairs = _pairs()
    parser = OneLineParser(prog="bench_codecs", description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", default="q8,q4,sign,bf16,fp16", help=f"comma-separated, of {', '.join(pairs)}")
    parser.add_argument("--sizes", default="64KB,1.05MB,6.3MB", help="comma-separated fp32 sizes, e.g. 64KB,6.3MB")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved A/B repeats (medians over them)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1, as a ring rank)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    names = [n for n in args.codecs.split(",") if n]
    bad = [n for n in names if n not in pairs]
    if bad or not names:
        parser.error(f"unknown codec {', '.join(bad) or repr(args.codecs)}; valid: {', '.join(pairs)}")
    try:
        sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    if not sizes:
        parser.error(f"--sizes names no size: {args.sizes!r}")
    if args.repeats < 1 or args.threads < 1:
        parser.error(f"--repeats and --threads must be >= 1, got {args.repeats} and {args.threads}")
    if args.device not in ("cpu", "cuda") or (args.device == "cuda" and not torch.cuda.is_available()):
        parser.error(f"--device must be cpu or cuda (with a GPU), got {args.device!r}")
    torch.set_num_threads(args.threads)
    clock = "this thread's CPU time" if args.device == "cpu" else "wall time"
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.device}, {args.repeats} interleaved repeats; "
          f"GB/s of fp32 input, by {clock}")
    rows = []
    for name in names:
        for numel in sizes:
            rows.append(measure_ab(pairs[name], numel, args.repeats, args.device))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(markdown(rows))
    if not all(row.same_bits for row in rows):
        print("bench_codecs: error: new and old codecs gave different bits (see 'same bits')", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
