"""``torch.nn.SyncBatchNorm`` on CPU tensors, for tests only: its five batch-norm kernels in plain torch.

SyncBatchNorm trains on GPU tensors only: its module refuses CPU input, and the kernels its autograd function
calls (``torch.batch_norm_stats`` and four more) have no CPU implementation. Everything else it does, the
``all_gather`` of the statistics in forward and the ``all_reduce`` in backward on the caller's group, is what
could collide with PipeSGD's background ring, and that runs on gloo with CPU tensors as it does with CUDA ones.
``cpu_sync_batchnorm()`` supplies the kernels (the formulas of ATen's CUDA ones, the biased batch variance
for normalising and the unbiased one for the running variance) and lets the module take CPU input, so the
real module and autograd function run in CI; ``experiments/gpu_check.py`` runs them on a GPU with the real kernels.
"""
from __future__ import annotations

import contextlib
from unittest import mock

import torch
from torch import nn

__all__ = ["cpu_sync_batchnorm"]


def _per_channel(t: torch.Tensor) -> torch.Tensor:
    """(N, C, *) -> (C, N * prod(*)): one row per channel."""
    return t.transpose(0, 1).reshape(t.size(1), -1)


def _broadcastable(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(1, -1, *([1] * (like.dim() - 2)))


def batch_norm_stats(x, eps):
    rows = _per_channel(x)
    mean = rows.mean(1)
    return mean, (rows.var(1, unbiased=False) + eps).rsqrt()


def batch_norm_gather_stats_with_counts(x, means, invstds, running_mean, running_var, momentum, eps, counts):
    counts = counts.to(means.dtype).view(-1, 1)
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    variances = invstds.pow(-2) - eps  # each rank's biased variance
    var = (counts * (variances + (means - mean).pow(2))).sum(0) / total
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_(momentum * mean)
    if running_var is not None:
        running_var.mul_(1 - momentum).add_(momentum * var * total / (total - 1))
    return mean, (var + eps).rsqrt()


def batch_norm_elemt(x, weight, bias, mean, invstd, eps):
    out = (x - _broadcastable(mean, x)) * _broadcastable(invstd, x)
    if weight is not None:
        out = out * _broadcastable(weight, x)
    return out + _broadcastable(bias, x) if bias is not None else out


def batch_norm_backward_reduce(grad_out, x, mean, invstd, weight, input_g, weight_g, bias_g):
    dy, xmu = _per_channel(grad_out), _per_channel(x) - mean.view(-1, 1)
    sum_dy, sum_dy_xmu = dy.sum(1), (dy * xmu).sum(1)
    grad_weight = sum_dy_xmu * invstd if weight_g else None
    return sum_dy, sum_dy_xmu, grad_weight, (sum_dy if bias_g else None)


def batch_norm_backward_elemt(grad_out, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    n = count.sum().to(x.dtype)
    scale = invstd if weight is None else invstd * weight
    mean_dy, mean_dy_xmu = _broadcastable(sum_dy / n, x), _broadcastable(invstd.pow(2) * sum_dy_xmu / n, x)
    return (grad_out - mean_dy - (x - _broadcastable(mean, x)) * mean_dy_xmu) * _broadcastable(scale, x)


KERNELS = (batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_elemt, batch_norm_backward_reduce,
           batch_norm_backward_elemt)


@contextlib.contextmanager
def cpu_sync_batchnorm():
    """Within the block, SyncBatchNorm modules train on CPU tensors with the kernels above."""
    accept_cpu = mock.patch.object(torch._C, "_get_privateuse1_backend_name", lambda: "cpu")
    original_forward = nn.SyncBatchNorm.forward

    def forward(self, input):
        # The module's device check is the only place CPU input is refused; the name is patched just for it.
        with accept_cpu:
            return original_forward(self, input)

    with contextlib.ExitStack() as stack:
        for kernel in KERNELS:
            stack.enter_context(mock.patch.object(torch, kernel.__name__, kernel))
        stack.enter_context(mock.patch.object(nn.SyncBatchNorm, "forward", forward))
        yield
