"""The low-rank stand-in (``PipeSGD(lookahead_standin="coarse-lowrank")``): each rank's own gradient with its part in
a small subspace replaced by every rank's average there, from two small all-reduces per step.

Why: look-ahead's own-gradient stand-in leaves each rank reacting to its own look-ahead error (on the character GPT
with AdamW +1.8 % validation loss at width 2, four ranks); everyone's q8 average closes the gap (+0.2 %) but it is a
quarter of the uncompressed bytes on the critical path, as slow as synchronous q8 all-reduce
(``experiments/results/charlm_time``). In simulation the average's part in a rank-4 subspace of each weight matrix,
with the rank's own gradient outside it, did as well as the q4 average of everything (``experiments/results/
staleness_sim/report.md``), for about a twentieth of the uncompressed bytes on the character GPT.

What, per step on the channel's worker (``pipesgd.delay.coarse`` runs it before the exact exchange):
  Step 1: per weight matrix M (a parameter's gradient, first dimension by the rest), P = M Q with Q the shared warm
          start (PowerSGD's power iteration, Vogels et al. 2019); vectors (biases, norms) whole. One all-reduce of
          them all, to the mean.
  Step 2: U = the orthonormal columns of the mean P (QR); every vector is its exact average from here.
  Step 3: R = M^T U (this rank's coordinates in U); one all-reduce of them all, to the mean A (the average's).
  Step 4: the stand-in is M + U (A - R)^T: the own gradient outside the subspace, the average's inside. A is the next
          step's warm start Q, the same on every rank (a checkpoint keeps it).
The stand-ins average to the average (the subspace is shared), as the own gradients do. Bytes: rank x (rows + cols)
per matrix plus the vectors, twice the latency of one all-reduce.
"""
from __future__ import annotations

import math

import torch

from pipesgd.comm.ring import RingReport, backend_allreduce_
from pipesgd.comm.topology import RingTopology

RANK = 4  # columns of the shared subspace per matrix (rank 4 matched the q4 average of all in simulation)
SEED = 0  # the first warm start, the same on every rank


class LowRankFill:
    """Turns a copy of this rank's gradients (parameter-shaped ``slots``) into the low-rank stand-in, in place."""

    def __init__(self, params: list[torch.Tensor], topology: RingTopology, rank: int = RANK) -> None:
        self._topology = topology
        self._matrices = [i for i, p in enumerate(params) if p.dim() >= 2]
        self._vectors = [i for i, p in enumerate(params) if p.dim() < 2]
        self._shapes = {i: (params[i].shape[0], params[i].numel() // params[i].shape[0]) for i in self._matrices}
        self._ranks = {i: min(rank, *self._shapes[i]) for i in self._matrices}
        generator = torch.Generator().manual_seed(SEED)
        self._warm = {i: torch.randn(self._shapes[i][1], self._ranks[i], generator=generator)
                      .to(params[i].device, torch.float32) for i in self._matrices}

    def __call__(self, slots: list[torch.Tensor]) -> RingReport:
        report = RingReport()
        matrices = {i: slots[i].reshape(self._shapes[i]).float() for i in self._matrices}
        # Step 1
        first = self._flat([matrices[i] @ self._warm[i] for i in self._matrices] +
                           [slots[i].reshape(-1).float() for i in self._vectors])
        if first.numel():
            report.add(backend_allreduce_(first, self._topology, "mean"))
        projected = self._split(first, [(self._shapes[i][0], self._ranks[i]) for i in self._matrices])
        # Step 2
        bases = [torch.linalg.qr(p).Q for p in projected]
        offset = sum(p.numel() for p in projected)
        for i in self._vectors:
            slots[i].copy_(first[offset:offset + slots[i].numel()].view_as(slots[i]))
            offset += slots[i].numel()
        # Step 3
        own = [matrices[i].T @ u for i, u in zip(self._matrices, bases)]
        second = self._flat(own)
        if second.numel():  # the same on every rank: no matrix, no second all-reduce
            report.add(backend_allreduce_(second, self._topology, "mean"))
        averaged = self._split(second, [(self._shapes[i][1], self._ranks[i]) for i in self._matrices])
        # Step 4
        for i, u, mine, theirs in zip(self._matrices, bases, own, averaged):
            slots[i].add_((u @ (theirs - mine).T).view_as(slots[i]).to(slots[i].dtype))
            self._warm[i] = theirs
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
        return sum(q.numel() * q.element_size() for q in self._warm.values())

    def state_dict(self) -> dict:
        """The warm start: identical on every rank, so any rank's is every rank's."""
        return {"warm": [self._warm[i].cpu().clone() for i in self._matrices]}

    def load_state_dict(self, state: dict | None) -> None:
        if not state:
            return
        warm = state.get("warm") or []
        if len(warm) != len(self._matrices) or any(w.shape != self._warm[i].shape
                                                    for w, i in zip(warm, self._matrices)):
            raise ValueError("the low-rank stand-in's saved warm start does not match this model's matrices")
        for w, i in zip(warm, self._matrices):
            self._warm[i] = w.to(self._warm[i].device, torch.float32)
