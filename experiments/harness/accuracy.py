"""Accuracy under staleness and compression (issue 12, item 3): final accuracy and loss curves of ``pipesgd-train``
runs on local gloo ranks for each pipeline width and each codec, over several seeds, summarised per configuration.

Steps of ``run_study``: (1) plan one run per task x configuration x seed; (2) skip runs the result file already
holds (``resume``); (3) launch each remaining run with torchrun; (4) read its metrics into a compact record;
(5) re-write the result with the per-configuration summary after every run. ``experiments/accuracy.py`` drives it.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from typing import Callable

from experiments.harness.provenance import read_result, write_result
from pipesgd.compression import available as codec_names
from pipesgd.defaults import NEEDS_ERROR_FEEDBACK, STALENESS, STALENESS_MODES, WARMUP_STEPS
from experiments.harness.rank_launch import free_port
from experiments.harness.results import load_run

__all__ = ["TASKS", "AccuracyConfig", "RunSpec", "load_config", "plan", "trainer_flags", "run_record",
           "summarise", "run_study", "summary_markdown", "EF_SUFFIX"]

EF_SUFFIX = "+ef"  # a codec name ending in it runs with --error-feedback
# Task name: pipesgd-train flags. ``cifar10:DIR`` is also accepted (read from a local directory, never downloaded).
TASKS: dict[str, list[str]] = {
    "digits": ["--dataset", "digits", "--model", "lenet"],  # scikit-learn's 8x8 digits, shipped in the package
    "mnist1d": ["--dataset", "mnist1d", "--model", "lenet"],  # generated MNIST-1D-style sequences, a 1-D CNN
    "resnet20": ["--dataset", "digits", "--model", "resnet20"],  # the same digits through a deep BatchNorm network
    # A character-level GPT on this machine's Python standard library (issue 36): AdamW (decoupled decay 0.1) with 30
    # steps of warm-up, then cosine decay to 10 %; batch 32 windows of 64 characters per rank. A fixed 300 steps
    # (--steps overrides the study's --epochs): 105 s at 2 ranks and 150 s at 4 on 2 cores (width 1).
    "charlm": ["--dataset", "pysrc", "--model", "gpt", "--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.1",
               "--lr-schedule", "cosine", "--lr-warmup-steps", "30", "--batch-size", "32", "--steps", "300"],
}


def task_flags(task: str) -> list[str]:
    """The data set and model flags of ``task``; ``cifar10:DIR`` trains the LeNet-like CNN on a local CIFAR-10."""
    if task in TASKS:
        return list(TASKS[task])
    if task.startswith("cifar10:") and task.split(":", 1)[1]:
        return ["--dataset", task, "--model", "lenet"]
    raise ValueError(f"unknown task {task!r}; valid: {', '.join(TASKS)}, cifar10:DIR")


def split_codec(codec: str) -> tuple[str, bool]:
    """``q8+ef`` -> (``q8``, True); ``none`` -> (``none``, False)."""
    return (codec[: -len(EF_SUFFIX)], True) if codec.endswith(EF_SUFFIX) else (codec, False)


@dataclass(frozen=True, slots=True)
class AccuracyConfig:
    """What the study runs; a TOML file sets any field, command-line flags override it."""

    # What to compare.
    tasks: tuple[str, ...] = ("digits", "mnist1d")  # names in TASKS or cifar10:DIR
    widths: tuple[int, ...] = (1, 2, 3, 4)  # pipeline widths without compression (1 = synchronous SGD)
    stalenesses: tuple[str, ...] = ("none", "lookahead")  # each width above 1 runs with each (--staleness)
    codec_width: int = 2  # the width every codec runs at
    codec_staleness: str = STALENESS  # the staleness every codec runs with
    # Codecs at codec_width (``+ef``: with error feedback). Plain ``sign`` is refused by the trainer.
    codecs: tuple[str, ...] = ("fp16", "bf16", "q8", "q8+ef", "q4", "q4+ef", "sign+ef")
    seeds: tuple[int, ...] = (0, 1, 2)
    # How each run trains (the trainer's defaults otherwise: SGD lr 0.02, momentum 0.9, batch 32 per rank).
    ranks: int = 4  # local gloo processes per run
    epochs: int = 20  # passes over each rank's shard; evaluated after every one
    warmup_steps: int = WARMUP_STEPS  # synchronous steps before the pipeline opens (the trainer's default)
    extra_flags: tuple[str, ...] = ()  # further pipesgd-train flags for every run (recorded in each record)
    timeout_s: float = 600.0  # a run still going after this is stopped and reported as failed
    # Output.
    loss_points: int = 40  # training-loss curve kept per run (bin means over steps)
    raw_dir: str = "results/accuracy"  # per-rank metrics (git-ignored)
    result: str = "experiments/results/accuracy/accuracy.json"  # the committed summary

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("tasks is empty")
        for task in self.tasks:
            task_flags(task)
        for name, values in (("widths", self.widths), ("seeds", self.seeds)):
            if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                raise ValueError(f"{name} must be a non-empty list of integers, got {list(values)!r}")
        if min(self.widths) < 1 or self.codec_width < 1:
            raise ValueError(f"widths must be >= 1, got {list(self.widths)} and codec_width {self.codec_width}")
        for staleness in (*self.stalenesses, self.codec_staleness):
            if staleness not in STALENESS_MODES:
                raise ValueError(f"unknown staleness {staleness!r}; valid: {', '.join(STALENESS_MODES)}")
        if not self.stalenesses:
            raise ValueError("stalenesses is empty")
        lossy = [c for c in codec_names() if c != "none"]
        for codec in self.codecs:
            name, ef = split_codec(codec)
            if name not in lossy:
                raise ValueError(f"unknown codec {codec!r}; valid: {', '.join(lossy)} (each also with {EF_SUFFIX})")
            if name in NEEDS_ERROR_FEEDBACK and not ef:
                raise ValueError(f"codec {codec!r}: pipesgd-train refuses it without error feedback; "
                                 f"use {name}{EF_SUFFIX}")
        for name in ("ranks", "epochs", "loss_points"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s!r}")


_TUPLES = {f.name for f in dataclasses.fields(AccuracyConfig) if f.type.startswith("tuple")}


def load_config(path: str | None, overrides: dict) -> AccuracyConfig:
    """Defaults, then the TOML file at ``path`` (if any), then ``overrides`` (flags given; None = not given).
    Raises ``ValueError`` with one line for an unreadable file, an unknown key or a bad value."""
    values: dict = {}
    if path:
        try:
            with open(path, "rb") as handle:
                values = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(AccuracyConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    for key in _TUPLES & set(values):
        if isinstance(values[key], (str, int)):
            raise ValueError(f"{key} must be a list, got {values[key]!r}")
        values[key] = tuple(values[key])
    try:
        return AccuracyConfig(**values)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One training run of the study."""

    task: str
    width: int
    codec: str  # compression name, without the +ef suffix
    error_feedback: bool
    seed: int
    staleness: str = "none"  # --staleness at widths above 1 (width 1 has nothing in flight)

    @property
    def config_key(self) -> str:  # the configuration it belongs to (all seeds)
        stale = f" staleness={self.staleness}" if self.width > 1 else ""
        return f"{self.task} width={self.width} {self.codec}{EF_SUFFIX if self.error_feedback else ''}{stale}"

    @property
    def key(self) -> str:
        return f"{self.config_key} seed={self.seed}"

    @property
    def file_stem(self) -> str:
        task = self.task.split(":", 1)[0]
        stale = f"-{self.staleness}" if self.width > 1 else ""
        return f"{task}-w{self.width}-{self.codec}{'-ef' if self.error_feedback else ''}{stale}-s{self.seed}"


