"""Start one process per node, stream their output as ``[node i] …``, and stop them all together.

Rules:
1. Each node's command starts in its own session (process group); its stdout+stderr go to one pipe.
2. If a node exits non-zero, the others are stopped; a timeout or an interrupt (Ctrl-C, SIGTERM turned
   into KeyboardInterrupt/SystemExit by the caller) stops everyone too.
3. Stopping = SIGTERM to every node's process group and every descendant (torchrun puts its workers
   in sessions of their own, so the group alone is not enough), ``grace_s`` to exit, then SIGKILL.
4. The result is the worst exit code among nodes that ended on their own (signals as 128+n); nodes we
   stopped do not count, so the first failure's code is what comes back. Timeout → 124.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import TextIO

TIMEOUT_EXIT = 124
POLL_S = 0.05


def exit_code(returncode: int) -> int:
    """Shell convention: a process killed by signal n reports 128 + n."""
    return 128 - returncode if returncode < 0 else returncode


def descendants(root_pid: int) -> list[int]:
    """All live descendants of ``root_pid`` (read from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, frontier = [], [root_pid]
    while frontier:
        nxt = [c for p in frontier for c in children.get(p, [])]
        found.extend(nxt)
        frontier = nxt
    return found


def _signal(pids: list[int], groups: list[int], sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_all(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Rule 3: SIGTERM every tree still running, wait up to ``grace_s``, SIGKILL what is left. The descendants are listed
    while each leader is alive (a reaped leader's pid could be reused) and kept for the SIGKILL round, since leaders
    that exit on SIGTERM orphan their children."""
    groups = [p.pid for p in procs]  # start_new_session=True: pgid == leader pid
    tree = [pid for p in procs if p.poll() is None for pid in descendants(p.pid)]
    _signal(tree, groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    tree += [pid for p in procs if p.poll() is None for pid in descendants(p.pid)]
    _signal(tree, groups, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass


def _pump(index: int, stream, out: TextIO, lock: threading.Lock) -> None:
    prefix = f"[node {index}] "
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        with lock:
            out.write(prefix + line + "\n")
            out.flush()
    stream.close()


def _say(out: TextIO, lock: threading.Lock, message: str) -> None:
    with lock:
        out.write(message + "\n")
        out.flush()


def supervise(commands: list[tuple[list[str], dict[str, str]]], *, timeout_s: float | None = None,
              out: TextIO | None = None, err: TextIO | None = None, grace_s: float = 5.0) -> int:
    """Run ``commands`` (one ``(argv, env)`` per node) to completion under the rules above."""
    out = out or sys.stdout
    err = err or sys.stderr
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    own_codes: dict[int, int] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        # Rule 1
        for i, (argv, env) in enumerate(commands):
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(p)
            t = threading.Thread(target=_pump, args=(i, p.stdout, out, lock), daemon=True)
            t.start()
            pumps.append(t)
        # Rule 2
        while len(own_codes) < len(procs):
            for i, p in enumerate(procs):
                if i not in own_codes and p.poll() is not None:
                    own_codes[i] = exit_code(p.returncode)
                    if own_codes[i] != 0:
                        _say(err, lock, f"pipesgd-cluster: node {i} exited with code {own_codes[i]}; "
                                        "stopping the other nodes")
                        return max(own_codes.values())
            if deadline is not None and time.monotonic() > deadline:
                _say(err, lock, f"pipesgd-cluster: timeout after {timeout_s:g} s; stopping all nodes")
                return TIMEOUT_EXIT
            time.sleep(POLL_S)
        return max(own_codes.values(), default=0)
    except BaseException:
        _say(err, lock, "pipesgd-cluster: interrupted; stopping all nodes")
        raise
    finally:
        # Rule 3 (a no-op for nodes that already ended and left nothing behind)
        stop_all(procs, grace_s)
        for t in pumps:
            t.join(timeout=2.0)
