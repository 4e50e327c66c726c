"""The one-collective gather all-reduce (pipesgd.comm.gather) on 2-4 gloo processes: bit for bit the algorithm written
out in one process, the same bits on every rank, error feedback conserving the sum (world size 1: test_alltoall)."""
from __future__ import annotations

import pytest
import torch

from pipesgd.comm.gather import gather_allreduce, gather_allreduce_
from pipesgd.compression import build
from tests.distributed import run_ranks
from tests.test_alltoall import _every_codec_and_size, assert_matches_the_reference, feedback_rounds, round_trip
from tests.test_ring import rank_data


def reference_mean(inputs: list[torch.Tensor], codec) -> torch.Tensor:
    """Every rank's decode(encode(values)), summed in rank order, divided by p (a lossless codec: the values)."""
    total = torch.zeros_like(inputs[0])
    for x in inputs:
        total += x.clone() if codec.lossless else round_trip(codec, x.clone())
    return total / len(inputs)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_the_reference_bit_for_bit_on_every_rank(world):
    assert_matches_the_reference(run_ranks(_every_codec_and_size, world, gather_allreduce), world, reference_mean)


def _feedback_conserves_the_sum(rank: int, world: int, name: str):
    """Two calls: the sum conserved (``feedback_gap``), and how large the residual the encode left."""
    rounds = list(feedback_rounds(rank, world, name, gather_allreduce_))
    report = rounds[-1][2]
    return [gap for _, gap, _ in rounds], [float(r.abs().max()) for r, _, _ in rounds], report.bytes_sent, \
        report.raw_bytes


def _feedback_for_each(rank: int, world: int):
    return [_feedback_conserves_the_sum(rank, world, name) for name in ("q4", "sign", "bf16")]


def test_error_feedback_conserves_the_sum_and_the_report_counts_p_minus_1_payloads():
    for per_codec in run_ranks(_feedback_for_each, 3):
        for (gaps, sizes, sent, raw), name in zip(per_codec, ("q4", "sign", "bf16")):
            assert max(gaps) < 1e-9 and min(sizes) > 0  # the encode really dropped something, and nothing is lost
            assert sent == 2 * build(name).payload_bytes(100_003, torch.float64) and raw == 2 * 100_003 * 8
