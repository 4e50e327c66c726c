"""The timing model's two-collective exchange (issue 38 part 5): its textbook cost beside the ring's, "auto" resolved
as the trainer resolves it, its own α-β from calibrate's samples, and predict/sweep saying which all-reduce is
faster."""
from __future__ import annotations

import subprocess
import sys

import pytest

from timing_model.calibration import Calibration, Sample
from timing_model.core import collectives
from timing_model.fitting import fit_calibration, fit_collective
from timing_model.predict import Scenario, predict
from timing_model.validation import calibrated_scenario

MB = 2**20


def test_exchange_is_the_ring_plus_one_call_in_the_textbook():
    for p in (2, 3, 4, 16):
        ring = collectives.allreduce_ring(p, 8 * MB, 1e-4, 1e-9, 1e-10, 2e-3)
        exchange = collectives.allreduce_exchange(p, 8 * MB, 1e-4, 1e-9, 1e-10, 2e-3)
        assert exchange == pytest.approx(ring + 2e-3, rel=1e-12)
    assert collectives.allreduce_exchange(1, 8 * MB, 1e-4, 1e-9, 1e-10, 2e-3) == 0.0


def _scenario(**changes) -> Scenario:
    base = dict(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=125e6, latency_s=50e-6, overhead_s=1e-3,
                compute_s=0.1, compression="q8", bucket_bytes=25 * MB)
    return Scenario(**{**base, **changes})


@pytest.mark.parametrize("compression,allreduce,resolved", [
    ("q8", "auto", "alltoall"), ("sign", "auto", "alltoall"), ("none", "auto", "backend"),
    ("q8", "ring", "ring"), ("none", "alltoall", "alltoall"), ("none", "ring", "ring")])
def test_auto_resolves_as_the_trainer_and_each_mode_says_what_it_ran(compression, allreduce, resolved):
    prediction = predict(_scenario(compression=compression, allreduce=allreduce))
    assert prediction.result("pipe").allreduce == prediction.result("sync").allreduce == resolved
    assert prediction.result("ddp").allreduce == "backend" and prediction.result("ps-sync").allreduce == "-"


def test_plain_model_exchange_costs_one_overhead_more_per_bucket():
    ring, exchange = (predict(_scenario(allreduce=a)).result("sync") for a in ("ring", "alltoall"))
    assert exchange.comm_total_s - ring.comm_total_s == pytest.approx(4 * 1e-3, rel=1e-9)  # 4 buckets of 25 MB
    assert exchange.codec_s == pytest.approx(ring.codec_s)  # the same encodes and decodes


def test_unknown_allreduce_is_refused():
    with pytest.raises(ValueError, match="unknown allreduce 'tree'"):
        predict(_scenario(allreduce="tree"))


def _samples(collective: str, algorithm: str, latency: float, bandwidth: float) -> list[Sample]:
    fn = collectives.ALLREDUCE[algorithm]
    return [Sample("allreduce", collective, "none", p, float(n), fn(p, n, latency, 1 / bandwidth, 0.0, 1e-3))
            for p in (2, 4) for n in (MB, 4 * MB, 16 * MB)]


def _calibration() -> Calibration:
    samples = (_samples("ring", "ring", 2e-3, 1e8) + _samples("backend", "ring", 1e-4, 1.1e8)
               + _samples("alltoall", "exchange", 3e-4, 0.9e8))
    return fit_calibration(samples, {}, {}, None, {}, {"world_size": 4})


def test_calibrate_fits_the_exchange_its_own_latency_and_bandwidth():
    fit = fit_collective(_samples("alltoall", "exchange", 3e-4, 0.9e8), "alltoall", "exchange")
    assert fit.latency_s == pytest.approx(3e-4, rel=1e-6) and fit.bandwidth_Bps == pytest.approx(0.9e8, rel=1e-6)
    assert fit.overhead_s == pytest.approx(1e-3, rel=1e-6) and fit.max_abs_rel_err < 1e-6
    cal = _calibration()
    assert set(cal.fits) == {"ring", "backend", "alltoall"}
    assert cal.fits["alltoall"].latency_s == pytest.approx(3e-4, rel=1e-6)


