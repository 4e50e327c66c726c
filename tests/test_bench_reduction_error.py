"""experiments/bench_reduction_error.py: which steps a cell averages, and the tables it prints, on synthetic
records (the measurement itself runs p gloo ranks for minutes; its committed result is its test)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "bench_reduction_error.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_reduction_error", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(p: int, algorithm: str, feedback: bool, errors: list[float], accumulated: float = 0.0) -> dict:
    return {"p": p, "data": "gradient-like", "numel": 8, "codec": "q8", "feedback": feedback, "algorithm": algorithm,
            "errors": errors, "accumulated": accumulated}


def test_feedback_cells_skip_the_first_step_which_has_no_residual_yet():
    bench = _module()
    assert bench.per_step(record(2, "ring", False, [0.1, 0.2, 0.3])) == pytest.approx(0.2)
    assert bench.per_step(record(2, "ring", True, [0.9, 0.2, 0.4])) == pytest.approx(0.3)


def test_tables_put_ring_and_alltoall_side_by_side_per_world_size():
    bench = _module()
    records = [record(p, a, f, [0.01 * p + (0.001 if a == "alltoall" else 0)] * 2, 0.005)
               for p in (2, 4) for a in ("ring", "alltoall") for f in (False, True)]
    lines = bench.tables(records, [2, 4], 2).splitlines()
    assert "| data | codec | feedback | p=2 ring | p=2 alltoall | p=4 ring | p=4 alltoall |" in lines
    assert "| gradient-like | q8 | off | 2.000 | 2.100 | 4.000 | 4.100 |" in lines
    assert "| gradient-like | q8 | 0.500 | 0.500 | 0.500 | 0.500 |" in lines  # accumulated, feedback rows only
