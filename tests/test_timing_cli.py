"""pipesgd-timing: output formats parse back, the pure formula comes through, bad input is one line + exit 2."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import asdict
from types import SimpleNamespace

import re

import pytest

from tests.distributed import run_ranks
from timing_model.core import equations
from timing_model.empirical import overlap
from timing_model.calibration import Fit
from pipesgd.measure.cli import main
from timing_model.fitting import ALGORITHM_OF, host_record, overlap_sizes
from timing_model.modes import MODES
from timing_model.params import CODEC_RATIOS
from timing_model.commands.predict import PREDICT_COLUMNS
from timing_model.units import parse_time

BASE = ["--nodes", "4", "--bandwidth", "10gbit", "--bytes", "100MB", "--compute", "120ms"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def parse_markdown(text: str) -> list[dict]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def test_predict_json_is_the_pure_formula(capsys):
    code, out, err = run_cli(capsys, "predict", *BASE, "--format", "json")
    assert code == 0 and err == ""
    rows = json.loads(out)
    assert [r["mode"] for r in rows] == list(MODES)
    by_mode = {r["mode"]: r for r in rows}
    for row in rows:
        for key in ("iteration_s", "speedup_vs_sync", "compute_s", "straggler_s", "exposed_comm_s", "codec_s",
                    "update_s", "interference_s", "throughput_it_s", "regime"):
            assert key in row
        assert row["straggler_s"] == row["codec_s"] == row["interference_s"] == row["update_s"] == 0.0
    assert by_mode["sync"]["iteration_s"] == pytest.approx(0.120 + 0.120)  # T_c + 1.5·M/B
    assert by_mode["pipe"]["iteration_s"] == pytest.approx(0.120)
    assert by_mode["pipe"]["speedup_vs_sync"] == pytest.approx(2.0)
    assert by_mode["ps-sync"]["exposed_comm_s"] == pytest.approx(0.640)


def test_predict_lockstep_flag_adds_to_the_blocking_modes_only(capsys):
    _, base, _ = run_cli(capsys, "predict", *BASE, "--format", "json")
    code, out, _ = run_cli(capsys, "predict", *BASE, "--lockstep", "3ms", "--format", "json")
    before, after = ({r["mode"]: r for r in json.loads(text)} for text in (base, out))
    assert code == 0
    for mode in MODES:
        extra = 0.003 if mode in ("sync", "ddp") else 0.0
        assert after[mode]["iteration_s"] == pytest.approx(before[mode]["iteration_s"] + extra), mode
        assert after[mode]["lockstep_s"] == extra


def test_predict_takes_a_negative_lockstep_and_the_colocated_step(capsys):
    _, base, _ = run_cli(capsys, "predict", *BASE, "--format", "json", "--modes", "sync")
    code, out, _ = run_cli(capsys, "predict", *BASE, "--lockstep=-2ms", "--format", "json", "--modes", "sync")
    assert code == 0
    assert json.loads(out)[0]["iteration_s"] == pytest.approx(json.loads(base)[0]["iteration_s"] - 0.002)
    ps = ("--nodes", "4", "--bandwidth", "10gbit", "--bytes", "80kB", "--compute", "2ms", "--format", "json",
          "--modes", "ps-async", "--ps-colocated", "--ps-service", "2ms", "--ps-service-idle", "0.5ms")
    paces = [json.loads(run_cli(capsys, "predict", *ps, *extra)[1])[0]["iteration_s"]
             for extra in ((), ("--ps-colocated-step", "1ms"))]
    assert paces[1] != pytest.approx(paces[0])  # the co-located worker's own step sets the slow phase's length
    code, _, err = run_cli(capsys, "predict", *BASE, "--ps-colocated-step", "-1ms")
    assert code == 2 and err.count("\n") == 1


def test_predict_markdown_and_csv_agree(capsys):
    """The wide table (times with their unit) and the short default one say what csv says, to four digits."""
    _, md, _ = run_cli(capsys, "predict", *BASE, "--latency", "50us", "--format", "wide")
    _, short, _ = run_cli(capsys, "predict", *BASE, "--latency", "50us")
    _, text, _ = run_cli(capsys, "predict", *BASE, "--latency", "50us", "--format", "csv")
    md_rows, csv_rows = parse_markdown(md), list(csv.DictReader(io.StringIO(text)))
    assert [r["mode"] for r in md_rows] == [r["mode"] for r in csv_rows] == list(MODES)
    assert [r["mode"] for r in parse_markdown(short)] == list(MODES)
    for a, b, c in zip(md_rows, csv_rows, parse_markdown(short)):
        assert parse_time(a["iteration_s"]) == pytest.approx(float(b["iteration_s"]), rel=1e-3)
        assert parse_time(c["iteration"]) == pytest.approx(float(b["iteration_s"]), rel=1e-3)


def test_predict_default_table_fits_100_columns_and_names_its_columns(capsys):
    """Short lines, no e-notation even for a 1.5 B-parameter model, a legend of the speedup, and "comm hidden"
    where Pipe-SGD's all-reduce hides behind compute (the wide table's regime still says what the comm is bound by)."""
    code, out, err = run_cli(capsys, "predict", "--nodes", "4", "--bandwidth", "10gbit", "--params", "1.5B",
                             "--compute", "120ms")
    assert code == 0 and err == ""
    assert max(len(line) for line in out.splitlines()) <= 100
    assert not re.search(r"\de[+-]\d", out)
    assert "vs sync: times faster than synchronous all-reduce (width 1) with the same codec" in out
    rows = {r["mode"]: r for r in parse_markdown(out)}
    assert rows["sync"]["iteration"] == "7.32 s" and rows["sync"]["vs sync"] == "1x"
    code, out, _ = run_cli(capsys, "predict", *BASE)
    rows = {r["mode"]: r for r in parse_markdown(out)}
    assert rows["pipe"]["bound"] == "compute-bound (comm hidden)" and rows["sync"]["bound"] == "bandwidth-bound"
    assert rows["pipe"]["iteration"] == "120 ms" and rows["pipe"]["vs sync"] == "2x" and rows["pipe"]["width"] == "2"
    assert max(len(line) for line in out.splitlines()) <= 100


def test_predict_wide_has_every_column(capsys):
    code, out, _ = run_cli(capsys, "predict", *BASE, "--format", "wide")
    rows = parse_markdown(out)
    assert code == 0 and list(rows[0]) == PREDICT_COLUMNS and len(rows) == len(MODES)
    pipe = {r["mode"]: r for r in rows}["pipe"]
    assert pipe["regime"] == "bandwidth-bound" and pipe["hidden_comm_s"] == "120 ms" and pipe["straggler_s"] == "0"


@pytest.mark.parametrize("flag, value, unit", [
    ("--compute", "120", "give a unit, e.g. 120ms or 120s"), ("--latency", "0.1", "e.g. 0.1ms or 0.1s"),
    ("--lockstep=-2", None, "time '-2': give a unit, e.g. -2ms or -2s"), ("--bucket", "4096", "e.g. 4096MB or 4096B"),
    ("--copy-rate", "5", "has no unit"), ("--params", "61MB", "a size in bytes goes to --bytes"),
])
def test_a_bare_time_size_or_rate_is_refused_in_one_line_naming_the_unit(capsys, flag, value, unit):
    code, out, err = run_cli(capsys, "predict", "--nodes", "4", "--bandwidth", "1gbit", "--params", "1M", flag,
                             *(() if value is None else (value,)))
    assert code == 2 and out == "" and err.count("\n") == 1 and unit in err
    code, _, err = run_cli(capsys, "predict", "--nodes", "4", "--bandwidth", "1gbit", "--bytes", "4096")
    assert code == 2 and "--bytes: size '4096': give a unit, e.g. 4096MB or 4096B" in err


def test_zero_needs_no_unit_and_counts_none(capsys):
    for extra in (("--compute", "0"), ("--latency", "0", "--bucket", "0"), ("--lockstep=-0",)):
        code, _, err = run_cli(capsys, "predict", "--nodes", "4", "--bandwidth", "1gbit", "--params", "1500000", *extra)
        assert code == 0, err


def test_predict_with_options(capsys):
    code, out, _ = run_cli(capsys, "predict", "--nodes", "4", "--bandwidth", "1.25GB/s", "--latency", "50us",
                           "--params", "61M", "--compute", "120ms", "--compute-std", "5ms", "--update", "5ms",
                           "--compression", "q8", "--codec-gbps", "4,6", "--width", "2", "--overlap-fraction", "0.5",
                           "--servers", "2", "--slowdown", "0.1", "--overhead", "100us", "--collective", "tree",
                           "--batch-size", "32", "--format", "json")
    assert code == 0
    rows = {r["mode"]: r for r in json.loads(out)}
    assert rows["sync"]["codec_s"] > 0 and rows["sync"]["straggler_s"] > 0 and rows["pipe"]["samples_per_s"] > 0
    # every flag reaches its scenario field: the rows are the model's own prediction of that scenario
    from timing_model.predict import Scenario, predict
    from timing_model.core.straggler import expected_max_normal_factor

    scenario = Scenario.of(nodes=4, bandwidth_Bps=1.25e9, latency_s=50e-6, grad_bytes=4 * 61e6, compute_s=0.120,
                           compute_std_s=0.005, update_s=0.005, compression="q8", encode_Bps=4e9, decode_Bps=6e9,
                           width=2, overlap_fraction=0.5, servers=2, slowdown=0.1, overhead_s=100e-6,
                           collective="tree", batch_size=32)
    for expected in predict(scenario).results:
        row = rows[expected.mode]
        for key, value in expected.as_dict().items():
            assert row[key] == (pytest.approx(value, rel=1e-9) if isinstance(value, float) else value), (row, key)
    # and by hand: E[max of 4 normal computes] − mean = e_4·σ; samples/s = workers × batch / iteration
    assert rows["sync"]["straggler_s"] == pytest.approx(expected_max_normal_factor(4) * 0.005, rel=1e-9)
    assert rows["pipe"]["samples_per_s"] == pytest.approx(4 * 32 / rows["pipe"]["iteration_s"], rel=1e-9)
    assert rows["pipe"]["update_s"] == pytest.approx(0.005)


def test_sweep_tables(capsys):
    code, out, _ = run_cli(capsys, "sweep", "--nodes", "2,4,8", "--bandwidth", "1gbit,10gbit", "--params", "25M",
                           "--compute", "100ms", "--format", "json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 6
    assert {"nodes", "bandwidth", "winner", "pipe_vs_sync", "pipe_vs_ps-sync", "pipe_vs_ddp"} <= set(rows[0])
    code, md, _ = run_cli(capsys, "sweep", "--nodes", "2,4,8", "--bandwidth", "1gbit,10gbit", "--params", "25M",
                          "--compute", "100ms", "--compression", "none,bf16")
    assert code == 0 and "Which mode wins here" in md and "Pipe-SGD speedup" in md
    code, md, _ = run_cli(capsys, "sweep", "--nodes", "2,4", "--bandwidth", "1gbit,10gbit", "--params", "25M")
    assert "bandwidth=1gbit" in md  # two axes: a pivoted win map


def test_validate_cli(tmp_path, capsys):
    from tests.test_timing_model import FIT, write_run
    from timing_model.calibration import Calibration, write_calibration

    calib = tmp_path / "calib.json"
    write_calibration(str(calib), Calibration({"ring": FIT, "backend": FIT}))
    paths = write_run(tmp_path, "run", "pipe", 2, 4e6, 0.03, 0.002)
    code, out, err = run_cli(capsys, "validate", "--calibration", str(calib), *paths, "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["summary"]["runs"] == 1 and data["summary"]["max_abs_error"] < 0.01
    code, out, _ = run_cli(capsys, "validate", "--calibration", str(calib), *paths)
    assert code == 0 and "median |error|" in out


def test_predict_with_calibration_uses_the_fit_of_each_mode(tmp_path, capsys):
    from timing_model.calibration import Calibration, Fit, write_calibration

    ring = Fit(0.0, 0.0, 1.25e9, float("inf"), 0, 0.0, 0.0)
    backend = Fit(0.0, 0.0, 2.5e9, float("inf"), 0, 0.0, 0.0)
    calib = tmp_path / "calib.json"
    write_calibration(str(calib), Calibration({"ring": ring, "backend": backend}, {"q8": (1e9, 1e9)}))
    code, out, err = run_cli(capsys, "predict", "--nodes", "4", "--bandwidth", "1gbit", "--bytes", "100MB",
                             "--calibration", str(calib), "--format", "json", "--modes", "sync,ddp",
                             "--overlap-fraction", "0")
    assert code == 0, err
    rows = {r["mode"]: r for r in json.loads(out)}
    # Uncompressed sync runs the backend's all_reduce (PipeSGD's fast path), as ddp does: the backend fit,
    # 20 Gbit/s, not the flag's 1 Gbit/s.
    assert rows["sync"]["iteration_s"] == pytest.approx(0.060)
    assert rows["ddp"]["iteration_s"] == pytest.approx(0.060)
    code, out, _ = run_cli(capsys, "predict", "--nodes", "4", "--bandwidth", "1gbit", "--bytes", "100MB",
                           "--calibration", str(calib), "--format", "json", "--modes", "sync", "--compression", "q8")
    row = json.loads(out)[0]
    assert row["codec_s"] == pytest.approx(2.75 * 0.1)  # calibrated codec speed, per hop: (4 + 7)·25 MB / 1 GB/s
    # With a codec on every hop our ring runs: its fit (10 Gbit/s) carries the compressed bytes.
    assert row["iteration_s"] == pytest.approx(0.120 / CODEC_RATIOS["q8"] + row["codec_s"], rel=1e-6)


@pytest.mark.parametrize("argv, needle", [
    (["predict", "--nodes", "4", "--bandwidth", "0gbit", "--params", "61M"], "bandwidth"),
    (["predict", "--nodes", "4", "--bandwidth", "-1gbit", "--params", "61M"], "positive"),
    (["predict", "--nodes", "4", "--bandwidth", "10gbot", "--params", "61M"], "unknown unit"),
    (["predict", "--nodes", "0", "--bandwidth", "10gbit", "--params", "61M"], "nodes"),
    (["predict", "--nodes", "4", "--bandwidth", "10gbit", "--params", "61M", "--compression", "zip"], "zip"),
    (["predict", "--nodes", "4", "--bandwidth", "10gbit", "--params", "61M", "--modes", "hogwild"], "hogwild"),
    (["predict", "--nodes", "2,4", "--bandwidth", "10gbit", "--params", "61M"], "sweep"),
    (["predict", "--nodes", "4", "--bandwidth", "10gbit"], "required"),
    (["frobnicate"], "invalid choice"),
    (["calibrate"], ">= 2 ranks"),
    (["validate", "--calibration", "no-such-calib.json", "x.jsonl"], "not found"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch, argv, needle):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("pipesgd-timing: error:") and err.count("\n") == 1 and needle in err
    assert "Traceback" not in err


def test_validate_malformed_files_exit_2(tmp_path, capsys):
    from tests.test_timing_model import FIT
    from timing_model.calibration import Calibration, write_calibration

    calib = tmp_path / "c.json"
    write_calibration(str(calib), Calibration({"ring": FIT}))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    code, _, err = run_cli(capsys, "validate", "--calibration", str(calib), str(bad))
    assert code == 2 and "malformed JSON" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "validate", "--calibration", str(bad), str(bad))
    assert code == 2 and "not valid JSON" in err


def test_python_m_entry_point_and_error_exit():
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    ok = subprocess.run([sys.executable, "-m", "timing_model", "predict", *BASE, "--format", "csv"],
                        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith("mode,")
    bad = subprocess.run([sys.executable, "-m", "timing_model", "predict", "--nodes", "4", "--bandwidth", "fast",
                          "--params", "1M"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("pipesgd-timing: error:") and "Traceback" not in bad.stderr



def test_python_m_timing_model_calibrate_points_to_pipesgd_timing():
    """The pure model cannot measure: its ``calibrate`` is one line naming the command that can, exit 2."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-m", "timing_model", "calibrate", "--sizes", "4KB:4KB", "--out", "c.json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith("pipesgd-timing: error:") and "pipesgd-timing calibrate" in done.stderr