def test_each_choice_takes_its_own_fit_and_an_old_calibration_lends_the_ring():
    cal = _calibration()
    assert cal.fit_for("pipe", "q8") is cal.fits["alltoall"]
    assert cal.fit_for("pipe", "q8", "ring") is cal.fits["ring"]
    assert cal.fit_for("sync", "none") is cal.fits["backend"]
    assert cal.fit_for("ddp", "q8") is cal.fits["backend"]
    old = Calibration({k: v for k, v in cal.fits.items() if k != "alltoall"})
    assert old.fit_for("pipe", "q8") is cal.fits["ring"]
    # calibrated on gloo with CUDA tensors, where the trainer's "auto" runs the ring for a codec
    staged = Calibration(cal.fits, meta={"backend": "gloo", "device": "cuda"})
    assert staged.fit_for("pipe", "q8") is cal.fits["ring"] and staged.fit_for("pipe", "none") is cal.fits["backend"]
    nccl = Calibration(cal.fits, meta={"backend": "nccl", "device": "cuda"})
    assert nccl.fit_for("pipe", "q8") is cal.fits["alltoall"]


def test_the_trainer_choice_alone_takes_the_probe_anchor():
    cal = _calibration()
    cal.host = {"overlap": [{"compression": "q8", "n_bytes": 100.0 * MB, "ring_alone_s": 0.5}]}
    auto = calibrated_scenario(_scenario(), cal, "pipe")
    ring = calibrated_scenario(_scenario(allreduce="ring"), cal, "pipe")
    assert auto.empirical.ring_anchor_s == 0.5 and ring.empirical.ring_anchor_s == 0.0
    assert (auto.latency_s, ring.latency_s) == (cal.fits["alltoall"].latency_s, cal.fits["ring"].latency_s)


def test_a_calibration_made_before_the_exchange_anchors_the_ring_it_timed():
    cal = _calibration()
    old = Calibration({k: v for k, v in cal.fits.items() if k != "alltoall"}, meta={"world_size": 4})
    old.host = {"overlap": [{"compression": "q8", "n_bytes": 100.0 * MB, "ring_alone_s": 0.5}]}
    for allreduce in ("auto", "ring"):  # an older run recorded no choice and is predicted on the ring
        assert calibrated_scenario(_scenario(allreduce=allreduce), old, "pipe").empirical.ring_anchor_s == 0.5


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "timing_model", *args], capture_output=True, text=True, timeout=60)


def test_predict_names_the_allreduce_and_sweep_says_which_is_faster():
    common = ["--nodes", "8", "--bandwidth", "1gbit", "--params", "25M", "--compute", "50ms", "--compression", "q8"]
    shown = _cli("predict", *common, "--allreduce", "ring", "--format", "csv")
    assert shown.returncode == 0, shown.stderr
    assert "allreduce" in shown.stdout.splitlines()[0] and ",ring" in shown.stdout
    swept = _cli("sweep", *common, "--allreduce", "ring,alltoall", "--overhead", "5ms", "--nodes", "2,16")
    assert swept.returncode == 0, swept.stderr
    table = swept.stdout.split("Pipe-SGD's iteration with each all-reduce", 1)[1]
    assert "pipe ms, ring" in table and "pipe ms, alltoall" in table
    # with the textbook terms the exchange pays one call more per bucket, so the ring is faster at every size
    assert table.count("| ring |") == 2 and "| alltoall |" not in table


def test_bad_allreduce_is_one_line_and_exit_2():
    done = _cli("predict", "--nodes", "4", "--bandwidth", "1gbit", "--params", "1M", "--allreduce", "tree")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "unknown allreduce 'tree'" in done.stderr


@pytest.mark.parametrize("config,expected", [
    ({"compression": "q8"}, "ring"),  # recorded before the exchange existed: every codec ran on our ring
    ({"compression": "none"}, "auto"),  # the backend's all_reduce, as "auto" still runs it
    ({"compression": "q8", "allreduce": "alltoall"}, "alltoall"),
    ({"compression": "none", "allreduce": "backend"}, "auto"),
    ({"compression": "q8", "allreduce": "ring"}, "ring")])
