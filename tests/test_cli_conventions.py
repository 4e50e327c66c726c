"""The three command lines' one convention (``timing_model.cli_conventions``): every bad input is exactly one line
``PROG: error: ...`` on stderr, exit code 2, no traceback, and nothing started (each test makes starting work fail
the test); and the shared pieces: negative values, non-finite numbers, output paths checked up front."""
from __future__ import annotations

import argparse
import os

import pytest

from timing_model.cli_conventions import finite_float, join_negative_values, positive_float
from pipesgd.runlog.output_paths import check_output_dir, check_output_file


def _one_line_error(capsys, prog: str) -> str:
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
    assert "Traceback" not in err + out
    return err


def _forbid(monkeypatch, target: str, what: str) -> None:
    def started(*args, **kwargs):
        raise AssertionError(f"{what} started on bad input")
    monkeypatch.setattr(target, started)


# -- pipesgd-train -----------------------------------------------------------------------------------------------
TRAIN_BAD = [  # {dir}: an existing directory, {file}: an existing file
    (["--config", "{dir}"], "--config {dir} is a directory"),
    (["--metrics", "/proc/m.jsonl"], "--metrics /proc/m.jsonl: cannot create a file in /proc"),
    (["--metrics", "{dir}"], "is a directory, expected a file"),
    (["--metrics", "{file}"], "already exists: choose another file, remove it, or pass --resume"),
    (["--metrics", "{file}/m.jsonl"], "is not a directory"),
    (["--checkpoint", "/proc/ck"], "--checkpoint /proc/ck: cannot create a file in /proc"),
    (["--checkpoint", "{file}"], "is a file, expected a directory"),
    (["--trace", "/proc/t.json"], "--trace /proc/t.json: cannot create a file in /proc"),
    (["--lr", "inf"], "--lr must be a finite number (got inf)"),
    (["--lr", "1e400"], "--lr must be a finite number"),
    (["--weight-decay", "nan"], "--weight-decay must be a finite number (got nan)"),
    (["--timeout", "-inf"], "--timeout must be a finite number"),
    (["--lr", "-1e-3"], "--lr must be positive"),
    (["--steps", "abc"], "argument --steps: invalid int value: 'abc'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--allreduce", "mesh"], "unknown --allreduce 'mesh' (valid: auto, ring, alltoall)"),
    (["--mode", "ddp", "--allreduce", "ring"], "--allreduce applies to --mode pipe or sync only, not ddp"),
]


@pytest.mark.parametrize("argv,message", TRAIN_BAD, ids=[" ".join(a) for a, _ in TRAIN_BAD])
def test_train_refuses_bad_input_in_one_line(argv, message, tmp_path, capsys, monkeypatch):
    from pipesgd.train import cli

    _forbid(monkeypatch, "pipesgd.train.cli.init_process_group", "the process group")
    existing = tmp_path / "existing.jsonl"
    existing.write_text("{}\n")
    paths = {"dir": str(tmp_path), "file": str(existing)}
    assert cli.main([a.format(**paths) for a in argv]) == 2
    assert message.format(**paths) in _one_line_error(capsys, "pipesgd-train")
    assert sorted(os.listdir(tmp_path)) == ["existing.jsonl"]  # nothing written


def test_train_refuses_a_non_finite_toml_value(tmp_path, capsys):
    from pipesgd.train import cli

    config = tmp_path / "run.toml"
    config.write_text("lr = inf\n")
    assert cli.main(["--config", str(config)]) == 2
    assert "--lr must be a finite number (got inf)" in _one_line_error(capsys, "pipesgd-train")


def test_train_refuses_any_rank_s_existing_metrics_file(tmp_path, capsys, monkeypatch):
    """With several ranks every rank refuses alike when one rank's file exists (no rank left waiting)."""
    from pipesgd.train import cli

    (tmp_path / "m.rank1.jsonl").write_text("{}\n")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _forbid(monkeypatch, "pipesgd.train.cli.init_process_group", "the process group")
    assert cli.main(["--metrics", str(tmp_path / "m.jsonl")]) == 2
    assert f"--metrics {tmp_path / 'm.rank1.jsonl'} already exists" in _one_line_error(capsys, "pipesgd-train")


