"""experiments/bench_codec_rows.py: a tiny run writes both tables with provenance, and bad input exits 2 before any
work (the measurement itself is its committed result, experiments/results/bench_codec_rows/)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_process import run_in_process

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "bench_codec_rows.py"


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_tiny_run_writes_both_tables(tmp_path):
    done = run("--codecs", "q8,sign", "--p", "3", "--sizes-mib", "0.01", "--ranks", "2", "--rounds", "2",
               "--repeats", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "codec_rows.md").read_text()
    assert "- command: " in text and "- commit: " in text
    assert "| q8 | 3 | 0.01 |" in text and "| sign | 3 | 0.01 |" in text  # table 1: one process, p = 3
    assert "| q8 | 2 | 0.01 |" in text and "| sign | 2 | 0.01 |" in text  # table 2: two gloo ranks
    assert not (tmp_path / ".ranks.md").exists()


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (["--codecs", "q9"], ["--ranks", "1"], ["--sizes-mib", "0"], ["--p", "0"]):
        done = run_in_process(SCRIPT, *args, "--out", str(tmp_path / "never"))
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.strip().splitlines()[-1].startswith("bench_codec_rows.py: error:"), done.stderr
        assert not (tmp_path / "never").exists()
