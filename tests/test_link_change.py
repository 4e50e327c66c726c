"""``experiments/link_change.py`` (issue 39 item 2): bad input is one line and exit 2 before any cluster exists, and
the report reads a result's runs (the experiment itself needs root and minutes: it is run by hand)."""
from __future__ import annotations

import json

import pytest

from experiments.link_change import Rank0Steps, report
from tests.in_process import run_in_process

SCRIPT = "experiments/link_change.py"


@pytest.mark.parametrize("argv, needle", [
    (["--variants", "pipe,zip"], "unknown variant(s) ['zip']"),
    (["--at", "150"], "--at + 2 x --recheck < --steps"),
    (["--recheck", "0"], "--recheck must be a positive integer"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--after", "unshaped"], "a link that changes must be shaped"),
    (["--report", "--result", "/nonexistent.json"], "cannot read /nonexistent.json"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle):
    done = run_in_process(SCRIPT, *argv)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and needle in done.stderr, done.stderr


def test_the_report_compares_auto_with_recheck_after_the_change():
    runs = [{"variant": "pipe+auto", "before_ms": 60.0, "after_ms": 150.0, "wall_s": 20.0, "choices": [[2, "none"]]},
            {"variant": "pipe+auto+recheck", "before_ms": 61.0, "after_ms": 60.0, "wall_s": 12.5,
             "choices": [[2, "none"], [92, "q4 + error feedback"]]}]
    config = {"nodes": 4, "before": "1gbit", "after": "100mbit", "steps": 160, "at": 50, "recheck": "20"}
    table = report({"config": config, "runs": runs})
    assert "| pipe+auto | 60.0 | 150.0 | 20.0 | 2: none | 0.40 |" in table
    assert "| pipe+auto+recheck | 61.0 | 60.0 | 12.5 | 2: none; 92: q4 + error feedback | 1.00 |" in table
    again = {**runs[0], "after_ms": 170.0, "wall_s": 22.0}  # a second round of pipe+auto: median and range
    table = report({"config": config, "runs": runs + [again]})
    assert "| pipe+auto | 60.0 (60.0-60.0) | 160.0 (150.0-170.0) | 21.0 (20.0-22.0) | 2: none / 2: none | 0.38 |" in table


def test_rank0_steps_follows_the_metrics_as_they_grow(tmp_path):
    metrics = str(tmp_path / "run.jsonl")
    steps = Rank0Steps(metrics)
    assert steps() == -1  # nothing written yet
    rank0 = tmp_path / "run.rank0.jsonl"
    rank0.write_text(json.dumps({"type": "config"}) + "\n" + json.dumps({"type": "step", "step": 3}) + "\n")
    assert steps() == 3
    with open(rank0, "a") as f:
        f.write(json.dumps({"type": "step", "step": 4}) + "\n" + '{"type": "step", "st')  # the last one half written
    assert steps() == 4
    with open(rank0, "a") as f:
        f.write('ep": 5}\n')
    assert steps() == 5
