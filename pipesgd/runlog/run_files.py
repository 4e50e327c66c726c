"""How one run's checkpoints are named per rank: ``DIR/rankN.pt``. The writer and the resume code both use these
functions, so the naming cannot drift; the metrics files' names are ``timing_model.run_metrics``'s.
"""
from __future__ import annotations

import glob
import os
import re

_CHECKPOINT_NAME = re.compile(r"rank(\d+)\.pt")


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
