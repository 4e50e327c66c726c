"""The flat bucket sets of one PipeSGD wrapper, and (``gradient_as_bucket_view``, as DDP's) ``p.grad`` as views
into one of them, so that backward writes straight into the bucket and neither hand-off nor apply copies.
"""
from __future__ import annotations

import torch

from pipesgd.runlog import phases
from pipesgd.grads.buckets import Bucket, gradient_slots, read_gradients, viewable, write_gradients


class BucketSet(list):
    """One set of flat buckets (the list of tensors the ring takes) with every parameter's slot in it, shaped
    like the parameter and built once per set: binding the set, checking that ``p.grad`` is still in it and
    zeroing it then cost one identity test per parameter instead of slicing and comparing pointers every step."""

    __slots__ = ("slots",)

    def __init__(self, flats: list[torch.Tensor], buckets: list[Bucket], params: list[torch.Tensor]) -> None:
        super().__init__(flats)
        slots: list[torch.Tensor | None] = [None] * len(params)
        for bucket, flat in zip(buckets, flats):
            for i, slot in zip(bucket.param_indices, gradient_slots(bucket, params, flat)):
                slots[i] = slot
        self.slots = slots


class BucketSets:
    """Owns every set of flat buckets (a ``BucketSet``); each set is bound (``p.grad`` of the viewable parameters
    are views into it), in flight (handed to the ring) or free (at most ``keep`` kept for reuse).

    With views off nothing is bound: ``hand_off`` copies ``p.grad`` in and ``bind`` copies the average out. With
    views on, at most K sets exist for width K: the set just applied becomes the bound one while the K-1 younger
    sets are still on the ring. Which parameters can be views (``buckets.viewable``) is decided once."""

    def __init__(self, buckets: list[Bucket], params: list[torch.Tensor], as_view: bool, keep: int) -> None:
        self._buckets = buckets
        self._params = params
        self.as_view = as_view
        self._keep = keep
        in_bucket = {i: bucket for bucket in buckets for i in bucket.param_indices}
        self._as_view = [as_view and viewable(p, in_bucket[i]) for i, p in enumerate(params)]
        self._all_views = all(self._as_view)
        self._free: list[BucketSet] = []
        self._bound: BucketSet | None = None
        self.allocated = 0  # sets ever created: K in a steady pipeline of width K (one per step in flight)

    def hand_off(self, keep_local: bool) -> BucketSet:
        """This step's gradients as a bucket set the ring may own; no ``p.grad`` points into it afterwards. A gradient
        already in its slot costs nothing; one the caller replaced (or None: zeros) is copied in. ``keep_local``: no
        average replaces ``p.grad`` this step (the pipeline fills), so the views move to a fresh set of the same values."""
        out = self._bound if self._bound is not None else self._acquire()
        self._bound = None
        read_gradients(self._params, out.slots)
        if self.as_view and keep_local:
            local = self._acquire()
            with phases.timed("pack_unpack"):
                for flat, copy in zip(out, local):
                    copy.copy_(flat)
            self.bind(local, create=False)  # a missing gradient stays None, as without views
        return out

    def bind(self, averaged: list[torch.Tensor], copy: bool = True, create: bool = True) -> None:
        """Make ``averaged`` (an applied set) what ``p.grad`` holds: views where possible, copies elsewhere.
        ``copy=False`` only moves the views (a skipped step); without views the set is copied out and recycled."""
        averaged = self._as_set(averaged)
        write_gradients(self._params, averaged.slots, self._as_view, copy=copy, create=create)
        if not self.as_view:
            self.recycle(averaged)
            return
        if self._bound is not None and self._bound is not averaged:
            self.recycle(self._bound)
        self._bound = averaged

    def recycle(self, buffers: BucketSet) -> None:
        if len(self._free) < self._keep:
            self._free.append(buffers)

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool) -> None:
        """The optimizer's ``zero_grad``, except that gradients that are views stay views and are zeroed
        (one fill per bucket): a None would make the next backward allocate and ``hand_off`` copy again."""
        bound = self._bound
        if bound is None:
            optimizer.zero_grad(set_to_none=set_to_none)
            return
        # Every parameter the optimizer holds is communicated (it may hold more: frozen ones) and still views its
        # slot: zeroing the buckets is all the optimizer's zero_grad would do (its per-parameter loop costs more).
        if self._all_in_slots(bound) and sum(len(g["params"]) for g in optimizer.param_groups) == len(self._params):
            for flat in bound:
                flat.zero_()
            return
        views = [(p, slot) for p, slot in zip(self._params, bound.slots) if p.grad is slot]
        for p, _ in views:
            p.grad = None  # hidden from the optimizer's zero_grad, which would drop or re-zero them
        optimizer.zero_grad(set_to_none=set_to_none)
        for flat in bound:
            flat.zero_()
        for p, slot in views:
            p.grad = slot

    @property
    def set_bytes(self) -> int:
        """Bytes of one set: the communicated gradients in the buckets' working dtypes."""
        return sum(b.numel * torch.empty((), dtype=b.dtype).element_size() for b in self._buckets)

    def _all_in_slots(self, buckets: BucketSet) -> bool:
        """Whether every ``p.grad`` is its slot in ``buckets`` (a view the optimizer's zero_grad need not see)."""
        return self._all_views and all(p.grad is slot for p, slot in zip(self._params, buckets.slots))

    def _as_set(self, buckets: list[torch.Tensor]) -> BucketSet:
        """``buckets`` with its slots (a set restored from a checkpoint arrives as a plain list)."""
        return buckets if isinstance(buckets, BucketSet) else BucketSet(buckets, self._buckets, self._params)

    def _acquire(self) -> BucketSet:
        if self._free:
            return self._free.pop()
        self.allocated += 1
        return BucketSet([b.empty() for b in self._buckets], self._buckets, self._params)
