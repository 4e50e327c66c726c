"""Every notebook runs top to bottom on a clean clone from committed results, and its committed copy carries the
outputs a reader sees (re-made by ``python -m experiments.harness.notebooks`` after results change)."""
import json
import os

import pytest

from experiments.harness.notebooks import execute, notebook_paths

NOTEBOOKS = notebook_paths()


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
@pytest.mark.slow
def test_notebook_runs_from_committed_results(path):
    pytest.importorskip("nbclient", reason="the notebooks extra is not installed (pip install -e '.[notebooks]')")
    notebook = execute(path)
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_notebook_shows_its_outputs(path):
    with open(path) as handle:
        cells = json.load(handle)["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert code, f"{path} has no code"
    assert all(c.get("outputs") for c in code), f"{path}: a code cell without saved output (re-execute it)"
    assert any(o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})
               for c in code for o in c["outputs"]), f"{path} shows no figure"