def test_a_run_is_predicted_with_the_allreduce_it_recorded(config, expected):
    from timing_model.validation import RunRecord, scenario_for

    run = RunRecord("r", config, "pipe", 4, 100.0 * MB, (0.2,), (0.1,), (0.01,))
    assert scenario_for(run, _calibration()).allreduce == expected


def test_the_held_out_benchmark_row_carries_the_model_verdict():
    """experiments/bench_allreduce_choice.py --calibration: each measured cell gets both predictions and whether
    the model picks the all-reduce that measured faster."""
    from experiments.bench_allreduce_choice import _row, predicted_s

    cal = _calibration()
    ring, exchange = (predicted_s(cal, 4, 4 * MB, "q8", a) for a in ("ring", "alltoall"))
    assert exchange < ring  # its fit: a fifth of the ring's latency, a little less bandwidth
    measured = {"p": 4, "mib": 4.0, "codec": "q8", "ring_s": 0.030, "alltoall_s": 0.020}
    line = _row(measured, cal)
    assert line.startswith("| 4 | 4 | q8 | 30.0 | 20.0 | 0.67 |") and line.endswith(" yes |")
    assert _row(dict(measured, alltoall_s=0.040), cal).endswith(" no |")
    assert _row(measured, None) == "| 4 | 4 | q8 | 30.0 | 20.0 | 0.67 |"


def test_a_compressed_all_reduce_fits_a_codec_factor_and_a_fixed_cost_per_call(tmp_path):
    from timing_model.calibration import compressed_parts, read_calibration, write_calibration
    from timing_model.fitting import fit_codec_costs
    from timing_model.params import CODEC_RATIOS

    fit = fit_collective(_samples("alltoall", "exchange", 3e-4, 0.9e8), "alltoall", "exchange")
    codecs = {"q8": (2e9, 3e9)}
    truth = {2: (1.5, 0.004), 4: (6.0, 0.011)}  # (factor, seconds per call) per cluster size
    samples = []
    for p, (f, h) in truth.items():
        for n in (MB, 4 * MB, 16 * MB):
            probe = Sample("allreduce", "alltoall", "q8", p, float(n), 1.0)
            wire, codec = compressed_parts(probe, fit, "exchange", codecs, CODEC_RATIOS)
            samples.append(Sample("allreduce", "alltoall", "q8", p, float(n), wire + f * codec + h))
    factors, call_s = fit_codec_costs(samples, fit, codecs, CODEC_RATIOS, "exchange", collective="alltoall")
    for p, (f, h) in truth.items():
        assert factors["q8"][p] == pytest.approx(f, rel=1e-6) and call_s["q8"][p] == pytest.approx(h, rel=1e-6)
    cal = Calibration({"alltoall": fit}, codecs, codec_exchange_factors=factors, codec_exchange_call_s=call_s)
    assert cal.codec_call_s("q8", 4, "alltoall") == pytest.approx(0.011)
    assert cal.codec_call_s("q8", 8, "alltoall") == pytest.approx(0.011)  # the nearest calibrated size
    assert cal.codec_call_s("q8", 4, "ring") == 0.0 and cal.codec_call_s("sign", 4, "alltoall") == 0.0
    write_calibration(str(tmp_path / "c.json"), cal)
    back = read_calibration(str(tmp_path / "c.json"))
    assert back.codec_exchange_call_s == cal.codec_exchange_call_s
    # in a prediction: once per bucket, as codec time, for sync and pipe with a codec
    scenario = calibrated_scenario(_scenario(allreduce="alltoall"), back, "pipe")
    assert scenario.empirical.codec_call_s == pytest.approx(0.011)
    plain = predict(scenario.with_changes(codec_call_s=0.0), ("sync",)).result("sync")
    timed = predict(scenario, ("sync",)).result("sync")
    assert timed.comm_total_s - plain.comm_total_s == pytest.approx(4 * 0.011)  # 4 buckets
