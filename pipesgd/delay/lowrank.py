"""The low-rank stand-in (``lookahead_standin="coarse-lowrank"``): each rank's own gradient with its part in a small
shared subspace replaced by every rank's average there (why, and its rank: docs/architecture.md). Per weight matrix
M (first dimension by the rest) with U the shared orthonormal basis, on the channel's worker:
  Step 1: R = M^T U; vectors (biases, norms) whole. One all-reduce of them all to the mean: A = average^T U, and
          every vector's exact average.
  Step 2: the stand-in is M + U (A - R)^T; the next forward pass may start from here (the caller signals it).
  Step 3, after the signal (``advance``): one power iteration on the average with U as warm start (PowerSGD's):
          P = M A all-reduced to the mean; the next step's U is its QR, the same on every rank.
The stand-ins average to the average. Bytes: rank x (rows + cols) per matrix plus the vectors, of which
rank x cols and the vectors lie on the critical path."""
from __future__ import annotations

import math

import torch

from pipesgd.comm.ring import RingReport, backend_allreduce_
from pipesgd.comm.topology import RingTopology

# Columns of the shared subspace per matrix and per step in flight: at width 3 two stand-ins add their errors, and a
# subspace twice as wide did better there (docs/architecture.md).
RANK = 4
SEED = 0  # the first basis, the same on every rank


class LowRankFill:
    """Turns a copy of this rank's gradients (parameter-shaped ``slots``) into the low-rank stand-in, in place
    (``__call__``), then moves the shared subspace on (``advance``)."""

    def __init__(self, params: list[torch.Tensor], topology: RingTopology, rank: int = RANK) -> None:
        self._topology = topology
        self._matrices = [i for i, p in enumerate(params) if p.dim() >= 2]
        self._vectors = [i for i, p in enumerate(params) if p.dim() < 2]
        self._shapes = {i: (params[i].shape[0], params[i].numel() // params[i].shape[0]) for i in self._matrices}
        self._ranks = {i: min(rank, *self._shapes[i]) for i in self._matrices}
        generator = torch.Generator().manual_seed(SEED)
        self._bases = {i: torch.linalg.qr(torch.randn(self._shapes[i][0], self._ranks[i], generator=generator)).Q
                       .to(params[i].device, torch.float32) for i in self._matrices}
        self._power: torch.Tensor | None = None  # this step's M A, which advance() all-reduces

    def __call__(self, slots: list[torch.Tensor]) -> RingReport:
        """Steps 1 and 2: what the next forward pass waits for."""
        report = RingReport()
        matrices = [slots[i].reshape(self._shapes[i]).float() for i in self._matrices]
        own = [m.T @ self._bases[i] for i, m in zip(self._matrices, matrices)]
        # Step 1
        first = self._flat(own + [slots[i].reshape(-1).float() for i in self._vectors])
        if first.numel():
            report.add(backend_allreduce_(first, self._topology, "mean"))
        averaged = self._split(first, [(self._shapes[i][1], self._ranks[i]) for i in self._matrices])
        # Step 3's input, from the own gradient before step 2 overwrites it
        self._power = self._flat([m @ a for m, a in zip(matrices, averaged)])
        # Step 2
        offset = sum(a.numel() for a in averaged)
        for i in self._vectors:
            slots[i].copy_(first[offset:offset + slots[i].numel()].view_as(slots[i]))
            offset += slots[i].numel()
        for i, mine, theirs in zip(self._matrices, own, averaged):
            slots[i].add_((self._bases[i] @ (theirs - mine).T).view_as(slots[i]).to(slots[i].dtype))
        return report

    def advance(self) -> RingReport:
        """Step 3: the next step's subspace, off the critical path (after the stand-in is signalled)."""
        report, power, self._power = RingReport(), self._power, None
        if power is None or not power.numel():  # the same on every rank: no matrix, no all-reduce
            return report
        report.add(backend_allreduce_(power, self._topology, "mean"))
        if not bool(torch.isfinite(power).all()):  # an overflowed step (GradScaler skips it): keep the subspace
            return report
        for i, p in zip(self._matrices, self._split(power, [(self._shapes[i][0], self._ranks[i])
                                                             for i in self._matrices])):
            self._bases[i] = torch.linalg.qr(p).Q
        return report

    @staticmethod
    def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)

    @staticmethod
    def _split(flat: torch.Tensor, shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
        sizes = [math.prod(shape) for shape in shapes]
        return [piece.view(shape) for piece, shape in zip(flat[:sum(sizes)].split(sizes), shapes)]

    @property
    def memory_bytes(self) -> int:
        """The bases and one step's M A (each rows x rank per matrix, fp32)."""
        return 2 * sum(u.numel() * u.element_size() for u in self._bases.values())

    def state_dict(self) -> dict:
        """The subspace: identical on every rank, so any rank's is every rank's."""
        return {"basis": [self._bases[i].cpu().clone() for i in self._matrices]}

    def load_state_dict(self, state: dict | None) -> None:
        if not state:
            return
        bases = state.get("basis") or []
        if len(bases) != len(self._matrices) or any(u.shape != self._bases[i].shape
                                                     for u, i in zip(bases, self._matrices)):
            raise ValueError("the low-rank stand-in's saved subspace does not match this model's matrices")
        for u, i in zip(bases, self._matrices):
            self._bases[i] = u.to(self._bases[i].device, torch.float32)
