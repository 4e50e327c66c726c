"""Smoke runs of the GPU scripts on the CPU (issue 13, part 2): each prints its table with the device name
and writes it under --out; bad combinations fail in one line before any process starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from tests.in_process import run_in_process

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
ENV["PYTHONPATH"] = str(ROOT)


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


@pytest.mark.slow
def test_gpu_contention_runs_on_cpu_and_times_every_codec_beside_every_load(tmp_path):
    proc = run_script("gpu_contention.py", "--device", "cpu", "--ranks", "2", "--model", "lenet", "--batch", "4",
                      "--repeats", "2", "--out", str(tmp_path), "--switch-interval-ms", "0.25")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "device: CPU" in proc.stdout and "GIL switch interval 0.25 ms" in proc.stdout
    rows = json.loads((tmp_path / "gpu_contention.json").read_text())["rows"]
    timed = {(r["codec"], r["all-reduce"], r["load"]) for r in rows if r.get("ring ms")}
    runs = [("none", "backend")] + [(c, a) for c in ("bf16", "q8") for a in ("alltoall", "ring")]
    assert timed == {(c, a, load) for c, a in runs for load in ("alone", "gpu-sleep", "python-spin", "training")}
    assert all(float(r["ring ms"]) > 0 for r in rows if r.get("ring ms"))


@pytest.mark.slow
def test_gpu_exchange_probe_runs_on_cpu_and_times_every_piece(tmp_path):
    proc = run_script("gpu_exchange_probe.py", "--device", "cpu", "--ranks", "3", "--sizes", "0.02", "--repeats", "1",
                      "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "exchange_probe.json").read_text())
    assert [r["collective"] for r in data["raw"]] == [
        "all-to-all (exchange step 2)", "the same bytes one peer at a time", "all-gather (exchange step 5)",
        "4 ring hops"]
    assert [r["all-reduce"] for r in data["allreduce"]] == [
        "exchange, all-gather as all-to-all (the library's where staged)", "exchange, the backend's all-gather", "ring"]
    assert all(float(r["ms"]) > 0 for r in data["raw"] + data["allreduce"])


@pytest.mark.slow
def test_gpu_host_profile_runs_on_cpu_and_profiles_every_variant(tmp_path):
    proc = run_script("gpu_host_profile.py", "--device", "cpu", "--ranks", "2", "--models", "lenet", "--steps", "1",
                      "--warmup", "1", "--top", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    sections = [line for line in (tmp_path / "host_profile.md").read_text().splitlines() if line.startswith("## ")]
    assert len(sections) == 4 and all("ms per step under the profiler" in line for line in sections)


@pytest.mark.slow
def test_gpu_thread_profile_runs_on_cpu_and_splits_every_variant_by_thread(tmp_path):
    proc = run_script("gpu_thread_profile.py", "--device", "cpu", "--ranks", "2", "--models", "lenet", "--steps", "2",
                      "--warmup", "1", "--variants", "q8:alltoall,q8:ring", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "thread_profile.json").read_text())
    assert list(data) == ["lenet, Pipe-SGD K = 2, q8 on alltoall", "lenet, Pipe-SGD K = 2, q8 on ring"]
    for threads in data.values():
        training, comm = threads["training"], threads["communication"]
        assert training["cpu_ms"] > 0 and comm["cpu_ms"] > 0 and comm["span_ms"] > 0
        # the communication thread's operators are its own: the collectives there, the backward pass on the other
        assert any(name.startswith("c10d::") for name, _ in comm["top_ops"])
        assert not any("backward" in name for name, _ in comm["top_ops"])
        assert any("backward" in name for name, _ in training["top_ops"])
        assert 0 < comm["op_own_ms"] <= comm["span_ms"] * 1.01
    assert (tmp_path / "trace-lenet.json.gz").stat().st_size > 0 and (tmp_path / "thread_profile.md").exists()


def test_thread_profile_own_times_leave_out_spans_that_outlast_their_parent():
    import gpu_thread_profile
    events = [{"name": "job", "ts": 0, "dur": 100}, {"name": "c10d::send", "ts": 10, "dur": 20},
              {"name": "gloo:send", "ts": 15, "dur": 500},  # ends when the transfer does: asynchronous
              {"name": "aten::div", "ts": 40, "dur": 30}, {"name": "aten::empty", "ts": 45, "dur": 5}]
    own = gpu_thread_profile.self_times(events)
    assert own == {0: 50, 1: 20, 3: 25, 4: 5}


@pytest.mark.parametrize("args, needle", [(["--variants", "q8:tree"], "a variant is CODEC:ALLREDUCE"),
                                          (["--variants", "q9:ring"], "unknown codec q9"),
                                          (["--models", "vgg"], "--models: one or more of"),
                                          (["--steps", "0"], "must be >= 1")])
def test_gpu_thread_profile_bad_arguments_are_one_line(args, needle, tmp_path):
    proc = refusal("gpu_thread_profile.py", *args, "--out", str(tmp_path / "p"))
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("script", ["gpu_check.py", "gpu_speed.py"])
def test_nccl_without_cuda_is_one_line(script, tmp_path):
    proc = refusal(script, "--device", "cpu", "--backend", "nccl", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{script}: error: --backend nccl needs --device cuda"


GPU_SCRIPTS = ["gpu_check.py", "gpu_speed.py", "gpu_contention.py", "gpu_exchange_probe.py", "gpu_host_profile.py",
               "gpu_thread_profile.py"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_cuda_asked_for_where_there_is_none_is_one_line_before_any_rank_starts(script, tmp_path):
    proc = refusal(script, "--device", "cuda", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "error: --device cuda but no CUDA device is available" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("script", [*GPU_SCRIPTS, "gpu_session.py", "bench_allreduce_choice.py",
                                    "bench_reduction_error.py", "bench_codec_rows.py"])
def test_a_flag_that_does_not_parse_is_one_line_without_the_usage_block(script):
    proc = refusal(script, "--no-such-flag")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "unrecognized arguments: --no-such-flag" in proc.stderr or "required" in proc.stderr


# -- the GPU session runbook (experiments/gpu_session.py) ---------------------------------------------------------
sys.path.insert(0, str(ROOT / "experiments"))
import gpu_session  # noqa: E402


def test_gpu_session_plan_covers_every_stage_and_its_flags_parse(tmp_path):
    from pipesgd.train.flags import resolve
    from pipesgd.measure.cli import COMMANDS
    from timing_model.cli import build_parser

    steps = gpu_session.plan(list(gpu_session.STAGES), tmp_path, "cuda", str(tmp_path), gpus=2)
    assert [s.stage for s in steps] == sorted((s.stage for s in steps), key=gpu_session.STAGES.index)
    names = {s.name for s in steps}
    assert {"netns", "check-gloo", "check-nccl1", "check-nccl2", "speed", "calibrate", "validate", "iproute2",
            "bench-cluster-1gbit", "bench-pipeline-200mbit", "grid-lenet-1gbit", "grid-resnet20-1gbit"} <= names
    assert {f"train-{v}" for v in gpu_session.MODEL_VARIANTS} <= names
    for step in steps:  # the flags of the trainer and calibrate steps are what those tools accept today
        if "pipesgd.train" in step.argv:
            config = resolve(step.argv[step.argv.index("pipesgd.train") + 1:])
            assert config.device == "cuda" and config.backend == "gloo" and config.model == "resnet20"
        if "calibrate" in step.argv:
            args = build_parser(COMMANDS).parse_args(step.argv[step.argv.index("pipesgd.measure") + 1:])
            assert args.device == "cuda" and args.backend == "gloo"
        if "--cores-per-node" in step.argv:
            assert step.argv[step.argv.index("--cores-per-node") + 1] == "4"
    assert "check-nccl2" not in {s.name for s in gpu_session.plan(["check"], tmp_path, "cuda", None, gpus=1)}


@pytest.mark.slow
def test_gpu_session_runs_steps_within_the_budget_and_records_each(tmp_path):
    steps = [gpu_session.Step("env", "ok", [sys.executable, "-c", "print('hello')"], 30, 0),
             gpu_session.Step("env", "fails", [sys.executable, "-c", "raise SystemExit(3)"], 30, 0),
             gpu_session.Step("env", "missing", ["/nonexistent/tool"], 30, 0),
             gpu_session.Step("env", "slow", [sys.executable, "-c", "import time; time.sleep(30)"], 1, 0),
             gpu_session.Step("env", "late", [sys.executable, "-c", "pass"], 30, 10_000)]
    assert gpu_session.run_steps(steps, tmp_path, budget_s=120) == 3  # a skipped step is not a failure
    record = {s["name"]: s["result"] for s in json.loads((tmp_path / "session.json").read_text())}
    assert record["ok"] == "ok" and record["fails"] == "exit 3" and record["missing"].startswith("not found")
    assert record["slow"].startswith("timeout") and record["late"].startswith("skipped:")
    assert (tmp_path / "logs" / "ok.log").read_text().endswith("hello\n")
    assert "| env | fails | exit 3 |" in (tmp_path / "session.md").read_text()


def _ar(members: dict[str, bytes]) -> bytes:
    out = b"!<arch>\n"
    for name, data in members.items():
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data + b"\n" * (len(data) % 2)
    return out


def test_deb_unpacking_without_dpkg(tmp_path):
    import io
    import tarfile

    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:xz") as archive:
        info = tarfile.TarInfo("./usr/bin/hello")
        info.size = 5
        archive.addfile(info, io.BytesIO(b"hi!\n\n"))
    deb = tmp_path / "hello_1_amd64.deb"
    deb.write_bytes(_ar({"debian-binary": b"2.0\n", "control.tar.xz": b"x", "data.tar.xz": payload.getvalue()}))
    gpu_session.unpack_deb(deb, tmp_path / "root")
    assert (tmp_path / "root" / "usr" / "bin" / "hello").read_bytes() == b"hi!\n\n"
    (tmp_path / "bad.deb").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="not a Debian package"):
        gpu_session.unpack_deb(tmp_path / "bad.deb", tmp_path / "root")


@pytest.mark.parametrize("script", ["gpu_speed.py", "gpu_contention.py"])
def test_a_switch_interval_must_be_positive(script, tmp_path):
    proc = refusal(script, "--device", "cpu", "--out", str(tmp_path), "--switch-interval-ms", "0")
    assert proc.returncode == 2 and "--switch-interval-ms must be positive" in proc.stderr and \
        len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [(["--stages", "gpu"], "unknown stage gpu"),
                                         (["--debs", "/nonexistent"], "is not a folder"),
                                         (["--budget-s", "0"], "must be positive")])
def test_gpu_session_bad_arguments_are_one_line(args, needle, tmp_path):
    proc = refusal("gpu_session.py", "--dry-run", "--out", str(tmp_path), *args)
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_prepared_gpu_call_runs_every_step_and_packs_its_results(tmp_path):
    """experiments/gpu_next.sh with stand-ins for the GPU machine's tools (python3, pip, nvidia-*: they print their
    arguments): every step runs within the budget, says its exit code, and the results come packed."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("python3", "pip", "nvidia-smi", "nvidia-cuda-mps-control"):
        (tools / name).write_text('#!/bin/sh\necho "$0 $*"\n')
        (tools / name).chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {"PATH": f"{tools}:/usr/bin:/bin", "OUT": str(out), "HOME": str(tmp_path)}
    script = Path(__file__).resolve().parent.parent / "experiments" / "gpu_next.sh"
    proc = subprocess.run(["bash", str(script), "300"], capture_output=True, text=True, timeout=60, env=env,
                          cwd=script.parent.parent)
    assert proc.returncode == 0, proc.stderr
    (packed_path,) = out.glob("*.tgz")  # one tarball, named after the call's folder
    folder = out / packed_path.name.removesuffix(".tgz")
    steps = (folder / "steps.txt").read_text()
    assert steps.count("rc=0") == steps.count("== ") >= 3, steps
    with tarfile.open(packed_path) as packed:
        names = packed.getnames()
    assert f"{folder.name}/speed-mps.log" in names and f"{folder.name}/steps.txt" in names
    assert "--backend nccl" in (folder / "check-nccl1.log").read_text()
    assert "--device cuda" in (folder / "buffer-copies.log").read_text()
    # The last step needs iproute2's packages in .device/debs (carried to the device; git-ignored, so absent in CI).
    if (script.parent.parent / ".device" / "debs").is_dir():
        assert "skip" not in steps and "--cores-per-node 4" in (folder / "pipeline-16cores.log").read_text(), steps
    else:
        (skipped,) = [line for line in steps.splitlines() if "skip" in line]
        assert skipped.startswith("skip pipeline-16cores (") and ".device/debs absent" in skipped, steps


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
