"""How many torch calls the communication worker makes per bucket of the two-collective exchange as p grows (issue 38
part 3: "the comm worker's Python per bucket O(1)"), counted rather than timed, so the count is the same on any
machine.

    python experiments/count_exchange_calls.py                        # p = 2, 4, 8 on loopback gloo, LeNet (~1 min)
    python experiments/count_exchange_calls.py --ranks 2,3 --codecs q8 --out /tmp/c

Per p and codec: the calls of one ``GradientExchange`` call over a bucket of ``--model``'s parameter count on rank 0
(after one uncounted call), as the dispatcher sees them from Python (``TorchDispatchMode``; the exchange runs on the
calling thread here, the same code the worker runs), in four kinds: views (no kernel: slices, reshapes, detach),
allocations, host syncs (``item()`` and the like: on a GPU the thread waits for the device) and the rest, each a
kernel on a GPU, the collectives among them; and the encoder's own calls (``amax``: one per encode call). Chunks are
batched as on CUDA, whatever their length (``pipesgd.compression.rows`` batches CPU chunks of up to 32 Ki elements
only, where that measured faster). Two paths: ``direct``, payloads on the tensors' own device (gloo on CPU, NCCL), and
``staged``, through host buffers as gloo carries CUDA tensors (here host to host: the same calls, the copies plain
ones). The last columns are the growth per extra peer between the smallest and largest p. Writes
``exchange_calls.md`` (provenance first) under ``--out``.
"""
from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser, known_names  # noqa: E402
from experiments.harness.provenance import markdown_header, provenance  # noqa: E402
from gpu_common import build, launch, markdown  # noqa: E402
from pipesgd.comm.exchange import GradientExchange  # noqa: E402
from pipesgd.comm.topology import RingTopology  # noqa: E402
from pipesgd.compression import ErrorFeedback  # noqa: E402
from pipesgd.compression import build as build_codec  # noqa: E402
from pipesgd.compression import rows as rows_module  # noqa: E402
from timing_model.atomic import write_text_atomic  # noqa: E402

CODECS = ("q8", "q8+ef", "sign+ef", "bf16")
MODELS = ("lenet", "resnet20", "resnet18")
VIEWS = {"view", "_unsafe_view", "slice", "select", "detach", "unsqueeze", "as_strided", "expand", "unbind", "split",
         "split_with_sizes", "alias", "t", "_reshape_alias", "squeeze", "narrow"}
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "zeros", "zeros_like", "new_zeros"}
KINDS = ("views", "allocations", "host syncs", "kernels", "of which collectives", "encoder amax")


class Kinds(TorchDispatchMode):
    """Counts each call by its kind (module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.count: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, name = str(func).split(".")[:2]
        kind = ("views" if name in VIEWS else "allocations" if name in ALLOCATIONS
                else "host syncs" if name == "_local_scalar_dense" else "kernels")
        self.count[kind] += 1
        self.count["of which collectives"] += namespace == "c10d"
        self.count["encoder amax"] += name == "amax"
        return func(*args, **(kwargs or {}))


class StagedTopology(RingTopology):
    """A topology that stages every payload through host buffers, as gloo with CUDA tensors does."""

    def stages(self, device: torch.device) -> bool:
        return True


PATHS = {"direct": RingTopology, "staged": StagedTopology}


def count_rank(rank: int, world: int, args) -> None:
    torch.set_num_threads(1)
    rows_module.CPU_BATCH_ELEMENTS = 1 << 62  # CUDA's rule: every chunk batched (module doc)
    for path, variant in ((path, variant) for path in args.paths for variant in args.codecs):
        name, feedback = variant.removesuffix("+ef"), variant.endswith("+ef")
        codec = build_codec(name, rank=rank)
        exchange = GradientExchange(PATHS[path](dist.group.WORLD), codec, "alltoall",
                                    ErrorFeedback(codec) if feedback else None)
        bucket = [torch.randn(args.numel, generator=torch.Generator().manual_seed(rank))]
        exchange(bucket)
        kinds = Kinds()
        with kinds:
            exchange(bucket)
        if rank == 0:
            row = {"path": path, "p": world, "codec": variant, "calls": sum(kinds.count[k] for k in KINDS[:4]),
                   **{kind: kinds.count[kind] for kind in KINDS}}
            print(row, flush=True)
            with open(args.rows_file, "a", encoding="utf-8") as rows:
                rows.write(json.dumps(row) + "\n")


def table(rows: list[dict], codecs: list[str]) -> str:
    """Rows by path, codec and p; each path and codec's largest p also gets the growth per extra peer."""
    ordered = sorted(rows, key=lambda r: (list(PATHS).index(r["path"]), codecs.index(r["codec"]), r["p"]))
    for path, codec in {(r["path"], r["codec"]) for r in ordered}:
        same = [r for r in ordered if (r["path"], r["codec"]) == (path, codec)]
        low, high = same[0], same[-1]
        for kind in ("calls", "kernels") if high["p"] > low["p"] else ():
            high[f"{kind} per extra peer"] = f"{(high[kind] - low[kind]) / (high['p'] - low['p']):.1f}"
    columns = ["path", "p", "codec", "calls", *KINDS, "calls per extra peer", "kernels per extra peer"]
    return markdown(ordered, columns)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="count_exchange_calls", description=__doc__)
    parser.add_argument("--ranks", default="2,4,8", help="comma-separated world sizes, each >= 2 (default 2,4,8)")
    parser.add_argument("--codecs", default=",".join(CODECS), help=f"comma-separated, of {', '.join(CODECS)}")
    parser.add_argument("--paths", default="direct,staged", help="comma-separated, of direct, staged")
    parser.add_argument("--model", default="lenet", help=f"the bucket: this model's parameters ({', '.join(MODELS)})")
    parser.add_argument("--out", default="experiments/results/bench_host")
    args = parser.parse_args(argv)
    args.codecs = known_names(parser, args.codecs, CODECS, "codec")
    known_names(parser, args.model, MODELS, "model")
    args.paths = known_names(parser, args.paths, PATHS, "path")
    try:
        worlds = sorted({int(p) for p in args.ranks.split(",")})
    except ValueError:
        parser.error(f"--ranks: comma-separated whole numbers, got {args.ranks!r}")
    if worlds[0] < 2:
        parser.error("--ranks: every world size must be >= 2 (one rank exchanges nothing)")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--out {args.out}: {error.strerror}")
    args.origin = provenance()
    args.numel = sum(p.numel() for p in build(args.model).parameters())  # the bucket: one model's gradient
    with tempfile.TemporaryDirectory() as scratch:  # the ranks' rows, one line each from rank 0
        args.rows_file = str(Path(scratch) / "rows.jsonl")
        for world in worlds:
            launch(count_rank, world, "gloo", args)
        rows = [json.loads(line) for line in Path(args.rows_file).read_text().splitlines()]
    note = (f"loopback gloo on CPU, torch {torch.__version__}; one bucket of {args.model}'s "
            f"{args.numel} parameters, one exchange call after one")
    text = markdown_header("Torch calls per bucket of the two-collective exchange, by p", args.origin)
    write_text_atomic(str(out / "exchange_calls.md"), f"{text}\n{note}\n\n{table(rows, args.codecs)}\n")
    print(f"wrote {out / 'exchange_calls.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
