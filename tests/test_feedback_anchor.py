"""Error feedback priced by the ring timed with it: the probe (``pipesgd.measure.feedback``), how the calibration
keeps its rows and how a run with ``--error-feedback`` is predicted from them instead of the isolated rate."""
from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from tests.distributed import run_ranks
from tests.test_timing_terms import calibration, scenario
from pipesgd.measure.calibrate_command import _probes
from timing_model.fitting import host_record
from timing_model.predict import predict
from timing_model.validation import calibrated_scenario

# the probe's paired rings at 1 MB on 4 ranks: feedback added 12 ms
FEEDBACK_ROW = {"compression": "q8", "n_bytes": 1e6, "pairs": 30, "ring_alone_s": 0.031, "ring_feedback_s": 0.043,
                "feedback_s": 0.012}


def with_feedback_rows(rows=(FEEDBACK_ROW,)):
    cal = calibration()
    cal.host = {**cal.host, "feedback_rings": list(rows)}
    cal.codecs = {"q8": (1e9, 2e9)}
    cal.codec_feedback = {"q8": 5e8}
    return cal


def test_the_probed_difference_is_the_feedback_rate_at_that_size():
    cal = with_feedback_rows()
    # E = p encodes of M/p bytes each (equations.codec_passes): 4 x 0.25 MB in 12 ms
    assert cal.ring_feedback_speed("pipe", "q8", 1e6, 4) == pytest.approx(1e6 / 0.012)
    assert cal.ring_feedback_speed("sync", "q8", 1e6 + 4, 4) == pytest.approx((1e6 + 4) / 0.012)  # the size asked
    for where in (("pipe", "sign", 1e6, 4), ("pipe", "q8", 2e6, 4), ("pipe", "q8", 1e6, 2), ("ps-sync", "q8", 1e6, 4),
                  ("ddp", "q8", 1e6, 4)):
        assert cal.ring_feedback_speed(*where) is None  # not probed there, or not our ring
    within_noise = with_feedback_rows(rows=({**FEEDBACK_ROW, "feedback_s": -0.001},))
    assert within_noise.ring_feedback_speed("pipe", "q8", 1e6, 4) == float("inf")


def test_a_run_with_feedback_adds_the_probed_difference_to_the_plain_rings_anchor():
    s = scenario(grad_bytes=1e6, compression="q8", error_feedback=True)
    measured = calibrated_scenario(s, with_feedback_rows(), "pipe")
    # the interference probe's plain ring, as for a run without feedback
    assert measured.empirical.ring_anchor_s == 0.03
    assert predict(measured, ("pipe",)).result("pipe").comm_total_s == pytest.approx(0.03 + 0.012)
    # not probed: the isolated rate scaled by the codec's in-ring factor, as before
    apart = calibrated_scenario(s, with_feedback_rows(rows=()), "pipe")
    assert apart.feedback_Bps == pytest.approx(with_feedback_rows().feedback_speed("q8", 4))
    assert predict(apart, ("pipe",)).result("pipe").comm_total_s != pytest.approx(0.042)
    # without --error-feedback the probe plays no part
    plain = replace(measured, error_feedback=False)
    assert predict(plain, ("pipe",)).result("pipe").comm_total_s == pytest.approx(0.03)


def test_host_record_keeps_the_feedback_rings():
    assert host_record({"feedback_rings": [FEEDBACK_ROW]})["feedback_rings"] == [FEEDBACK_ROW]
    assert "feedback_rings" not in host_record({"feedback_rings": []})


def test_probe_only_names_are_checked():
    args = lambda names, ps=False: argparse.Namespace(probe_only=names, ps_probe_only=ps)  # noqa: E731
    assert _probes(args("feedback,ps")) == ("feedback", "ps")
    assert _probes(args("ps-sync")) == ("ps-sync",)
    assert _probes(args(None, ps=True)) == ("ps",)
    assert _probes(args("ps", ps=True)) == ("ps",)
    with pytest.raises(ValueError, match="unknown probe 'rings'"):
        _probes(args("rings"))


def _feedback_probe_on_ranks(rank, world_size):
    from pipesgd.measure import feedback

    compute = {"model": "mlp", "input_shape": (16,), "num_classes": 4, "batch_size": 8, "hidden": 8}
    rows = feedback.measure_feedback_rings(compute, ("none", "q8", "sign"), repeats=3, warmup=1)["feedback_rings"]
    # the collective is the trainer's: it keeps the compression error in its residual for the next call
    import torch

    ring = feedback.TrainerRing("q8", error_feedback=True)
    ring(torch.randn(300, generator=torch.Generator().manual_seed(rank)))
    return rows, ring.feedback.residual_norm()


def test_the_probe_times_each_lossy_codec_with_feedback_on_every_rank():
    results = run_ranks(_feedback_probe_on_ranks, 2, timeout_s=120)
    rows = results[0][0]
    assert [r["compression"] for r in rows] == ["q8", "sign"]  # the lossless one is not probed
    for row in rows:
        assert row["ring_alone_s"] > 0 and row["ring_feedback_s"] > 0 and row["pairs"] >= 3 and row["n_bytes"] > 0
        assert row["feedback_s"] < row["ring_feedback_s"]  # pair by pair, with feedback less the plain ring
    assert all(result[0] == rows for result in results)  # every rank returns the slowest rank's medians
    assert all(result[1] > 0 for result in results)


def test_calibrate_reports_what_feedback_adds():
    from pipesgd.measure.calibrate_command import report

    text = report(with_feedback_rows(), "calib.json")
    assert "error feedback adds to the ring at the model's size: q8 +12.00 ms (31.00 ms without) at 1.00 MB" in text
    assert "error feedback adds" not in report(calibration(), "calib.json")
