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
