"""run_in_process(script, *args): an experiment script run as ``python script args`` inside the test's interpreter,
for the checks that it refuses bad input in one line with exit status 2 before any work, or only reads a result.

A script's own interpreter spends seconds importing torch before it reads its first flag; here the imports are
the test session's, so a refusal costs what parsing costs. The result is a ``subprocess.CompletedProcess`` as
``subprocess.run(..., capture_output=True, text=True)`` gives: the exit status (``sys.exit``'s code, 1 with the
traceback on stderr for an uncaught error), and what the script printed. ``sys.argv``, ``sys.path``, the working
directory, the environment and torch's thread count are put back afterwards. Runs that start ranks or do the work
stay real subprocesses: a refusal that slipped through would start them here.
"""
from __future__ import annotations

import contextlib
import io
import os
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

import torch


def run_in_process(script: str | Path, *args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    argv = [str(script), *args]
    out, err = io.StringIO(), io.StringIO()
    saved = (sys.argv, list(sys.path), os.getcwd(), dict(os.environ), torch.get_num_threads())
    try:
        sys.argv = list(argv)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = _run(argv[0])
    finally:
        sys.argv, sys.path[:], _ = saved[0], saved[1], os.chdir(saved[2])
        os.environ.clear()
        os.environ.update(saved[3])
        torch.set_num_threads(saved[4])
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def _run(path: str) -> int:
    """The exit status of running ``path`` as ``__main__``, as the interpreter would report it."""
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)  # sys.exit("message"), as the interpreter prints it
        return 1
    except Exception:  # noqa: BLE001 - reported as the interpreter reports it
        traceback.print_exc()
        return 1
    return 0
