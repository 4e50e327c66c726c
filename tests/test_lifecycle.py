"""A wrapper's background work ends cleanly however the script ends: close(), garbage collection, or the
interpreter's exit without flush() (issue 35, item 3)."""
from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch import nn

from pipesgd import PipeSGD
from tests.single_process import process_group  # noqa: F401 - a fixture


@pytest.mark.slow
def test_a_torchrun_script_without_flush_exits_cleanly_and_says_what_was_lost(ddp_style_run):
    # tests/ddp_style_script.py under torchrun (tests/conftest.py): width 2, and it ends without flush() or close()
    # with a step in flight; the interpreter's exit must neither abort nor hang.
    _, done = ddp_style_run
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rank 0 done" in out and "rank 1 done" in out
    assert out.count("1 step(s) in flight that were never applied") == 2, out
    assert "terminate called" not in out and "ChildFailedError" not in out


def _stepped_wrapper(width: int) -> PipeSGD:
    model = nn.Linear(3, 1)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=width, warmup_steps=0)
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    return opt


def test_a_dropped_wrapper_warns_about_its_steps_in_flight(process_group):
    opt = _stepped_wrapper(width=2)
    with pytest.warns(RuntimeWarning, match="1 step\\(s\\) in flight that were never applied"):
        del opt
        gc.collect()


def test_close_and_flushed_wrappers_say_nothing(process_group):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        explicit = _stepped_wrapper(width=2)
        explicit.close()  # an explicit close may be an error path: no warning, and none later
        flushed = _stepped_wrapper(width=2)
        flushed.flush()
        del explicit, flushed
        gc.collect()