# -- pipesgd-timing ----------------------------------------------------------------------------------------------
SCENARIO = ["--nodes", "4", "--params", "61M"]
TIMING_BAD = [
    (["calibrate", "--out", "/proc/x.json"], "--out /proc/x.json: cannot create a file in /proc"),
    (["calibrate", "--out", "{dir}"], "--out {dir}: is a directory"),
    (["calibrate", "--backend", "zzz"], "argument --backend: invalid choice: 'zzz'"),
    (["calibrate", "--backend", "nccl"], "--backend nccl needs --device cuda"),
    (["calibrate", "--model", "mlp", "--input-shape", "abc"], "--input-shape: 'abc' is not a list of integers"),
    (["calibrate", "--sizes", "10B:14B"], "--sizes: size range '10B:14B': '10B' is 10 bytes, not a power of two"),
    (["calibrate", "--sizes", "10:14"], "--sizes: size '10': give a unit, e.g. 10MB or 10B"),
    (["calibrate", "--fit-min-bytes", "1000"], "--fit-min-bytes: size '1000': give a unit"),
    (["calibrate", "--repeats", "0"], "--repeats must be >= 1"),
    (["calibrate", "--compressions", "zip"], "unknown compression 'zip'"),
    (["predict", *SCENARIO, "--bandwidth", "1gbps"], "--bandwidth: bandwidth '1gbps' is ambiguous"),
    (["predict", *SCENARIO, "--bandwidth", "1000"], "--bandwidth: bandwidth '1000' has no unit"),
    (["predict", *SCENARIO, "--bandwidth", "-1gbit"], "--bandwidth: bandwidth '-1gbit': must be positive"),
    (["predict", *SCENARIO, "--bandwidth", "1gbit", "--latency", "inf"], "--latency: time 'inf'"),
    (["predict", *SCENARIO, "--bandwidth", "1gbit", "--compute", "1e400s"], "--compute: time '1e400s': must be finite"),
    (["predict", *SCENARIO, "--bandwidth", "1gbit", "--slowdown", "nan"], "--slowdown: slowdown 'nan'"),
    (["sweep", *SCENARIO, "--bandwidth", "1gbit,1000"], "--bandwidth: bandwidth '1000' has no unit"),
    (["validate", "--calibration", "/nonexistent.json", "x.jsonl"], "calibration file '/nonexistent.json' not found"),
    (["predict", *SCENARIO, "--bandwidth", "1gbit", "--bogus"], "unrecognized arguments: --bogus"),
    (["predict", "--nodes", "4"], "the following arguments are required"),
]


@pytest.mark.parametrize("argv,message", TIMING_BAD, ids=[" ".join(a) for a, _ in TIMING_BAD])
def test_timing_refuses_bad_input_in_one_line(argv, message, tmp_path, capsys, monkeypatch):
    from pipesgd.measure.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")  # calibrate's own refusal of one rank comes first otherwise
    monkeypatch.setenv("RANK", "0")
    _forbid(monkeypatch, "torch.distributed.init_process_group", "measuring")
    assert main([a.format(dir=tmp_path) for a in argv]) == 2
    assert message.format(dir=tmp_path) in _one_line_error(capsys, "pipesgd-timing")
    assert os.listdir(tmp_path) == []


def test_timing_calibration_failing_after_it_measured_is_exit_1(tmp_path, capsys, monkeypatch):
    """Once ranks measured, a failed fit is a run-time failure (1), not bad input (2)."""
    import torch.distributed as dist

    from pipesgd.measure.cli import main
    from pipesgd.measure import calibrate_command as calibrate

    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("init_process_group", "barrier", "destroy_process_group"):
        monkeypatch.setattr(dist, name, lambda *a, **k: None)

    def failed_fit(*args, **kwargs):
        raise ValueError("calibration failed: ring: need at least 2 samples")
    monkeypatch.setattr(calibrate, "run_calibration", failed_fit)
    assert main(["calibrate", "--out", str(tmp_path / "c.json")]) == 1
    assert "calibration failed: ring" in _one_line_error(capsys, "pipesgd-timing")


