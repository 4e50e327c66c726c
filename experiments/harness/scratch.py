"""A benchmark's folder of raw run files (metrics, traces, the training log): a trainer refuses to write over a
metrics file, so a folder that holds an earlier sitting's runs is refused before any run starts, in one line."""
from __future__ import annotations

import glob
import os

__all__ = ["earlier_runs_problem"]


def earlier_runs_problem(directory: str, flag: str) -> str | None:
    """Why ``directory`` cannot take a new sitting's run files (it holds ``*.jsonl`` metrics), or None."""
    found = sorted(glob.glob(os.path.join(directory, "*.jsonl")))
    if not found:
        return None
    return (f"{flag} {directory} already holds an earlier sitting's runs ({os.path.basename(found[0])}"
            f"{f' and {len(found) - 1} more' if len(found) > 1 else ''}): choose another {flag} or remove them")
