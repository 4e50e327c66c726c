"""Results of the prepared GPU call (``experiments/gpu_next.sh``) into the committed files, each with the header the
results folder's files open with (command, date, machine, commit, conditions), so a session with a lent GPU spends
its minutes on the findings rather than on copying.

    python experiments/gpu_import.py FILES_AT/gpu13.tgz --commit 1a2b3c4 --call "sixth session, one call"
    python experiments/gpu_import.py gpu13.tgz --commit 1a2b3c4 --dry-run          # what it would write

Each step that ended with exit code 0 has its table copied, and its json where the script writes one; steps that
failed, timed out or were skipped are listed and left out (their logs are in the tarball). ``--commit`` names the
working tree's commit: the device's checkout carries a stale ``.git``, so the tarball cannot say. Traces stay in the
tarball (megabytes; not committed results).
"""
from __future__ import annotations

import re
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser  # noqa: E402
from timing_model.atomic import write_text_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MPS = "under the MPS daemon"
NO_MPS = "no MPS (the daemon was stopped before this step): the processes time-slice the GPU"
CLUSTER = ("no GPU: 4 emulated nodes (network namespaces, tc tbf from bookworm's iproute2 unpacked without dpkg), "
           "4 CPU cores of their own each")


@dataclass(frozen=True)
class StepResult:
    """Where one step of gpu_next.sh leaves its table and where it is committed."""
    source: str        # inside the call's folder
    target: str        # under the repository root
    command: str
    conditions: str


STEPS = {
    "check-gloo": StepResult("check/gpu_check.md", "experiments/results/gpu/gpu_check.md",
                             "python3 experiments/gpu_check.py --device cuda --ranks 4 --out DIR", MPS),
    "speed-mps": StepResult("speed/gpu_speed.md", "experiments/results/gpu/gpu_speed-mps.md",
                            "python3 experiments/gpu_speed.py --device cuda --ranks 4 --out DIR", MPS),
    "profile-mps": StepResult("profile/thread_profile.md", "experiments/results/gpu/thread_profile-mps.md",
                              "python3 experiments/gpu_thread_profile.py --device cuda --ranks 4 --out DIR", MPS),
    "contention-ts": StepResult("contention/gpu_contention.md", "experiments/results/gpu/gpu_contention.md",
                                "python3 experiments/gpu_contention.py --device cuda --ranks 4 --out DIR", NO_MPS),
    "codec-compiled": StepResult("codec/codec_compiled.md",
                                 "experiments/results/codec_compiled/codec_compiled-cuda.md",
                                 "python3 experiments/bench_codec_compiled.py --device cuda --out DIR", NO_MPS),
    "buffer-copies": StepResult("buffers/buffer_copies.md",
                                "experiments/results/bench_buffer_copies/buffer_copies-cuda.md",
                                "python3 experiments/bench_buffer_copies.py --device cuda --out DIR", NO_MPS),
    "check-nccl1": StepResult("check-nccl/gpu_check.md", "experiments/results/gpu/gpu_check-nccl.md",
                              "python3 experiments/gpu_check.py --device cuda --ranks 1 --backend nccl --out DIR",
                              NO_MPS),
    "pipeline-16cores": StepResult("pipeline/200mbit-16cores.md",
                                   "experiments/results/gpu/bench_pipeline-200mbit-16cores-alltoall.md",
                                   "python3 experiments/bench_pipeline.py --bandwidth 200mbit --nodes 4 "
                                   "--cores-per-node 4 --variants q8,q8+ef --baselines - --allreduce alltoall "
                                   "--label 200mbit-16cores --out DIR", CLUSTER),
}
_STEP_LINE = re.compile(r"== (\S+) \(timeout \d+s\) (\d\d:\d\d):\d\dZ")
_RC_LINE = re.compile(r"\s+rc=(\d+) in (\d+)s")


def read_steps(text: str) -> dict[str, tuple[int, str, int]]:
    """steps.txt -> {step: (exit code, start HH:MM UTC, seconds)}; skipped steps are absent."""
    steps, current = {}, None
    for line in text.splitlines():
        if (match := _STEP_LINE.match(line)):
            current = (match.group(1), match.group(2))
        elif (match := _RC_LINE.match(line)) and current is not None:
            steps[current[0]] = (int(match.group(1)), current[1], int(match.group(2)))
            current = None
    return steps


