"""Compute loads for the calibration, each ``(call, label)`` whose ``call()`` runs the work once and returns its own
seconds: a trainer model's forward + backward, or a matmul loop when no model is given."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from pipesgd.measure.timing import synchronize
from pipesgd.train.models import build_model, grad_bytes

__all__ = ["Load", "matmul_load", "model_batch", "model_load", "measure_compute"]

Load = tuple[Callable[[], float], str]


def matmul_load(device: torch.device | str = "cpu", n: int = 256) -> Load:
    """One n×n fp32 matmul per call."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)

    def call() -> float:
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(a.device)
        return time.perf_counter() - start

    return call, f"matmul {n}x{n}"


def model_batch(compute: dict,
                device: torch.device | str = "cpu") -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The trainer model that ``compute`` names ({'model', 'input_shape', 'num_classes', 'batch_size'[,
    'hidden']}) on ``device``, and one random batch for it (inputs, labels)."""
    opts = {"hidden": compute["hidden"]} if compute.get("hidden") else {}
    model = build_model(compute["model"], tuple(compute["input_shape"]), compute["num_classes"], **opts).to(device)
    x = torch.randn(compute["batch_size"], *compute["input_shape"], device=device)
    y = torch.randint(0, compute["num_classes"], (compute["batch_size"],), device=device)
    return model, x, y


def model_load(compute: dict, device: torch.device | str = "cpu") -> tuple[Callable[[], float], str, int]:
    """One forward + backward of a trainer model on random data per call, timed (the gradients are dropped after
    the clock stops). ``compute`` = {'model', 'input_shape', 'num_classes', 'batch_size'[, 'hidden']};
    returns (call, label, gradient bytes)."""
    model, x, y = model_batch(compute, device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def call() -> float:
        synchronize(x.device)
        start = time.perf_counter()
        loss_fn(model(x), y).backward()
        synchronize(x.device)
        seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return seconds

    return call, f"{compute['model']} forward+backward, batch {compute['batch_size']}", grad_bytes(model)


def measure_compute(compute: dict, repeats: int = 10, device: torch.device | str = "cpu") -> float:
    """Median seconds of ``model_load``'s forward + backward over ``repeats`` calls after two warm-up calls."""
    call, _, _ = model_load(compute, device)
    times = [call() for _ in range(repeats + 2)]
    return statistics.median(times[2:])
