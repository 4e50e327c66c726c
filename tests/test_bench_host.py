"""experiments/bench_host.py: its flags, and one tiny run printing every wrapper side by side."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "bench_host.py"


def _main():
    spec = importlib.util.spec_from_file_location("bench_host", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("argv", [["--models", "vgg"], ["--iters", "0"], ["--rounds", "-1"], ["--bogus"]])
def test_bad_flags_are_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _main()(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("bench_host: error: "), err


@pytest.mark.slow
def test_a_tiny_run_prints_every_wrapper_against_the_optimizer_alone():
    # its own process: the script initialises (and destroys) a world-size-1 default group
    out = subprocess.run([sys.executable, str(SCRIPT), "--models", "lenet", "--iters", "2", "--rounds", "1"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| lenet")]
    assert [row[2] for row in rows] == ["plain", "ddp", "pipe K=1", "pipe K=2 plain update", "pipe K=2"]
    assert rows[0][-1] == "+0.00 |"  # the floor against itself
    assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in rows)