def plan(cfg: AccuracyConfig) -> list[RunSpec]:
    """Every run, task by task, seed-major so a partial study already has every configuration once."""
    configs = [(w, "none", False, s if w > 1 else "none") for w in cfg.widths
               for s in (cfg.stalenesses if w > 1 else ("none",))]
    stale = cfg.codec_staleness if cfg.codec_width > 1 else "none"
    configs += [(cfg.codec_width, *split_codec(c), stale) for c in cfg.codecs]
    configs = list(dict.fromkeys(configs))
    return [RunSpec(task, w, codec, ef, seed, staleness) for task in cfg.tasks for seed in cfg.seeds
            for w, codec, ef, staleness in configs]


def trainer_flags(spec: RunSpec, cfg: AccuracyConfig) -> list[str]:
    """The ``pipesgd-train`` flags of one run (recorded with it). Width 1 is the pipeline at K = 1, i.e. sync."""
    flags = [*task_flags(spec.task), "--mode", "pipe", "--width", str(spec.width), "--compression", spec.codec,
             "--epochs", str(cfg.epochs), "--eval-every", "1", "--seed", str(spec.seed), "--threads", "1",
             "--warmup-steps", str(cfg.warmup_steps)]
    if spec.width > 1:
        flags += ["--staleness", spec.staleness]
    return flags + (["--error-feedback"] if spec.error_feedback else []) + list(cfg.extra_flags)