GRID = [4096, 1 << 20, 4 << 20]
KNOWN = Fit(0.0, 40e-6, 1.0e9, 8e9, 0, 0.0, 0.0)  # the terms the synthetic timings below are made of
REDUCE_CALL_S = 3e-6
BF16_RING_FACTOR = 1.7


def _measure_rank(rank, world_size, compressions=("none",), compute=None):
    from pipesgd.measure.calibrate import measure_calibration

    measured = measure_calibration(GRID, repeats=3, warmup=1, compressions=compressions, compute=compute,
                                   overlap_sizes_bytes=overlap_sizes(GRID))
    return None if measured is None else asdict(measured)


def _known_seconds(sample: dict, codecs: dict) -> float:
    """What ``KNOWN`` says a measured point takes (compressed rings: wire at ratio× + BF16_RING_FACTOR × codec)."""
    if sample["kind"] == "reduce":
        return sample["n_bytes"] / KNOWN.reduce_Bps + REDUCE_CALL_S
    if sample["compression"] == "none":
        return KNOWN.predict(sample["nodes"], sample["n_bytes"], ALGORITHM_OF.get(sample["collective"], "ring"))
    ratio = CODEC_RATIOS[sample["compression"]]
    wire = Fit(0.0, KNOWN.latency_s, KNOWN.bandwidth_Bps * ratio, KNOWN.reduce_Bps, 0, 0.0, 0.0)
    encode, decode = codecs[sample["compression"]]
    return (wire.predict(sample["nodes"], sample["n_bytes"])
            + BF16_RING_FACTOR * equations.codec_time(sample["nodes"], sample["n_bytes"], encode, decode, True))


