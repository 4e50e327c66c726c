"""Many workers in one process: how look-ahead's stand-in ages as workers multiply (issue 36, item 3).

The stand-in for an average still in flight is one worker's own gradient, noisier the more workers share a global
batch. Running 16 or 64 gloo ranks on two cores is not possible, so ``simulate`` runs W workers in one process
with the library's own pieces: each worker's look-ahead is a ``pipesgd.delay.lookahead.Lookahead`` (the replay of the
real optimizer on its own gradients in flight), the due rule is ``pipesgd.delay.pipeline.Pipeline``, and the master
step is the wrapped torch optimizer on the mean gradient, as ``PipeSGD`` applies it. Data and model are the
trainer's: ``shard_batches`` gives worker w of W the same batches as rank w of a W-rank run.

Steps of one simulated iteration t:
  Step 1: each worker moves the master weights to its look-ahead (its stand-ins of the steps in flight), computes
          its gradient on its batch there, and moves back.
  Step 2: the mean over workers is step t's averaged gradient (what the all-reduce would deliver).
  Step 3: each worker keeps its own gradient as its stand-in; the pipeline applies the due step's mean to the master.
"""
from __future__ import annotations

import dataclasses
import random
import statistics
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pipesgd.defaults import STALENESS_MODES, WARMUP_STEPS
from pipesgd.comm.handles import CompletedWork
from pipesgd.delay.lookahead import Lookahead
from pipesgd.delay.pipeline import Pipeline
from pipesgd.train.data import load_digits, make_mnist1d, shard_batches, steps_per_epoch
from pipesgd.train.loop import evaluate
from pipesgd.train.models import build_model

TASKS = {"digits": lambda seed: load_digits(seed), "mnist1d": lambda seed: make_mnist1d(seed)}


@dataclass(frozen=True, slots=True)
class SimSpec:
    """One simulated run: W workers share a global batch, LeNet with SGD and momentum as the trainer's default."""

    task: str = "digits"
    workers: int = 4
    width: int = 1
    staleness: str = "none"  # "lookahead" or "none" (width 1: nothing in flight)
    seed: int = 0
    global_batch: int = 128  # split evenly over the workers
    epochs: int = 20
    lr: float = 0.02
    momentum: float = 0.9
    warmup_steps: int = WARMUP_STEPS

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; valid: {', '.join(TASKS)}")
        if self.staleness not in STALENESS_MODES:
            raise ValueError(f"unknown staleness {self.staleness!r}; valid: {', '.join(STALENESS_MODES)}")
        if self.workers < 1 or self.global_batch % self.workers:
            raise ValueError(f"global batch {self.global_batch} must split evenly over {self.workers} workers")
        if self.width < 1 or self.epochs < 1:
            raise ValueError("width and epochs must be at least 1")

    @property
    def key(self) -> str:
        stale = f" {self.staleness}" if self.width > 1 else ""
        return f"{self.task} W={self.workers} width={self.width}{stale} seed={self.seed}"


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def simulate(spec: SimSpec) -> dict:
    """Train as ``spec`` says; return its final test accuracy and loss."""
    ds = TASKS[spec.task](spec.seed)
    _seed(spec.seed)
    model = build_model("lenet", ds.input_shape, ds.num_classes)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum)
    looking = spec.width > 1 and spec.staleness == "lookahead"
    workers = [Lookahead(optimizer, params, spec.width) if looking else None for _ in range(spec.workers)]
    pipeline: Pipeline[list[torch.Tensor]] = Pipeline(spec.width, spec.warmup_steps)
    local_batch = spec.global_batch // spec.workers
    per_epoch = steps_per_epoch(len(ds.x_train), spec.workers, local_batch)

    def apply(step: int, mean: list[torch.Tensor]) -> None:
        for worker in workers:
            if worker is not None:
                worker.discard(step)
        for p, g in zip(params, mean):
            p.grad = g
        optimizer.step()

    model.train()
    t = 0
    for epoch in range(spec.epochs):
        shards = [shard_batches(ds, epoch, spec.seed, w, spec.workers, local_batch) for w in range(spec.workers)]
        for batches in zip(*shards):
            # Step 1: every worker's gradient at its own look-ahead weights.
            grads = []
            for worker, (x, y) in zip(workers, batches):
                if worker is not None:
                    worker.advance()
                model.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                grads.append([p.grad.detach().clone() for p in params])
                if worker is not None:
                    worker.restore()
            # Step 2: the average the all-reduce would deliver.
            mean = [torch.stack(gs).mean(0) for gs in zip(*grads)]
            # Step 3: stand-ins kept while step t is in flight; the due step applied to the master weights.
            if looking and pipeline.depth(t) > 1:
                for worker, own in zip(workers, grads):
                    worker.record(t, own)
            pipeline.submit(t, CompletedWork(mean))
            due = pipeline.pop_due(t)
            if due is not None:
                apply(due.step, due.handle.wait())
            t += 1
    for entry in pipeline.flush():
        apply(entry.step, entry.handle.wait())
    accuracy, loss = evaluate(model, ds, torch.device("cpu"))
    return {"key": spec.key, **dataclasses.asdict(spec), "steps": t, "steps_per_epoch": per_epoch,
            "final_accuracy": round(accuracy, 5), "final_loss": round(loss, 5)}


