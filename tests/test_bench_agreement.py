"""The agreement benchmark (experiments/bench_agreement.py): its settings' checks, one-line errors, and a smoke run
on loopback whose records hold every round of both sides and the ratio of their medians."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from experiments.harness.agreement import AgreementSettings
from tests.in_process import run_in_process
from tests.test_bench_pipeline import ENV, ROOT


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_agreement.py"), *args],
                          capture_output=True, text=True, env=ENV, timeout=300)


@pytest.mark.parametrize("kwargs, message", [({"workload": "resnet"}, "unknown workload 'resnet'"),
                                             ({"variants": ("q9",)}, "unknown variant 'q9'"),
                                             ({"variants": ()}, "at least one variant"),
                                             ({"rounds": 0}, "rounds must be >= 1")])
def test_settings_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AgreementSettings(out_json="x.jsonl", **kwargs)


def test_script_refuses_bad_flags_in_one_line(tmp_path):
    proc = run_in_process(ROOT / "experiments" / "bench_agreement.py", "--loopback", "--variants", "q8,q9", "--out",
                       str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip().endswith("valid: none, fp16, fp16+ef, bf16, bf16+ef, q8, "
                                                                 "q8+ef, q4, q4+ef, sign+ef")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_loopback_run_records_both_sides_of_every_round(tmp_path):
    proc = _script("--loopback", "--nodes", "2", "--workload", "tiny", "--variants", "none,q8", "--rounds", "2",
                   "--steps", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "loopback.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in records] == ["none", "q8"]
    for r in records:
        assert r["ranks"] == 2 and len(r["on_s"]) == len(r["off_s"]) == 2 and min(r["on_s"] + r["off_s"]) > 0
        assert r["ratio"] == pytest.approx(statistics.median(r["on_s"]) / statistics.median(r["off_s"]))
    assert "| tiny | q8 |" in proc.stdout and (tmp_path / "loopback.md").read_text() == proc.stdout