def _fit_on_known_timings(measured: dict, compressions=("none",), compute=None):
    """The fit of the measured grid, with every sample's seconds replaced by ``KNOWN``'s: the grid the measurement
    produces must let the fit recover the terms (real timings on this busy box are too noisy to check a fit)."""
    from pipesgd.measure.calibrate_command import calibration_from

    known = dict(measured, samples=[dict(s, seconds=_known_seconds(s, measured["codecs"]))
                                    for s in measured["samples"]])
    return calibration_from(SimpleNamespace(**known), GRID, 3, 1, compressions, "cpu", compute)


@pytest.mark.slow
def test_calibrate_two_ranks_small_grid():
    """Measurement plumbing at world size 2 (real timings: structure and signs), then the fit of that grid on known
    timings (values)."""
    results = run_ranks(_measure_rank, 2, timeout_s=90)
    assert results[1] is None
    measured = results[0]
    kinds = [(s["kind"], s["collective"]) for s in measured["samples"]]
    assert kinds.count(("allreduce", "ring")) == kinds.count(("allreduce", "backend")) == 3
    assert kinds.count(("allreduce", "alltoall")) == 3  # the exchange, uncompressed
    assert kinds.count(("reduce", "local")) == 3
    assert all(s["seconds"] > 0 for s in measured["samples"])
    assert [s["n_bytes"] for s in measured["samples"] if s["collective"] == "backend"] == [float(n) for n in GRID]
    assert {s["nodes"] for s in measured["samples"] if s["kind"] == "allreduce"} == {2}
    assert (measured["backend"], measured["world_size"], measured["nodes"]) == ("gloo", 2, [2])
    host = host_record(measured["host"])  # interference and hand-off terms (values: this busy box, not checked)
    assert host["comm_slowdown"] >= 0 and host["compute_slowdown"] >= 0 and len(host["overlap"]) == 2
    assert [r["n_bytes"] for r in host["overlap"]] == [float(1 << 20), float(4 << 20)]  # the sizes >= BURST_BYTES
    assert host["copy_Bps"] > 0 and host["handoff_s"] > 0 and len(host["copy"]) == 3
    cal = _fit_on_known_timings(measured)
    for name in ("ring", "backend", "alltoall"):
        fit = cal.fits[name]
        assert fit.latency_s == pytest.approx(KNOWN.latency_s, rel=1e-6)
        assert fit.bandwidth_Bps == pytest.approx(KNOWN.bandwidth_Bps, rel=1e-6)
        assert fit.reduce_Bps == pytest.approx(KNOWN.reduce_Bps, rel=1e-6)
        assert fit.overhead_s == 0.0 and fit.max_abs_rel_err < 1e-6
    assert "one cluster size only: overhead fixed at 0, latency absorbs it" in cal.fits["ring"].notes
    assert cal.meta["grid"] == {"nodes": [2], "sizes_bytes": GRID, "repeats": 3, "warmup": 1,
                                "compressions": ["none"], "min_fit_bytes": 0.0}
    assert cal.host == host and cal.compute is None and len(cal.residuals) == 9


