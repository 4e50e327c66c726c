"""Many workers in one process: how look-ahead's stand-in ages as workers multiply (issue 36, item 3).

The stand-in for an average still in flight is one worker's own gradient, noisier the more workers share a global
batch. Running 16 or 64 gloo ranks on two cores is not possible, so ``simulate`` runs W workers in one process
with the library's own pieces: each worker's look-ahead is a ``pipesgd.delay.lookahead.Lookahead`` (the replay of the
real optimizer on its own gradients in flight), the due rule is ``pipesgd.delay.pipeline.Pipeline``, and the master
step is the wrapped torch optimizer on the mean gradient, as ``PipeSGD`` applies it. Data and model are the
trainer's: ``shard_batches`` gives worker w of W the same batches as rank w of a W-rank run.

The same runs diagnose a gap: ``standin="oracle"`` gives every worker the true average of each step in flight
as its stand-in (something no rank has in a real run) and so separates the stand-in's noise from the rest of
the delayed update; ``"shrunk"`` and ``"frozen-v"`` try two ways to lessen that noise with what a worker holds
(``experiments.harness.standin_variants``); ``"meanpoint"`` gives each worker its own batch's gradient evaluated
at the workers' mean look-ahead point instead of at its own (one more gradient per worker and step, which no real
run would pay): the same batch noise, without the worker's response to its own look-ahead error (the Hessian times
that error), so it separates the two; ``"overshoot"`` is the own gradient with the library's look-ahead reach 1.2
(``standin_variants.OvershootLookahead``) and ``"oracle-overshoot"`` the true average with that reach: synchronous SGD
whose gradients are taken 0.2 updates past the weights, a control for whether the reach helps staleness or
the optimizer; ``"last-average"`` is the last average applied to the master (the same on every worker, known
without waiting) and ``"own-share"`` the own gradient's 1/W share beside it. ``charlm`` is the accuracy study's
transformer task: the character GPT with AdamW, warm-up and cosine decay, 300 steps at a local batch of 32.

Steps of one simulated iteration t:
  Step 1: each worker moves the master weights to its look-ahead (its stand-ins of the steps in flight), computes
          its gradient on its batch there, and moves back.
  Step 2: the mean over workers is step t's averaged gradient (what the all-reduce would deliver).
  Step 3: each worker keeps its own gradient as its stand-in; the pipeline applies the due step's mean to the master.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from pipesgd.defaults import STALENESS_MODES, WARMUP_STEPS
from pipesgd.comm.handles import CompletedWork
from pipesgd.delay.lookahead import Lookahead
from pipesgd.delay.pipeline import Pipeline
from pipesgd.train.data import load_digits, load_pysrc, make_mnist1d, shard_batches, steps_per_epoch
from pipesgd.train.loop import cross_entropy, evaluate
from pipesgd.train.models import build_model
from pipesgd.train.optimizers import build_inner_optimizer
from pipesgd.train.schedule import build_schedule

from experiments.harness.standin_variants import (OVERSHOOT, CorrectedLookahead, FrozenMomentLookahead, OvershootLookahead,
                                                  LaggedLowRankAverage, LowRankAverage, ShrunkLookahead,
                                                  coarse_average)

TASKS = {"digits": lambda seed: load_digits(seed), "mnist1d": lambda seed: make_mnist1d(seed),
         "charlm": lambda seed: load_pysrc()}
# A worker's own gradient (the library's); the true average; two attempts at a better one (``standin_variants``);
# the own batch at the workers' mean look-ahead point (the noise without the worker's reaction to its own error);
# the own gradient with the look-ahead's reach scaled past the weights in flight (``OVERSHOOT``); everyone's q4 average.
STANDINS = ("local", "oracle", "shrunk", "frozen-v", "meanpoint", "overshoot", "oracle-overshoot", "coarse",
            "coarse-sign", "coarse-exchange", "own-then-coarse", "last-average", "own-share", "corrected", "lowrank",
            "lowrank8", "lowrank-lag")
# The last average applied to the master, the same on every worker and known without waiting ("last-average"); the
# own gradient's 1/W share beside it, (own + (W-1) last) / W ("own-share"): what the worker knows of the average.
LAST_AVERAGE = ("last-average", "own-share")
# The own gradient for the newest step in flight, everyone's q8 exchange average for the older ones (width >= 3): a
# coarse average that arrives during a compute phase, so that no forward pass waits for one.
LATE_COARSE = ("q8", True)
# everyone's average after a round trip through this codec (and, the exchange's, the mean once more)
COARSE = {"coarse": ("q4", False), "coarse-sign": ("sign", False), "coarse-exchange": ("q4", True)}
ORACLES = ("oracle", "oracle-overshoot")  # the true average stands in
STANDIN_TITLES = {"oracle": "true-average stand-in", "shrunk": "shrunk stand-in", "frozen-v": "frozen second moment",
                  "meanpoint": "own batch at the mean point", "overshoot": f"reach x{OVERSHOOT:g}",
                  "oracle-overshoot": f"true average, reach x{OVERSHOOT:g}", "coarse": "q4 average of all",
                  "coarse-sign": "sign average of all", "coarse-exchange": "q4 exchange of all",
                  "own-then-coarse": "own, then q8 exchange of all", "last-average": "last average applied",
                  "own-share": "own 1/W share beside the last average",
                  "corrected": "own, its reaction taken out", "lowrank": "own, the average's rank-4 part shared",
                  "lowrank8": "own, the average's rank-8 part shared",
                  "lowrank-lag": "own, the average's rank-4 part in last step's subspace"}
# the worker's look-ahead where it is not the library's ``Lookahead``
LOOKAHEADS = {"shrunk": ShrunkLookahead, "frozen-v": FrozenMomentLookahead, "corrected": CorrectedLookahead,
              "overshoot": OvershootLookahead, "oracle-overshoot": OvershootLookahead}


@dataclass(frozen=True, slots=True)
class Recipe:
    """How a task trains: the README's LeNet recipe, or the accuracy study's charlm one (its trainer flags)."""

    model: str = "lenet"
    optimizer: str = "sgd"
    lr: float = 0.02
    weight_decay: float = 0.0
    schedule: str = "constant"
    lr_warmup_steps: int = 0
    steps: int = 0  # 0: ``SimSpec.epochs`` epochs
    local_batch: int = 0  # 0: the global batch split over the workers


RECIPES = {"digits": Recipe(), "mnist1d": Recipe(),
           "charlm": Recipe(model="gpt", optimizer="adamw", lr=1e-3, weight_decay=0.1, schedule="cosine",
                            lr_warmup_steps=30, steps=300, local_batch=32)}


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
    standin: str = "local"  # any other: a diagnostic (see the module doc)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; valid: {', '.join(TASKS)}")
        if self.staleness not in STALENESS_MODES:
            raise ValueError(f"unknown staleness {self.staleness!r}; valid: {', '.join(STALENESS_MODES)}")
        if self.workers < 1 or self.global_batch % self.workers:
            raise ValueError(f"global batch {self.global_batch} must split evenly over {self.workers} workers")
        if self.standin not in STANDINS:
            raise ValueError(f"unknown stand-in {self.standin!r}; valid: {', '.join(STANDINS)}")
        if self.standin == "frozen-v" and RECIPES[self.task].optimizer not in ("adam", "adamw"):
            raise ValueError(f"the frozen-v stand-in needs Adam or AdamW; {self.task} trains with "
                             f"{RECIPES[self.task].optimizer}")
        if self.width < 1 or self.epochs < 1:
            raise ValueError("width and epochs must be at least 1")

    @property
    def key(self) -> str:
        stale = f" {self.staleness}" if self.width > 1 else ""
        stale += f" {self.standin}-stand-in" if self.width > 1 and self.staleness == "lookahead" and \
            self.standin != "local" else ""
        return f"{self.task} W={self.workers} width={self.width}{stale} seed={self.seed}"


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _gradients(model: torch.nn.Module, params: list[torch.Tensor], batch) -> list[torch.Tensor]:
    x, y = batch
    model.zero_grad(set_to_none=True)
    cross_entropy(model(x), y).backward()
    return [p.grad.detach().clone() for p in params]


def gradients_at_mean_point(model: torch.nn.Module, params: list[torch.Tensor], points: list[list[torch.Tensor]],
                            batches) -> list[list[torch.Tensor]]:
    """Each worker's batch gradient at the mean of the workers' look-ahead ``points`` (the "meanpoint" stand-in);
    ``params`` are left as they were."""
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
        for p, *coordinates in zip(params, *points):
            p.copy_(torch.stack(coordinates).mean(0))
    grads = [_gradients(model, params, batch) for batch in batches]
    with torch.no_grad():
        for p, value in zip(params, saved):
            p.copy_(value)
    return grads


class ReactionSize:
    """How large each worker's reaction to its own look-ahead error is beside its deviation from the average, over
    a run: sqrt(sum |own - stand-in at the mean point|^2 / sum |own - average|^2), summed over workers and steps."""

    def __init__(self) -> None:
        self.reaction = self.deviation = 0.0
        self.steps = 0

    def add(self, own: list[list[torch.Tensor]], at_mean_point: list[list[torch.Tensor]],
            average: list[torch.Tensor]) -> None:
        for mine, there in zip(own, at_mean_point):
            self.reaction += sum(float((a - b).pow(2).sum()) for a, b in zip(mine, there))
            self.deviation += sum(float((a - m).pow(2).sum()) for a, m in zip(mine, average))
        self.steps += 1

    @property
    def ratio(self) -> float:
        return (self.reaction / self.deviation) ** 0.5 if self.deviation else 0.0


def simulate(spec: SimSpec) -> dict:
    """Train as ``spec`` says; return its final test accuracy and loss."""
    ds = TASKS[spec.task](spec.seed)
    recipe = RECIPES[spec.task]
    _seed(spec.seed)
    model = build_model(recipe.model, ds.input_shape, ds.num_classes)
    params = list(model.parameters())
    optimizer = build_inner_optimizer(recipe.optimizer, model, spec.lr, spec.momentum, recipe.weight_decay)
    local_batch = spec.global_batch // spec.workers
    per_epoch = steps_per_epoch(len(ds.x_train), spec.workers, local_batch)
    total = recipe.steps or spec.epochs * per_epoch
    schedule = build_schedule(recipe.schedule, spec.lr, recipe.lr_warmup_steps, total)
    if schedule is not None:
        schedule.apply(optimizer.param_groups, 0)
    looking = spec.width > 1 and spec.staleness == "lookahead"
    kind = LOOKAHEADS.get(spec.standin, Lookahead)
    workers = [kind(optimizer, params, spec.width) if looking else None for _ in range(spec.workers)]
    pipeline: Pipeline[list[torch.Tensor]] = Pipeline(spec.width, spec.warmup_steps)

    last: list[list[torch.Tensor]] = []  # the last average applied (LAST_AVERAGE)

    def apply(step: int, mean: list[torch.Tensor]) -> None:
        last[:] = [mean]
        for worker in workers:
            if worker is not None:
                worker.discard(step)
                if isinstance(worker, (ShrunkLookahead, CorrectedLookahead)):
                    worker.observe(step, mean)
        for p, g in zip(params, mean):
            p.grad = g
        optimizer.step()

    reaction = ReactionSize()
    lowrank = (LaggedLowRankAverage(seed=spec.seed) if spec.standin == "lowrank-lag" else  # the shared subspace
               LowRankAverage(8 if spec.standin == "lowrank8" else 4, seed=spec.seed))
    grads_before = None  # "own-then-coarse": the workers' gradients of the step before
    model.train()
    t = 0
    for epoch in range(-(-total // per_epoch)):
        shards = [shard_batches(ds, epoch, spec.seed, w, spec.workers, local_batch) for w in range(spec.workers)]
        for batches in zip(*shards):
            if t == total:
                break
            # Step 1: every worker's gradient at its own look-ahead weights.
            grads, points = [], []
            for worker, batch in zip(workers, batches):
                if worker is not None:
                    worker.advance()
                if spec.standin == "meanpoint":
                    points.append([p.detach().clone() for p in params])
                grads.append(_gradients(model, params, batch))
                if worker is not None:
                    worker.restore()
            # Step 2: the average the all-reduce would deliver.
            mean = [torch.stack(gs).mean(0) for gs in zip(*grads)]
            # Step 3: stand-ins kept while step t is in flight; the due step applied to the master weights.
            if looking and pipeline.depth(t) > 1:
                stand_ins = ([mean] * len(workers) if spec.standin in ORACLES else
                             gradients_at_mean_point(model, params, points, batches) if spec.standin == "meanpoint"
                             else [coarse_average(grads, *COARSE[spec.standin])] * len(workers)
                             if spec.standin in COARSE else grads)
                if spec.standin in ("lowrank", "lowrank8", "lowrank-lag"):
                    stand_ins = lowrank.standins(grads, mean)
                if spec.standin in LAST_AVERAGE and last:
                    share = 1.0 if spec.standin == "last-average" else 1 - 1 / spec.workers
                    stand_ins = [[torch.lerp(g, a, share) for g, a in zip(own, last[0])] for own in grads]
                if spec.standin == "own-then-coarse":  # step t-1's own stand-in gives way to everyone's average
                    late = coarse_average(grads_before, *LATE_COARSE) if grads_before is not None else None
                    for worker in workers:
                        if late is not None and t - 1 in worker.pending_steps:
                            worker.discard(t - 1)
                            worker.record(t - 1, late, uses=spec.width - 2)  # one forward pass has used it
                    grads_before = grads
                for worker, stand_in in zip(workers, stand_ins):
                    worker.record(t, stand_in)
                if spec.standin == "meanpoint":
                    reaction.add(grads, stand_ins, mean)
            pipeline.submit(t, CompletedWork(mean))
            due = pipeline.pop_due(t)
            if due is not None:
                apply(due.step, due.handle.wait())
            if schedule is not None:
                schedule.apply(optimizer.param_groups, t + 1)  # the next step's rate, as the trainer sets it
            t += 1
    for entry in pipeline.flush():
        apply(entry.step, entry.handle.wait())
    accuracy, loss = evaluate(model, ds, torch.device("cpu"))
    extra = {"reaction_ratio": round(reaction.ratio, 4)} if reaction.steps else {}
    return {"key": spec.key, **dataclasses.asdict(spec), "steps": t, "steps_per_epoch": per_epoch,
            "final_accuracy": round(accuracy, 5), "final_loss": round(loss, 5), **extra}


def run_all(specs: list[SimSpec], jobs: int = 1) -> Iterator[dict]:
    """Simulate every spec and yield each run as it ends: one after another here, or in ``jobs`` processes side by
    side, one thread each. A run depends only on its spec, so the runs are the same either way."""
    if jobs <= 1:
        for spec in specs:
            yield simulate(spec)
        return
    # spawn, not fork: the parent has torch's thread pools running
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=torch.set_num_threads, initargs=(1,)) as pool:
        for future in concurrent.futures.as_completed([pool.submit(simulate, spec) for spec in specs]):
            yield future.result()


def plan(tasks: list[str], workers: list[int], seeds: list[int], width: int = 2,
         standins: tuple[str, ...] = ("local",)) -> list[SimSpec]:
    """Per task and worker count: width 1, width ``width`` plain and with look-ahead (per stand-in), every seed."""
    configs = [(1, "none", "local"), (width, "none", "local")] + [(width, "lookahead", s) for s in standins]
    specs = []
    for task in tasks:
        recipe = RECIPES[task]
        for w in workers:
            sizes = dict(global_batch=recipe.local_batch * w) if recipe.local_batch else {}
            specs += [SimSpec(task=task, workers=w, width=k, staleness=s, standin=standin, seed=seed, lr=recipe.lr,
                              **sizes) for seed in seeds for k, s, standin in configs]
    return specs


def summarise(runs: list[dict]) -> list[dict]:
    """Mean and sample std of the final accuracy and loss per (task, workers, width, staleness, stand-in), in
    plan order."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        key = (run["task"], run["workers"], run["width"], run["staleness"], run.get("standin", "local"))
        groups.setdefault(key, []).append(run)
    out = []
    for (task, workers, width, staleness, standin), members in groups.items():
        row = {"task": task, "workers": workers, "width": width, "staleness": staleness,
               "local_batch": members[0]["global_batch"] // workers, "seeds": sorted(m["seed"] for m in members)}
        if standin != "local":
            row["standin"] = standin
        for metric in ("accuracy", "loss"):
            values = [m[f"final_{metric}"] for m in members]
            row[f"{metric}_mean"] = round(statistics.fmean(values), 5)
            row[f"{metric}_std"] = round(statistics.stdev(values), 5) if len(values) > 1 else 0.0
        ratios = [m["reaction_ratio"] for m in members if "reaction_ratio" in m]
        if ratios:
            row["reaction_ratio_mean"] = round(statistics.fmean(ratios), 4)
        out.append(row)
    return out


def summary_markdown(summary: list[dict]) -> str:
    """Per worker count, width 1 against width K plain and with look-ahead: final test accuracy (%) for the
    classification tasks; for charlm the final validation loss, with the true-average stand-in where it ran."""
    width = max((c["width"] for c in summary), default=2)
    rows: dict[tuple, dict] = {}
    for c in summary:
        rows.setdefault((c["task"], c["workers"]), {})[(c["width"], c["staleness"], c.get("standin", "local"))] = c
    tables = []
    accuracy = [(key, cs) for key, cs in rows.items() if RECIPES[key[0]].model != "gpt"]
    if accuracy:
        others = [s for s in STANDINS[1:] if any((width, "lookahead", s) in cs for _, cs in accuracy)]
        lines = [f"| task | workers | local batch | width 1 | plain width {width} | look-ahead width {width} | "
                 f"look-ahead − width 1 | " + "".join(f"look-ahead, {STANDIN_TITLES[s]} | " for s in others).rstrip(),
                 "|---|---|---|---|---|---|---|" + "---|" * len(others)]

        def cell(c: dict | None) -> str:
            return f"{100 * c['accuracy_mean']:.1f} ± {100 * c['accuracy_std']:.1f}" if c else "-"

        for (task, workers), cs in accuracy:
            sync, plain, ahead = (cs.get((1, "none", "local")), cs.get((width, "none", "local")),
                                  cs.get((width, "lookahead", "local")))
            gap = f"{100 * (ahead['accuracy_mean'] - sync['accuracy_mean']):+.1f}" if sync and ahead else "-"
            batch = (sync or plain or ahead)["local_batch"]
            extra = "".join(f" {cell(cs.get((width, 'lookahead', s)))} |" for s in others)
            lines.append(f"| {task} | {workers} | {batch} | {cell(sync)} | {cell(plain)} | {cell(ahead)} | {gap} |"
                         + extra)
        tables.append("\n".join(lines))
    losses = [(key, cs) for key, cs in rows.items() if RECIPES[key[0]].model == "gpt"]
    if losses:
        others = [s for s in STANDINS[1:] if any((width, "lookahead", s) in cs for _, cs in losses)]
        lines = [f"| task | workers | local batch | width 1 | plain width {width} | look-ahead width {width} | "
                 + "".join(f"look-ahead, {STANDIN_TITLES[s]} | " for s in others).rstrip(),
                 "|---|---|---|---|---|---|" + "---|" * len(others)]
        for (task, workers), cs in losses:
            sync = cs.get((1, "none", "local"))

            def loss(c: dict | None) -> str:
                if c is None:
                    return "-"
                gap = f" ({100 * (c['loss_mean'] / sync['loss_mean'] - 1):+.1f} %)" if sync and c is not sync else ""
                return f"{c['loss_mean']:.4f} ± {c['loss_std']:.4f}{gap}"

            batch = next(iter(cs.values()))["local_batch"]
            cells = [loss(sync), loss(cs.get((width, "none", "local")))] + [
                loss(cs.get((width, "lookahead", s))) for s in ("local", *others)]
            lines.append(f"| {task} | {workers} | {batch} | " + " | ".join(cells) + " |")
        tables.append("\n".join(lines))
    reactions = [f"{c['task']} W={c['workers']} width {c['width']}: {c['reaction_ratio_mean']:.2f}"
                 for c in summary if "reaction_ratio_mean" in c]
    if reactions:
        tables.append("Each worker's reaction to its own look-ahead error beside its deviation from the average "
                      "(root-mean-square ratio, mean-point runs): " + "; ".join(reactions))
    return "\n\n".join(tables)
