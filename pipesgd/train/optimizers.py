"""The inner torch optimizers by ``--optimizer`` name: a registry of builders from the model and the run's
learning rate, momentum and weight decay (the config validates names against it)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

# nanoGPT's character-level setting: beta2 0.99 rather than its 0.95 for GPT-2, because few tokens per step
# make each gradient noisy and the second moment needs a longer memory.
ADAMW_BETAS = (0.9, 0.99)


def _sgd(model: nn.Module, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)


def _adam(model: nn.Module, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)


def _adamw(model: nn.Module, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with the weight decay as its decoupled decay, applied (as nanoGPT does) to the weight matrices and
    embeddings only: biases and normalisation gains (tensors of fewer than 2 dimensions) are not decayed."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=ADAMW_BETAS)


# momentum is SGD's only (the Adams ignore it)
OPTIMIZERS: dict[str, Callable[[nn.Module, float, float, float], torch.optim.Optimizer]] = {
    "sgd": _sgd, "adam": _adam, "adamw": _adamw,
}


def build_inner_optimizer(name: str, model: nn.Module, lr: float, momentum: float,
                          weight_decay: float) -> torch.optim.Optimizer:
    return OPTIMIZERS[name](model, lr, momentum, weight_decay)
