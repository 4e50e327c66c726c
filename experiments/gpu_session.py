"""Everything the GPU machine is needed for, in one script that fits the device's 10-minute calls.

    python experiments/gpu_session.py --out $OUT --stages env,check,speed                     # call 1 (~8 min)
    python experiments/gpu_session.py --out $OUT --stages model,cluster --debs .device/debs   # call 2
    python experiments/gpu_session.py --dry-run --stages all                                  # the plan only
    python experiments/gpu_session.py --device cpu --out /tmp/s --stages env,model            # CPU smoke run

Stages, in priority order (what each settles):
  env      device, CUDA, torch, cores, root, whether network namespaces can be made (``unshare``)
  check    issue 13 part 3 and issue 10's SyncBatchNorm: ``gpu_check.py``, 4 ranks sharing the GPU over gloo,
           then NCCL at world size 1 (and across GPUs when there are two or more)
  speed    issue 13 part 4: ``gpu_speed.py``, 4 ranks sharing the GPU (LeNet, ResNet-20, ResNet-18)
  model    issue 14 item 3: ``pipesgd-timing calibrate`` on the GPU (4 ranks, gloo on CUDA tensors), then
           ResNet-20 runs (sync, ddp, pipe, pipe+bf16, pipe+q8) that the calibration never sees, then
           ``timing_model validate``
  cluster  issue 13 part 5 and issue 11 on a core per node: iproute2 from ``--debs`` (Debian packages fetched
           elsewhere with ``apt-get download``; unpacked without dpkg), then ``bench_cluster.py --nodes 4
           --bandwidth 1gbit`` and ``bench_pipeline.py --bandwidth 200mbit`` with ``--cores-per-node 4``
  grid     issue 14 on a core per node: the comparison's lenet-1gbit and resnet20-1gbit cells (calibration, every
           variant, the model's error) with ``--cores-per-node 4``: is the LeNet gap the 2 shared cores?
           (run after ``cluster``, or with ``--debs``, where the machine has no ``ip``/``tc``)
Every step runs as a subprocess under its own timeout and the session's ``--budget-s`` (a step that no longer
fits is skipped and says so); its output goes to ``OUT/logs/<step>.log`` and ``OUT/session.md`` / ``.json`` are
rewritten after every step, so a call cut off by the device's limit still returns all that finished.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from experiments.harness.one_line import OneLineParser  # noqa: E402
STAGES = ("env", "check", "speed", "model", "cluster", "grid")
MODEL_VARIANTS = {"sync": ["--mode", "sync"], "ddp": ["--mode", "ddp"], "pipe": ["--mode", "pipe"],
                  "pipe+bf16": ["--mode", "pipe", "--compression", "bf16"],
                  "pipe+q8": ["--mode", "pipe", "--compression", "q8"]}
# unshare(CLONE_NEWNET) through libc (os.unshare needs Python 3.12): can this machine make network namespaces?
NETNS_PROBE = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); rc = libc.unshare(0x40000000); "
               "print('network namespaces: ' + ('ok' if rc == 0 else 'unshare failed: ' + os.strerror(ctypes.get_errno()))); "
               "raise SystemExit(rc != 0)")


@dataclass
class Step:
    """One command of the session."""

    stage: str
    name: str
    argv: list[str]
    timeout_s: float
    min_s: float = 30.0  # skip unless at least this much of the budget is left
    env: dict[str, str] = field(default_factory=dict)  # added to the session's environment
    result: str = ""  # filled in: "ok", "exit N", "timeout", "skipped: ..."
    seconds: float = 0.0


def _py(*args: str) -> list[str]:
    return [sys.executable, *args]


def _torchrun(ranks: int, *args: str) -> list[str]:
    return _py("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *args)


def plan(stages: list[str], out: Path, device: str, debs: str | None, gpus: int) -> list[Step]:
    """The steps of ``stages`` in order; ``device`` cpu shrinks every size for a smoke run."""
    smoke = device == "cpu"
    ranks = 2 if smoke else 4
    steps: list[Step] = []
    if "env" in stages:
        steps += [Step("env", "nvidia-smi", ["nvidia-smi", "-L"], 30, 5),
                  Step("env", "torch", _py("-c", "import os, torch; print('torch', torch.__version__, 'cuda', "
                                           "torch.version.cuda, 'gpus', torch.cuda.device_count(), [torch.cuda."
                                           "get_device_name(i) for i in range(torch.cuda.device_count())], "
                                           "'cores', len(os.sched_getaffinity(0)), 'root', os.geteuid() == 0)"), 60, 5),
                  Step("env", "netns", _py("-c", NETNS_PROBE), 30, 5)]
    if "check" in stages:
        small = ["--hidden", "16", "--steps", "4"] if smoke else []
        steps.append(Step("check", "check-gloo", _py("experiments/gpu_check.py", "--device", device, "--ranks",
                                                     str(ranks), *small, "--out", str(out / "gpu")), 360, 120))
        if not smoke:
            steps.append(Step("check", "check-nccl1", _py("experiments/gpu_check.py", "--device", "cuda", "--ranks",
                                                          "1", "--backend", "nccl", "--out", str(out / "gpu-nccl")),
                              180, 60))
            if gpus >= 2:
                steps.append(Step("check", "check-nccl2", _torchrun(2, "experiments/gpu_check.py", "--device", "cuda",
                                                                    "--backend", "nccl", "--out",
                                                                    str(out / "gpu-nccl2")), 240, 60))
    if "speed" in stages:
        small = ["--models", "lenet", "--batch", "4", "--repeats", "2", "--codec-mb", "1"] if smoke else []
        steps.append(Step("speed", "speed", _py("experiments/gpu_speed.py", "--device", device, "--ranks", str(ranks),
                                                *small, "--out", str(out / "gpu")), 420, 120))
    if "model" in stages:
        steps += model_steps(out / "model", device, ranks, smoke)
    if "cluster" in stages or "grid" in stages:
        steps += cluster_steps(out, debs, smoke, "cluster" in stages, "grid" in stages)
    return steps


def model_steps(folder: Path, device: str, ranks: int, smoke: bool) -> list[Step]:
    """Calibrate on the device, run the workload in each mode, validate the runs against the calibration."""
    model, features = ("mlp", "64") if smoke else ("resnet20", "3072")  # 3072 = a 3x32x32 image, flattened
    batch, steps_per_run = ("16", "8") if smoke else ("64", "60")
    calib = folder / "calib.json"
    steps = [Step("model", "calibrate", _torchrun(
        ranks, "-m", "pipesgd.measure", "calibrate", "--device", device, "--backend", "gloo", "--model", model,
        "--input-shape", features, "--batch-size", batch, "--compressions", "none,bf16,q8",
        "--sizes", "64KB:256KB" if smoke else "64KB:4MB", "--repeats", "3" if smoke else "10", "--out", str(calib)),
        300, 60)]
    for name, flags in MODEL_VARIANTS.items():
        steps.append(Step("model", f"train-{name}", _torchrun(
            ranks, "-m", "pipesgd.train", *flags, "--device", device, "--backend", "gloo", "--model", model,
            "--dataset", "synthetic", "--synthetic-features", features, "--synthetic-samples", "16384",
            "--batch-size", batch, "--steps", steps_per_run, "--warmup-steps", "3" if smoke else "5",
            "--threads", "1", "--eval-every", "0", "--metrics", str(folder / f"{name}.jsonl")), 180, 30))
    # The trainer writes NAME.rankN.jsonl per rank: the shell expands them (the runs that exist: a step skipped or
    # failed must not hide the others), validate groups them into runs.
    runs = " ".join(f"{folder}/{name}.rank*.jsonl" for name in MODEL_VARIANTS)
    steps.append(Step("model", "validate", ["sh", "-c", f"{sys.executable} -m timing_model validate --calibration "
                                                        f"{calib} $(ls {runs} 2>/dev/null)"], 60, 5))
    return steps


def cluster_steps(out: Path, debs: str | None, smoke: bool, benches: bool, grid: bool) -> list[Step]:
    """iproute2 where it is missing, then the cluster benchmarks and / or the grid cells with a node's own cores."""
    nodes, per_node = ("2", "1") if smoke else ("4", "4")
    tools = Path("/tmp/pipesgd-iproute2")  # binaries and library links: not results, so not under OUT
    stage = "cluster" if benches else "grid"
    steps = []
    if debs:
        steps.append(Step(stage, "iproute2", _py(__file__, "--unpack-debs", debs, "--into", str(tools)), 60, 5))
    env = {"PATH": f"{tools / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    if benches:
        quick = ["--quick", "--variants", "none,q8"] if smoke else []
        steps += [Step("cluster", "bench-cluster-1gbit", _py(
            "experiments/bench_cluster.py", "--nodes", nodes, "--bandwidth", "1gbit", "--cores-per-node", per_node,
            "--skip-accuracy", "--steps", "12" if smoke else "40", "--out", str(out / "bench_cluster")), 420, 120, env),
            Step("cluster", "bench-pipeline-200mbit", _py(
                "experiments/bench_pipeline.py", "--bandwidth", "200mbit", "--nodes", nodes, "--cores-per-node",
                per_node, *quick, "--out", str(out / "bench_pipeline")), 480, 120, env)]
    if grid:
        folder = out / "comparison-own-cores"
        small = ["--variants", "sync,pipe", "--steps", "8"] if smoke else []
        for cell, timeout_s in (("lenet-1gbit", 300), ("resnet20-1gbit", 360)):
            steps.append(Step("grid", f"grid-{cell}", _py(
                "experiments/comparison.py", "--cells", cell, "--nodes", nodes, "--cores-per-node", per_node, *small,
                "--result", str(folder / "runs.json"), "--out", str(folder)), timeout_s, 120, env))
    return steps


# -- iproute2 without dpkg -------------------------------------------------------------------------------------
def deb_members(data: bytes) -> dict[str, bytes]:
    """The members of a .deb (an ``ar`` archive): name -> bytes."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not a Debian package (no ar header)")
    members, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        members[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)  # members are 2-byte aligned
    return members


def unpack_deb(path: Path, into: Path) -> None:
    """Extract the package's files (its ``data.tar.*``) under ``into``, as ``dpkg -x`` does."""
    members = deb_members(path.read_bytes())
    data = next((v for k, v in members.items() if k.startswith("data.tar")), None)
    if data is None:
        raise ValueError(f"{path.name}: no data.tar member")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        archive.extractall(into, filter="tar")


def system_sonames() -> set[str]:
    """Shared libraries the system's loader already finds (``ldconfig -p``)."""
    ldconfig = shutil.which("ldconfig") or next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)),
                                                "ldconfig")
    try:
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split()[0] for line in listing.splitlines()[1:] if line.strip()}


