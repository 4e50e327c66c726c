"""Mixed precision under PipeSGD: bf16 autocast as is; fp16 with a GradScaler driven by the wrapper (the delayed
gradient unscaled with its own step's scale, an overflow skipping the same step on every rank), against fp32."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD
from pipesgd.grads.amp import DelayedLossScale
from tests.distributed import run_ranks
from tests.test_pipesgd import batch, make_model

STEPS = 10
OVERFLOW_STEP = 4  # rank 1's loss is made infinite at this step
# Autocast rounds activations and gradients (fp16: 11 significant bits, bf16: 8); over 10 steps of lr 0.1 the
# weights stay within these of the fp32 run (measured worst cases 2.6e-4 and 2.0e-3 with
# tests.test_amp._runs on 2 gloo ranks).
FP16_ATOL = 2e-3
BF16_ATOL = 1e-2


def train(rank: int, precision: str, inject: bool):
    model = make_model(torch.float32)
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12) if precision == "fp16" else None
    opt = PipeSGD(inner, model, width=2, warmup_steps=0,
                  options=PipeSGDOptions(grad_scaler=scaler, nonfinite="skip", max_grad_norm=10.0))
    skipped, scales = [], []
    for t in range(STEPS):
        x, y = batch(t, rank, torch.float32)
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = nn.functional.mse_loss(model(x), y)
        if inject and t == OVERFLOW_STEP and rank == 1:
            loss = loss * float("inf")
        (scaler.scale(loss) if scaler is not None else loss).backward()
        stats = opt.step()
        opt.zero_grad()
        if stats.skipped_nonfinite:
            skipped.append(stats.applied_step)
        scales.append(scaler.get_scale() if scaler is not None else 1.0)
    skipped += [s.applied_step for s in opt.flush() if s.skipped_nonfinite]
    opt.close()
    return skipped, scales, [p.detach().clone() for p in model.parameters()]


def _runs(rank: int, world: int):
    return {(precision, inject): train(rank, precision, inject)
            for precision in ("fp32", "fp16", "bf16") for inject in (False, True) if precision != "bf16" or not inject}


@pytest.mark.slow
def test_fp16_with_a_grad_scaler_skips_an_overflow_on_every_rank_and_tracks_fp32():
    per_rank = run_ranks(_runs, 2)
    for key in per_rank[0]:
        skipped, scales, weights = per_rank[0][key]
        other = per_rank[1][key]
        assert other[0] == skipped and other[1] == scales, key  # the same decision and scale on every rank
        assert all(torch.equal(a, b) for a, b in zip(other[2], weights)), key  # bitwise identical replicas
    fp32 = per_rank[0][("fp32", False)][2]
    for key in [("fp16", False), ("bf16", False)]:
        assert per_rank[0][key][0] == []
        for got, want in zip(per_rank[0][key][2], fp32):
            torch.testing.assert_close(got, want, rtol=0, atol=FP16_ATOL if key[0] == "fp16" else BF16_ATOL)
    skipped, scales, weights = per_rank[0][("fp16", True)]
    assert skipped == [OVERFLOW_STEP]
    # Applied at step OVERFLOW_STEP + 1 (width 2): the scale halves once, then stays (growth interval 2000).
    assert scales[OVERFLOW_STEP] == 2.0**12 and scales[OVERFLOW_STEP + 1:] == [2.0**11] * (STEPS - OVERFLOW_STEP - 1)
    fp32_skipped, _, fp32_weights = per_rank[0][("fp32", True)]
    assert fp32_skipped == [OVERFLOW_STEP]  # fp32 with nonfinite="skip" drops the same step
    for got, want in zip(weights, fp32_weights):
        torch.testing.assert_close(got, want, rtol=0, atol=FP16_ATOL)


class Recorder(torch.optim.SGD):
    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.seen: list[torch.Tensor] = []

    def step(self, closure=None):
        self.seen.append(torch.cat([p.grad.reshape(-1).clone() for group in self.param_groups
                                    for p in group["params"]]))


def test_a_delayed_gradient_is_unscaled_with_the_scale_of_its_own_step():
    """Step 0 was scaled by 8; by the time it is applied the scaler's scale is 4: the optimizer must see g."""
    param = nn.Parameter(torch.ones(3))
    opt = Recorder([param])
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones(()))  # what a loop's first scaler.scale(loss) does: the scale tensor exists
    delayed = DelayedLossScale(scaler, opt)
    delayed.record(0)
    scaler.update(4.0)
    g = torch.tensor([0.5, -1.0, 2.0])
    param.grad = g * 8
    skipped, norm = delayed.apply(0, True, [param], lambda: 1.25)
    assert not skipped and norm == 1.25 and torch.equal(opt.seen[-1], g)
    # An overflow under the current scale skips the step and halves the scale.
    delayed.record(1)
    param.grad = torch.tensor([float("inf"), 0.0, 0.0])
    assert delayed.apply(1, False, [param], lambda: 0.0) == (True, None)
    assert len(opt.seen) == 1 and scaler.get_scale() == 2.0
    # A stale overflow (its scale, 4, is above today's, 2) skips without lowering the scale again.
    delayed.load_state_dict({2: 4.0})
    assert delayed.apply(2, False, [param], lambda: 0.0) == (True, None) and scaler.get_scale() == 2.0
