"""experiments/bench_allreduce_choice.py: bad flags refused in one line, and one tiny loopback run with the
exchange's all-gather A/B and the bare collectives."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_process import run_in_process

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "bench_allreduce_choice.py"


def _run(*argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.parametrize("argv, message", [
    (["--codecs", "q9"], "unknown compressor 'q9'"),
    (["--sizes-mib", "x"], "could not convert"),
    (["--ranks", "1"], "must be >= 2"),
    (["--rounds", "0"], "must be >= 2, --rounds and --repeats >= 1"),
    (["--bandwidth", "fast"], "bandwidth 'fast'"),
    (["--bandwidth", "1gbit", "--nodes", "1"], "must be >= 2"),
])
def test_bad_flags_are_one_line_and_exit_2(argv, message, tmp_path):
    done = run_in_process(SCRIPT, *argv, "--out", str(tmp_path), cwd=ROOT)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert not any(tmp_path.iterdir())  # refused before any work


@pytest.mark.slow
def test_a_tiny_run_prints_both_all_reduces_the_a_b_variants_and_the_bare_collectives(tmp_path):
    done = _run("--ranks", "3", "--codecs", "q8", "--sizes-mib", "0.02", "--rounds", "1", "--repeats", "1",
                "--gather-ab", "--pairwise-ab", "--raw", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    table = (tmp_path / "allreduce_choice.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| 3 |")]
    assert len(rows) == 2  # the all-reduces' row and the bare collectives' row
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2] == "q8" and len(cells) == 10 and all(float(c) > 0 for c in cells[3:])
    assert all(float(c) > 0 for c in rows[1].strip("|").split("|")[3:])
