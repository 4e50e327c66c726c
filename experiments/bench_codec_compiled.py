"""q8 and q4 with each codec call's kernels fused by ``torch.compile``, against the library's eager codec (issue 38
part 3: "codec kernels fused where the GPU allows"), before any of it goes into the library: the same bytes?, and
how much host time per call (what the communication thread holds the GIL for, issuing launches) and device time
per call each takes.

    python experiments/bench_codec_compiled.py --device cuda --out DIR        # on the GPU machine (Triton)
    python experiments/bench_codec_compiled.py --device cpu --sizes 35000 --repeats 3 --out /tmp/c   # a smoke run

The eager codec (``pipesgd.compression.quantize``) issues about a dozen operations per encode and three per decode;
the compiled one computes the same steps (scale = max|x| / qmax per block, NaN for a block holding inf or NaN;
codes = round(x / scale), 0 where the scale is NaN; q4 packed two per byte; decode = code * scale) in one function
per direction, compiled once for every size (``dynamic=True``). Sizes: a LeNet chunk at p = 4 (35 K elements), all
of LeNet (140 K), a ResNet-18 chunk at p = 4 (2.8 M), all of it (11.2 M). Per size and codec: host us per call (the
wall time of issuing ``--repeats`` calls in a row, divided by them; on CUDA nothing waits for the device), device ms
per call (the calls between two CUDA events; the wall time on CPU), and whether payloads and decoded values are
the eager codec's (code bytes bit for bit; scales and decoded values as numbers, so +0.0 and -0.0 agree). The
first call's compile time is reported apart. Writes ``codec_compiled.md``.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser, known_names  # noqa: E402
from experiments.harness.provenance import markdown_header, provenance  # noqa: E402
from pipesgd.compression import build  # noqa: E402
from timing_model.atomic import write_text_atomic  # noqa: E402

CODECS = ("q8", "q4")
DEFAULT_SIZES = "35000,140000,2800000,11200000"


def encode(flat: torch.Tensor, block: int, qmax: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, code bytes) of ``flat``: the quantizer's steps as one function for the compiler."""
    n = flat.numel()
    rows = (n + block - 1) // block
    blocks = F.pad(flat.float(), (0, rows * block - n)).view(rows, block)
    scale = torch.maximum(blocks.amax(dim=1), blocks.amin(dim=1).neg()) / qmax
    scale = torch.where(torch.isfinite(scale), scale, float("nan"))
    q = torch.round(blocks / torch.where(scale > 0, scale, 1.0)[:, None])
    codes = torch.where(torch.isnan(scale)[:, None], 0.0, q).flatten()[:n].to(torch.int8)
    if bits == 4:
        nibbles = F.pad(codes + 8, (0, n % 2), value=8).to(torch.uint8).view(-1, 2)
        return scale, nibbles[:, 0] | (nibbles[:, 1] << 4)
    return scale, codes.view(torch.uint8)


def decode(scale: torch.Tensor, code_bytes: torch.Tensor, n: int, block: int, bits: int) -> torch.Tensor:
    if bits == 4:
        codes = torch.stack(((code_bytes & 0xF), (code_bytes >> 4)), dim=1).flatten()[:n].to(torch.float32) - 8
    else:
        codes = code_bytes.view(torch.int8).to(torch.float32)
    rows = scale.numel()
    return (F.pad(codes, (0, rows * block - n)).view(rows, block) * scale[:, None]).flatten()[:n]


def compiled_pair(codec):
    """The compiled codec's compress and decompress, payloads laid out as the library's."""
    enc = torch.compile(encode, dynamic=True)
    dec = torch.compile(decode, dynamic=True)
    block, bits = codec.block_size, codec.bits

    def compress(flat: torch.Tensor) -> torch.Tensor:
        scale, code_bytes = enc(flat, block, codec.qmax, bits)
        return torch.cat((scale.view(torch.uint8), code_bytes))

    def decompress(payload: torch.Tensor, n: int) -> torch.Tensor:
        rows = (n + block - 1) // block
        return dec(payload[: 4 * rows].view(torch.float32), payload[4 * rows:], n, block, bits)

    return compress, decompress


