"""experiments/bench_gain_curve.py's pure parts: where a point sits and how high, the timing model's prediction of the
pipe run from the sync run and its curve, the report and the figure drawn from a result dict, and bad flags refused
in one line before any work (the measurement itself is the script's committed result)."""
from __future__ import annotations

from pathlib import Path

import pytest

from experiments.harness.breakdown import Breakdown
from experiments.harness.gain_curve import build, link_wire_s, model_inputs, place_points, predicted, textbook_gain
from experiments.harness.gain_curve_report import points_table, render
from experiments.harness.provenance import provenance
from tests.in_process import run_in_process

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "bench_gain_curve.py"
MB = 1.09e6  # about ResNet-20's fp32 gradient


def _parts(compute=0.040, update=0.002, exchange=0.050, wire=0.042) -> dict:
    return {name: 0.0 for name in Breakdown.__slots__} | {"compute_s": compute, "update_s": update,
                                                          "exchange_s": exchange, "wire_s": wire}


def _run(codec, link, round_, mode, iteration, bps=4e7, **parts) -> dict:
    return {"codec": codec, "bandwidth": link, "bandwidth_bps": bps, "round": round_, "mode": mode,
            "iteration_s": iteration, "grad_bytes": MB, "parts": _parts(**parts)}


def _inputs(shared_core=True, **parts):
    iteration = parts.pop("iteration", 0.100)
    return model_inputs(iteration, Breakdown(**_parts(**parts)), nodes=2, grad_bytes=MB, compression="q8",
                        shared_core=shared_core)


def test_a_point_sits_at_the_sync_runs_exchange_over_its_compute_and_is_the_median_of_the_rounds_ratios():
    runs = [_run("q8", "40mbit", 0, "sync", 0.100), _run("q8", "40mbit", 0, "pipe", 0.050, compute=0.060),
            _run("q8", "40mbit", 1, "sync", 0.090, exchange=0.040), _run("q8", "40mbit", 1, "pipe", 0.060),
            _run("q8", "40mbit", 2, "sync", 0.120, exchange=0.060), _run("q8", "40mbit", 2, "pipe", 0.080),
            _run("q8", "unshaped", 0, "sync", 0.070, bps=None)]  # no pipe run: no point
    [point] = place_points(runs, nodes=2, shared_core=True)
    assert (point["codec"], point["bandwidth"], point["rounds"]) == ("q8", "40mbit", 3)
    # the sync runs' median exchange (50 ms) over their compute + update (42 ms); the pipe run's compute is not used
    assert point["comm_over_compute"] == pytest.approx(0.050 / 0.042)
    assert point["gain"] == pytest.approx(1.5)  # rounds' ratios 2.0, 1.5, 1.5
    assert (point["gain_min"], point["gain_max"]) == (pytest.approx(1.5), pytest.approx(2.0))
    assert point["sync_s"] == pytest.approx(0.100) and point["pipe_s"] == pytest.approx(0.060)
    assert point["pipe_parts"]["compute_s"] == pytest.approx(0.040)
    assert point["link_wire_s"] == pytest.approx(link_wire_s(2, MB, "q8", 4e7))


def test_the_model_takes_the_sync_runs_parts_and_its_rest_as_host_work():
    inputs = _inputs(iteration=0.100)  # 40 + 2 + 50 ms, 8 ms of it neither: host work
    assert inputs.host_s == pytest.approx(0.008) and inputs.exchange_cpu_s == pytest.approx(0.008)
    sync_s, pipe_s = predicted(inputs)
    assert sync_s == pytest.approx(0.100)  # compute + update + host + exchange: the measured sync iteration
    # one core: the exchange's CPU runs on the training core, beside compute + update + host
    assert pipe_s == pytest.approx(max(0.040 + 0.002 + 0.008 + 0.008, 0.050))
    assert predicted(_inputs(shared_core=False, iteration=0.100))[1] == pytest.approx(0.050)  # the exchange's
    assert _inputs(iteration=0.050).host_s == 0.0  # an iteration shorter than the parts adds none


def test_the_link_alone_halves_with_twice_the_rate_and_q8_sends_about_a_quarter():
    assert link_wire_s(2, MB, "q8", None) is None  # unshaped: no rate to predict from
    slow, fast = link_wire_s(2, MB, "none", 2e7), link_wire_s(2, MB, "none", 4e7)
    assert slow == pytest.approx(2 * fast)
    assert link_wire_s(2, MB, "q8", 4e7) == pytest.approx(fast / 4, rel=0.01)


def test_the_curve_starts_at_no_wire_and_peaks_where_the_exchange_meets_the_training_side():
    runs = [_run("q8", "40mbit", 0, "sync", 0.100), _run("q8", "40mbit", 0, "pipe", 0.060)]
    data = build(runs, nodes=2, shared_core=True, margin=10.0)  # a span wide enough to reach the no-wire end
    curve = data["curves"]["q8"]["points"]
    training, host, cpu = 0.042, 0.008, 0.008
    assert curve[0][0] == pytest.approx(cpu / training)  # below it the exchange would be shorter than its own CPU
    assert curve[0][1] == pytest.approx(1.0)  # the exchange is all CPU on the training core: nothing to overlap
    assert curve[-1][0] == pytest.approx(10 * data["points"][0]["comm_over_compute"])
    peak = max(curve, key=lambda point: point[1])
    best = (2 * (training + host) + cpu) / (training + host + cpu)  # the exchange = training side + its CPU
    assert peak[1] == pytest.approx(best, rel=0.02) and peak[1] < best + 1e-9
    assert peak[0] == pytest.approx((training + host + cpu) / training, rel=0.1)
    ratios = [r for r, _ in curve]
    assert ratios == sorted(ratios) and len(ratios) == 80


