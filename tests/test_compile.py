"""A ``torch.compile``d model under PipeSGD on CPU: the same losses as the eager model (slow: compiling)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD
from tests.test_buffers import make_bn_model
from tests.test_pipesgd import batch
from tests.single_process import process_group  # noqa: F401 - a fixture

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("process_group")]  # a group of one
STEPS = 6


def _compile_works() -> str | None:
    """None if torch.compile runs here, else why not (no C++ compiler for inductor, say)."""
    try:
        torch.compile(lambda v: v * 2 + 1)(torch.ones(2))
        return None
    except Exception as error:  # noqa: BLE001 - any failure means the feature is unavailable here
        return f"torch.compile is unavailable: {str(error).splitlines()[0][:120]}"


def losses(compiled: bool) -> list[float]:
    model = make_bn_model().float()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=2, warmup_steps=1,
                  options=PipeSGDOptions(max_grad_norm=1.0))
    forward = torch.compile(model) if compiled else model
    out = []
    for t in range(STEPS):
        x, y = batch(t, 0, torch.float32)
        loss = nn.functional.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(float(loss.detach()))
    opt.flush()
    return out


def test_a_compiled_model_trains_like_the_eager_one():
    reason = _compile_works()
    if reason is not None:
        pytest.skip(reason)
    eager, compiled = losses(False), losses(True)
    # Inductor fuses and reorders float32 arithmetic, so the losses agree to rounding, not bit for bit.
    assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-6)
