"""experiments/bench_buffer_copies.py: a tiny run writes both ways' rows for each model with provenance; bad input
exits 2 with one line before any work (the measurement is its committed result,
experiments/results/bench_buffer_copies/)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_process import run_in_process

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "bench_buffer_copies.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_tiny_run_writes_both_ways_for_each_model(tmp_path):
    done = run("--repeats", "2", "--calls", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "buffer_copies.md").read_text()
    assert "- command: " in text and "- commit: " in text
    for model, buffers in (("resnet20", 63), ("resnet18", 60)):  # 21 / 20 BatchNorms, three buffers each
        assert f"| {model} | {buffers} | loop |" in text
        flat = next(line for line in text.splitlines() if line.startswith(f"| {model} | {buffers} | flat group |"))
        assert flat.endswith("x |")


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, says in ((["--models", "vgg"], "unknown model vgg"), (["--repeats", "0"], "must be >= 1"),
                       (["--calls", "x"], "invalid int value")):
        done = run_in_process(SCRIPT, *args, "--out", str(tmp_path / "never"))
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "never").exists()