def install_iproute2(debs: Path, into: Path) -> str:
    """Unpack every .deb of ``debs`` under ``into``/root and write ``into``/bin/ip and tc wrappers that find the
    libraries the system lacks (only those: the wrappers' library path is inherited by what ``ip netns exec``
    starts, so it must not shadow the system's own). Returns a one-line summary."""
    if all(shutil.which(tool) for tool in ("ip", "tc")):
        return "ip and tc already installed: nothing to do"
    packages = sorted(debs.glob("*.deb"))
    if not packages:
        raise ValueError(f"no .deb files in {debs}")
    root, libs, bin_dir = into / "root", into / "lib", into / "bin"
    for package in packages:
        unpack_deb(package, root)
    libs.mkdir(parents=True, exist_ok=True)
    have = system_sonames()
    private = []
    for found in sorted([*root.glob("usr/lib/*/*.so*"), *root.glob("lib/*/*.so*")]):
        if found.name not in have and not (libs / found.name).exists():
            (libs / found.name).symlink_to(found.resolve())
            private.append(found.name)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool, where in (("ip", ("bin/ip", "sbin/ip", "usr/bin/ip", "usr/sbin/ip")), ("tc", ("sbin/tc", "usr/sbin/tc"))):
        binary = next((root / w for w in where if (root / w).exists()), None)
        if binary is None:
            raise ValueError(f"no {tool} binary in the packages of {debs}")
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH="{libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
                           f'exec "{binary}" "$@"\n')
        wrapper.chmod(0o755)
    version = subprocess.run([str(bin_dir / "ip"), "-V"], capture_output=True, text=True, timeout=30)
    if version.returncode != 0:
        raise ValueError(f"the unpacked ip does not start: {version.stderr.strip()[:200]}")
    return f"{len(packages)} packages unpacked; {version.stdout.strip()}; private libraries: {', '.join(private) or 'none'}"


