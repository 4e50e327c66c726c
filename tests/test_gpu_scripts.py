"""Smoke runs of the GPU scripts on the CPU (issue 13, part 2): each prints its table with the device name
and writes it under --out; bad combinations fail in one line before any process starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
ENV["PYTHONPATH"] = str(ROOT)


def run_script(name: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / name), *args], capture_output=True,
                          text=True, env=ENV, timeout=timeout_s)


@pytest.mark.slow
def test_gpu_check_runs_on_cpu_and_every_check_passes_or_is_skipped(tmp_path):
    proc = run_script("gpu_check.py", "--device", "cpu", "--ranks", "2", "--hidden", "16", "--steps", "4",
                      "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "device: CPU" in proc.stdout and "| check | detail | value | result |" in proc.stdout
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    results = {r["result"] for r in rows}
    assert results <= {"PASS", "skip"} and "PASS" in results
    checks = {r["check"] for r in rows}
    assert {"K = 1 vs reference", "K = 2 vs reference", "stalled side stream", "stalled compute stream",
            "no sync from step()", "memory_allocated", "codec kernels CUDA vs CPU"} <= checks
    assert (tmp_path / "gpu_check.md").read_text().startswith("# GPU path correctness")


@pytest.mark.slow
def test_gpu_speed_runs_on_cpu_and_reports_overlap_efficiency(tmp_path):
    proc = run_script("gpu_speed.py", "--device", "cpu", "--ranks", "2", "--models", "lenet", "--batch", "4",
                      "--repeats", "2", "--codec-mb", "1", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "device: CPU" in proc.stdout
    data = json.loads((tmp_path / "gpu_speed.json").read_text())
    variants = {r["variant"]: r for r in data["rows"]}
    for name in ("compute only", "DDP", "DDP + fp16 hook", "sync (K = 1)", "Pipe-SGD K = 2, none",
                 "Pipe-SGD K = 2, bf16", "Pipe-SGD K = 2, q8"):
        assert name in variants, name
    assert float(variants["Pipe-SGD K = 2, q8"]["overlap efficiency"]) > 0
    assert {r["codec"] for r in data["codecs"]} == {"bf16", "q8", "q4", "sign"}


@pytest.mark.parametrize("script", ["gpu_check.py", "gpu_speed.py"])
def test_nccl_without_cuda_is_one_line(script, tmp_path):
    proc = run_script(script, "--device", "cpu", "--backend", "nccl", "--out", str(tmp_path), timeout_s=60)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "error: --backend nccl needs --device cuda"
