"""Committed results: small JSON files under ``experiments/results/`` that notebooks and the README read, each
carrying where it came from (the command, the date, the machine, the commit) so every figure can be traced.

Experiments write them with ``write_result`` (atomically: a crash leaves the previous file whole); notebooks
and figure scripts find them with ``find_results`` from the repository root or from ``notebooks/``.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

from timing_model.atomic import write_text_atomic

__all__ = ["RESULTS_SUBDIR", "provenance", "markdown_header", "write_result", "read_result", "find_results"]

RESULTS_SUBDIR = os.path.join("experiments", "results")


_CHECKOUT = os.path.dirname(os.path.abspath(__file__))  # git runs here: the checkout the package runs from


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=_CHECKOUT)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    # only the trailing newline goes: `status --porcelain` lines start with a space (" M path")
    return done.stdout.rstrip() if done.returncode == 0 else ""


def _commit() -> str:
    """HEAD of the checkout the package runs from, ``+dirty`` when tracked files differ from it (the result
    then came from code that no commit holds), ``unknown`` outside a git checkout."""
    head = _git("rev-parse", "--short=12", "HEAD")
    if not head:
        return "unknown"
    changed = [line[3:] for line in _git("status", "--porcelain", "--untracked-files=no").splitlines()]
    # results being written (and figures drawn from them) are not code: only other changes make a result dirty
    code = [path for path in changed if not path.startswith((RESULTS_SUBDIR + "/", "experiments/figures/"))]
    return head + ("+dirty" if code else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _machine() -> dict:
    machine = {"cpu": _cpu_model(), "cores": os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
               "python": platform.python_version()}
    try:
        import torch

        machine["torch"] = torch.__version__
        if torch.cuda.is_available():
            machine["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return machine


def provenance(command: list[str] | None = None) -> dict:
    """Where a result comes from: ``command`` (default: this process's), UTC date, machine, commit."""
    argv = command if command is not None else [os.path.relpath(sys.argv[0]) if sys.argv[0] else "python",
                                                *sys.argv[1:]]
    return {"command": shlex.join(argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": _machine(), "commit": _commit()}


def markdown_header(title: str, origin: dict) -> str:
    """The top of a committed markdown result: ``title`` and where it comes from (``provenance()``)."""
    machine = ", ".join(f"{key} {value}" for key, value in origin["machine"].items())
    return (f"# {title}\n\n- command: `{origin['command']}`\n- date: {origin['date']}\n- machine: {machine}\n"
            f"- commit: {origin['commit']}\n")


def write_result(path: str, data: dict, origin: dict | None = None) -> None:
    """Write ``data`` as JSON with a ``provenance`` entry (``origin``, else this process's) atomically."""
    if "provenance" in data:
        raise ValueError("data already has a 'provenance' entry; pass it as origin")
    record = {"provenance": origin if origin is not None else provenance(), **data}
    write_text_atomic(path, json.dumps(record, indent=1, sort_keys=False) + "\n")


def read_result(path: str) -> dict:
    """A committed result; raises ``ValueError`` for a file without provenance (not one of ours)."""
    with open(path) as handle:
        data = json.load(handle)
    if not isinstance(data, dict) or "provenance" not in data:
        raise ValueError(f"{path}: not a committed result (no 'provenance' entry)")
    return data


def find_results(name: str, start: str | None = None) -> str:
    """Path of ``experiments/results/<name>`` looked up from ``start`` (default: cwd) and its parents, so a
    notebook finds it whether run from ``notebooks/`` or the repository root."""
    here = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(here, RESULTS_SUBDIR, name)
        if os.path.exists(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            raise FileNotFoundError(f"no {os.path.join(RESULTS_SUBDIR, name)} in {start or os.getcwd()} "
                                    "or its parents (run from the repository or notebooks/)")
        here = parent
