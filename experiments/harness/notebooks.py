"""Executing the notebooks: CI runs each one top to bottom (``tests/test_notebooks.py``); after new results are
committed, ``python -m experiments.harness.notebooks`` re-executes them in place so their saved outputs (the figures a
reader sees on the forge) match the committed results.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

__all__ = ["NOTEBOOKS_DIR", "notebook_paths", "execute", "main"]

NOTEBOOKS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                             "notebooks")
CELL_TIMEOUT_S = 300


def notebook_paths(directory: str = NOTEBOOKS_DIR) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "*.ipynb")))


def execute(path: str, save: bool = False):
    """Run every cell of ``path`` in a fresh python3 kernel with ``notebooks/`` as working directory; the
    executed notebook (written back in place, atomically, when ``save``). A failing cell raises."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}})
    client.execute()
    if save:
        from timing_model.atomic import write_text_atomic

        write_text_atomic(path, nbformat.writes(notebook) + "\n")
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebooks", nargs="*", help="notebooks to execute (default: all in notebooks/)")
    parser.add_argument("--check", action="store_true", help="execute without writing the outputs back")
    args = parser.parse_args(argv)
    paths = args.notebooks or notebook_paths()
    for path in paths:
        print(f"executing {path}", file=sys.stderr, flush=True)
        try:
            execute(path, save=not args.check)
        except Exception as error:  # a failing cell: name the notebook and the error in one line
            first = str(error).strip().splitlines()
            print(f"notebooks: error: {path}: {type(error).__name__}: {first[-1] if first else ''}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
