"""experiments/figures.py draws the README's figures from committed results and refuses bad input in one line."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_process import run_in_process

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}


def _figures(*args):
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "figures.py"), *args], capture_output=True,
                          text=True, env=ENV, timeout=300)


def test_unknown_figure_is_one_line_error(tmp_path):
    proc = run_in_process(ROOT / "experiments" / "figures.py", "--only", "nope", "--out", str(tmp_path))
    assert proc.returncode == 2 and "unknown figure nope; valid: comparison_split" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_every_figure_draws_from_committed_results(tmp_path):
    pytest.importorskip("matplotlib", reason="the notebooks extra is not installed")
    proc = _figures("--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == sorted(["accuracy_codecs.png", "accuracy_widths.png", "time_to_accuracy.png",
                           "comparison_split.png", "model_scatter.png", "timeline.png", "gain_curve.png"])
    assert all((tmp_path / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    index = (tmp_path / "README.md").read_text()
    assert index.count("- `") == 7 and "commit" in index


@pytest.mark.slow
def test_one_figure_redrawn_replaces_only_its_line_in_the_index(tmp_path):
    pytest.importorskip("matplotlib", reason="the notebooks extra is not installed")
    stale = "- `timeline.png` from somewhere: `an older command` (old)"
    (tmp_path / "README.md").write_text("# Figures\n\n- `model_scatter.png` from an older run\n" + stale + "\n")
    proc = _figures("--only", "model_scatter", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = (tmp_path / "README.md").read_text().splitlines()
    assert lines[0] == "# Figures" and lines[3] == stale  # the other figure's line stays where it was
    assert lines[2].startswith("- `model_scatter.png` from `experiments/results/fidelity/sitting-a.json`")
    assert "commit" in lines[2] and len(lines) == 4
