"""The trainer's flags and TOML file: ``build_parser`` mirrors ``TrainConfig``'s fields as flags, ``load_toml``
reads a flat file of the same names, and ``resolve`` lays flags over the file over defaults."""
from __future__ import annotations

import argparse
import tomllib
from dataclasses import fields

from .config import ConfigError, TrainConfig, flag_name, registry_names


def help_text(f) -> str:
    """A field's flag help: its text, the names it offers (``choices``), and its default."""
    choices = f"; one of {', '.join(registry_names(f))}" if f.metadata["choices"] is not None else ""
    return f"{f.metadata['help']}{choices} (default: {f.default!r})"


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (no usage dump), raising instead of exiting."""

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(message)


def _width(text: str) -> int | str:
    """--width: an integer, or auto."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer or auto: {text!r}") from None


# The help's sections, in the order a newcomer reads them: each TrainConfig field in exactly one
# (tests/test_train_config.py checks that none is missing or doubled).
GROUPS = {
    "what to train": ("model", "hidden", "dataset", "synthetic_samples", "synthetic_features", "synthetic_classes"),
    "optimisation": ("epochs", "steps", "batch_size", "accumulate", "optimizer", "lr", "momentum", "weight_decay",
                     "lr_schedule", "lr_warmup_steps", "clip_grad_norm", "amp", "compile", "seed"),
    "how gradients meet (distribution)": ("mode", "width", "warmup_steps", "allreduce", "bucket_mb", "buffers",
                                          "check_replicas", "auto_recheck_every"),
    "codec (compression on the wire)": ("compression", "error_feedback"),
    "staleness (mode pipe, width >= 2)": ("staleness", "lookahead_standin"),
    "baselines (DDP, parameter server)": ("ddp_hook", "powersgd_rank", "servers", "push_every", "pull_every"),
    "periodic averaging (localsgd, diloco)": ("sync_every", "sync_delay", "outer_lr", "outer_momentum"),
    "execution": ("device", "backend", "threads", "timeout", "debug"),
    "outputs: metrics, evaluation, checkpoints, traces": ("metrics", "eval_every", "eval_steps", "eval_deferred",
                                                          "checkpoint", "checkpoint_every", "resume", "trace",
                                                          "trace_steps"),
}

# What a flag's value is, where its type alone does not say (flags with choices list them instead).
VALUE_NAMES = {
    "width": "K", "hidden": "UNITS", "dataset": "NAME[:DIR]", "synthetic_samples": "N", "synthetic_features": "N",
    "synthetic_classes": "N", "epochs": "N", "steps": "N", "batch_size": "N", "accumulate": "N", "lr": "RATE",
    "momentum": "BETA", "weight_decay": "L2", "lr_warmup_steps": "N", "clip_grad_norm": "NORM", "seed": "INT",
    "warmup_steps": "N", "bucket_mb": "MIB", "check_replicas": "N", "auto_recheck_every": "N",
    "powersgd_rank": "RANK", "sync_every": "STEPS", "sync_delay": "STEPS", "outer_lr": "RATE",
    "outer_momentum": "BETA", "servers": "N", "push_every": "N", "pull_every": "N", "threads": "N",
    "timeout": "SECONDS", "metrics": "FILE.jsonl", "eval_every": "EPOCHS", "eval_steps": "STEPS",
    "checkpoint": "DIR", "checkpoint_every": "STEPS", "trace": "FILE", "trace_steps": "A:B",
}


def metavar(f) -> str:
    """The placeholder of a field's value in the help: its choices, or what the value is."""
    if f.metadata["choices"] is not None and f.name != "dataset":  # dataset also takes NAME:DIR
        return "{" + ",".join(registry_names(f)) + "}"
    return VALUE_NAMES.get(f.name, "VALUE")


def build_parser() -> argparse.ArgumentParser:
    """Flags mirror TrainConfig's fields, in GROUPS; every default is None so that only given flags override."""
    parser = _OneLineParser(
        prog="pipesgd-train",
        usage="%(prog)s [-h] [--config FILE.toml] [flags]\n"
              "       torchrun --nproc-per-node N -m pipesgd.train [flags]",
        description="Data-parallel training with Pipe-SGD and its baselines. Launch with torchrun "
                    "(e.g. torchrun --nproc-per-node 4 -m pipesgd.train) or alone (world size 1). "
                    "With no flags it trains an MLP on scikit-learn's digits with Pipe-SGD width 2 for "
                    "20 epochs of batch 32 per worker (220 steps with 4 workers), SGD lr 0.02, momentum 0.9: "
                    "seconds of training on two CPU cores (the README's first command shows what it reaches).",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file of field = value (flags win over it)")
    by_name = {f.name: f for f in fields(TrainConfig)}
    for title, names in GROUPS.items():
        group = parser.add_argument_group(title)
        for name in names:
            f = by_name[name]
            flag = f"--{flag_name(f.name)}"
            text = help_text(f).replace("%", "%%")
            if isinstance(f.default, bool):
                group.add_argument(flag, dest=f.name, action="store_true", help=text)
            else:
                kind = _width if f.name == "width" else type(f.default)
                group.add_argument(flag, dest=f.name, type=kind, metavar=metavar(f), help=text)
    return parser


def load_toml(path: str) -> dict:
    """Read a flat TOML file whose keys are TrainConfig fields (dashes or underscores)."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path} is a directory, expected a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    known = {f.name: f for f in fields(TrainConfig)}
    values = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"unknown key {key!r} in {path}")
        default = known[name].default
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not type(default) and not (name == "width" and value == "auto"):
            raise ConfigError(f"key {key!r} in {path} must be {type(default).__name__}, got {value!r}")
        values[name] = value
    return values


def resolve(argv: list[str] | None = None) -> TrainConfig:
    """Defaults, then the TOML file, then flags; validated."""
    args = vars(build_parser().parse_args(argv))
    config_path = args.pop("config", None)
    values = load_toml(config_path) if config_path else {}
    values.update(args)
    return TrainConfig(**values)