# The step probes' time budgets for the test below, which checks what they record, not their values (a full
# calibration's 2-15 s per probe took ~20 s of this test); every probe still runs at least its minimum steps.
TEST_PROBE_BUDGET_S = 0.3


def _short_probe_budgets() -> None:
    """In this rank's process: every probe of ``measure_host`` sized to ``TEST_PROBE_BUDGET_S``."""
    from functools import partial

    from pipesgd.measure import feedback, host

    host.ALONE_BUDGET_S = host.WINDOW_BUDGET_S = feedback.FEEDBACK_BUDGET_S = TEST_PROBE_BUDGET_S  # read per call
    for name in ("measure_lockstep", "measure_ddp_step", "measure_ps_service", "measure_ps_round"):
        setattr(host, name, partial(getattr(host, name), budget_s=TEST_PROBE_BUDGET_S))


def _measure_with_model_rank(rank, world_size):
    compute = {"model": "mlp", "input_shape": (16,), "num_classes": 4, "batch_size": 8, "hidden": 64}
    _short_probe_budgets()
    return _measure_rank(rank, world_size, ("none", "bf16"), compute)


@pytest.mark.slow
def test_calibrate_with_a_model_probes_interference_with_its_own_step_per_codec():
    """With --model the interference load is that model's forward+backward, reducing its own gradient size
    (mlp 16-64-64-4: 5,508 parameters, 22,032 bytes) once per codec."""
    compute = {"model": "mlp", "input_shape": (16,), "num_classes": 4, "batch_size": 8, "hidden": 64}
    measured = run_ranks(_measure_with_model_rank, 2, timeout_s=120)[0]
    host = host_record(measured["host"])
    assert "mlp forward+backward, batch 8" in host["load"]
    assert [(r["compression"], r["n_bytes"]) for r in host["overlap"]] == [("none", 22032.0), ("bf16", 22032.0)]
    assert set(host["comm_slowdown_by_codec"]) == {"none", "bf16"}
    assert host["comm_slowdown"] == host["comm_slowdown_by_codec"]["none"]
    # the window probe: one load per all-reduce, per codec; its λ is the inverse of the model's window_comm
    for row in host["overlap"]:
        assert row["window_steps"] >= 5 and row["load_window_s"] > 0 and row["ring_window_s"] > 0
    assert set(host["window_loss_by_codec"]) == {"none", "bf16"} and min(host["window_loss_by_codec"].values()) >= 0
    none = host["overlap"][0]
    alone, window, ring = none["ring_alone_s"], none["load_window_s"], none["ring_window_s"]
    # the inverse, where the ring lost at most the window (λ ≤ 1)
    assert overlap.window_comm(alone, window, host["window_loss"]) == pytest.approx(
        max(alone, min(ring, alone + window)), rel=1e-9)
    # the lockstep probe: synchronous steps of the same model, its period at least the slowest compute
    lockstep = host["lockstep"]
    assert "mlp forward+backward, batch 8" in lockstep["load"] and lockstep["steps"] >= 5
    assert lockstep["period_s"] >= lockstep["compute_max_s"] > 0 and lockstep["ring_alone_s"] > 0
    assert lockstep["excess_s"] >= 0
    assert host["lockstep_s"] == lockstep["excess_s"] - lockstep["ring_alone_s"]  # signed
    # the DDP probe: the same model's steps under DDP, and its forward + backward alone
    ddp = host["ddp_step"]
    assert "mlp forward+backward, batch 8" in ddp["load"] and ddp["steps"] >= 5
    assert ddp["period_s"] > 0 and ddp["compute_s"] > 0
    # the ps-sync probe: the same model's synchronous parameter-server rounds
    rounds = host["ps_round"]
    assert "mlp forward+backward, batch 8" in rounds["load"] and rounds["steps"] >= 5 and rounds["excess_s"] > 0
    # the feedback probe: the lossy codec's ring at the model's size without and with error feedback
    assert [(r["compression"], r["n_bytes"]) for r in host["feedback_rings"]] == [("bf16", 22032.0)]
    assert measured["compute_s"] > 0 and set(measured["codecs"]) == set(measured["feedback"]) == {"bf16"}
    cal = _fit_on_known_timings(measured, ("none", "bf16"), compute)
    assert cal.compute == {"model": "mlp", "batch_size": 8, "compute_s": measured["compute_s"], "hidden": 64}
    assert cal.compute["hidden"] == 64 and cal.compute["compute_s"] > 0
    assert set(cal.codec_ring_factors) <= {"bf16"} and all(set(f) == {2} for f in cal.codec_ring_factors.values())
    assert cal.codec_ring_factors["bf16"][2] == pytest.approx(BF16_RING_FACTOR, rel=1e-6)