# -- pipesgd-cluster ---------------------------------------------------------------------------------------------
CLUSTER_BAD = [
    (["up", "--bandwidth", "-1gbit"], "argument --bandwidth: bandwidth '-1gbit': must be positive"),
    (["up", "--bandwidth", "1gbps"], "bandwidth '1gbps' is ambiguous"),
    (["up", "--bandwidth", "1000"], "bandwidth '1000' has no unit: write bits (1000bit) or bytes (1000B/s)"),
    (["up", "--bandwidth", "fast"], "bandwidth 'fast': not a number"),
    (["up", "--queue-ms", "nan"], "argument --queue-ms: must be a finite number (got 'nan')"),
    (["up", "--queue-ms", "-5"], "argument --queue-ms: must be positive"),
    (["up", "--nodes", "0"], "argument --nodes: must be >= 1"),
    (["up", "--mtu", "10"], "argument --mtu: must be in 576..65535"),
    (["up", "--cores-per-node", "100000"], "--cores-per-node 100000 needs 400000 cores for 4 nodes"),
    (["up", "--burst", "lots"], "argument --burst: bad size 'lots'"),
    (["up", "--name", "other"], "bad cluster name 'other'"),
    (["up", "--latency", "5ms"], "netem is not available on this kernel; latency emulation unsupported"),
    (["measure", "--duration", "-1"], "argument --duration: must be positive"),
    (["measure", "--src", "1", "--dst", "1"], "measure needs two different nodes"),
    (["run", "--timeout", "-1", "--", "true"], "argument --timeout: must be positive"),
    (["run", "--timeout", "inf", "--", "true"], "argument --timeout: must be a finite number"),
    (["run", "--nproc-per-node", "0", "--", "true"], "argument --nproc-per-node: must be >= 1"),
    (["run"], "no command: use `pipesgd-cluster run [options] -- COMMAND ...`"),
    (["status", "--", "true"], "`--` and a command only make sense with `run`"),
    (["bogus"], "invalid choice: 'bogus'"),
    ([], "the following arguments are required: command"),
]


@pytest.mark.parametrize("argv,message", CLUSTER_BAD, ids=[" ".join(a) or "(none)" for a, _ in CLUSTER_BAD])
def test_cluster_refuses_bad_input_in_one_line(argv, message, capsys, monkeypatch):
    from pipesgd.cluster import cli

    for target in ("Cluster.up", "Cluster.load"):
        _forbid(monkeypatch, f"pipesgd.cluster.cli.{target}", target)
    _forbid(monkeypatch, "pipesgd.cluster.cli.teardown", "teardown")
    assert cli.main(argv) == 2
    assert message in _one_line_error(capsys, "pipesgd-cluster")


def test_cluster_failures_at_run_time_are_exit_1_in_the_same_form(capsys, tmp_path, monkeypatch):
    from pipesgd.cluster import cli

    monkeypatch.setenv("PIPESGD_CLUSTER_STATE_DIR", str(tmp_path))
    assert cli.main(["run", "--name", "psgd-absent", "--", "true"]) == 1
    assert "no cluster named 'psgd-absent'" in _one_line_error(capsys, "pipesgd-cluster")


# -- the shared pieces -------------------------------------------------------------------------------------------
def test_negative_values_reach_their_flag_and_a_command_keeps_its_own():
    assert join_negative_values(["--bandwidth", "-1gbit", "--lr", "-.5", "--x", "-inf", "--flag", "--y", "3"]) == \
        ["--bandwidth=-1gbit", "--lr=-.5", "--x=-inf", "--flag", "--y", "3"]
    assert join_negative_values(["run", "--timeout", "5", "--", "cmd", "--n", "-1"]) == \
        ["run", "--timeout", "5", "--", "cmd", "--n", "-1"]


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e400", "abc"])
def test_float_flags_refuse_non_finite_numbers(text):
    with pytest.raises(argparse.ArgumentTypeError):
        finite_float(text)
    assert positive_float("1e-3") == 1e-3


def test_output_paths_allow_missing_directories_without_creating_them(tmp_path):
    check_output_file(str(tmp_path / "a" / "b" / "m.jsonl"), "--metrics")
    check_output_dir(str(tmp_path / "a" / "ck"), "--checkpoint")
    assert os.listdir(tmp_path) == []  # the probe file is gone and no directory was made


def test_output_paths_refuse_a_read_only_place(tmp_path, monkeypatch):
    """Where the kernel refuses to create a file (as on a read-only file system), the probe says so."""
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(ValueError, match=r"--out .*: cannot create a file in .* \(Read-only file system\)"):
        check_output_file(str(tmp_path / "x.json"), "--out")
