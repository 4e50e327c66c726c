"""The comparison grid's runs in two sittings side by side (``experiments.harness.repeatability``)."""
import json

import pytest

from experiments.harness import repeatability


def _run(cell, variant, t_iter_s, error=None, status="ok"):
    run = {"cell": cell, "workload": cell.split("-")[0], "variant": variant, "status": status, "t_iter_s": t_iter_s}
    if error is not None:
        run["model"] = {"error": error, "predicted_s": t_iter_s * (1 + error)}
    return run


FIRST = {"runs": [_run("lenet-1gbit", "sync", 0.010, -0.05), _run("lenet-1gbit", "pipe", 0.008, 0.02),
                  _run("resnet20-1gbit", "sync", 0.060, 0.01), _run("resnet20-1gbit", "ddp", 0.070, status="failed"),
                  _run("alexnet-unshaped", "sync", 0.300)]}
SECOND = {"runs": [_run("lenet-1gbit", "pipe", 0.010, -0.10), _run("lenet-1gbit", "sync", 0.009, 0.20),
                   _run("resnet20-1gbit", "sync", 0.063), _run("resnet20-1gbit", "ddp", 0.071, 0.0)]}


def test_pairs_keep_the_runs_measured_in_both_with_their_change_and_model_errors():
    found = repeatability.pairs(FIRST, SECOND)
    assert [(p.cell, p.variant) for p in found] == [("lenet-1gbit", "sync"), ("lenet-1gbit", "pipe"),
                                                    ("resnet20-1gbit", "sync")]  # a failed run and one absent
    sync, pipe, resnet = found
    assert sync.change == pytest.approx(-0.10) and pipe.change == pytest.approx(0.25)
    assert (sync.first_error, sync.second_error) == (-0.05, 0.20)
    assert resnet.second_error is None and resnet.workload == "resnet20"


def test_the_pooled_error_is_the_model_on_the_mean_of_both_sittings():
    sync, pipe, resnet = repeatability.pairs(FIRST, SECOND)
    # predicted 9.5 and 10.8 ms against 10 and 9 ms measured: 20.3 / 19 - 1
    assert sync.pooled_error == pytest.approx(20.3 / 19 - 1)
    # +2 % and -10 % in the two sittings: the sums, 8.16 + 9.0 against 8 + 10 ms, not the mean of the errors
    assert pipe.pooled_error == pytest.approx(17.16 / 18 - 1)
    assert pipe.pooled_error != pytest.approx((pipe.first_error + pipe.second_error) / 2)
    assert resnet.pooled_error is None and resnet.error_shift is None  # the second sitting did not predict it
    assert sync.error_shift == pytest.approx(0.25) and pipe.error_shift == pytest.approx(-0.12)


def test_summary_rows_per_workload_and_over_all():
    rows = repeatability.summary_rows(repeatability.pairs(FIRST, SECOND))
    assert rows == [("lenet", 2, "17.5 % / 25.0 %", "3.5 % / 5.0 %", "15.0 % / 20.0 %", "18.5 % / 25.0 %",
                     "5.8 % / 6.8 %"),
                    ("resnet20", 1, "5.0 % / 5.0 %", "1.0 % / 1.0 %", "-", "-", "-"),
                    ("all", 3, "10.0 % / 25.0 %", "2.0 % / 5.0 %", "15.0 % / 20.0 %", "18.5 % / 25.0 %",
                     "5.8 % / 6.8 %")]


def test_main_prints_the_table_and_refuses_bad_inputs(tmp_path, capsys):
    first, second, empty = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "empty.json"
    first.write_text(json.dumps(FIRST))
    second.write_text(json.dumps(SECOND))
    empty.write_text(json.dumps({"runs": []}))
    assert repeatability.main([str(first), str(second), "--all"]) == 0
    out = capsys.readouterr().out
    assert "lenet-1gbit        pipe          A      8.0 ms  B     10.0 ms   +25.0 %   model A  +2.0 %  B -10.0 %" in out
    assert "resnet20-1gbit     sync          A     60.0 ms  B     63.0 ms    +5.0 %   model A  +1.0 %  B       -" in out
    assert "| all | 3 | 10.0 % / 25.0 % | 2.0 % / 5.0 % | 15.0 % / 20.0 % | 18.5 % / 25.0 % | 5.8 % / 6.8 % |" in out
    # lenet sync 10 -> 9 ms and pipe 8 -> 10 ms: the one pair predicted in both changed its order
    assert "of the 1 pairs of predicted runs sitting A measured more than 5 % apart in a cell, the other sitting " \
           "ordered 0 alike (0 %)" in out
    assert repeatability.main([str(first), str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert repeatability.main([str(first), str(empty)]) == 2
    assert "no measured run in common" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[1, 2]")
    assert repeatability.main([str(first), str(tmp_path / "list.json")]) == 2
    assert "not a comparison result" in capsys.readouterr().err


def test_the_sitting_figure_draws_each_run_predicted_in_both_where_it_belongs():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.harness.comparison_plot import plot_sitting_errors

    fig, axes = plt.subplots(1, 2)
    assert plot_sitting_errors(FIRST, SECOND, axes) == 2  # resnet20 sync lacks the second prediction
    points = [[tuple(round(v, 6) for v in o) for c in ax.collections for o in c.get_offsets()] for ax in axes]
    # lenet sync: -5 % then +20 %, measured 10 -> 9 ms (-10 %), the error moved +25 points
    assert sorted(points[0]) == [(-5.0, 20.0), (2.0, -10.0)]
    assert sorted(points[1]) == [(-10.0, 25.0), (25.0, -12.0)]
    plt.close(fig)