def test_the_curves_share_a_span_and_each_holds_its_codecs_own_inputs():
    runs = [_run("q8", "40mbit", 0, "sync", 0.100, wire=0.030), _run("q8", "40mbit", 0, "pipe", 0.060),
            _run("none", "unshaped", 0, "sync", 0.070, exchange=0.020, wire=0.019),
            _run("none", "unshaped", 0, "pipe", 0.065)]
    curves = build(runs, nodes=2, shared_core=True)["curves"]
    assert list(curves) == ["q8", "none"]
    assert curves["none"]["inputs"]["exchange_cpu_s"] == pytest.approx(0.001)
    assert curves["q8"]["inputs"]["exchange_cpu_s"] == pytest.approx(0.020)
    assert curves["none"]["points"][0][0] == pytest.approx(0.020 / 0.042 / 2)  # the lowest point, halved
    assert curves["q8"]["points"][0][0] == pytest.approx(0.020 / 0.042)  # its exchange's CPU alone: no lower
    assert curves["q8"]["points"][-1][0] == pytest.approx(curves["none"]["points"][-1][0])
    assert build([], nodes=2, shared_core=True) == {"points": [], "curves": {}}


def test_the_ideal_is_the_papers_equation():
    assert textbook_gain(1.0) == pytest.approx(2.0)
    assert textbook_gain(0.5) == pytest.approx(1.5) and textbook_gain(3.0) == pytest.approx(4 / 3)


def _data(points=True) -> dict:
    runs = [_run("q8", "40mbit", 0, "sync", 0.100), _run("q8", "40mbit", 0, "pipe", 0.060)] if points else []
    setup = {"model": "resnet20", "dataset": "digits", "batch_size": 32, "nodes": 2, "cores_per_node": 1,
             "shared_core": True, "bandwidths": ["40mbit"], "codecs": ["q8"], "steps": 60, "warmup_steps": 10,
             "repeats": 1}
    return {"provenance": provenance(["experiments/bench_gain_curve.py", "--repeats", "1"]), "setup": setup,
            "figure": "gain_curve.png", "runs": runs, **build(runs, nodes=2, shared_core=True)}


def test_the_report_has_provenance_a_row_per_point_and_where_the_time_went():
    text = render(_data())
    assert "- command: `experiments/bench_gain_curve.py --repeats 1`" in text and "- commit: " in text
    assert "2 emulated nodes with 1 core of their own each" in text and "1 interleaved round." in text
    assert "![gain against comm / compute](gain_curve.png)" in text
    model = predicted(_inputs())[1]
    row = (f"| q8 | 40mbit | 1.19 | 100.0 | 60.0 | 1.67x (1.67-1.67) | {1e3 * model:.1f} | {0.100 / model:.2f}x "
           f"| {100 * (model - 0.060) / 0.060:+.1f} % | 42.0 / {1e3 * link_wire_s(2, MB, 'q8', 4e7):.1f} |")
    assert row in text
    assert "| q8, 40mbit, sync | 100.0 |" in text and "| q8, 40mbit, pipe | 60.0 |" in text
    assert points_table([]).count("\n") == 1  # the header alone


def test_a_result_without_points_says_so():
    assert "No point: no codec and link had both a sync and a pipe run." in render(_data(points=False))


def test_the_figure_draws_every_codecs_points_and_curve():
    matplotlib = pytest.importorskip("matplotlib", reason="the notebooks extra is not installed")
    matplotlib.use("Agg")
    from experiments.harness.gain_curve_plot import figure

    fig = figure(_data())
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert sorted(labels) == ["ideal: (1 + r) / max(1, r), nothing shared", "q8: measured", "q8: the model",
                              "q8: the model at each point"]


@pytest.mark.parametrize("args, says", [
    (["--compression", "q8,q9"], "unknown codec q9"),
    (["--bandwidths", "40mbit,fast"], "--bandwidths: bandwidth 'fast'"),
    (["--bandwidths", "40mbit,40mbit"], "must not repeat a name"),
    (["--cores-per-node", "0"], "need --nodes >= 2 and --cores-per-node >= 1"),
    (["--nodes", "64"], "needs 64 cores"),
    (["--steps", "5", "--warmup-steps", "2"], "need --steps > --warmup-steps + 3"),
    (["--repeats", "x"], "invalid int value"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path, args, says):
    done = run_in_process(SCRIPT, *args, "--out", str(tmp_path / "out"), "--raw", str(tmp_path / "raw"))
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "raw").exists()


def test_a_raw_folder_with_an_earlier_sittings_runs_is_refused_before_any_run(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "40mbit-q8-sync-0.jsonl").write_text("{}\n")
    done = run_in_process(SCRIPT, "--out", str(tmp_path / "out"), "--raw", str(raw))
    assert done.returncode == 2, done.stderr
    assert "already holds an earlier sitting's runs (40mbit-q8-sync-0.jsonl)" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    assert (raw / "40mbit-q8-sync-0.jsonl").read_text() == "{}\n"  # nothing of the earlier sitting is touched
