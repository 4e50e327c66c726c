"""Which tensors a PipeSGD wrapper communicates, and how it knows that a backward pass wrote gradients."""
from __future__ import annotations

import torch


class FreshGradients:
    """Whether a backward wrote gradients since the last ``step()``."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False

    def mark(self, _param: torch.Tensor) -> None:
        self.value = True


def communicated_params(optimizer: torch.optim.Optimizer, model_or_params) -> tuple[list, list[str]]:
    """The optimizer's trainable parameters, in the model's order, with their names."""
    if isinstance(model_or_params, torch.nn.Module):
        named = list(model_or_params.named_parameters())
    else:
        named = [(f"param{i}", p) for i, p in enumerate(model_or_params)]
    if not named:
        raise ValueError("the model has no parameters")
    in_model = {id(p) for _, p in named}
    in_optimizer = [p for g in optimizer.param_groups for p in g["params"]]
    foreign = [p for p in in_optimizer if id(p) not in in_model]
    if foreign:
        raise ValueError(f"the optimizer holds {len(foreign)} parameter(s) that are not in the model")
    wanted = {id(p) for p in in_optimizer if p.requires_grad}
    chosen = [(n, p) for n, p in named if id(p) in wanted]
    seen, params, names = set(), [], []
    for n, p in chosen:  # tied weights appear once
        if id(p) not in seen:
            seen.add(id(p))
            params.append(p)
            names.append(n)
    return params, names
