"""How many torch calls PipeSGD adds on the training thread per iteration (issue 38 part 3: "the training thread left
alone", no per-parameter loop), counted rather than timed, so the count is the same on any machine.

    python experiments/count_step_calls.py                        # 2 gloo ranks on CPU, ResNet-18 (~30 s)
    python experiments/count_step_calls.py --models lenet --out /tmp/c

Per model, optimizer (SGD with momentum, AdamW; ``foreach=True`` as on a GPU) and way (the optimizer alone, PipeSGD
width 2 q8 with ``staleness="none"`` and with look-ahead, no warm-up): the torch calls the training thread issues in
``zero_grad()`` + ``step()`` and in the whole iteration (forward and backward included), as the dispatcher sees them
from Python (``TorchDispatchMode``, which is per thread: the communication worker's calls are not counted), per
iteration over ``--iters`` iterations after 3. A call in a loop over the parameters or buffers shows as a count that
grows with them. Writes ``step_calls.md`` (provenance first) under ``--out``.
"""
from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser, known_names  # noqa: E402
from experiments.harness.provenance import markdown_header, provenance  # noqa: E402
from gpu_common import CIFAR_SHAPE, build, launch, markdown  # noqa: E402
from pipesgd import PipeSGD  # noqa: E402
from timing_model.atomic import write_text_atomic  # noqa: E402

MODELS, WAYS = ("lenet", "resnet20", "resnet18"), ("alone", "pipe", "pipe+lookahead")
OPTIMIZERS = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=True),
              "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True)}


class Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count(model: torch.nn.Module, optimizer: str, way: str, iters: int) -> tuple[float, float]:
    """(calls in zero_grad + step, calls in the whole iteration), per iteration, on a fresh ``model``."""
    opt = OPTIMIZERS[optimizer](model.parameters())
    if way != "alone":
        opt = PipeSGD(opt, model, width=2, compression="q8", warmup_steps=0,
                      staleness="lookahead" if way == "pipe+lookahead" else "none")
    x, y = torch.randn(8, *CIFAR_SHAPE), torch.randint(0, 10, (8,))
    in_step, total = Calls(), Calls()
    for i in range(3 + iters):
        with total if i >= 3 else nullcontext():
            with in_step if i >= 3 else nullcontext():
                opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            with in_step if i >= 3 else nullcontext():
                opt.step()
    if way != "alone":
        opt.flush()
        opt.close()
    return in_step.count / iters, total.count / iters


def main_rank(rank: int, world: int, args) -> None:
    torch.set_num_threads(1)
    rows, params = [], {}
    for model_name in args.models:
        for optimizer in OPTIMIZERS:
            base = None
            for way in WAYS:
                torch.manual_seed(0)
                model = build(model_name)
                params[model_name] = sum(1 for _ in model.parameters())
                step, whole = count(model, optimizer, way, args.iters)
                base = whole if way == "alone" else base
                rows.append({"model": model_name, "optimizer": optimizer, "way": way, "zero_grad + step": f"{step:g}",
                             "iteration": f"{whole:g}", "added to the iteration": f"{whole - base:+g}"})
                if rank == 0:
                    print(rows[-1], flush=True)
    if rank == 0:
        note = (f"{world} gloo ranks on CPU, torch {torch.__version__}; per iteration, over {args.iters} after 3; "
                "parameters: " + ", ".join(f"{m} {n}" for m, n in params.items()))
        table = markdown(rows, list(rows[0]))
        text = markdown_header("Torch calls on the training thread per iteration", args.origin)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_text_atomic(str(Path(args.out) / "step_calls.md"), f"{text}\n{note}\n\n{table}\n")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="count_step_calls", description=__doc__)
    parser.add_argument("--models", default="resnet18", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--ranks", type=int, default=2, help="gloo processes (default 2)")
    parser.add_argument("--iters", type=int, default=3, help="counted iterations (default 3)")
    parser.add_argument("--out", default="experiments/results/bench_host")
    args = parser.parse_args(argv)
    args.models = known_names(parser, args.models, MODELS, "model")
    if args.ranks < 2 or args.iters < 1:
        parser.error("--ranks must be >= 2 (one rank syncs nothing) and --iters >= 1")
    args.origin = provenance()
    launch(main_rank, args.ranks, "gloo", args)
    print(f"wrote {Path(args.out) / 'step_calls.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