def machine(env: str) -> tuple[str, str]:
    """(the call's date, the machine in words) from env.txt: date, ``nvidia-smi -L``, torch and Python, nproc."""
    lines = [line.strip() for line in env.splitlines() if line.strip()]
    date = next((line for line in lines if re.fullmatch(r"\d{4}-\d\d-\d\d", line)), "date unknown")
    gpu = next((re.sub(r"\s*\(UUID.*", "", line.split(":", 1)[1]).strip() for line in lines
                if line.startswith("GPU 0:")), "GPU unknown")
    torch_line = next((line for line in lines if re.match(r"\d+\.\d+\.\d+", line) and " " in line), "")
    torch_version, cuda, python = (torch_line.split()[:3] + ["?", "?", "?"])[:3]
    cores = next((line for line in reversed(lines) if line.isdigit()), "?")
    return date, (f"lent GPU machine ({gpu}, {cores} CPU cores, Python {python}, torch {torch_version}, CUDA {cuda})")


def with_header(table: str, step: StepResult, start: str, date: str, where: str, commit: str, call: str,
                call_s: str) -> str:
    """``table`` (a script's markdown) with the committed header after its title; a provenance header the script
    wrote itself goes (it names the device's stale checkout)."""
    lines = table.splitlines()
    title, body = lines[0], lines[1:]
    own = ("- command:", "- date:", "- machine:", "- commit:")
    head = [line for line in body[:8] if line.startswith(own)]
    body = [line for line in body if line not in head]
    header = [title, "", f"- command: `{step.command}` (step of `bash experiments/gpu_next.sh`, one device call of "
              f"{call_s})", f"- date: {date} {start} UTC ({call})", f"- machine: {where}", f"- commit: {commit}",
              f"- conditions: {step.conditions}"]
    return "\n".join(header + body).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="gpu_import", description=__doc__)
    parser.add_argument("tarball", help="the call's gpu13.tgz")
    parser.add_argument("--commit", required=True, help="the working tree's commit the call ran")
    parser.add_argument("--call", default="one call", help="which session and call, for the date line")
    parser.add_argument("--root", default=str(ROOT), help="repository root to write under (default: this one)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[0-9a-f]{7,40}", args.commit):
        parser.error(f"--commit: a commit's hex name, got {args.commit!r}")
    try:
        with tarfile.open(args.tarball) as packed:
            files = {m.name: packed.extractfile(m).read().decode() for m in packed.getmembers()
                     if m.isfile() and not m.name.endswith(".gz")}
    except (OSError, tarfile.TarError, UnicodeDecodeError) as error:
        parser.error(f"cannot read {args.tarball}: {error}")
    folder = next((name.split("/")[0] for name in files if name.endswith("/steps.txt")), None)
    if folder is None:
        parser.error(f"{args.tarball} holds no steps.txt: not a gpu_next.sh call")
    steps_text = files[f"{folder}/steps.txt"]
    steps = read_steps(steps_text)
    date, where = machine(files.get(f"{folder}/env.txt", ""))
    done = re.search(r"done in (\d+)s", steps_text)
    call_s = f"{done.group(1)} s" if done else "unknown length"
    for name, step in STEPS.items():
        rc, start, seconds = steps.get(name, (None, "", 0))
        source = files.get(f"{folder}/{step.source}")
        if rc != 0 or source is None:
            why = "skipped" if rc is None else f"exit code {rc}" if rc != 0 else f"no {step.source}"
            print(f"{name}: not imported ({why}; its log: {folder}/{name}.log)")
            continue
        text = with_header(source, step, start, date, where, args.commit, args.call, call_s)
        target = Path(args.root) / step.target
        print(f"{name}: {'would write' if args.dry_run else 'wrote'} {step.target} ({seconds} s on the device)")
        data = files.get(f"{folder}/{step.source.removesuffix('.md')}.json")  # its numbers, where it writes them
        if not args.dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(str(target), text)
            if data is not None:
                write_text_atomic(str(target.with_suffix(".json")), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
