"""The one-collective gather all-reduce (pipesgd.comm.gather) on 1-4 gloo processes: bit for bit the algorithm written
out in one process, the same bits on every rank, error feedback conserving the sum, world size 1 exact."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pipesgd.comm.gather import gather_allreduce, gather_allreduce_
from pipesgd.comm.topology import RingTopology
from pipesgd.compression import ErrorFeedback, build
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_alltoall import CODECS, SIZES, round_trip
from tests.test_ring import rank_data


def reference_mean(inputs: list[torch.Tensor], codec) -> torch.Tensor:
    """Every rank's decode(encode(values)), summed in rank order, divided by p (a lossless codec: the values)."""
    total = torch.zeros_like(inputs[0])
    for x in inputs:
        total += x.clone() if codec.lossless else round_trip(codec, x.clone())
    return total / len(inputs)


def _every_codec_and_size(rank: int, world: int):
    results = {}
    for name in CODECS:
        for numel in SIZES:
            got = gather_allreduce(rank_data(rank, numel), compression=name)
            gathered = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(gathered, got)
            results[name, numel] = (got, all(torch.equal(g, got) for g in gathered))
    return results


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_the_reference_bit_for_bit_on_every_rank(world):
    per_rank = run_ranks(_every_codec_and_size, world)
    for name in CODECS:
        codec = build(name)
        for numel in SIZES:
            want = reference_mean([rank_data(q, numel) for q in range(world)], codec)
            for rank, results in enumerate(per_rank):
                got, identical = results[name, numel]
                assert identical, (name, numel, rank)
                assert torch.equal(got, want), (name, numel, rank, float((got - want).abs().max()))


def _feedback_conserves_the_sum(rank: int, world: int, name: str):
    """Two calls: sum_i x_i + sum_i r_i(before) == p * mean + sum_i r_i(after)."""
    feedback = ErrorFeedback(build(name))
    topology = RingTopology(dist.group.WORLD)
    gaps, sizes = [], []
    for call in range(2):
        x = rank_data(rank + 10 * call, 100_003, torch.float64)
        residual = feedback.residual("bucket", x)
        lhs = x + residual
        dist.all_reduce(lhs)
        flat = x.clone()
        report = gather_allreduce_(flat, feedback.compressor, topology, "mean", residual)
        rhs = residual.clone()
        dist.all_reduce(rhs)
        rhs += world * flat
        gaps.append(float((lhs - rhs).abs().max()))
        sizes.append(float(residual.abs().max()))
    return gaps, sizes, report.bytes_sent, report.raw_bytes


def _feedback_for_each(rank: int, world: int):
    return [_feedback_conserves_the_sum(rank, world, name) for name in ("q4", "sign", "bf16")]


def test_error_feedback_conserves_the_sum_and_the_report_counts_p_minus_1_payloads():
    for per_codec in run_ranks(_feedback_for_each, 3):
        for (gaps, sizes, sent, raw), name in zip(per_codec, ("q4", "sign", "bf16")):
            assert max(gaps) < 1e-9 and min(sizes) > 0  # the encode really dropped something, and nothing is lost
            assert sent == 2 * build(name).payload_bytes(100_003, torch.float64) and raw == 2 * 100_003 * 8


def test_world_size_one_is_exact_sends_nothing_and_folds_the_residual(process_group):
    x, r = torch.randn(100), torch.randn(100)
    flat, residual = x.clone(), r.clone()
    report = gather_allreduce_(flat, build("q4"), RingTopology(dist.group.WORLD), "mean", residual)
    assert torch.equal(flat, x + r) and torch.equal(residual, torch.zeros(100)) and report.bytes_sent == 0
    assert torch.equal(gather_allreduce(x.clone(), compression="sign"), x)
