"""``experiments/auto_choice_report.py``: the best fixed configuration per cell and each auto variant's ratio to it,
from a runs.json; a file it cannot read is one line and exit 2."""
from __future__ import annotations

import json

from experiments.auto_choice_report import main


def _run(cell: str, variant: str, t_iter: float, to_target: float | None, choice: str | None = None) -> dict:
    return {"cell": cell, "variant": variant, "status": "ok", "t_iter_s": t_iter, "time_to_target_s": to_target,
            "reached_target": to_target is not None, "auto_choice": choice}


def test_the_table_names_the_best_fixed_and_each_auto_variants_ratio(tmp_path, capsys):
    runs = [_run("resnet20-100mbit", "sync", 0.180, 6.0), _run("resnet20-100mbit", "pipe+q4", 0.060, 2.0),
            _run("resnet20-100mbit", "pipe+auto", 0.066, 2.2, "width 2, q8 + error feedback"),
            _run("alexnet-1gbit", "pipe+q8", 0.300, None), _run("alexnet-1gbit", "pipe+auto", 0.270, None, "q4")]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"provenance": {"command": "a test"}, "runs": runs}))
    assert main(["--result", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    per_iteration = next(line for line in lines if line.startswith("| resnet20-100mbit (ms per iteration)"))
    assert "| 180.0 | 60.0 | 66.0 | - | pipe+q4 | 1.10 | pipe+auto: width 2, q8 + error feedback |" in per_iteration
    assert any(line.startswith("| alexnet-1gbit (ms per iteration)") and "| pipe+q8 | 0.90 |" in line for line in lines)
    to_target = [line for line in lines if "(s to target)" in line]
    assert len(to_target) == 1 and "| 6.00 | 2.00 | 2.20 | pipe+q4 | 1.10 |" in to_target[0]


def test_a_file_it_cannot_read_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--result", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("auto_choice_report: cannot read")
