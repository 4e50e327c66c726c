"""experiments/count_step_calls.py: a tiny two-rank run counts every way's calls (on ResNet-20, 65 parameters and 63
BatchNorm buffers, PipeSGD adds a few calls, not a few per tensor) and writes them with provenance; bad input exits 2 with one line before any
rank starts (the counts themselves are its committed result, experiments/results/bench_host/step_calls.md)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_process import run_in_process

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "count_step_calls.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_a_tiny_run_counts_every_way(tmp_path):
    done = run("--models", "resnet20", "--iters", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "step_calls.md").read_text()
    assert "- command: " in text and "- commit: " in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| resnet20 |")]
    assert [(r[1], r[2]) for r in rows] == [(o, w) for o in ("sgd", "adamw") for w in ("alone", "pipe", "pipe+lookahead")]
    added = {(r[1], r[2]): int(r[5].rstrip(" |")) for r in rows}
    assert all(added[(o, "alone")] == 0 for o in ("sgd", "adamw"))
    assert all(abs(added[(o, way)]) < 30 for o in ("sgd", "adamw") for way in ("pipe", "pipe+lookahead")), added


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, says in ((["--models", "vgg"], "unknown model vgg"), (["--ranks", "1"], "--ranks must be >= 2"),
                       (["--iters", "0"], "--iters >= 1")):
        done = run_in_process(SCRIPT, *args, "--out", str(tmp_path / "never"))
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "never").exists()