def plan(tasks: list[str], workers: list[int], seeds: list[int], width: int = 2) -> list[SimSpec]:
    """Per task and worker count: width 1, width ``width`` plain and with look-ahead, for every seed."""
    configs = [(1, "none"), (width, "none"), (width, "lookahead")]
    return [SimSpec(task=task, workers=w, width=k, staleness=s, seed=seed)
            for task in tasks for w in workers for seed in seeds for k, s in configs]


def summarise(runs: list[dict]) -> list[dict]:
    """Mean and sample std of the final accuracy per (task, workers, width, staleness), in plan order."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["task"], run["workers"], run["width"], run["staleness"]), []).append(run)
    out = []
    for (task, workers, width, staleness), members in groups.items():
        accuracy = [m["final_accuracy"] for m in members]
        out.append({"task": task, "workers": workers, "width": width, "staleness": staleness,
                    "local_batch": members[0]["global_batch"] // workers, "seeds": sorted(m["seed"] for m in members),
                    "accuracy_mean": round(statistics.fmean(accuracy), 5),
                    "accuracy_std": round(statistics.stdev(accuracy), 5) if len(accuracy) > 1 else 0.0})
    return out


def summary_markdown(summary: list[dict]) -> str:
    """Final test accuracy (%) per worker count: width 1, width K plain, width K with look-ahead."""
    width = max((c["width"] for c in summary), default=2)
    lines = [f"| task | workers | local batch | width 1 | plain width {width} | look-ahead width {width} | "
             f"look-ahead − width 1 |", "|---|---|---|---|---|---|---|"]
    rows: dict[tuple, dict] = {}
    for c in summary:
        rows.setdefault((c["task"], c["workers"]), {})[(c["width"], c["staleness"])] = c

    def cell(c: dict | None) -> str:
        return f"{100 * c['accuracy_mean']:.1f} ± {100 * c['accuracy_std']:.1f}" if c else "-"

    for (task, workers), cs in rows.items():
        sync = cs.get((1, "none"))
        plain = next((c for (k, s), c in cs.items() if k > 1 and s == "none"), None)
        ahead = next((c for (k, s), c in cs.items() if k > 1 and s == "lookahead"), None)
        gap = f"{100 * (ahead['accuracy_mean'] - sync['accuracy_mean']):+.1f}" if sync and ahead else "-"
        batch = (sync or plain or ahead)["local_batch"]
        lines.append(f"| {task} | {workers} | {batch} | {cell(sync)} | {cell(plain)} | {cell(ahead)} | {gap} |")
    return "\n".join(lines)
