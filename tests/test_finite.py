"""The fast finiteness check must give exactly the elementwise answer, including when a finite sum overflows."""
import math

import pytest
import torch

from pipesgd.grads.finite import all_finite, l2_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_bad_element_anywhere_is_found(dtype, bad):
    for where in (0, 517, 4095):
        t = torch.randn(4096).to(dtype)
        t[where] = bad
        assert all_finite(t) is False


def test_opposite_infinities_whose_sum_is_nan_are_found():
    assert all_finite(torch.tensor([float("inf"), float("-inf"), 1.0])) is False


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finite_values_whose_sum_overflows_are_finite(dtype):
    t = torch.full((8,), 3e38, dtype=dtype)
    assert not math.isfinite(float(t.sum(dtype=torch.float32)))  # the sum alone would call this bad
    assert all_finite(t) is True
    assert all_finite(torch.cat([t, -t])) is True


def test_ordinary_and_empty_tensors_are_finite():
    assert all_finite(torch.randn(100_000)) is True
    assert all_finite(torch.empty(0)) is True


def test_l2_norm_matches_float64_and_survives_fp32_overflow():
    t = torch.randn(10_000)
    assert l2_norm(t) == pytest.approx(float(torch.linalg.vector_norm(t.double())), rel=1e-5)
    big = torch.full((4,), 1e20)  # squares overflow fp32
    assert l2_norm(big) == pytest.approx(2e20, rel=1e-6)
    assert l2_norm(torch.tensor([1.0, float("inf")])) == float("inf")
    assert math.isnan(l2_norm(torch.tensor([1.0, float("nan")])))
