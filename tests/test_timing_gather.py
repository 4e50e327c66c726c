"""The timing model's one-collective gather all-reduce (``pipesgd.comm.gather``): its textbook cost against the ring's
(it wins where calls and latency dominate, loses where bytes do), its codec passes, and predict costing it when asked
(``--allreduce gather``; "auto" never picks it, as the trainer)."""
from __future__ import annotations

import math

import pytest

from timing_model.core import collectives, equations
from timing_model.predict import Scenario, predict

MB = 2**20


def test_gather_is_one_all_gather_of_every_payload():
    for p in (2, 4, 16):
        want = collectives.allgather_ring(p, p * 8 * MB, 1e-4, 1e-9) + 2e-3 + (p - 1) * 8 * MB * 1e-10
        assert collectives.allreduce_gather(p, 8 * MB, 1e-4, 1e-9, 1e-10, 2e-3) == pytest.approx(want, rel=1e-12)
    assert collectives.allreduce_gather(1, 8 * MB, 1e-4, 1e-9) == 0.0


def test_gather_beats_the_ring_on_small_messages_and_loses_on_large_ones():
    α, β = 1e-4, 1 / 1.25e9  # 10 Gbit/s, 100 µs per message
    small, large = 64 * 1024, 64 * MB
    for p in (4, 8):
        assert collectives.allreduce_gather(p, small, α, β) < collectives.allreduce_ring(p, small, α, β)
        assert collectives.allreduce_gather(p, large, α, β) > collectives.allreduce_ring(p, large, α, β)
    assert collectives.allreduce_gather(2, large, α, β) < collectives.allreduce_ring(2, large, α, β)  # same bytes


def test_gather_codec_encodes_once_and_decodes_every_payload():
    assert equations.gather_codec_time(4, 8.0, 2.0, 1.0) == pytest.approx(8 / 2 + 4 * 8 / 1)
    assert equations.gather_codec_time(4, 8.0, 2.0, 1.0, 4.0) == pytest.approx(8 / 2 + 4 * 8 / 1 + 8 / 4)
    assert equations.gather_codec_time(1, 8.0, 2.0, 1.0) == 0.0


def _scenario(**changes) -> Scenario:
    # LeNet-sized on a loopback-like link: a message's latency (0.35 ms, the ring's Python per hop) sets the time
    base = dict(nodes=4, grad_bytes=0.5 * MB, bandwidth_Bps=1.25e9, latency_s=3.5e-4, overhead_s=1e-3,
                compute_s=0.01, compression="q8", bucket_bytes=25 * MB, encode_Bps=10e9, decode_Bps=20e9)
    return Scenario(**{**base, **changes})


def test_predict_costs_the_gather_when_asked_and_auto_never_picks_it():
    ring, gather = (predict(_scenario(allreduce=a)).result("sync") for a in ("ring", "gather"))
    assert gather.allreduce == "gather" and ring.allreduce == "ring"
    assert gather.comm_total_s < ring.comm_total_s  # half a megabyte: the ring's 6 messages cost more
    assert gather.codec_s == pytest.approx(0.5 * MB / 10e9 + 4 * 0.5 * MB / 20e9)
    big_ring, big_gather = (predict(_scenario(allreduce=a, grad_bytes=400 * MB, bandwidth_Bps=12.5e6)).result("sync")
                            for a in ("ring", "gather"))
    assert big_gather.comm_total_s > big_ring.comm_total_s  # 100 Mbit/s and 400 MB: bytes
    assert predict(_scenario(allreduce="auto")).result("pipe").allreduce == "alltoall"
    assert math.isfinite(gather.iteration_s) and gather.iteration_s > 0
