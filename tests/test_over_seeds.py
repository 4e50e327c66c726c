"""experiments/over_seeds.py: a grid run once per seed, summarised per variant over the sittings."""
from __future__ import annotations

import json
import os

from experiments.over_seeds import summary_rows
from tests.in_process import run_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sitting(ddp_tta, pipe_tta, pipe_loss):
    run = lambda variant, t_iter, tta, loss: {"cell": "charlm-100mbit", "variant": variant, "status": "ok",  # noqa
                                              "t_iter_s": t_iter, "time_to_target_s": tta, "final_loss": loss,
                                              "final_accuracy": 0.5}
    return {"runs": [run("ddp", 0.4, ddp_tta, 1.70), run("pipe", 0.2, pipe_tta, pipe_loss),
                     {"cell": "charlm-100mbit", "variant": "sync", "status": "failed"}],
            "provenance": {"command": "c", "date": "d", "commit": "x"}}


def test_means_spreads_and_ratios_are_taken_within_each_sitting():
    rows = summary_rows([sitting(100.0, 40.0, 1.71), sitting(120.0, 60.0, 1.73)], "ddp")
    ddp, pipe = rows[2].split(" | "), rows[3].split(" | ")
    assert len(rows) == 4  # header, rule, ddp, pipe: the failed run is left out
    assert pipe[3] == "200.0 ± 0.0" and pipe[4] == "2.00x"
    assert pipe[5] == "1.7200 ± 0.0141"  # sample std of 1.71 and 1.73
    assert pipe[7] == "40.0, 60.0" and pipe[8] == "50.0" and pipe[9].startswith("2.25x (2 of 2)")  # (2.5 + 2.0) / 2
    assert ddp[9].startswith("1.00x")


def test_a_sitting_that_missed_the_target_shows_and_the_mean_says_so():
    rows = summary_rows([sitting(100.0, 40.0, 1.71), sitting(120.0, None, 1.80)], "ddp")
    pipe = rows[3].split(" | ")
    assert pipe[7] == "40.0, -" and pipe[8] == "not every sitting" and pipe[9].startswith("2.50x (1 of 2)")


def test_bad_inputs_are_one_line_and_exit_2(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sitting(1.0, 1.0, 1.0)))
    for argv, needle in (([str(tmp_path / "none.json")], "No such file"),
                         ([str(path), "--baseline", "ps-sync"], "no run of the baseline 'ps-sync'")):
        done = run_in_process(os.path.join(ROOT, "experiments", "over_seeds.py"), *argv, cwd=ROOT)
        assert done.returncode == 2 and needle in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_another_target_is_read_from_each_runs_curve(tmp_path):
    """``--target-loss`` gives each file its own target (in order) and re-reads time to it from the runs' curves."""
    paths = []
    for name, loss in (("a", 1.0), ("b", 2.0)):
        data = sitting(1.0, 1.0, 1.0)
        for run in data["runs"][:2]:
            run["curve"] = [{"wall_s": 5.0, "loss": 3.0}, {"wall_s": 9.0, "loss": loss}]
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(data))
    done = run_in_process(os.path.join(ROOT, "experiments", "over_seeds.py"), *map(str, paths),
                          "--target-loss", "1.5,3.5", cwd=ROOT)
    pipe = done.stdout.splitlines()[3].split(" | ")
    assert done.returncode == 0 and pipe[7] == "9.0, 5.0"
    for bad in ("1,2,3", "-1", "x"):
        done = run_in_process(os.path.join(ROOT, "experiments", "over_seeds.py"), *map(str, paths),
                              "--target-loss", bad, cwd=ROOT)
        assert done.returncode == 2 and "--target-loss" in done.stderr and len(done.stderr.strip().splitlines()) == 1
