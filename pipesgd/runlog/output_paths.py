"""Checks that an output path can be written, made before any work starts, so that a long run never fails at its end
over a path. Torch-free. Missing directories are fine; refused, with a ``ValueError`` naming the flag: a directory
where a file is expected and the reverse, an existing file that cannot be written, and a place where no file can
be created."""
from __future__ import annotations

import os
import tempfile

__all__ = ["check_output_file", "check_output_dir"]


def check_output_file(path: str, flag: str) -> None:
    """``path`` can be written as a file (created, or replaced / appended to)."""
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a directory, expected a file")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {path}: the file is not writable")
    _check_can_create_in(os.path.dirname(os.path.abspath(path)), f"{flag} {path}")


def check_output_dir(path: str, flag: str) -> None:
    """``path`` is, or can be made, a directory that files can be created in."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a file, expected a directory")
    _check_can_create_in(os.path.abspath(path), f"{flag} {path}")


def _check_can_create_in(directory: str, what: str) -> None:
    """The nearest existing ancestor of ``directory`` (itself, if it exists) is a directory a file can be created
    in. Probed by creating and removing a file: ``os.access`` answers yes to root on /proc."""
    existing = directory
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{what}: {existing} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".pipesgd-probe-", dir=existing)
    except OSError as exc:
        raise ValueError(f"{what}: cannot create a file in {existing} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)