def launch(flags: list[str], metrics: str, ranks: int, timeout_s: float, log_path: str) -> int | None:
    """One torchrun of ``pipesgd.train`` on ``ranks`` local processes; its return code (None: timed out)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
            "--master-port", str(free_port()), "-m", "pipesgd.train", *flags, "--metrics", metrics]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and the ranks it started, in their own session
            proc.wait()
            return None


def _bins(values: list[float], n: int) -> list[float]:
    """``values`` cut into at most ``n`` consecutive bins of near-equal length, one mean per bin."""
    n = min(n, len(values))
    edges = [round(i * len(values) / n) for i in range(n + 1)]
    return [statistics.fmean(values[a:b]) for a, b in zip(edges, edges[1:])]


def run_record(spec: RunSpec, flags: list[str], metrics: str, loss_points: int, wall_s: float) -> dict:
    """The committed record of one finished run, read from its metrics files."""
    run = load_run(metrics)
    if not run.evals:
        raise ValueError(f"{metrics}: no eval records")
    evals = {e["step"]: e for e in run.evals}  # a step evaluated twice (end of run) counts once
    curve = [evals[s] for s in sorted(evals)]
    by_step: dict[int, list[float]] = {}
    for record in run.steps:
        if record.get("loss") is not None:
            by_step.setdefault(record["step"], []).append(float(record["loss"]))
    steps = sorted(by_step)
    losses = [statistics.fmean(by_step[s]) for s in steps]  # mean over ranks
    final = curve[-1]  # the evaluation after the last epoch (the run's summary accuracy)
    return {"key": spec.key, "config": spec.config_key, "task": spec.task, "width": spec.width, "codec": spec.codec,
            "error_feedback": spec.error_feedback, "staleness": spec.staleness, "seed": spec.seed, "flags": flags,
            "final_accuracy": round(float(final["accuracy"]), 5), "final_loss": round(float(final["loss"]), 5),
            "steps": steps[-1] + 1 if steps else 0, "wall_s": round(wall_s, 1),
            "eval": {"step": [e["step"] for e in curve], "accuracy": [round(e["accuracy"], 5) for e in curve],
                     "loss": [round(e["loss"], 5) for e in curve]},
            "train_loss": {"step": [round(x, 1) for x in _bins([float(s) for s in steps], loss_points)],
                           "loss": [round(x, 5) for x in _bins(losses, loss_points)]}}


def _stats(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 5),
            "std": round(statistics.stdev(values), 5) if len(values) > 1 else 0.0,  # sample std (n - 1)
            "min": min(values), "max": max(values)}


def summarise(runs: list[dict]) -> list[dict]:
    """Per configuration (task, width, codec, error feedback), in the order first seen: the seeds and the mean,
    sample std, min and max of the final accuracy and the mean final loss."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(run["config"], []).append(run)
    out = []
    for key, members in groups.items():
        first = members[0]
        out.append({"config": key, "task": first["task"], "width": first["width"], "codec": first["codec"],
                    "error_feedback": first["error_feedback"], "staleness": first.get("staleness", "none"),
                    "seeds": sorted(m["seed"] for m in members),
                    "accuracy": _stats([m["final_accuracy"] for m in members]),
                    "loss": _stats([m["final_loss"] for m in members])})
    return out


def _result(cfg: AccuracyConfig, runs: list[dict], failed: list[dict], earlier: list[dict] | None = None) -> dict:
    """The result file's content; ``settings`` are this invocation's, ``earlier`` the provenance of those before
    it whose runs a ``--resume`` kept (each run records its own flags)."""
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}
    return {"experiment": "accuracy", "settings": settings, "summary": summarise(runs), "runs": runs,
            "failed": failed, **({"earlier": earlier} if earlier else {})}


