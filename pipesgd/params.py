"""Which tensors a PipeSGD wrapper communicates, how it knows that a backward pass wrote gradients, and which
parameters got none (``UnusedParameters``: left out of the optimizer's step, as torch and DDP leave them)."""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist


class FreshGradients:
    """Whether a backward wrote gradients since the last ``step()``, and into which parameters (by id)."""

    __slots__ = ("value", "got", "tracking")

    def __init__(self) -> None:
        self.value = False
        self.got: set[int] = set()
        self.tracking = True  # which parameters: only while some are agreed unused (or not agreed yet)

    def mark(self, param: torch.Tensor) -> None:
        self.value = True
        if self.tracking:
            self.got.add(id(param))


class UnusedParameters:
    """The parameters that no rank's backward reached, agreed once at the wrapper's first step (as DDP's
    ``static_graph``: a per-step agreement would be a second collective per step) and hidden from the optimizer
    (``p.grad`` None), so weight decay and momentum leave them as torch alone would. A parameter that a later step
    gives a gradient raises, naming it, since its gradient would be dropped."""

    def __init__(self, params: list[torch.Tensor], names: list[str], group: dist.ProcessGroup | None,
                 world_size: int) -> None:
        self._params, self._names, self._group, self._world_size = params, names, group, world_size
        self.indices: list[int] | None = None  # None until the first step agrees them

    def observe(self, fresh: FreshGradients, step: int) -> None:
        """Read (and clear) which parameters this step's backward reached; the first call agrees the unused set on
        every rank of the group (a small all-reduce), later ones refuse a gradient for an agreed-unused one."""
        if not fresh.tracking:  # every parameter is used: nothing to watch for in later steps
            return
        got, fresh.got = fresh.got, set()
        if self.indices is None:
            # on the parameters' device: NCCL reduces nothing else, gloo takes either
            device = self._params[0].device
            reached = torch.tensor([id(p) in got for p in self._params], dtype=torch.int32, device=device)
            if self._world_size > 1:
                dist.all_reduce(reached, op=dist.ReduceOp.MAX, group=self._group)
            self.indices = [i for i, v in enumerate(reached.tolist()) if not v]
            fresh.tracking = bool(self.indices)  # a backward's hooks then record nothing more
            return
        late = [self._names[i] for i in self.indices if id(self._params[i]) in got]
        if late:
            raise RuntimeError(f"parameter {late[0]!r} got a gradient at step {step} but none on any rank at the "
                               f"wrapper's first step, which fixes the unused parameters (as DDP's static_graph): use "
                               f"it from the first step on, or freeze it (requires_grad=False) before wrapping")

    @contextmanager
    def hidden(self):
        """``p.grad`` None for the unused parameters while the optimizer steps, their gradient (a zero bucket view)
        back afterwards so that ``zero_grad`` and the next backward find the bucket as before."""
        if not self.indices:
            yield
            return
        saved = [(self._params[i], self._params[i].grad) for i in self.indices]
        for p, _ in saved:
            p.grad = None
        try:
            yield
        finally:
            for p, grad in saved:
                p.grad = grad


def communicated_params(optimizer: torch.optim.Optimizer, model_or_params) -> tuple[list, list[str]]:
    """The optimizer's trainable parameters, in the model's order, with their names."""
    if isinstance(model_or_params, torch.nn.parallel.DistributedDataParallel):
        raise TypeError("the model is wrapped in DistributedDataParallel, which would average the gradients a second "
                        "time: pass the unwrapped module (ddp_model.module) to PipeSGD")
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
    if not wanted:
        raise ValueError("no parameter of the optimizer requires a gradient (all are frozen), so PipeSGD would have "
                         "nothing to average, as DDP refuses: unfreeze some (requires_grad=True) or drop the wrapper")
    chosen = [(n, p) for n, p in named if id(p) in wanted]
    seen, params, names = set(), [], []
    for n, p in chosen:  # tied weights appear once
        if id(p) not in seen:
            seen.add(id(p))
            params.append(p)
            names.append(n)
    return params, names
