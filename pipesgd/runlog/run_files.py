"""How one run's files are named per rank: metrics ``FILE.jsonl`` / ``FILE.rankN.jsonl``, checkpoints
``DIR/rankN.pt``. The writer, the readers (``pipesgd.runlog.results``, ``timing_model.validation``) and the
checkpoint code all use these functions, so the naming cannot drift. Torch-free.
"""
from __future__ import annotations

import glob
import os
import re

_RANK_SUFFIX = re.compile(r"\.rank(\d+)(?=\.[^.]*$|$)")
_CHECKPOINT_NAME = re.compile(r"rank(\d+)\.pt")


def metrics_path(path: str, rank: int, world_size: int) -> str:
    """``FILE.jsonl`` for a single process, ``FILE.rankN.jsonl`` for rank N of several."""
    if world_size == 1:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext or '.jsonl'}"


def run_name(path: str) -> str:
    """A metrics file's run: its path without ``.rankN`` (``FILE.rank2.jsonl`` -> ``FILE.jsonl``)."""
    return _RANK_SUFFIX.sub("", path)


def rank_of(path: str) -> int | None:
    """N of a ``FILE.rankN.jsonl`` path; None for a single-process file."""
    match = _RANK_SUFFIX.search(path)
    return int(match.group(1)) if match else None


def metrics_files(path: str) -> list[str]:
    """The files of the run written to ``--metrics path``: ``path`` itself if it exists, else its
    ``.rankN`` siblings in rank order."""
    if os.path.exists(path):
        return [path]
    stem, ext = os.path.splitext(path)
    files = [f for f in glob.glob(f"{glob.escape(stem)}.rank*{ext}") if run_name(f) == path]
    return sorted(files, key=lambda f: rank_of(f) or 0)


def checkpoint_path(directory: str, rank: int) -> str:
    """This rank's checkpoint file in ``directory``."""
    return os.path.join(directory, f"rank{rank}.pt")


def checkpoint_ranks(directory: str) -> list[int]:
    """The ranks that have a checkpoint file in ``directory``, sorted."""
    ranks = []
    for path in glob.glob(os.path.join(glob.escape(directory), "rank*.pt")):
        match = _CHECKPOINT_NAME.fullmatch(os.path.basename(path))
        if match:
            ranks.append(int(match.group(1)))
    return sorted(ranks)