def test_calibrate_refuses_an_unknown_model_before_joining(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, out, err = run_cli(capsys, "calibrate", "--model", "transformer")
    assert code == 2 and out == "" and "unknown model 'transformer'" in err and err.count("\n") == 1
    code, out, err = run_cli(capsys, "calibrate", "--model", "mlp", "--batch-size", "0")
    assert code == 2 and "--batch-size" in err
    code, out, err = run_cli(capsys, "calibrate", "--probe-only", "feedback")
    assert code == 2 and "--probe-only needs --model" in err and err.count("\n") == 1
    code, out, err = run_cli(capsys, "calibrate", "--probe-only", "feedback", "--model", "mlp")
    assert code == 2 and "needs --compressions with a lossy codec" in err
    code, out, err = run_cli(capsys, "calibrate", "--probe-only", "ps,rings", "--model", "mlp")
    assert code == 2 and "unknown probe 'rings'; valid: ps, ps-sync, feedback" in err


@pytest.mark.slow
def test_calibrate_failing_on_rank_0_leaves_the_other_ranks_clean(tmp_path):
    """Rank 0 fits and writes alone after the others are done; when that fails (here: one message size, too few
    samples to fit) it still meets them at the final barrier, so they do not crash with a 'connection closed'
    traceback, and it reports a run-time failure (exit 1). An unwritable --out no longer gets this far: every
    rank refuses it before measuring (tests/test_cli_conventions.py)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "calib.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
            "pipesgd.measure", "calibrate", "--sizes", "4KB:4KB", "--repeats", "2", "--warmup", "0", "--no-overlap",
            "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode != 0 and not out.exists()
    errors = [line for line in done.stderr.splitlines() if line.startswith("pipesgd-timing: error:")]
    assert len(errors) == 1 and "calibration failed" in errors[0], done.stderr
    assert "exitcode  : 1" in done.stderr  # torchrun's report of rank 0: a run-time failure, not bad input (2)
    # (torchrun itself may report that it stopped rank 1 after rank 0 failed; rank 1 must not have crashed)
    assert "[rank1]: Traceback" not in done.stderr and "Connection closed" not in done.stderr


def test_readable_times_and_numbers_never_use_e_notation():
    from timing_model.units import format_number, format_time

    assert [format_time(s) for s in (0, 5e-5, 0.12, 9.018, 90.18, 1234.5, -0.002)] == [
        "0", "50 us", "120 ms", "9018 ms", "90.18 s", "20.57 min", "-2 ms"]
    assert format_time(0.12, like=38.5) == "0.12 s"  # one unit down a column
    assert [format_number(v) for v in (90180.4, 0.0125, 2.0, 1.0174)] == ["90180", "0.0125", "2", "1.017"]
    assert parse_time("0.12") == pytest.approx(0.12)  # the library still reads a bare number as seconds
    with pytest.raises(ValueError, match="give a unit, e.g. 0.12ms or 0.12s"):
        parse_time("0.12", require_unit=True)
