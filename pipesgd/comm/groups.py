"""Which process group a wrapper or collective runs on, and the error when there is none: as DDP, no
``init_process_group``, no run (a missing group taken as a world of one let every rank of a job train alone).
A single process initialises a group of one, e.g. over an in-memory store."""
from __future__ import annotations

import torch.distributed as dist

SINGLE_PROCESS_HINT = ("init_process_group('gloo', store=torch.distributed.HashStore(), rank=0, world_size=1)")


class NoProcessGroupError(RuntimeError):
    """A collective or a wrapper was asked for without an initialised process group."""


def require_group(group: dist.ProcessGroup | None, what: str) -> dist.ProcessGroup:
    """``group``, or the default group if None; raises ``NoProcessGroupError`` naming ``what`` when no process
    group has been initialised."""
    if not dist.is_initialized():
        raise NoProcessGroupError(
            f"{what} needs torch.distributed's process group: call torch.distributed.init_process_group() first "
            f"(under torchrun: init_process_group('gloo') or ('nccl'); one process alone: {SINGLE_PROCESS_HINT})"
        )
    return group if group is not None else dist.group.WORLD
