"""experiments/bench_gil_switch.py: a tiny run writes its table with provenance and leaves the interpreter's switch
interval as it found it; bad input exits 2 with one line before any work (the measurement itself is its committed
result, experiments/results/bench_gil_switch/)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_process import run_in_process

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "bench_gil_switch.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_tiny_run_writes_its_table(tmp_path):
    done = run("--intervals-ms", "1,0.2", "--hops", "2", "--wire-ms", "0.5", "--elements", "1024",
               "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "gil_switch.md").read_text()
    assert "- command: " in text and "- commit: " in text
    rows = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 0.2 |")]
    assert len(rows) == 2 and all(row.endswith("x |") for row in rows)


def test_the_switch_interval_is_restored(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent.parent))
    from experiments import bench_gil_switch

    before = sys.getswitchinterval()
    assert bench_gil_switch.main(["--intervals-ms", "0.3", "--hops", "1", "--wire-ms", "0", "--elements", "64",
                                  "--out", str(tmp_path)]) == 0
    assert sys.getswitchinterval() == before


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (["--intervals-ms", "0"], ["--intervals-ms", "fast"], ["--hops", "0"], ["--wire-ms", "-1"]):
        done = run_in_process(SCRIPT, *args, "--out", str(tmp_path / "never"))
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
        assert done.stderr.startswith("bench_gil_switch.py: error:") and not (tmp_path / "never").exists()
