"""Error feedback off the critical path (issue 11): a deferred encoder books nothing until ``drain``, books then
exactly what an eager one books, and the ring drains only once every send of a hop is posted."""
from __future__ import annotations

import torch

from pipesgd.compression import ErrorFeedback, build, open_encoder
from pipesgd.comm.ring import ring_allreduce_
from tests.fake_topology import LoopbackTopology


def randn(numel: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


def test_a_deferred_encoder_books_at_drain_what_an_eager_one_books_at_once():
    codec = build("q4", block_size=16)
    x, r = randn(64), randn(64, seed=1)
    eager_flat, eager_res = x.clone(), r.clone()
    eager = open_encoder(codec, eager_flat, eager_res, mean_over=2)
    flat, res = x.clone(), r.clone()
    deferred = open_encoder(codec, flat, res, mean_over=2, deferred=True)
    assert torch.equal(flat, x) and torch.equal(res, r)  # nothing folded when opened
    deferred.fold_(flat[:32], 0)
    deferred.fold_(flat[32:], 32)
    assert torch.equal(flat, eager_flat) and torch.equal(res, torch.zeros(64))
    payloads = [deferred.encode(flat[:16], 0), deferred.settle_(flat[32:64], 32)]
    assert torch.equal(res, torch.zeros(64)) and torch.equal(flat, eager_flat)  # encoded, nothing booked yet
    deferred.drain()
    assert torch.equal(payloads[0], eager.encode(eager_flat[:16], 0))
    assert torch.equal(payloads[1], eager.settle_(eager_flat[32:64], 32))
    assert torch.equal(res, eager_res) and torch.equal(flat, eager_flat)  # same bits, residual and settled chunk
    deferred.drain()  # nothing left: a second drain changes nothing
    assert torch.equal(res, eager_res)


class RecordingLoopback(LoopbackTopology):
    """Records the residual when the last send of each hop is posted and when the hop starts waiting."""

    def __init__(self, residual: torch.Tensor) -> None:
        self.residual = residual
        self.at_send: list[torch.Tensor] = []
        self.at_wait: list[torch.Tensor] = []

    def sends_posted(self) -> None:
        self.at_send.append(self.residual.clone())

    def waiting(self) -> None:
        self.at_wait.append(self.residual.clone())


def test_the_ring_books_feedback_only_after_the_hop_s_sends_are_posted():
    feedback = ErrorFeedback(build("sign", block_size=8))
    x = randn(40)
    residual = feedback.residual(0, x)
    residual.copy_(randn(40, seed=2))  # last ring's error, folded in chunk by chunk
    old = residual.clone()
    topology = RecordingLoopback(residual)
    flat = x.clone()
    ring_allreduce_(flat, feedback.compressor, topology, "mean", residual)
    # Hop 0 (reduce-scatter) sent chunk 0, folded beforehand; chunk 1 is folded while waiting.
    assert torch.equal(topology.at_send[0][:20], torch.zeros(20)) and torch.equal(topology.at_send[0][20:], old[20:])
    assert not torch.equal(topology.at_wait[0][:20], torch.zeros(20))  # booked while waiting, not before the send
    assert torch.equal(topology.at_wait[0][20:], torch.zeros(20))
    # Hop 0 of the all-gather sent the owned chunk's payload before its error was booked.
    assert torch.equal(topology.at_send[1][20:], torch.zeros(20))
    assert not torch.equal(topology.at_wait[1][20:], torch.zeros(20))
    assert torch.equal(residual, topology.at_wait[1])  # nothing booked after the last wait
