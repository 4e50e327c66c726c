"""pipesgd-train configuration: CLI > TOML > defaults, validation errors as one line with exit 2."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from pipesgd.train.cli import main
from pipesgd.train.config import ConfigError, TrainConfig
from pipesgd.train.flags import resolve


def test_defaults_are_the_readme_run():
    cfg = resolve([])
    assert (cfg.mode, cfg.width, cfg.model, cfg.dataset) == ("pipe", 2, "mlp", "digits")
    assert cfg.resolved_backend == "gloo" and cfg.effective_width == 2


def test_cli_over_toml_over_defaults(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('mode = "sync"\nlr = 1\nbatch-size = 16\nepochs = 3\n')
    cfg = resolve(["--config", str(toml), "--epochs", "5"])
    assert cfg.mode == "sync"  # from TOML
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)  # TOML int widened to the field's float
    assert cfg.batch_size == 16  # TOML key with dashes
    assert cfg.epochs == 5  # flag wins over TOML
    assert cfg.momentum == TrainConfig().momentum  # default where neither says anything
    assert cfg.effective_width == 1  # sync is width 1 whatever --width says


def test_toml_errors(tmp_path):
    bad_key = tmp_path / "a.toml"
    bad_key.write_text("learning_rate = 0.1\n")
    with pytest.raises(ConfigError, match="unknown key 'learning_rate'"):
        resolve(["--config", str(bad_key)])
    bad_type = tmp_path / "b.toml"
    bad_type.write_text('epochs = "ten"\n')
    with pytest.raises(ConfigError, match="must be int"):
        resolve(["--config", str(bad_type)])
    with pytest.raises(ConfigError, match="config file not found"):
        resolve(["--config", str(tmp_path / "missing.toml")])


def test_width_auto_from_a_flag_or_toml(tmp_path):
    toml = tmp_path / "auto.toml"
    toml.write_text('width = "auto"\ncompression = "auto"\nauto-recheck-every = 50\n')
    cfg = resolve(["--config", str(toml)])
    assert (cfg.width, cfg.compression, cfg.auto_recheck_every) == ("auto", "auto", 50)
    assert cfg.effective_width == "auto"
    assert resolve(["--width", "3"]).width == 3
    toml.write_text('width = "wide"\n')
    with pytest.raises(ConfigError, match="must be int"):
        resolve(["--config", str(toml)])


def test_resolved_config_json_roundtrips(tmp_path):
    cfg = resolve(["--mode", "ddp", "--ddp-hook", "fp16"])
    path = tmp_path / "out" / "config.json"
    cfg.write_json(str(path))
    assert TrainConfig(**json.loads(path.read_text())) == cfg


BAD_INPUTS = [
    (["--mode", "allreduce"], "unknown --mode 'allreduce'"),
    (["--model", "vgg"], "unknown --model 'vgg'"),
    (["--dataset", "imagenet"], "unknown --dataset 'imagenet'"),
    (["--width", "0"], "--width must be at least 1"),
    (["--dataset", "mnist:/nonexistent/dir"], "data directory not found: /nonexistent/dir"),
    (["--dataset", "cifar10"], "needs a directory"),
    (["--batch-size", "5000"], "larger than a worker's shard"),
    (["--mode", "ddp", "--compression", "fp16"], "--compression applies to --mode pipe|sync only"),
    (["--mode", "ps-sync", "--compression", "q8"], "--compression applies to --mode pipe|sync only"),
    (["--compression", "sign"], "--compression sign needs --error-feedback"),
    (["--ddp-hook", "fp16"], "--ddp-hook applies to --mode ddp only"),
    (["--error-feedback"], "--error-feedback needs a lossy --compression"),
    (["--compression", "auto", "--error-feedback"], "--compression auto chooses error feedback"),
    (["--compression", "auto", "--warmup-steps", "1"], "--warmup-steps must be >= 2"),
    (["--compression", "zip"], "auto"),  # the valid names listed include auto
    (["--width", "wide"], "--width: not an integer or auto: 'wide'"),
    (["--width", "auto", "--mode", "sync"], "--width auto applies to --mode pipe only"),
    (["--width", "auto", "--warmup-steps", "1"], "--width auto measures during the warm-up: --warmup-steps must"),
    (["--auto-recheck-every", "5"], "--auto-recheck-every needs --width auto or --compression auto"),
    (["--width", "auto", "--auto-recheck-every", "-1"], "--auto-recheck-every must not be negative"),
    (["--resume"], "--resume needs --checkpoint"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--servers", "1"], "--servers applies to --mode ps-sync|ps-async only"),
    (["--sync-every", "4"], "--sync-every applies to --mode localsgd|diloco only, not pipe"),
    (["--mode", "localsgd", "--sync-every", "1"], "--mode localsgd needs --sync-every >= 2"),
    (["--mode", "diloco", "--sync-every", "0"], "--sync-every must be at least 1 (got 0)"),
    (["--mode", "diloco", "--sync-every", "4", "--sync-delay", "4"], "--sync-delay must be in [0, --sync-every)"),
    (["--mode", "diloco", "--sync-delay", "-1"], "--sync-delay must be in [0, --sync-every)"),
    (["--mode", "diloco", "--outer-lr", "0"], "--outer-lr must be positive"),
    (["--mode", "diloco", "--outer-momentum", "1"], "--outer-momentum must be in [0, 1)"),
    (["--mode", "localsgd", "--outer-lr", "0.5"], "--outer-lr applies to --mode diloco only, not localsgd"),
    (["--mode", "ddp", "--sync-delay", "1"], "--sync-delay applies to --mode diloco only, not ddp"),
    (["--mode", "diloco", "--compression", "q8"], "--compression applies to --mode pipe|sync only, not diloco"),
    (["--epochs", "two"], "invalid int value"),
    (["--no-such-flag"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv,message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("pipesgd-train: error: ") and message in err, err


def test_bad_input_from_a_real_process_has_no_traceback():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "pipesgd.train", "--mode", "ddp", "--compression", "q8"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "pipesgd-train: error: --compression applies to --mode pipe|sync only, not ddp; "
        "DDP compresses with --ddp-hook fp16"]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# -- one owner per fact: names come from the registries, defaults from pipesgd.defaults ----------------------
def test_names_are_checked_against_the_registries(monkeypatch):
    from torch import nn

    from pipesgd import compression
    from pipesgd.train.data import DATASETS
    from pipesgd.train.models import MODELS

    monkeypatch.setitem(MODELS, "tiny", lambda input_shape, num_classes, **_: nn.Flatten())
    assert resolve(["--model", "tiny"]).model == "tiny"  # registered after the config module was imported
    monkeypatch.setitem(DATASETS, "toy", lambda cfg: None)
    assert resolve(["--dataset", "toy"]).dataset_name == "toy"
    with pytest.raises(ConfigError, match=r"unknown --compression 'q2' \(valid: " + ", ".join(compression.available())):
        resolve(["--compression", "q2"])


def test_shared_defaults_come_from_their_owner():
    from pipesgd import defaults

    cfg = TrainConfig()
    assert cfg.warmup_steps == defaults.WARMUP_STEPS and cfg.bucket_mb == defaults.BUCKET_MB
    for codec in defaults.NEEDS_ERROR_FEEDBACK:
        with pytest.raises(ConfigError, match=f"--compression {codec} needs --error-feedback"):
            resolve(["--compression", codec])
        assert resolve(["--compression", codec, "--error-feedback"]).error_feedback


def _flag_entries_text(help_text: str) -> str:
    """The help after its first section title, with the section titles (lines not indented) left out."""
    body = help_text.split("options:", 1)[1]
    return "\n".join(line for line in body.splitlines() if line.startswith(" ") or not line.strip())


def test_help_shows_every_flag_with_its_default_and_its_valid_names(monkeypatch):
    from dataclasses import fields

    from pipesgd.train.flags import build_parser
    from pipesgd.train.modes import MODES

    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at the terminal width, hyphenated words too
    options = _flag_entries_text(build_parser().format_help())
    entries = {e.split()[0]: " ".join(e.split()) for e in re.split(r"\n  (?=--)", options) if e.strip()}
    for f in fields(TrainConfig):
        entry = entries["--" + f.name.replace("_", "-")]
        assert entry.endswith(f"(default: {f.default!r})"), entry
        assert " ".join(f.metadata["help"].split()) in entry, entry
    text = " ".join(options.split())  # undo argparse's line wrapping
    assert "one of " + ", ".join(MODES) in text


def test_help_groups_the_flags_and_names_their_values(monkeypatch):
    from dataclasses import fields

    from pipesgd.train.flags import GROUPS, build_parser

    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(f.name for f in fields(TrainConfig))  # each field in exactly one group
    monkeypatch.setenv("COLUMNS", "400")
    text = build_parser().format_help()
    titles = [line[:-1] for line in text.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert titles == ["options", *GROUPS], titles
    for f in fields(TrainConfig):
        if f.metadata["choices"] is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        shown = re.search(rf"^  {re.escape(flag)} (\S+)", text, re.M).group(1)
        assert shown != f.name.upper().replace("_", "-") and shown != f.name.upper(), shown
    assert "  --mode {pipe,sync,ddp," in text and "  --lr RATE" in text and "  --metrics FILE.jsonl" in text
    assert "  --mode MODE" not in text


def test_help_leaves_torch_dynamo_unloaded():
    """torch.compile's machinery loads only when a model is wrapped (test_train_choices.py checks that --help
    loads no torch at all)."""
    probe = ("import runpy, sys\nsys.argv = ['pipesgd-train', '--help']\n"
             "try:\n    runpy.run_module('pipesgd.train', run_name='__main__')\nexcept SystemExit as e:\n"
             "    print('exit', e.code, 'torch._dynamo' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stderr.strip().splitlines()[-1] == "exit 0 False", proc.stderr
    assert "what to train:" in proc.stdout


def test_the_declared_python_floor_has_tomllib():
    import pathlib
    import tomllib

    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    floor = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
    major, minor = map(int, re.fullmatch(r">=\s*(\d+)\.(\d+)", floor).groups())
    assert (major, minor) >= (3, 11), f"train/config.py imports tomllib (3.11+), pyproject allows {floor}"
