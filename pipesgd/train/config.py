"""The trainer's configuration: one dataclass, resolved as CLI flags over an optional TOML file over defaults.

``pipesgd.train.flags.resolve(argv)`` returns a validated ``TrainConfig``; any bad value raises ``ConfigError`` (a
``ValueError``) with a one-line reason, before a process group exists. Each field carries its help text
and, where it names something, the names it offers (``choices``' torch-free copies of the owning registries,
which are asked only for a name not found there); defaults shared with other layers come from ``pipesgd.defaults``.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from importlib import import_module
from typing import Any

from timing_model.atomic import write_text_atomic
from pipesgd.defaults import (BUCKET_MB, LOOKAHEAD_STANDIN, LOOKAHEAD_STANDINS, NEEDS_ERROR_FEEDBACK, OUTER_LR,
                              OUTER_MOMENTUM, STALENESS, STALENESS_MODES, SYNC_EVERY, UNSHARED_STANDINS, WARMUP_STEPS)
from pipesgd.runlog.trace import parse_steps

# Only torch-free modules here, so that --help and every flag check run without loading torch.
from .choices import (AMP_MODES, BUFFER_MODES, CODECS, DATASETS, DATASETS_WITH_DIR, DDP_HOOKS, MODELS,
                      OPTIMIZERS, SCALED_AMP_MODES, TOKEN_DATASETS, TOKEN_MODELS)
from .schedule import FINAL_LR_FRACTION, SCHEDULES
from .modes import DILOCO_MODE, LOCAL_SGD_MODE, MODES, PERIODIC_MODES, PS_TRAIN_MODES, RING_MODES

DEVICES = ("cpu", "cuda")
BACKENDS = ("gloo", "nccl")


class ConfigError(ValueError):
    """A bad flag, TOML key or combination; the message is the one line shown to the user."""


def _field(default: Any, help: str, choices: Iterable[str] | None = None,
           registry: Callable[[], Iterable[str]] | None = None) -> Any:
    """A config field: its default, its flag's help text, the names its value must be one of, and, where users
    may register more at run time, the owning registry to ask (read only for a name not in ``choices``)."""
    return field(default=default, metadata={"help": help, "choices": None if choices is None else tuple(choices),
                                            "registry": registry})


def _codecs() -> list[str]:
    from pipesgd import compression

    return [*compression.available(), "auto"]


def _registry(module: str, name: str) -> Callable[[], Iterable[str]]:
    """The live registry ``name`` of ``pipesgd.train.<module>``, imported (with torch) only when asked."""
    return lambda: getattr(import_module(f"pipesgd.train.{module}"), name)


_models, _datasets, _optimizers = (_registry("models", "MODELS"), _registry("data", "DATASETS"),
                                   _registry("optimizers", "OPTIMIZERS"))


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything one training run needs. The defaults make ``torchrun --nproc-per-node 4 -m pipesgd.train`` train an
    accurate digits MLP with Pipe-SGD width 2 on 2 CPU cores in seconds: digits is small, so 20 epochs of batch 32
    per worker, and SGD lr 0.02 with momentum 0.9 stays stable through width 2's staleness."""

    # --- training mode (how gradients meet) ---
    mode: str = _field("pipe", "how gradients meet: pipe = Pipe-SGD at --width, sync = allreduce every step "
                       "(width 1), ddp = torch DDP, ps-* = parameter server, localsgd = torch's post-local SGD (parameters "
                       "averaged every --sync-every steps), diloco = DiLoCo (outer Nesterov step every --sync-every)",
                       MODES)
    width: int | str = _field(2, "pipeline width K for mode=pipe; auto: chosen at the end of the warm-up from what "
                              "it measured (1, 2 or 3); mode=sync always uses 1")
    staleness: str = _field(STALENESS, "mode=pipe at width >= 2: lookahead computes each gradient at the weights "
                            "the steps in flight will produce (this rank's own gradients standing in for their "
                            "averages); none is the paper's plain update (gradients K-1 steps stale)",
                            STALENESS_MODES)
    lookahead_standin: str = _field(LOOKAHEAD_STANDIN, "--staleness lookahead: what stands in for the averages in "
                                    "flight (docs/training.md): auto = coarse-lowrank under adam and adamw, local "
                                    "otherwise; local = this rank's own gradients (free); coarse-lowrank = the own "
                                    "gradients with every rank's average in a shared low-rank subspace of each "
                                    "weight matrix (one small all-reduce the next forward waits for)",
                                    LOOKAHEAD_STANDINS)
    compression: str = _field("none", "codec on every ring hop (pipe/sync only); auto: chosen at the end of the "
                              "warm-up from what it measured (compute, the link, each codec's speed)",
                              (*CODECS, "auto"), _codecs)
    error_feedback: bool = _field(False, "keep the compression residual and add it to the next gradient")
    allreduce: str = _field("auto", "mode pipe/sync, how buckets travel: auto = the backend's all-reduce without a "
                            "codec, with one the two-collective exchange (the ring where gloo carries CUDA tensors; "
                            "--compression auto measures both in the warm-up); ring = the paper's per-hop ring, "
                            "faster on bandwidth-bound links; alltoall = the exchange",
                            ("auto", "ring", "alltoall"))
    auto_recheck_every: int = _field(0, "with --width auto or --compression auto: choose again every N steps after "
                                     "the warm-up, switching only for a predicted gain (0 = choose once)")
    ddp_hook: str = _field("none", "DDP communication hook (mode=ddp only): fp16 casts each bucket to half, "
                           "powersgd is PyTorch's powerSGD_hook (low-rank, error feedback and warm start on, plain "
                           "allreduce for the first max(2, --warmup-steps) steps, seeded by --seed)",
                           DDP_HOOKS)
    powersgd_rank: int = _field(2, "--ddp-hook powersgd: rank of the low-rank approximation (1-4 typical)")
    servers: int = _field(0, "parameter-server modes: dedicated server ranks (0 = rank 0 serves and trains)")
    push_every: int = _field(1, "ps-async (Downpour): push accumulated gradients every n steps")
    pull_every: int = _field(1, "ps-async (Downpour): pull fresh parameters every m steps")
    warmup_steps: int = _field(WARMUP_STEPS, "mode=pipe: synchronous steps before the pipeline opens; "
                               "mode=localsgd: synchronous steps (gradients all-reduced) before local SGD starts; "
                               "--ddp-hook powersgd: uncompressed steps before PowerSGD starts (at least 2)")
    sync_every: int = _field(SYNC_EVERY, "localsgd/diloco: inner steps between two syncs (localsgd: at least 2)")
    sync_delay: int = _field(0, "diloco: inner steps the pseudo-gradient's all-reduce overlaps (Streaming DiLoCo's "
                             "tau, torchft's fragment_sync_delay): 0 blocks at the sync; tau takes the pseudo-gradient "
                             "tau steps before the sync and applies it at the sync (below --sync-every)")
    outer_lr: float = _field(OUTER_LR, "diloco: outer SGD learning rate (Nesterov momentum)")
    outer_momentum: float = _field(OUTER_MOMENTUM, "diloco: outer Nesterov momentum")
    bucket_mb: float = _field(BUCKET_MB, "gradient bucket size in MiB (pipe/sync/ddp)")
    check_replicas: int = _field(0, "pipe/sync: compare weights and synced buffers across ranks every N steps "
                                 "(0 = never)")
    buffers: str = _field("broadcast", "pipe/sync: module buffers (BatchNorm statistics) made identical where "
                          "the ranks meet (the end, checkpoints, replica checks; never a collective per step): rank "
                          "0's (broadcast, what DDP leaves on rank 0), their mean (average), or per rank (none)",
                          BUFFER_MODES)
    clip_grad_norm: float = _field(0.0, "pipe/sync: clip the averaged gradient to this global L2 norm before "
                                   "the optimizer applies it (0 = no clipping)")

    # --- model and data ---
    model: str = _field("mlp", "model to train", MODELS, _models)
    hidden: int = _field(128, "MLP hidden width")
    dataset: str = _field("digits", f"data set; {' and '.join(DATASETS_WITH_DIR)} read local files, given as "
                          "NAME:DIR", DATASETS, _datasets)
    synthetic_samples: int = _field(8192, "synthetic: number of samples (train + test)")
    synthetic_features: int = _field(64, "synthetic: features per sample")
    synthetic_classes: int = _field(10, "synthetic: number of classes")

    # --- optimisation ---
    epochs: int = _field(20, "passes over each worker's shard")
    steps: int = _field(0, "stop after this many steps (0 = run all epochs); overrides epochs when set")
    batch_size: int = _field(32, "samples per worker per step")
    amp: str = _field("none", "mixed precision of forward/backward: bf16 autocast (any mode), or fp16 autocast "
                      "with a loss scaler that PipeSGD drives (pipe/sync only)", AMP_MODES)
    compile: bool = _field(False, "run the forward through torch.compile(model) (the wrapper stays outside)")
    accumulate: int = _field(1, "split each batch into N micro-batches, backward each (loss scaled 1/N, as DDP "
                             "users do) and step once: the same update with 1/N of the activation memory")
    lr: float = _field(0.02, "learning rate")
    momentum: float = _field(0.9, "SGD momentum (ignored by adam, adamw and muon)")
    optimizer: str = _field("sgd", "inner torch optimizer (muon: torch's Muon on the hidden weight matrices, "
                            "AdamW on the rest)", OPTIMIZERS, _optimizers)
    weight_decay: float = _field(0.0, "L2 penalty of the inner optimizer")
    lr_schedule: str = _field("constant", "learning rate after the warm-up: constant (--lr), or cosine decay from "
                              f"--lr to {FINAL_LR_FRACTION:g} x --lr at the last step", SCHEDULES)
    lr_warmup_steps: int = _field(0, "steps of linear learning-rate warm-up, from --lr/(N+1) up to --lr at step N "
                                  "(not --warmup-steps, Pipe-SGD's synchronous steps)")
    seed: int = _field(0, "seeds model init, data split, shuffling and torch/numpy/python RNGs")

    # --- execution ---
    device: str = _field("cpu", "where to train", DEVICES)
    backend: str = _field("", "process-group backend; empty = gloo on cpu, nccl on cuda", BACKENDS)
    threads: int = _field(1, "torch intra-op threads per process (1 suits several processes per core)")
    timeout: float = _field(60.0, "seconds a peer may stall before the run fails (exceed the longest evaluation)")
    debug: bool = _field(False, "show Python tracebacks for expected failures too")

    # --- outputs ---
    metrics: str = _field("", "JSONL path; with world size > 1 each rank writes FILE.rankN.jsonl; an existing file is "
                          "refused (nothing is overwritten), except with --resume, which appends")
    eval_every: int = _field(1, "evaluate on the held-out split every N epochs (0 = only at the end)")
    eval_steps: int = _field(0, "also evaluate every N steps, as HF Trainer's eval_steps (0 = off)")
    eval_deferred: bool = _field(False, "copy the weights at each evaluation point and evaluate the copies after "
                                 "training, each record with its copy's wall clock: the evaluations take no time "
                                 "from the run (for time to accuracy; one model copy in host memory per point)")
    checkpoint: str = _field("", "checkpoint directory (one file per rank); empty = no checkpoints")
    checkpoint_every: int = _field(0, "also checkpoint every N steps (0 = only at the end)")
    resume: bool = _field(False, "continue from the checkpoint in --checkpoint; with none there yet, say so and start "
                          "fresh (so one command line serves the first launch and torchrun's restarts)")
    trace: str = _field("", "write a Chrome/Perfetto trace of each rank's threads to FILE (FILE.rankN.json with "
                        "world size > 1); merge with: python -m pipesgd.runlog.trace merge OUT.json FILE.rank*.json")
    trace_steps: str = _field("", "with --trace: the steps A:B traced (A included, B not); empty = the 6 steps "
                              "from --warmup-steps + 2")

    def __post_init__(self) -> None:
        self.validate()

    @property
    def dataset_name(self) -> str:
        return self.dataset.split(":", 1)[0]

    @property
    def dataset_dir(self) -> str:
        return self.dataset.split(":", 1)[1] if ":" in self.dataset else ""

    @property
    def resolved_backend(self) -> str:
        return self.backend or ("nccl" if self.device == "cuda" else "gloo")

    @property
    def trace_window(self) -> tuple[int, int]:
        """The steps [A, B) that --trace records."""
        if self.trace_steps:
            return parse_steps(self.trace_steps)
        return self.warmup_steps + 2, self.warmup_steps + 8

    @property
    def effective_width(self) -> int:
        return self.width if self.mode == "pipe" else 1

    def validate(self) -> None:
        """Raise ConfigError with a one-line reason if a value or a combination is invalid."""
        named = [f for f in fields(self) if f.metadata["choices"] is not None]
        # Names are checked against the registry that owns them; the dataset last, as its NAME:DIR form
        # gets further checks right after.
        for f in sorted(named, key=lambda f: f.name == "dataset"):
            value = self.dataset_name if f.name == "dataset" else getattr(self, f.name)
            if value == "" and f.default == "":  # an empty default means "chosen by context" (backend)
                continue
            _choice(flag_name(f.name), value, f)
        if self.dataset_name in DATASETS_WITH_DIR:
            if not self.dataset_dir:
                raise ConfigError(f"--dataset {self.dataset_name} needs a directory: --dataset {self.dataset_name}:DIR")
            if not os.path.isdir(self.dataset_dir):
                raise ConfigError(f"data directory not found: {self.dataset_dir}")
        elif self.dataset_dir:
            raise ConfigError(f"--dataset {self.dataset_name} takes no directory (got {self.dataset!r})")

        for f in fields(self):  # inf, nan and overflowing literals (1e400) would only fail once training runs
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{flag_name(f.name)} must be a finite number (got {value})")
        if self.width == "auto" and self.mode != "pipe":
            raise ConfigError(f"--width auto applies to --mode pipe only, not {self.mode}")
        for name in ("width", "epochs", "batch_size", "accumulate", "threads", "hidden", "push_every", "pull_every",
                     "synthetic_samples", "synthetic_features"):
            if getattr(self, name) != "auto" and getattr(self, name) < 1:
                raise ConfigError(f"--{flag_name(name)} must be at least 1 (got {getattr(self, name)})")
        for name in ("steps", "servers", "warmup_steps", "auto_recheck_every", "check_replicas", "eval_every",
                     "eval_steps", "checkpoint_every", "weight_decay", "clip_grad_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{flag_name(name)} must not be negative (got {getattr(self, name)})")
        if self.eval_deferred and not (self.eval_every or self.eval_steps):
            raise ConfigError("--eval-deferred needs evaluation points: --eval-every N or --eval-steps N")
        if self.synthetic_classes < 2:
            raise ConfigError(f"--synthetic-classes must be at least 2 (got {self.synthetic_classes})")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be positive (got {self.lr})")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"--momentum must be in [0, 1) (got {self.momentum})")
        if not self.timeout > 0:
            raise ConfigError(f"--timeout must be positive seconds (got {self.timeout})")
        if not self.bucket_mb > 0:
            raise ConfigError(f"--bucket-mb must be positive (got {self.bucket_mb})")

        ring_modes = "|".join(RING_MODES)
        if self.compression != "none" and self.mode not in RING_MODES:
            hint = "; DDP compresses with --ddp-hook fp16" if self.mode == "ddp" else ""
            raise ConfigError(f"--compression applies to --mode {ring_modes} only, not {self.mode}{hint}")
        if self.error_feedback and self.mode not in RING_MODES:
            raise ConfigError(f"--error-feedback applies to --mode {ring_modes} only, not {self.mode}")
        if self.compression == "auto" and self.error_feedback:
            raise ConfigError("--compression auto chooses error feedback with the codec; drop --error-feedback")
        chosen = [f"--{name} auto" for name in ("width", "compression") if getattr(self, name) == "auto"]
        if chosen and self.warmup_steps < 2:
            raise ConfigError(f"{chosen[0]} measures during the warm-up: --warmup-steps must be >= 2 "
                              f"(got {self.warmup_steps})")
        if self.auto_recheck_every and not chosen:
            raise ConfigError("--auto-recheck-every needs --width auto or --compression auto")
        if self.error_feedback and self.compression == "none":
            lossy = "|".join(name for name in CODECS if name != "none")
            raise ConfigError(f"--error-feedback needs a lossy --compression ({lossy})")
        if self.compression in NEEDS_ERROR_FEEDBACK and not self.error_feedback:
            raise ConfigError(f"--compression {self.compression} needs --error-feedback "
                              "(1-bit SGD does not converge without it)")
        if self.staleness != STALENESS and self.mode != "pipe":
            raise ConfigError(f"--staleness applies to --mode pipe only, not {self.mode}")
        if self.lookahead_standin not in UNSHARED_STANDINS and (self.mode != "pipe" or self.staleness != "lookahead"):
            raise ConfigError("--lookahead-standin applies to --mode pipe with --staleness lookahead only")
        if self.allreduce != "auto" and self.mode not in ("pipe", "sync"):
            raise ConfigError(f"--allreduce applies to --mode pipe or sync only, not {self.mode}")
        if self.ddp_hook != "none" and self.mode != "ddp":
            raise ConfigError(f"--ddp-hook applies to --mode ddp only, not {self.mode}")
        if self.powersgd_rank < 1:
            raise ConfigError(f"--powersgd-rank must be at least 1 (got {self.powersgd_rank})")
        if self.powersgd_rank != 2 and self.ddp_hook != "powersgd":
            raise ConfigError("--powersgd-rank applies to --mode ddp --ddp-hook powersgd only")
        if self.resume and self.ddp_hook == "powersgd":
            raise ConfigError("--resume with --ddp-hook powersgd is not supported: PowerSGD's error-feedback and "
                              "warm-start state is keyed to DDP's bucket layout, which DDP rebuilds on restart")
        self._validate_periodic()
        if self.trace_steps:
            if not self.trace:
                raise ConfigError("--trace-steps needs --trace FILE")
            try:
                parse_steps(self.trace_steps)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.servers and self.mode not in PS_TRAIN_MODES:
            raise ConfigError(f"--servers applies to --mode {'|'.join(PS_TRAIN_MODES)} only, not {self.mode}")
        if (self.push_every != 1 or self.pull_every != 1) and self.mode != "ps-async":
            raise ConfigError(f"--push-every/--pull-every apply to --mode ps-async only, not {self.mode}")
        if self.check_replicas and self.mode not in RING_MODES:
            raise ConfigError(f"--check-replicas applies to --mode {ring_modes} only, not {self.mode}")
        if self.clip_grad_norm and self.mode not in RING_MODES:
            raise ConfigError(f"--clip-grad-norm applies to --mode {ring_modes} only, not {self.mode}")
        if self.buffers != "broadcast" and self.mode not in RING_MODES:
            hint = " (DDP broadcasts rank 0's buffers itself)" if self.mode == "ddp" else ""
            raise ConfigError(f"--buffers applies to --mode {ring_modes} only, not {self.mode}{hint}")
        if self.amp in SCALED_AMP_MODES and self.mode not in RING_MODES:
            raise ConfigError(f"--amp {self.amp} applies to --mode {ring_modes} only (its loss scaler is driven by "
                              f"PipeSGD), not {self.mode}; --amp bf16 needs no scaler and works with every mode")
        if self.batch_size % self.accumulate:
            raise ConfigError(f"--batch-size {self.batch_size} must be divisible by --accumulate {self.accumulate} "
                              "(equal micro-batches)")
        if self.resolved_backend == "nccl" and self.device != "cuda":
            raise ConfigError("--backend nccl needs --device cuda")
        if self.checkpoint and self.servers:
            raise ConfigError("--checkpoint with dedicated parameter servers (--servers N) is not supported yet; "
                              "use --servers 0")
        if self.resume and not self.checkpoint:
            raise ConfigError("--resume needs --checkpoint DIR")
        if self.checkpoint_every and not self.checkpoint:
            raise ConfigError("--checkpoint-every needs --checkpoint DIR")
        if self.lr_warmup_steps < 0:
            raise ConfigError(f"--lr-warmup-steps must not be negative (got {self.lr_warmup_steps})")
        if self.steps and self.lr_warmup_steps >= self.steps:
            raise ConfigError(f"--lr-warmup-steps {self.lr_warmup_steps} must be fewer than --steps {self.steps}")
        if (self.dataset_name in TOKEN_DATASETS) != (self.model in TOKEN_MODELS):
            raise ConfigError(f"--model {self.model} cannot train on --dataset {self.dataset_name}: the token models "
                              f"({', '.join(TOKEN_MODELS)}) train on the text data sets ({', '.join(TOKEN_DATASETS)}) "
                              "and only there")

    def _validate_periodic(self) -> None:
        """The periodic-averaging flags: each only with its modes, in range."""
        periodic = "|".join(PERIODIC_MODES)
        if self.sync_every != SYNC_EVERY and self.mode not in PERIODIC_MODES:
            raise ConfigError(f"--sync-every applies to --mode {periodic} only, not {self.mode}")
        for name, default in (("sync_delay", 0), ("outer_lr", OUTER_LR), ("outer_momentum", OUTER_MOMENTUM)):
            if getattr(self, name) != default and self.mode != DILOCO_MODE:
                raise ConfigError(f"--{flag_name(name)} applies to --mode {DILOCO_MODE} only, not {self.mode}")
        if self.sync_every < 1:
            raise ConfigError(f"--sync-every must be at least 1 (got {self.sync_every})")
        if self.mode == LOCAL_SGD_MODE and self.sync_every < 2:
            raise ConfigError("--mode localsgd needs --sync-every >= 2 (averaging every step is --mode ddp)")
        if not 0 <= self.sync_delay < self.sync_every:
            raise ConfigError(f"--sync-delay must be in [0, --sync-every) = [0, {self.sync_every}) "
                              f"(got {self.sync_delay})")
        if not self.outer_lr > 0:
            raise ConfigError(f"--outer-lr must be positive (got {self.outer_lr})")
        if not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"--outer-momentum must be in [0, 1) (got {self.outer_momentum})")

    def to_dict(self) -> dict:
        return asdict(self)

    def write_json(self, path: str) -> None:
        """Write the resolved config next to the results (atomically, so readers never see half a file)."""
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def registry_names(f) -> tuple[str, ...]:
    """The names a field's value must be one of, as the flags offer them (torch-free copies of the registries)."""
    return f.metadata["choices"]


def _choice(flag: str, value: str, f) -> None:
    """Check a name: the offered ones first (no torch), then the owning registry, which may hold more."""
    if value in f.metadata["choices"]:
        return
    valid = tuple(f.metadata["registry"]()) if f.metadata["registry"] else f.metadata["choices"]
    if value not in valid:
        raise ConfigError(f"unknown --{flag} {value!r} (valid: {', '.join(valid)})")


def flag_name(field_name: str) -> str:
    """A field's flag without its dashes: ``eval_steps`` -> ``eval-steps``."""
    return field_name.replace("_", "-")
