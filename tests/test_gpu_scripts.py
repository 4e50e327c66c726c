"""Smoke runs of the GPU scripts on the CPU (issue 13, part 2): each prints its table with the device name
and writes it under --out; bad combinations fail in one line before any process starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.in_process import run_in_process

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
ENV["PYTHONPATH"] = str(ROOT)
sys.path.insert(0, str(ROOT / "experiments"))  # bench_codec_compiled's helpers


def run_script(name: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / name), *args], capture_output=True,
                          text=True, env=ENV, timeout=timeout_s)


def refusal(name: str, *args: str) -> subprocess.CompletedProcess:
    """``name`` refusing ``args`` (in this interpreter: tests/in_process.py)."""
    return run_in_process(ROOT / "experiments" / name, *args)


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
            "no sync from step()", "memory_allocated", "codec kernels CUDA vs CPU", "SyncBatchNorm, K = 2",
            "K = 2, q8 + EF, ring, stand-in coarse-lowrank"} <= checks
    assert (tmp_path / "gpu_check.md").read_text().startswith("# GPU path correctness")


@pytest.mark.slow
def test_gpu_speed_runs_on_cpu_and_reports_overlap_efficiency(tmp_path):
    proc = run_script("gpu_speed.py", "--device", "cpu", "--ranks", "2", "--models", "lenet", "--batch", "4",
                      "--repeats", "2", "--codec-mb", "1", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "device: CPU" in proc.stdout
    data = json.loads((tmp_path / "gpu_speed.json").read_text())
    variants = {r["variant"]: r for r in data["rows"]}
    for name in ("compute only", "DDP", "DDP + fp16 hook", "sync (K = 1)", "Pipe-SGD K = 2, lookahead, none, backend",
                 "Pipe-SGD K = 2, lookahead, bf16, alltoall", "Pipe-SGD K = 2, lookahead, q8, alltoall",
                 "Pipe-SGD K = 2, lookahead, q8, ring",
                 "Pipe-SGD K = 2, none, q8, alltoall",
                 "Pipe-SGD K = 2, lookahead, q8, ring, stand-in coarse-lowrank",
                 "all-reduce only, q8, alltoall", "all-reduce only, q8, ring", "all-reduce only, none, backend"):
        assert name in variants, name
    for allreduce in ("alltoall", "ring"):  # each against its own all-reduce's time
        q8 = variants[f"Pipe-SGD K = 2, lookahead, q8, {allreduce}"]
        assert float(q8["overlap efficiency"]) > 0 and q8["comm ms"] == variants[f"all-reduce only, q8, {allreduce}"][
            "comm ms"]
    assert float(variants["Pipe-SGD K = 2, lookahead, q8, alltoall"]["look-ahead ms"]) > 0
    assert "look-ahead ms" not in variants["Pipe-SGD K = 2, none, q8, alltoall"]
    assert {r["codec"] for r in data["codecs"]} == {"bf16", "q8", "q4", "sign"}


@pytest.mark.parametrize("script", ["gpu_check.py", "gpu_speed.py"])
def test_nccl_without_cuda_is_one_line(script, tmp_path):
    proc = refusal(script, "--device", "cpu", "--backend", "nccl", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{script}: error: --backend nccl needs --device cuda"


GPU_SCRIPTS = ["gpu_check.py", "gpu_speed.py"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_cuda_asked_for_where_there_is_none_is_one_line_before_any_rank_starts(script, tmp_path):
    proc = refusal(script, "--device", "cuda", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "error: --device cuda but no CUDA device is available" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("script", [*GPU_SCRIPTS, "bench_allreduce_choice.py",
                                    "bench_reduction_error.py", "bench_codec_rows.py"])
def test_a_flag_that_does_not_parse_is_one_line_without_the_usage_block(script):
    proc = refusal(script, "--no-such-flag")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "unrecognized arguments: --no-such-flag" in proc.stderr or "required" in proc.stderr


def test_a_switch_interval_must_be_positive(tmp_path):
    script = "gpu_speed.py"
    proc = refusal(script, "--device", "cpu", "--out", str(tmp_path), "--switch-interval-ms", "0")
    assert proc.returncode == 2 and "--switch-interval-ms must be positive" in proc.stderr and \
        len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_bench_codec_compiled_runs_on_cpu_and_gives_the_eager_codecs_values(tmp_path):
    """The compiled q8 against the library's, on CPU (inductor's C++): same scales, codes and decoded values, for a
    chunk with a zero block and an inf (masked) and one with a short last block."""
    proc = run_script("bench_codec_compiled.py", "--device", "cpu", "--codecs", "q8", "--sizes", "35000,12289",
                      "--repeats", "2", "--out", str(tmp_path), timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in (tmp_path / "codec_compiled.md").read_text().splitlines() if line.startswith("| q8 |")]
    assert len(rows) == 2 and all(row.split("|")[3].strip() == "yes" for row in rows), rows


def test_the_compiled_codecs_comparison_tells_a_wrong_code_apart():
    import bench_codec_compiled
    payload = torch.tensor([0, 0, 0, 128, 5, 6], dtype=torch.uint8)  # a -0.0 scale, two code bytes
    same = payload.clone()
    same[3] = 0  # +0.0: the same value
    assert bench_codec_compiled.same_payload(payload, same, rows=1)
    wrong = same.clone()
    wrong[5] = 7
    assert not bench_codec_compiled.same_payload(payload, wrong, rows=1)
    assert not bench_codec_compiled.same_values(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("args, needle", [(["--codecs", "sign"], "unknown codec sign"),
                                          (["--sizes", "1k"], "--sizes: comma-separated element counts"),
                                          (["--repeats", "0"], "must be >= 1")])
def test_bench_codec_compiled_bad_arguments_are_one_line(args, needle, tmp_path):
    proc = refusal("bench_codec_compiled.py", "--device", "cpu", *args, "--out", str(tmp_path / "c"))
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "c").exists()
