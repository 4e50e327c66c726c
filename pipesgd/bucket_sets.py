"""The flat bucket sets of one PipeSGD wrapper, and (``gradient_as_bucket_view``, as DDP's) ``p.grad`` as views
into one of them, so that backward writes straight into the bucket and neither hand-off nor apply copies.
"""
from __future__ import annotations

import torch

from pipesgd import phases
from pipesgd.buckets import Bucket, pack_gradients, unpack_to_gradients


class BucketSets:
    """Owns every set of flat buckets (one tensor per ``Bucket``); each set is in exactly one place:

    - bound: the ``p.grad`` of the viewable parameters are views into it (backward accumulates there);
    - in flight: handed to the ring (``hand_off``) and not yet applied;
    - free: kept for reuse (at most ``keep`` sets, so K in flight never allocate after the first steps).

    With views off nothing is ever bound: ``hand_off`` copies ``p.grad`` in and ``bind`` copies the average out.
    With views on, at most K sets exist for width K: the set just applied becomes the bound one, and backward
    after ``zero()`` refills it while the K-1 younger sets are still on the ring.
    """

    def __init__(self, buckets: list[Bucket], params: list[torch.Tensor], as_view: bool, keep: int) -> None:
        self._buckets = buckets
        self._params = params
        self.as_view = as_view
        self._keep = keep
        self._free: list[list[torch.Tensor]] = []
        self._bound: list[torch.Tensor] | None = None
        self.allocated = 0  # sets ever created: K in a steady pipeline of width K (one per step in flight)

    def hand_off(self, keep_local: bool) -> list[torch.Tensor]:
        """This step's gradients as a bucket set the ring may own; no ``p.grad`` points into it afterwards.

        A gradient already in its slot costs nothing; one the caller replaced (or None: zeros) is copied in.
        ``keep_local``: no averaged gradient replaces ``p.grad`` this step (the pipeline fills), so the views
        move to a fresh set holding the same values, as the caller's gradients stay theirs without views."""
        out = self._bound if self._bound is not None else self._acquire()
        self._bound = None
        for bucket, flat in zip(self._buckets, out):
            pack_gradients(bucket, self._params, flat)
        if self.as_view and keep_local:
            local = self._acquire()
            with phases.timed("pack_unpack"):
                for flat, copy in zip(out, local):
                    copy.copy_(flat)
            self.bind(local, create=False)  # a missing gradient stays None, as without views
        return out

    def bind(self, averaged: list[torch.Tensor], copy: bool = True, create: bool = True) -> None:
        """Make ``averaged`` (an applied set) what ``p.grad`` holds: views where possible, copies elsewhere.

        ``copy=False`` only moves the views (a skipped, non-finite step: ``p.grad`` must leave the ring's set).
        Without views the set is copied out and recycled at once."""
        for bucket, flat in zip(self._buckets, averaged):
            unpack_to_gradients(bucket, self._params, flat, as_view=self.as_view, copy=copy, create=create)
        if not self.as_view:
            self.recycle(averaged)
            return
        if self._bound is not None and self._bound is not averaged:
            self.recycle(self._bound)
        self._bound = averaged

    def release(self, averaged: list[torch.Tensor]) -> None:
        """``averaged`` was applied and is not what ``p.grad`` views: free it for a later step."""
        if averaged is not self._bound:
            self.recycle(averaged)

    def recycle(self, buffers: list[torch.Tensor]) -> None:
        if len(self._free) < self._keep:
            self._free.append(buffers)

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool) -> None:
        """The optimizer's ``zero_grad``, except that gradients that are views stay views and are zeroed
        (one fill per bucket): a None would make the next backward allocate and ``hand_off`` copy again."""
        bound = self._bound
        if bound is None:
            optimizer.zero_grad(set_to_none=set_to_none)
            return
        views = [(p, p.grad) for p in self._params if p.grad is not None and self._in_bound(p.grad)]
        for p, _ in views:
            p.grad = None  # hidden from the optimizer's zero_grad, which would drop or re-zero them
        optimizer.zero_grad(set_to_none=set_to_none)
        for flat in bound:
            flat.zero_()
        for p, grad in views:
            p.grad = grad

    @property
    def set_bytes(self) -> int:
        """Bytes of one set: the communicated gradients in the buckets' working dtypes."""
        return sum(b.numel * torch.empty((), dtype=b.dtype).element_size() for b in self._buckets)

    def _in_bound(self, grad: torch.Tensor) -> bool:
        ptr = grad.data_ptr()
        return any(flat.data_ptr() <= ptr < flat.data_ptr() + flat.numel() * flat.element_size()
                   for flat in self._bound if flat.dtype == grad.dtype and flat.device == grad.device)

    def _acquire(self) -> list[torch.Tensor]:
        if self._free:
            return self._free.pop()
        self.allocated += 1
        return [b.empty() for b in self._buckets]