def run_study(cfg: AccuracyConfig, resume: bool = False, log: Callable[[str], None] = print,
              launcher: Callable[..., int | None] = launch) -> dict:
    """Every planned run not already in the result (with ``resume``); the result is re-written after each run."""
    runs: list[dict] = []
    earlier: list[dict] = []  # the invocations that made the runs kept (the file's provenance is the latest's)
    if resume and os.path.exists(cfg.result):
        old = read_result(cfg.result)
        runs = old.get("runs", [])
        earlier = [*old.get("earlier", []), *([old["provenance"]] if "provenance" in old else [])]
    specs = plan(cfg)
    done = {r["key"] for r in runs}
    todo = [s for s in specs if s.key not in done]
    if done:
        log(f"resume: {len(specs) - len(todo)} of {len(specs)} runs already in {cfg.result}")
    os.makedirs(cfg.raw_dir, exist_ok=True)
    failed: list[dict] = []
    started = time.monotonic()
    for i, spec in enumerate(todo, 1):
        # Step 3: a fresh metrics file per run (the writer appends, so a stale one would mix runs).
        metrics = os.path.join(cfg.raw_dir, spec.file_stem + ".jsonl")
        for rank in range(cfg.ranks):
            stale = metrics.replace(".jsonl", f".rank{rank}.jsonl")
            if os.path.exists(stale):
                os.remove(stale)
        flags = trainer_flags(spec, cfg)
        t0 = time.monotonic()
        code = launcher(flags, metrics, cfg.ranks, cfg.timeout_s, metrics.replace(".jsonl", ".log"))
        wall_s = time.monotonic() - t0
        index = f"[{len(specs) - len(todo) + i}/{len(specs)}] {spec.key}"
        try:
            if code != 0:
                raise ValueError("timed out" if code is None else f"exit code {code}")
            record = run_record(spec, flags, metrics, cfg.loss_points, wall_s)  # Step 4
        except (ValueError, OSError, KeyError) as exc:
            failed.append({"key": spec.key, "flags": flags, "error": str(exc)})
            log(f"{index}: FAILED ({exc}; log {metrics.replace('.jsonl', '.log')})")
        else:
            runs = [r for r in runs if r["key"] != spec.key] + [record]
            eta = (time.monotonic() - started) / i * (len(todo) - i)
            log(f"{index}: {100 * record['final_accuracy']:.1f} % in {wall_s:.0f} s (ETA {eta / 60:.1f} min)")
        os.makedirs(os.path.dirname(os.path.abspath(cfg.result)), exist_ok=True)
        write_result(cfg.result, _result(cfg, _ordered(runs, specs), failed, earlier))  # Step 5
    result = _result(cfg, _ordered(runs, specs), failed, earlier)
    if not todo:
        log("nothing to run")
    return result


def _ordered(runs: list[dict], specs: list[RunSpec]) -> list[dict]:
    """Runs configuration by configuration in plan order, then by seed; runs outside the plan come last."""
    order: dict[str, int] = {}
    for s in specs:
        order.setdefault(s.config_key, len(order))
    return sorted(runs, key=lambda r: (order.get(r["config"], len(order)), r["seed"]))


def summary_markdown(result: dict) -> str:
    """The summary as a markdown table: final accuracy (%) mean +/- std, min, max and mean loss per configuration."""
    lines = ["| task | width | staleness | codec | error feedback | seeds | accuracy % (mean ± std) | min | max | "
             "loss (mean ± std) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["summary"]:
        a, loss = c["accuracy"], c["loss"]
        stale = c.get("staleness", "none") if c["width"] > 1 else "-"
        lines.append(f"| {c['task']} | {c['width']} | {stale} | {c['codec']} | {'yes' if c['error_feedback'] else 'no'} | "
                     f"{len(c['seeds'])} | {100 * a['mean']:.1f} ± {100 * a['std']:.1f} | {100 * a['min']:.1f} | "
                     f"{100 * a['max']:.1f} | {loss['mean']:.4f} ± {loss['std']:.4f} |")
    return "\n".join(lines)
