"""The issue-11 pipeline benchmark: the phase accumulators (off by default, on when asked), the settings' checks,
the report's tables from synthetic records, and a smoke run of experiments/bench_pipeline.py on loopback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipesgd.runlog import phases
from experiments.harness.pipeline import VARIANTS, PipelineSettings, parse_variant
from experiments.harness.pipeline_report import markdown, read_records
from tests.in_process import run_in_process

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
ENV["PYTHONPATH"] = str(ROOT)


def test_phases_accumulate_only_while_enabled():
    phases.reset()
    with phases.timed("codec"):
        sum(range(1000))
    assert phases.snapshot() == dict.fromkeys(phases.PHASES, 0.0)
    phases.enable(True)
    try:
        with phases.timed("codec"):
            sum(range(1000))
        with pytest.raises(ValueError, match="unknown phase 'network'; valid: wire_wait, codec"):
            phases.timed("network")
    finally:
        phases.enable(False)
    totals = phases.snapshot()
    assert totals["codec"] > 0 and all(v == 0.0 for k, v in totals.items() if k != "codec")
    phases.reset()
    assert not phases.enabled() and phases.snapshot()["codec"] == 0.0


def test_variants_and_settings_say_what_is_wrong(tmp_path):
    assert parse_variant("q8+ef") == ("q8", True) and parse_variant("bf16") == ("bf16", False)
    assert "sign" not in VARIANTS and "sign+ef" in VARIANTS
    with pytest.raises(ValueError, match="unknown variant 'q2'; valid: none, fp16"):
        parse_variant("q2")
    out = str(tmp_path / "r.jsonl")
    with pytest.raises(ValueError, match="unknown workload 'resnet'"):
        PipelineSettings(out, workloads=("resnet",))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        PipelineSettings(out, steps=0)
    with pytest.raises(ValueError, match="warmup must be >= 2"):
        PipelineSettings(out, warmup=1)


def _record(variant: str, t_iter: float) -> dict:
    return {"workload": "mlp1.9m", "params": 1_863_690, "variant": variant, "ranks": 4, "compute_s": 0.055,
            "ring_s": 0.115, "t_iter": t_iter, "efficiency": 0.115 / t_iter, "bytes_sent": 2.8e6,
            "compute": 0.05, "compute_cpu": 0.05, "wait": 0.06, "comm_busy": 0.11, "update": 0.001,
            "wire_wait": 0.08, "codec": 0.01, "error_feedback": 0.015, "pack_unpack": 0.002, "finite_check": 0.001,
            "cpu_main": 0.06, "cpu_process": 0.09}


def test_report_tables_show_efficiency_and_the_comm_split(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(_record(v, t)) + "\n" for v, t in (("q8", 0.130), ("q8+ef", 0.156))))
    text = markdown(read_records(str(path)), "t")
    assert "| mlp1.9m (1.86 M) | q8 | 55.0 | 115.0 | 130.0 | 0.88 | 2.80 |" in text
    assert "| mlp1.9m (1.86 M) | q8+ef | 55.0 | 115.0 | 156.0 | 0.74 | 2.80 |" in text
    # comm other = busy - (wire + codec + feedback + finite) = 110 - 106 ms; CPU comm = process - caller
    assert "| mlp1.9m | q8 | 50.0 | 2.0 | 60.0 | 1.0 | 110.0 | 80.0 | 10.0 | 15.0 | 1.0 | 4.0 | 60.0 | 30.0 |" in text
    # Four ranks each using 90 ms of CPU per iteration on 2 cores cannot iterate faster than 180 ms.
    shared = markdown(read_records(str(path)), "t", cores=2)
    assert "| mlp1.9m (1.86 M) | q8 | 55.0 | 115.0 | 130.0 | 0.88 | 2.80 | 180.0 | 0.64 |" in shared
    assert "CPU floor = all ranks' process CPU per iteration / 2 cores" in shared
    with pytest.raises(ValueError, match="cannot read benchmark records from"):
        read_records(str(tmp_path / "missing.jsonl"))


def test_against_ddp_table_gives_speedups_and_comm_cpu():
    pipe = {**_record("q8+ef", 0.100), "compute_cpu_s": 0.050}  # 90 ms process CPU: 40 ms beyond compute
    ddp = {"workload": "mlp1.9m", "params": 1_863_690, "variant": "ddp", "baseline": True, "ranks": 4,
           "compute_s": 0.055, "compute_cpu_s": 0.050, "t_iter": 0.350, "cpu_main": 0.06, "cpu_process": 0.070,
           "bytes_sent": 5.6e6}
    fp16 = {**ddp, "variant": "ddp+fp16", "t_iter": 0.250, "cpu_process": 0.080}
    text = markdown([pipe, ddp, fp16], "t")
    assert "| mlp1.9m | q8+ef | 100.0 | 3.50x | 2.50x | 40.0 | 2.00 |" in text
    assert "| mlp1.9m | ddp | 350.0 | 1.00x | 0.71x | 20.0 | 1.00 |" in text
    assert "| mlp1.9m | ddp+fp16 | 250.0 | 1.40x | 1.00x | 30.0 | 1.50 |" in text
    assert text.count("| ddp |") == 1  # baselines are not in the efficiency tables


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_pipeline.py"), *args],
                          capture_output=True, text=True, env=ENV, timeout=300)


def _refusal(*args: str) -> subprocess.CompletedProcess:
    return run_in_process(ROOT / "experiments" / "bench_pipeline.py", *args)


def test_script_refuses_bad_flags_in_one_line(tmp_path):
    proc = _refusal("--loopback", "--workloads", "resnet", "--out", str(tmp_path))
    assert proc.returncode == 2 and "error: unknown workload resnet; valid: mlp1.9m" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _refusal("--loopback", "--nodes", "1", "--out", str(tmp_path))
    assert proc.returncode == 2 and "--nodes must be >= 2" in proc.stderr
    for args, says in ((("--nodes", "four"), "invalid int value: 'four'"), (("--timeout", "0"), "--timeout must be > 0"),
                       (("--cores-per-node", "-1"), "--cores-per-node must be >= 0"),
                       (("--label", "a/b"), "--label names the result files"),
                       (("--out", str(tmp_path / "file.txt" / "sub")), "--out ")):
        (tmp_path / "file.txt").write_text("kept")
        out = () if args[0] == "--out" else ("--out", str(tmp_path))
        proc = _refusal("--loopback", *args, *out)
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stdout == "", (args, proc.stderr)  # one line, no usage block
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # nothing written before the refusals


@pytest.mark.slow
def test_quick_loopback_run_prints_and_writes_the_tables(tmp_path):
    proc = _script("--loopback", "--quick", "--nodes", "2", "--workloads", "tiny", "--variants", "none,q8+ef",
                   "--steps", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| tiny (0.01 M) | none |" in proc.stdout and "| tiny | q8+ef |" in proc.stdout
    records = json.loads((tmp_path / "loopback.json").read_text())["records"]
    assert [r["variant"] for r in records] == ["none", "q8+ef", "ddp", "ddp+fp16"]
    assert records[2]["baseline"] and records[2]["t_iter"] > 0 and records[2]["cpu_process"] > 0
    assert records[3]["bytes_sent"] == pytest.approx(records[2]["bytes_sent"] / 2, rel=0.01)  # fp16 halves it
    assert "| tiny | ddp+fp16 |" in proc.stdout and "| tiny | q8+ef |" in proc.stdout.split("vs ddp+fp16")[-2]
    q8 = records[1]
    assert q8["ranks"] == 2 and q8["t_iter"] > 0 and q8["efficiency"] > 0
    assert q8["codec"] > 0 and q8["error_feedback"] > 0 and q8["wire_wait"] > 0 and q8["pack_unpack"] > 0
    assert records[0]["error_feedback"] == 0.0  # no feedback, nothing booked
    written = (tmp_path / "loopback.md").read_text()
    assert written.startswith("# Pipe-SGD at its limit: 2 ranks on loopback")
    assert "\n- command: `" in written and "\n- commit: " in written and "\n| tiny (0.01 M) | none |" in written
    summary = json.loads((tmp_path / "loopback.json").read_text())
    assert summary["allreduce"] == "auto" and summary["provenance"]["commit"]
