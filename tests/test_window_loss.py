"""The window loss λ ∈ [0, 1] (issue 14): the share of a compute window that Pipe-SGD's ring loses beside it,
measured by calibrate's window probe at a Pipe-SGD step's duty cycle; its formula, its inverse, how the
calibration record and the CLI feed it, and that only pipe takes it."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from timing_model.empirical import overlap
from timing_model.calibration import Calibration, Fit
from timing_model.cli import main
from timing_model.fitting import host_record
from timing_model.empirical.host_terms import host_terms
from timing_model.predict import Scenario, predict
from timing_model.validation import calibrated_scenario

MB = 1e6


def test_window_comm_is_overlapped_comm_with_kappa_c_as_a_share_of_the_window():
    for t_ar, window, kc in [(0.01, 0.004, 12.8), (0.14, 0.08, 0.83), (0.005, 0.04, 0.5), (0.02, 0.01, 0.0)]:
        assert overlap.window_comm(t_ar, window, kc / (1 + kc)) == pytest.approx(
            overlap.overlapped_comm(t_ar, window, kc), rel=1e-12)


def test_window_comm_inside_the_window_past_it_and_beyond_a_whole_window():
    assert overlap.window_comm(0.005, 0.04, 0.5) == pytest.approx(0.010)  # ends inside: at half pace
    assert overlap.window_comm(0.010, 0.004, 0.25) == pytest.approx(0.011)  # loses a quarter of the window
    assert overlap.window_comm(0.010, 0.004, 1.0) == pytest.approx(0.014)  # no progress inside the window
    assert overlap.window_comm(0.010, 0.004, 0.0) == 0.010
    for bad in (-0.1, 1.5, math.inf, math.nan):
        with pytest.raises(ValueError):
            overlap.window_comm(0.01, 0.004, bad)


@pytest.mark.parametrize("t_ar,window,measured", [
    (0.0103, 0.0025, 0.0113),  # past the window
    (0.0051, 0.0050, 0.0100),  # no progress while the window ran: λ = 1
    (0.0057, 0.0400, 0.0150),  # ended inside the window
    (0.0100, 0.0100, 0.0200),  # the boundary: both branches agree
])
def test_window_loss_is_the_exact_inverse(t_ar, window, measured):
    loss = overlap.window_loss(t_ar, window, measured)
    assert loss > 0
    assert overlap.window_comm(t_ar, window, loss) == pytest.approx(measured, rel=1e-12)


def test_window_loss_is_zero_when_the_ring_kept_its_pace_one_at_most_and_refuses_bad_timings():
    assert overlap.window_loss(0.010, 0.004, 0.009) == 0.0
    assert overlap.window_loss(0.0075, 0.0037, 0.0142) == 1.0  # lost more than the window: the alone timing's noise
    for args in [(0.0, 0.004, 0.01), (0.01, 0.0, 0.01), (0.01, 0.004, math.nan), (0.01, 0.004, -1.0)]:
        with pytest.raises(ValueError):
            overlap.window_loss(*args)


def _row(compression, alone, together, load_window, ring_window):
    return {"compression": compression, "n_bytes": 79016.0, "ring_alone_s": alone, "ring_together_s": together,
            "load_alone_s": 0.0015, "load_together_s": 0.0015, "load_window_s": load_window,
            "ring_window_s": ring_window, "window_steps": 30}


def test_host_record_takes_lambda_per_codec_only_where_the_window_probe_ran():
    rows = [_row("none", 0.0100, 0.1410, 0.0040, 0.0110),  # κc 13.1, λ 0.25
            _row("q8", 0.0090, 0.0960, 0.0040, 0.0150)]  # more than the window: λ 1
    host = host_record({"load": "lenet", "overlap": rows})
    assert host["comm_slowdown"] == pytest.approx(13.1)
    assert host["window_loss_by_codec"] == pytest.approx({"none": 0.25, "q8": 1.0})
    assert host["window_loss"] == pytest.approx(0.25)
    assert host_terms(host, "q8")["window_loss"] == pytest.approx(1.0)
    assert host_terms(host, "bf16")["window_loss"] == pytest.approx(0.25)  # not probed: the uncompressed one
    old = [{k: v for k, v in r.items() if "window" not in k} for r in rows]  # a calibration before the probe
    assert "window_loss" not in host_record({"load": "lenet", "overlap": old})
    assert host_terms(host_record({"load": "lenet", "overlap": old}))["window_loss"] is None


def _scenario(**kw) -> Scenario:
    return Scenario.of(**{"nodes": 4, "grad_bytes": 0.079 * MB, "bandwidth_Bps": 1.2e7, "compute_s": 0.0025,
                          "update_s": 0.0003, "ring_anchor_s": 0.0103, "comm_slowdown": 12.8, **kw})


def test_pipe_takes_lambda_in_place_of_kappa_c_and_ddp_keeps_kappa_c():
    old = predict(_scenario(), ("pipe", "ddp", "sync"))
    new = predict(_scenario(window_loss=0.25), ("pipe", "ddp", "sync"))
    window = 0.0025 + 0.0003
    assert old.result("pipe").iteration_s == pytest.approx(overlap.overlapped_comm(0.0103, window, 12.8))
    assert new.result("pipe").iteration_s == pytest.approx(0.0103 + 0.25 * window)
    assert new.result("ddp").iteration_s == old.result("ddp").iteration_s
    assert new.result("sync").iteration_s == old.result("sync").iteration_s
    # width 1 is the synchronous step: no window
    one = replace(_scenario(window_loss=0.25), width=1)
    assert predict(one, ("pipe",)).result("pipe").iteration_s == pytest.approx(
        predict(one, ("sync",)).result("sync").iteration_s)
    for bad in (-0.1, 1.2):
        with pytest.raises(ValueError, match="window_loss"):
            _scenario(window_loss=bad).records()


def test_calibrated_scenario_takes_lambda_of_the_runs_codec_unless_given():
    fits = {"ring": Fit(overhead_s=0.0, latency_s=1e-4, bandwidth_Bps=1.2e7, reduce_Bps=1e10, n_samples=5,
                        median_abs_rel_err=0.0, max_abs_rel_err=0.0)}
    cal = Calibration(fits, host={"window_loss": 0.25, "window_loss_by_codec": {"none": 0.25, "q8": 1.0}})
    assert calibrated_scenario(_scenario(compression="q8"), cal, "pipe").empirical.window_loss == pytest.approx(1.0)
    assert calibrated_scenario(_scenario(window_loss=0.0), cal, "pipe").empirical.window_loss == 0.0
    assert calibrated_scenario(_scenario(), Calibration(fits), "pipe").empirical.window_loss is None


def test_predict_cli_takes_window_loss(capsys):
    argv = ["predict", "--nodes", "4", "--bytes", "79KB", "--bandwidth", "100mbit", "--compute", "2.5ms",
            "--comm-slowdown", "12.8", "--modes", "pipe", "--format", "json"]
    assert main(argv) == 0
    with_kc = capsys.readouterr().out
    assert main(argv + ["--window-loss", "25%"]) == 0
    with_loss = capsys.readouterr().out
    assert with_kc != with_loss
    for bad in ("-1", "1.5"):
        assert main(argv + ["--window-loss", bad]) == 2
        assert "window loss" in capsys.readouterr().err
