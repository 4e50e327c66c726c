"""Atomic file writes: a temp file in the target's directory, flushed and fsynced, then renamed over it.

Readers (and a crash at any moment) see either the old file or the whole new one, never half a file.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from typing import IO, Iterator


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