# -- running -----------------------------------------------------------------------------------------------
def run_steps(steps: list[Step], out: Path, budget_s: float) -> int:
    """Run ``steps`` in order within ``budget_s``; write the session record after each. Failed steps count."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}
    failed = 0
    for step in steps:
        left = deadline - time.monotonic()
        if left < step.min_s:
            step.result = f"skipped: {left:.0f} s of the budget left, needs {step.min_s:.0f}"
        else:
            step.result, step.seconds = _run(step, {**env, **step.env}, logs / f"{step.name}.log", min(step.timeout_s, left))
            failed += step.result != "ok"
        print(f"[gpu_session] {step.stage}/{step.name}: {step.result} ({step.seconds:.0f} s)", flush=True)
        write_record(steps, out)
    return failed


def _run(step: Step, env: dict[str, str], log: Path, timeout_s: float) -> tuple[str, float]:
    start = time.monotonic()
    with open(log, "w") as handle:
        handle.write(" ".join(step.argv) + "\n\n")
        handle.flush()
        try:
            proc = subprocess.run(step.argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, start_new_session=True)
        except FileNotFoundError:
            return f"not found: {step.argv[0]}", time.monotonic() - start
        except subprocess.TimeoutExpired:
            return f"timeout after {timeout_s:.0f} s", time.monotonic() - start
    return ("ok" if proc.returncode == 0 else f"exit {proc.returncode}"), time.monotonic() - start


def write_record(steps: list[Step], out: Path) -> None:
    """``session.md`` (a table) and ``session.json``, each written whole through a temporary file."""
    lines = ["# GPU session", "", f"commit {_commit()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", "",
             "| stage | step | result | seconds | command |", "|---|---|---|---|---|"]
    lines += [f"| {s.stage} | {s.name} | {s.result or 'pending'} | {s.seconds:.0f} | `{' '.join(s.argv[1:])[:160]}` |"
              for s in steps]
    for name, text in (("session.md", "\n".join(lines) + "\n"),
                       ("session.json", json.dumps([asdict(s) for s in steps], indent=2) + "\n")):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="gpu_session", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", default="env,check,speed", help=f"comma list of {', '.join(STAGES)}, or all")
    parser.add_argument("--out", default=os.environ.get("OUT") or "results/gpu_session", help="results folder")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a small smoke run")
    parser.add_argument("--debs", help="folder of iproute2's Debian packages (the cluster stage, where ip/tc lack)")
    parser.add_argument("--budget-s", type=float, default=560.0, help="seconds for all steps (default 560)")
    parser.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    parser.add_argument("--unpack-debs", metavar="DIR", help=argparse.SUPPRESS)  # the cluster stage's first step
    parser.add_argument("--into", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.unpack_debs:
        try:
            print(install_iproute2(Path(args.unpack_debs), Path(args.into or "iproute2").resolve()))
        except (ValueError, OSError, tarfile.TarError) as error:
            print(f"gpu_session: error: {error}", file=sys.stderr)
            return 1
        return 0
    stages = list(STAGES) if args.stages == "all" else [s for s in args.stages.split(",") if s]
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        parser.error(f"unknown stage {', '.join(bad) or repr(args.stages)}; valid: {', '.join(STAGES)}, all")
    if args.debs and not Path(args.debs).is_dir():
        parser.error(f"--debs {args.debs!r} is not a folder")
    if args.budget_s <= 0:
        parser.error("--budget-s must be positive")
    out = Path(args.out).resolve()
    gpus = _gpu_count() if args.device == "cuda" else 0
    steps = plan(stages, out, args.device, str(Path(args.debs).resolve()) if args.debs else None, gpus)
    if args.dry_run:
        for step in steps:
            print(f"{step.stage}/{step.name} (<= {step.timeout_s:.0f} s): {' '.join(step.argv)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    failed = run_steps(steps, out, args.budget_s)
    print((out / "session.md").read_text())
    return 1 if failed else 0


def _gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - the plan only needs a count; torch errors show up in the env stage
        return 0


if __name__ == "__main__":
    sys.exit(main())
