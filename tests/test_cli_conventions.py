"""The three command lines' one convention (``pipesgd.cli_conventions``): every bad input is exactly one line
``PROG: error: ...`` on stderr, exit code 2, no traceback, and nothing started (each test makes starting work fail
the test); and the shared pieces: negative values, non-finite numbers, output paths checked up front."""
from __future__ import annotations

import argparse
import os

import pytest

from pipesgd.cli_conventions import finite_float, join_negative_values, positive_float
from pipesgd.output_paths import check_output_dir, check_output_file


def _one_line_error(capsys, prog: str) -> str:
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
    assert "Traceback" not in err + out
    return err


def _forbid(monkeypatch, target: str, what: str) -> None:
    def started(*args, **kwargs):
        raise AssertionError(f"{what} started on bad input")
    monkeypatch.setattr(target, started)


# -- pipesgd-train -----------------------------------------------------------------------------------------------
TRAIN_BAD = [  # {dir}: an existing directory, {file}: an existing file
    (["--config", "{dir}"], "--config {dir} is a directory"),
    (["--metrics", "/proc/m.jsonl"], "--metrics /proc/m.jsonl: cannot create a file in /proc"),
    (["--metrics", "{dir}"], "is a directory, expected a file"),
    (["--metrics", "{file}"], "already exists: choose another file, remove it, or pass --resume"),
    (["--metrics", "{file}/m.jsonl"], "is not a directory"),
    (["--checkpoint", "/proc/ck"], "--checkpoint /proc/ck: cannot create a file in /proc"),
    (["--checkpoint", "{file}"], "is a file, expected a directory"),
    (["--trace", "/proc/t.json"], "--trace /proc/t.json: cannot create a file in /proc"),
    (["--lr", "inf"], "--lr must be a finite number (got inf)"),
    (["--lr", "1e400"], "--lr must be a finite number"),
    (["--weight-decay", "nan"], "--weight-decay must be a finite number (got nan)"),
    (["--timeout", "-inf"], "--timeout must be a finite number"),
    (["--lr", "-1e-3"], "--lr must be positive"),
    (["--steps", "abc"], "argument --steps: invalid int value: 'abc'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize("argv,message", TRAIN_BAD, ids=[" ".join(a) for a, _ in TRAIN_BAD])
def test_train_refuses_bad_input_in_one_line(argv, message, tmp_path, capsys, monkeypatch):
    from pipesgd.train import cli

    _forbid(monkeypatch, "pipesgd.train.cli.init_process_group", "the process group")
    existing = tmp_path / "existing.jsonl"
    existing.write_text("{}\n")
    paths = {"dir": str(tmp_path), "file": str(existing)}
    assert cli.main([a.format(**paths) for a in argv]) == 2
    assert message.format(**paths) in _one_line_error(capsys, "pipesgd-train")
    assert sorted(os.listdir(tmp_path)) == ["existing.jsonl"]  # nothing written


def test_train_refuses_a_non_finite_toml_value(tmp_path, capsys):
    from pipesgd.train import cli

    config = tmp_path / "run.toml"
    config.write_text("lr = inf\n")
    assert cli.main(["--config", str(config)]) == 2
    assert "--lr must be a finite number (got inf)" in _one_line_error(capsys, "pipesgd-train")


def test_train_refuses_any_rank_s_existing_metrics_file(tmp_path, capsys, monkeypatch):
    """With several ranks every rank refuses alike when one rank's file exists (no rank left waiting)."""
    from pipesgd.train import cli

    (tmp_path / "m.rank1.jsonl").write_text("{}\n")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _forbid(monkeypatch, "pipesgd.train.cli.init_process_group", "the process group")
    assert cli.main(["--metrics", str(tmp_path / "m.jsonl")]) == 2
    assert f"--metrics {tmp_path / 'm.rank1.jsonl'} already exists" in _one_line_error(capsys, "pipesgd-train")


# -- the shared pieces -------------------------------------------------------------------------------------------
def test_negative_values_reach_their_flag_and_a_command_keeps_its_own():
    assert join_negative_values(["--bandwidth", "-1gbit", "--lr", "-.5", "--x", "-inf", "--flag", "--y", "3"]) == \
        ["--bandwidth=-1gbit", "--lr=-.5", "--x=-inf", "--flag", "--y", "3"]
    assert join_negative_values(["run", "--timeout", "5", "--", "cmd", "--n", "-1"]) == \
        ["run", "--timeout", "5", "--", "cmd", "--n", "-1"]


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e400", "abc"])
def test_float_flags_refuse_non_finite_numbers(text):
    with pytest.raises(argparse.ArgumentTypeError):
        finite_float(text)
    assert positive_float("1e-3") == 1e-3


def test_output_paths_allow_missing_directories_without_creating_them(tmp_path):
    check_output_file(str(tmp_path / "a" / "b" / "m.jsonl"), "--metrics")
    check_output_dir(str(tmp_path / "a" / "ck"), "--checkpoint")
    assert os.listdir(tmp_path) == []  # the probe file is gone and no directory was made


def test_output_paths_refuse_a_read_only_place(tmp_path, monkeypatch):
    """Where the kernel refuses to create a file (as on a read-only file system), the probe says so."""
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(ValueError, match=r"--out .*: cannot create a file in .* \(Read-only file system\)"):
        check_output_file(str(tmp_path / "x.json"), "--out")
