"""The inner torch optimizers by ``--optimizer`` name: a registry of builders from the model and the run's
learning rate, momentum and weight decay (the config validates names against it)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pipesgd.muon_adamw import MuonAdamW, hidden_matrices

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


def _muon(model: nn.Module, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    """torch's Muon on the hidden layers' weight matrices and AdamW (as ``_adamw``'s) on the rest, as one optimizer
    (``pipesgd.muon_adamw``): the same rate and decoupled decay for both, Muon's update scaled to AdamW's size
    ("match_rms_adamw"), Muon's own Nesterov momentum 0.95. The embeddings, the head and every other matrix are
    decayed; biases and normalisation gains are not. A model without hidden matrices trains with AdamW alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    hidden = {id(p) for p in hidden_matrices(model)}
    groups = [{"params": [p for p in params if id(p) in hidden], "use_muon": True},
              {"params": [p for p in params if id(p) not in hidden and p.dim() >= 2], "use_muon": False},
              {"params": [p for p in params if p.dim() < 2], "use_muon": False, "weight_decay": 0.0}]
    return MuonAdamW([g for g in groups if g["params"]], lr=lr, weight_decay=weight_decay, betas=ADAMW_BETAS)


# momentum is SGD's only (the Adams ignore it, and Muon keeps its own)
OPTIMIZERS: dict[str, Callable[[nn.Module, float, float, float], torch.optim.Optimizer]] = {
    "sgd": _sgd, "adam": _adam, "adamw": _adamw, "muon": _muon,
}


def build_inner_optimizer(name: str, model: nn.Module, lr: float, momentum: float,
                          weight_decay: float) -> torch.optim.Optimizer:
    return OPTIMIZERS[name](model, lr, momentum, weight_decay)
