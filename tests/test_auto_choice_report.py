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


def test_autos_own_time_is_held_against_two_per_cent_of_a_200_step_run(tmp_path, capsys):
    """Two sittings: auto cost 60 and 100 ms at 50 ms per iteration (10 s for 200 steps): 0.60 % and 1.00 %; 300 ms
    at 60 ms (12 s): 2.50 %, over the bound. A fixed run records none."""
    runs = [[_run("c", "pipe+q4", 0.05, 2.0), {**_run("c", "pipe+auto", 0.05, 2.2), "auto_s": 0.06},
             {**_run("d", "pipe+auto", 0.06, 3.0), "auto_s": 0.3}],
            [_run("c", "pipe+q4", 0.05, 2.0), {**_run("c", "pipe+auto", 0.05, 2.1), "auto_s": 0.1}]]
    paths = []
    for i, sitting in enumerate(runs):
        paths.append(tmp_path / f"sitting{i}.json")
        paths[-1].write_text(json.dumps({"provenance": {"command": "a test"}, "runs": sitting}))
    assert main(["--result", *map(str, paths)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "| c | pipe+auto | 2 | 80 | 60 | 100 | 0.80% | 1.00% | 2 of 2 |" in lines
    assert "| d | pipe+auto | 1 | 300 | 300 | 300 | 2.50% | 2.50% | 0 of 1 |" in lines
    assert not any(line.startswith("| c | pipe+q4 | ") and "%" in line for line in lines)


def test_a_file_it_cannot_read_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--result", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("auto_choice_report: cannot read")


def test_several_sittings_give_each_ratios_mean_range_and_the_ratio_of_means(tmp_path, capsys):
    """Sitting 1: q4 best (2.0 s), auto 2.1 (1.05); sitting 2: q8 best (2.0 s; q4 3.0), auto 2.4 (1.20). Means over
    the sittings: q8 2.25 beats q4 2.5, and auto's 2.25 is 1.00 of it."""
    def sitting(q4: float, q8: float, auto: float) -> list[dict]:
        return [_run("resnet20-100mbit", "pipe+q4", 0.05, q4), _run("resnet20-100mbit", "pipe+q8", 0.05, q8),
                _run("resnet20-100mbit", "pipe+auto", 0.05, auto, "width 2, q4 + error feedback")]
    paths = []
    for i, runs in enumerate([sitting(2.0, 2.5, 2.1), sitting(3.0, 2.0, 2.4)]):
        paths.append(tmp_path / f"sitting{i}.json")
        paths[-1].write_text(json.dumps({"provenance": {"command": "a test", "commit": "abc"}, "runs": runs}))
    assert main(["--result", *map(str, paths)]) == 0
    lines = capsys.readouterr().out.splitlines()
    to_target = next(line for line in lines if line.startswith("| resnet20-100mbit | pipe+auto |"))
    assert to_target == ("| resnet20-100mbit | pipe+auto | 2 | 1.12 | 1.05 | 1.20 | 1 of 2 | 1.00 | pipe+q8 | "
                         "1.00 (pipe+q8) | width 2, q4 + error feedback |")
    assert sum(line.startswith("| resnet20-100mbit | pipe+auto | 2 | 1.00 | 1.00 | 1.00 | 2 of 2 |")
               for line in lines) == 1  # per iteration: all alike


def test_the_best_fixed_that_reached_the_target_in_every_sitting_is_named_beside_the_best_by_mean(tmp_path, capsys):
    """q4 reached the target in one sitting of two (2.0 s; its mean counts that one), sync in both (3.0, 3.0): auto's
    2.4 and 2.6 are 1.25x q4's mean and 0.83x sync's."""
    sittings = [[_run("c", "pipe+q4", 0.05, 2.0), _run("c", "sync", 0.1, 3.0), _run("c", "pipe+auto", 0.05, 2.4)],
                [_run("c", "pipe+q4", 0.05, None), _run("c", "sync", 0.1, 3.0), _run("c", "pipe+auto", 0.05, 2.6)]]
    paths = []
    for i, runs in enumerate(sittings):
        paths.append(tmp_path / f"sitting{i}.json")
        paths[-1].write_text(json.dumps({"provenance": {"command": "a test"}, "runs": runs}))
    assert main(["--result", *map(str, paths)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| c | pipe+auto | 2 |"))
    assert "| 1.25 | pipe+q4 | 0.83 (sync) |" in line


def _curve(accuracies: list[float], seconds_per_step: float) -> list[dict]:
    return [{"step": 2 * (i + 1), "wall_s": 2 * (i + 1) * seconds_per_step, "accuracy": a}
            for i, a in enumerate(accuracies)]


def test_a_run_cut_short_is_projected_to_its_target_from_the_same_seeds_full_runs(tmp_path, capsys):
    """sync at 100 Mbit/s, 4 s per step, cut at step 6 (the last evaluation, after the end's flush, is not compared;
    step 4 at 16 s is); at 1 Gbit/s the same seed's sync computed the same evaluations and reached 0.75 at step 8:
    16 + 4 x 4 = 32 s, against q8's 20 s that ran to the target."""
    def run(cell, variant, t_iter, curve, to_target=None):
        return {**_run(cell, variant, t_iter, to_target), "workload": "alexnet", "target_accuracy": 0.75,
                "curve": curve}
    full = [run("alexnet-1gbit", "sync", 0.5, _curve([0.1, 0.3, 0.6, 0.8], 0.5), 4.0),
            run("alexnet-100mbit", "pipe+q8", 1.5, _curve([0.1, 0.3, 0.6, 0.7, 0.8], 2.0), 20.0)]
    short = [run("alexnet-100mbit", "sync", 4.0, _curve([0.1, 0.3, 0.5], 4.0)),
             run("alexnet-100mbit", "pipe", 4.0, _curve([0.1, 0.2, 0.6], 4.0))]  # not the same steps: no projection
    full.append(run("alexnet-1gbit", "pipe", 0.5, _curve([0.1, 0.3, 0.6, 0.8], 0.5), 4.0))
    paths = {}
    for name, runs in (("full", full), ("short", short)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps({"provenance": {"command": "a test"}, "config": {"seed": 3}, "runs": runs}))
    assert main(["--result", str(paths["full"]), "--short", str(paths["short"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "| alexnet-100mbit | sync | 4000 | 8 (alexnet-1gbit) | yes | 32.0 | 20.0 (pipe+q8) | 1.60 |" in lines
    assert "| alexnet-100mbit | pipe | 4000 | 8 (alexnet-1gbit) | no | - | 20.0 (pipe+q8) | - |" in lines


def test_a_projected_run_counts_in_its_seeds_sitting_and_is_named_so(tmp_path, capsys):
    """Two sittings (seeds 0 and 1) at 100 Mbit/s: q4 ran to the target in one only; sync, too slow to run to it,
    was cut short in both and projected from the same seed's 1 Gbit/s run to 32 s in each (as in the test above).
    Auto's 20 and 24 s are then 0.69x sync's, the best fixed that reached it in every sitting, both projected."""
    def run(cell, variant, t_iter, curve, to_target=None):
        return {**_run(cell, variant, t_iter, to_target), "workload": "alexnet", "target_accuracy": 0.75,
                "curve": curve}
    paths = []
    for seed, q4, mine in ((0, 18.0, 20.0), (1, None, 24.0)):
        full = [run("alexnet-1gbit", "sync", 0.5, _curve([0.1, 0.3, 0.6, 0.8], 0.5), 4.0),
                run("alexnet-100mbit", "pipe+q4", 1.0, _curve([0.1, 0.3, 0.6, 0.8], 1.0), q4),
                run("alexnet-100mbit", "pipe+auto", 1.5, _curve([0.1, 0.3, 0.6, 0.8], 1.5), mine)]
        short = [run("alexnet-100mbit", "sync", 4.0, _curve([0.1, 0.3, 0.5], 4.0))]
        for name, runs in (("full", full), ("short", short)):
            paths.append(tmp_path / f"{name}{seed}.json")
            paths[-1].write_text(json.dumps({"provenance": {"command": "a test"}, "config": {"seed": seed},
                                             "runs": runs}))
    fulls, shorts = [str(p) for p in paths if "full" in p.name], [str(p) for p in paths if "short" in p.name]
    assert main(["--result", *fulls, "--short", *shorts]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("| alexnet-100mbit | pipe+auto | 2 |"))
    assert "| 0.69 (sync, projected in 2 of 2) |" in line