def timed(fn, device: torch.device, repeats: int) -> tuple[float, float]:
    """(host us per call, device ms per call) of ``repeats`` calls in a row."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if device.type == "cuda" else None
    if events:
        events[0].record()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    host = (time.perf_counter() - start) / repeats
    if events:
        events[1].record()
    sync()
    device_s = events[0].elapsed_time(events[1]) / 1e3 / repeats if events else host
    return host * 1e6, device_s * 1e3


def sample(n: int, block: int, device: torch.device) -> torch.Tensor:
    """Gradient-like values, with an all-zero block and a block holding inf where there is room (both masked)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(device)
    if n >= 3 * block:
        x[:block] = 0
        x[block + 3] = float("inf")
    return x


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, NaN where the other has NaN; +0.0 and -0.0 count as equal (an all-zero block's
    scale, max(0, -0), comes out with either sign, from the eager codec too, depending on its vectorised path)."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def same_payload(a: torch.Tensor, b: torch.Tensor, rows: int) -> bool:
    """Scales equal as values, code bytes equal bit for bit."""
    return (a.numel() == b.numel() and same_values(a[: 4 * rows].view(torch.float32), b[: 4 * rows].view(torch.float32))
            and torch.equal(a[4 * rows:], b[4 * rows:]))


def measure(codec_name: str, n: int, device: torch.device, repeats: int) -> dict:
    codec = build(codec_name)
    compress, decompress = compiled_pair(codec)
    x = sample(n, codec.block_size, device)
    start = time.perf_counter()
    payload = compress(x)
    decoded = decompress(payload, n)
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    eager_payload, ctx = codec.compress(x)
    row = {"codec": codec_name, "n": n, "first_call_s": first_s,
           "same_payload": same_payload(payload, eager_payload, (n + codec.block_size - 1) // codec.block_size),
           "same_decode": same_values(decoded, codec.decompress(eager_payload, ctx))}
    for kind, fn in (("eager encode", lambda: codec.compress(x)), ("compiled encode", lambda: compress(x)),
                     ("eager decode", lambda: codec.decompress(eager_payload, ctx)),
                     ("compiled decode", lambda: decompress(payload, n))):
        row[kind] = timed(fn, device, repeats)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| codec | elements | same bytes | encode host us: eager, compiled | encode device ms: eager, compiled "
             "| decode host us: eager, compiled | decode device ms: eager, compiled | first compiled call s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same = "yes" if r["same_payload"] and r["same_decode"] else (
            f"payload {'yes' if r['same_payload'] else 'NO'}, decode {'yes' if r['same_decode'] else 'NO'}")
        cells = [f"{r['eager ' + k][i]:.1f}, {r['compiled ' + k][i]:.1f}" if i == 0 else
                 f"{r['eager ' + k][i]:.3f}, {r['compiled ' + k][i]:.3f}" for k in ("encode",) for i in (0, 1)]
        cells += [f"{r['eager decode'][0]:.1f}, {r['compiled decode'][0]:.1f}",
                  f"{r['eager decode'][1]:.3f}, {r['compiled decode'][1]:.3f}"]
        lines.append(f"| {r['codec']} | {r['n']:,} | {same} | {' | '.join(cells)} | {r['first_call_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="bench_codec_compiled", description=__doc__)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--codecs", default=",".join(CODECS), help="comma-separated, of q8,q4")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated element counts")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    codecs = known_names(parser, args.codecs, CODECS, "codec")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: comma-separated element counts, got {args.sizes!r}")
    if min(sizes) < 1 or args.repeats < 1:
        parser.error("--sizes and --repeats must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but no CUDA device is available (use --device cpu for a smoke run)")
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # as a communication thread runs a codec beside the training step
    rows = []
    for name in codecs:
        for n in sizes:
            rows.append(measure(name, n, device, args.repeats))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    what = (torch.cuda.get_device_name(device) + f", CUDA {torch.version.cuda}") if device.type == "cuda" else "CPU"
    text = (markdown_header("q8 and q4, eager against compiled (torch.compile)", provenance())
            + f"- device: {what}, torch {torch.__version__}; per call, {args.repeats} calls in a row; host us: the "
            f"wall time of issuing them\n\n{table(rows)}\n")
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "codec_compiled.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
