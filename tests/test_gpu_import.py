"""experiments/gpu_import.py: a prepared GPU call's tarball into the committed result files, with their headers."""
from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = """== check-gloo (timeout 110s) 07:01:05Z
   rc=0 in 31s
== speed-mps (timeout 150s) 07:01:36Z
   rc=124 in 150s
== profile-mps (timeout 90s) 07:04:06Z
   rc=0 in 44s
skip contention-ts (12s left)
done in 401s
"""
ENV = """2026-12-01
GPU 0: NVIDIA H200 (UUID: GPU-1234)
2.11.0+cu130 13.0 3.12.3 (main, Apr 10 2026) [GCC 13.3.0]
abc1234 an old commit
16
MPS on
"""
CHECK = ("# GPU path correctness\n\ndevice: NVIDIA H200; gloo, 4 rank(s)\n\n"
         "| check | result |\n|---|---|\n| a | PASS |\n")
PROFILE = ("# One Pipe-SGD step's host time, thread by thread\n- command: `stale`\n- commit: abc1234\n\n"
           "| thread | CPU ms |\n|---|---|\n| training | 1.0 |\n")


def _tarball(path: Path) -> None:
    with tarfile.open(path, "w:gz") as packed:
        for name, text in {"gpu13/steps.txt": STEPS, "gpu13/env.txt": ENV, "gpu13/check/gpu_check.md": CHECK,
                           "gpu13/check/gpu_check.json": '{"rows": []}\n', "gpu13/speed/gpu_speed.md": "# x\n",
                           "gpu13/profile/thread_profile.md": PROFILE}.items():
            data = text.encode()
            member = tarfile.TarInfo(name)
            member.size = len(data)
            packed.addfile(member, io.BytesIO(data))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "gpu_import.py"), *args], capture_output=True,
                          text=True, timeout=60)


def test_a_call_is_imported_with_headers_and_failed_or_skipped_steps_are_left_out(tmp_path):
    _tarball(tmp_path / "gpu13.tgz")
    proc = _run(str(tmp_path / "gpu13.tgz"), "--commit", "5f39bed", "--call", "sixth session, one call",
                "--root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    check = (tmp_path / "experiments/results/gpu/gpu_check.md").read_text()
    assert check.startswith("# GPU path correctness\n\n- command: `python3 experiments/gpu_check.py --device cuda "
                            "--ranks 4 --out DIR` (step of `bash experiments/gpu_next.sh`, one device call of 401 s)\n")
    assert "- date: 2026-12-01 07:01 UTC (sixth session, one call)\n" in check
    assert ("- machine: lent GPU machine (NVIDIA H200, 16 CPU cores, Python 3.12.3, torch 2.11.0+cu130, CUDA 13.0)"
            in check)
    assert "- commit: 5f39bed\n- conditions: under the MPS daemon\n" in check and check.endswith("| a | PASS |\n")
    assert (tmp_path / "experiments/results/gpu/gpu_check.json").read_text() == '{"rows": []}\n'
    profile = (tmp_path / "experiments/results/gpu/thread_profile-mps.md").read_text()
    assert "stale" not in profile and "abc1234" not in profile and "| training | 1.0 |" in profile
    assert not (tmp_path / "experiments/results/gpu/gpu_speed-mps.md").exists()  # timed out: rc 124
    assert "speed-mps: not imported (exit code 124" in proc.stdout
    assert "contention-ts: not imported (skipped" in proc.stdout


def test_a_dry_run_writes_nothing_and_bad_input_is_one_line(tmp_path):
    _tarball(tmp_path / "gpu13.tgz")
    proc = _run(str(tmp_path / "gpu13.tgz"), "--commit", "5f39bed", "--root", str(tmp_path), "--dry-run")
    assert proc.returncode == 0 and "would write experiments/results/gpu/gpu_check.md" in proc.stdout
    assert not (tmp_path / "experiments").exists()
    for args, needle in [((str(tmp_path / "gpu13.tgz"), "--commit", "HEAD"), "--commit: a commit's hex name"),
                         ((str(tmp_path / "none.tgz"), "--commit", "5f39bed"), "cannot read")]:
        proc = _run(*args, "--root", str(tmp_path))
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
