"""Re-making committed predictions from a runs.json's stored inputs (``experiments.harness.repredict``)."""
from __future__ import annotations

import json
import os

import pytest

from experiments.harness.repredict import main, remake_all
from timing_model.calibration import read_calibration
from timing_model.predict import Scenario, predict
from timing_model.validation import calibrated_scenario

# One cell of an earlier sitting of the comparison grid (its calibration and runs with stored inputs), kept as a fixture
COMMITTED = os.path.join(os.path.dirname(__file__), "data", "comparison-cell.json")


def _grid(tmp_path, stored_factor: float) -> tuple[dict, str]:
    """A one-cell runs.json: the fixture's lenet-100mbit calibration and a ps-async run on it whose stored
    prediction is the model's times ``stored_factor``."""
    with open(COMMITTED) as handle:
        cell = json.load(handle)["cells"]["lenet-100mbit"]
    inputs = {"mode": "ps-async", "nodes": 4, "grad_bytes": 79016.0, "compute_s": 0.002, "update_s": 3e-4,
              "buffers_s": 0.0, "host_s": 4e-4, "ring_anchor_s": 0.0, "colocated_step_s": 0.0031, "override": False,
              "config": {"mode": "ps-async", "compression": "none", "width": 1, "servers": 0}}
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(cell["calibration"]))
    cal = read_calibration(str(path))
    scenario = Scenario.of(nodes=4, grad_bytes=79016.0, bandwidth_Bps=1.0, compute_s=0.002, update_s=3e-4,
                           host_s=4e-4, width=1, servers=1, ps_colocated=True, ps_colocated_step_s=0.0031)
    expected = predict(calibrated_scenario(scenario, cal, "ps-async"), ("ps-async",)).result("ps-async").iteration_s
    run = {"cell": "lenet-100mbit", "variant": "ps-async",
           "model": {"predicted_s": expected * stored_factor, "measured_s": 0.02, "error": 0.0, "inputs": inputs}}
    return {"cells": {"lenet-100mbit": cell}, "runs": [run]}, expected


def test_a_run_is_predicted_again_from_its_stored_inputs_and_its_cells_calibration(tmp_path):
    data, expected = _grid(tmp_path, 1.0)
    (row,) = remake_all(data)
    assert row.predicted_s == pytest.approx(expected, rel=1e-12)  # the co-located step and the mean inputs kept
    assert row.error == pytest.approx(expected / 0.02 - 1)
    data["runs"][0]["model"]["inputs"]["colocated_step_s"] = 0.0  # without it the model takes the remote think
    assert remake_all(data)[0].predicted_s != pytest.approx(expected)


def test_the_command_lists_the_runs_that_moved_and_both_summaries(tmp_path, capsys):
    data, _ = _grid(tmp_path, 1.1)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(data))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "lenet-100mbit" in out and out.count("median |error|") == 2
    assert main([str(tmp_path / "missing.json")]) == 2
    path.write_text("{not json")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("repredict: ") for line in err)


def test_every_stored_prediction_of_a_grid_can_be_made_again():
    with open(COMMITTED) as handle:
        data = json.load(handle)
    rows = remake_all(data)
    assert len(rows) == sum(1 for r in data["runs"] if r.get("model") and r["model"].get("error") is not None)
    assert all(r.predicted_s > 0 for r in rows)
