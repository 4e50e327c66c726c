"""Atomic file writes: a temp file in the target's directory, flushed and fsynced, then renamed over it.

Readers (and a crash at any moment) see either the old file or the whole new one, never half a file. The file
gets the permissions ``open(path, "w")`` would give it: an existing file's own, else 0666 less the umask.
"""
from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from typing import IO, Iterator


def _umask() -> int:
    """The process umask: read from /proc where Linux reports it (changing it, even for an instant, would race
    with other threads creating files), else set and restored at once."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: str) -> int:
    """What ``open(path, "w")`` leaves: the existing file's permission bits, or 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


@contextmanager
def atomic_open(path: str, mode: str = "w") -> Iterator[IO]:
    """``with atomic_open(path, "w" or "wb") as f:`` — ``path`` appears only if the block succeeds."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', got {mode!r}")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode) as handle:
            os.fchmod(fd, _mode_for(path))  # mkstemp makes 0600 files: private results nobody asked for
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)
