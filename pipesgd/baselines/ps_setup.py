"""Setup helpers of the parameter-server wrapper: which parameters, re-pointing an optimizer, the group timeout,
sharing the servers' weights with every rank."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


class NullLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def check_params(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[torch.Tensor]:
    """The trainable parameters, in model order; they must be exactly the optimizer's (frozen ones are left out)."""
    opt_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    model_params = list(model.parameters())
    model_ids = {id(p) for p in model_params}
    if not opt_ids <= model_ids:
        raise ValueError(f"the optimizer holds {len(opt_ids - model_ids)} tensor(s) that are not parameters of the model")
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in opt_ids]
    if missing:
        raise ValueError(f"trainable model parameters missing from the optimizer: {missing[:5]}")
    return [p for p in model_params if id(p) in opt_ids and p.requires_grad]


def repoint(optimizer: torch.optim.Optimizer, old: list[torch.Tensor], new: list[torch.Tensor]) -> None:
    """Make the optimizer update ``new[i]`` where it updated ``old[i]``, carrying its state along."""
    swap = {id(o): n for o, n in zip(old, new)}
    for group in optimizer.param_groups:
        group["params"] = [swap.get(id(p), p) for p in group["params"]]
    for o, n in zip(old, new):
        if o in optimizer.state:
            optimizer.state[n] = optimizer.state.pop(o)


def default_timeout() -> timedelta | None:
    """The default group's timeout, so the PS group gives up when the trainer's collectives would."""
    try:
        return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout
    except Exception:  # noqa: BLE001 - private API; fall back to torch's default
        return None


def share_weights(layouts, params: list[torch.Tensor], rank: int, group, source) -> None:
    """Each server fills its shard's buffers with ``source(layout, bufs)`` and broadcasts them to every
    rank's ``params`` (``group`` None: a single process, nothing to send)."""
    for layout in layouts:
        bufs = layout.empty_buffers()
        if layout.server == rank:
            source(layout, bufs)
        if group is not None:
            for b in bufs:
                dist.broadcast(b, src=layout.server, group=group)
        layout.unpack(bufs, params)
