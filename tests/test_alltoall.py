"""The two-collective all-reduce (pipesgd.comm.alltoall) against a single-process reference of its algorithm, on p = 1..4
gloo processes on CPU: every codec, sizes that p does not divide and sizes where some chunks are empty."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from pipesgd.comm.alltoall import alltoall_allreduce, alltoall_allreduce_
from pipesgd.compression import ErrorFeedback, build
from pipesgd.comm.topology import PAIRWISE_MIN_BYTES, RingTopology, launched_on_one_host
from experiments.harness.switches import exchange_collectives
from tests.distributed import run_checks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_ring import UNIT_ERROR, rank_data

CODECS = ("none", "fp16", "bf16", "q8", "q4", "sign")
SIZES = (0, 1, 2, 3, 5, 17, 4097, 10_001)  # p never divides 4097 or 10_001; 1 and 2 leave chunks empty


def round_trip(codec, x: torch.Tensor) -> torch.Tensor:
    payload, ctx = codec.compress(x)
    return codec.decompress(payload, ctx)


def reference_mean(inputs: list[torch.Tensor], codec) -> torch.Tensor:
    """The algorithm written out in one process: chunk c is rank c's exact values plus every other rank's
    decode(encode(values)), in rank order, divided by p, then decode(encode(.)) of that mean."""
    p, numel = len(inputs), inputs[0].numel()
    out = torch.empty_like(inputs[0])
    for c in range(p):
        lo, hi = c * numel // p, (c + 1) * numel // p
        total = inputs[c][lo:hi].clone()
        for q in range(p):
            if q != c:
                total += round_trip(codec, inputs[q][lo:hi].clone())
        total /= p
        out[lo:hi] = total if codec.lossless else round_trip(codec, total)
    return out


def _every_codec_and_size(rank: int, world: int, allreduce=alltoall_allreduce):
    """This rank's results of ``allreduce``, whether every rank got the same bits, and (for `none`) the backend's
    mean."""
    results = {}
    for name in CODECS:
        for numel in SIZES:
            got = allreduce(rank_data(rank, numel), compression=name)
            gathered = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(gathered, got)
            results[name, numel] = (got, all(torch.equal(g, got) for g in gathered))
    backend = {numel: rank_data(rank, numel) for numel in SIZES}
    for x in backend.values():
        dist.all_reduce(x)
        x /= world
    return results, backend


def assert_matches_the_reference(per_rank: list, world: int, reference) -> None:
    """Every rank's result of every codec and size (``_every_codec_and_size``) the same and equal, bit for bit, to
    ``reference(inputs, codec)``."""
    for name in CODECS:
        codec = build(name)
        for numel in SIZES:
            want = reference([rank_data(q, numel) for q in range(world)], codec)
            for rank, (results, _) in enumerate(per_rank):
                got, identical = results[name, numel]
                assert identical, (name, numel, rank)
                assert torch.equal(got, want), (name, numel, rank, float((got - want).abs().max()))


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.slow
def test_matches_the_reference_bit_for_bit_on_every_rank(world):
    per_rank = in_one_world(world)["reference"]
    assert_matches_the_reference(per_rank, world, reference_mean)
    for numel, want in per_rank[0][1].items():  # and the lossless exchange is the backend's mean
        torch.testing.assert_close(per_rank[0][0]["none", numel][0], want, rtol=1e-5, atol=1e-5)


def _every_codec_and_size_on(topology: RingTopology, rank: int, sizes=SIZES) -> dict:
    """This rank's results of ``alltoall_allreduce_`` on ``topology``, per codec and size."""
    results = {}
    for name in CODECS:
        for numel in sizes:
            results[name, numel] = flat = rank_data(rank, numel)
            alltoall_allreduce_(flat, build(name), topology, "mean")
    return results


def assert_every_rank_has_the_reference(per_rank: list[dict], world: int, sizes=SIZES) -> None:
    for name in CODECS:
        for numel in sizes:
            want = reference_mean([rank_data(q, numel) for q in range(world)], build(name))
            for rank, results in enumerate(per_rank):
                assert torch.equal(results[name, numel], want), (name, numel, rank)


def _gathered_by_alltoall(rank: int, world: int):
    """The exchange with its all-gather sent as an all-to-all (what it does where payloads are staged through host
    memory, gloo with CUDA tensors): this rank's results per codec and size."""
    topology = RingTopology(dist.group.WORLD)
    with exchange_collectives(gather_by_alltoall=True):
        return _every_codec_and_size_on(topology, rank)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.slow
def test_the_all_gather_sent_as_an_all_to_all_gives_the_same_bits(world):
    assert_every_rank_has_the_reference(in_one_world(world)["gathered"], world)


class _StagedOnCPU(RingTopology):
    """gloo with CUDA tensors, on CPU: every wire buffer in host staging slots and arrivals copied out of them."""

    def stages(self, device: torch.device) -> bool:
        return True


def _staged(rank: int, world: int):
    """The exchange where gloo stages payloads through host buffers (one copy of the batch's payloads into the
    send slot, arrivals copied out, the all-gather as an all-to-all): this rank's results per codec and size."""
    topology = _StagedOnCPU(dist.group.WORLD)
    assert not topology.sends_pairwise(torch.device("cpu"), 1 << 20)
    return _every_codec_and_size_on(topology, rank)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.slow
def test_payloads_staged_through_host_buffers_give_the_same_bits(world):
    assert_every_rank_has_the_reference(in_one_world(world)["staged"], world)


# Chunks on both sides of a 4096-element block (4096 and 4097 elements: one scale and two), so a rank's p-1 payloads
# come from two codec calls, in two buffers, and go into the send buffer by the copy path rather than as one span.
STRADDLING = {3: 3 * 4096 + 1, 4: 4 * 4096 + 2}


def _straddling(rank: int, world: int):
    topology = RingTopology(dist.group.WORLD)
    return [_every_codec_and_size_on(topology, rank, [STRADDLING[world]]),
            _every_codec_and_size_on(_StagedOnCPU(dist.group.WORLD), rank, [STRADDLING[world]])]


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.slow
def test_payloads_of_two_block_counts_give_the_same_bits_direct_and_staged(world):
    for path in zip(*in_one_world(world)["straddling"]):
        assert_every_rank_has_the_reference(list(path), world, [STRADDLING[world]])


def _sent_pairwise(rank: int, world: int):
    """The exchange with both collectives sent one peer at a time (forced from ``experiments/harness/switches.py``):
    this rank's results per codec and size, what it reported sending, and the conserved-sum gaps of two calls with
    q4's feedback."""
    with exchange_collectives(pairwise=True):
        return _every_codec_and_size_pairwise(rank, world)


def _every_codec_and_size_pairwise(rank: int, world: int):
    topology = RingTopology(dist.group.WORLD)
    assert topology.sends_pairwise(torch.device("cpu"), 1)
    results, sent = {}, {}
    for name in CODECS:
        for numel in SIZES:
            results[name, numel] = flat = rank_data(rank, numel)
            sent[name, numel] = alltoall_allreduce_(flat, build(name), topology, "mean").bytes_sent
    feedback = ErrorFeedback(build("q4"))
    gaps = [feedback_gap(world, rank_data(rank + 10 * call, 100_003, torch.float64),
                         feedback.residual(0, rank_data(rank, 100_003, torch.float64)),
                         lambda flat, residual: alltoall_allreduce_(flat, feedback.compressor, topology, "mean",
                                                                    residual))[0] for call in range(2)]
    return results, sent, gaps


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.slow
def test_the_collectives_sent_one_peer_at_a_time_give_the_same_bits(world):
    per_rank = in_one_world(world)["pairwise"]
    for name in CODECS:
        codec = build(name)
        for numel in SIZES:
            want = reference_mean([rank_data(q, numel) for q in range(world)], codec)
            for rank, (results, sent, _) in enumerate(per_rank):
                assert torch.equal(results[name, numel], want), (name, numel, rank)
                chunks = [(q + 1) * numel // world - q * numel // world for q in range(world)]
                own = codec.payload_bytes(chunks[rank], torch.float32) if chunks[rank] else 0
                others = sum(codec.payload_bytes(n, torch.float32) for q, n in enumerate(chunks) if q != rank and n)
                assert sent[name, numel] == (others + (world - 1) * own if numel else 0), (name, numel, rank)
    for _, _, gaps in per_rank:
        assert max(gaps) < 1e-9


def _pairwise_on_a_subgroup(rank: int, world: int):
    """On the group of global ranks 1..world-1 (group rank = global rank - 1), a 200_003-element q8 exchange: one
    peer at a time by default between hosts (its payloads are over PAIRWISE_MIN_BYTES per peer), then forced to gloo's
    collectives; both results, and what the default reported sending."""
    group = dist.new_group(list(range(1, world)))
    if rank == 0:
        return None
    topology = RingTopology(group)
    topology.one_host = False  # as between hosts, whatever this launch's environment says
    default, collectives = rank_data(rank, 200_003), rank_data(rank, 200_003)
    report = alltoall_allreduce_(default, build("q8"), topology, "mean")
    with exchange_collectives(pairwise=False):
        alltoall_allreduce_(collectives, build("q8"), topology, "mean")
    return default, collectives, report.bytes_sent


@pytest.mark.slow
def test_a_subgroup_goes_one_peer_at_a_time_by_default_with_the_collectives_bits():
    per_rank = in_one_world(4)["subgroup"][1:]
    q8 = build("q8")
    chunk = [(c + 1) * 200_003 // 3 - c * 200_003 // 3 for c in range(3)]
    assert q8.payload_bytes(min(chunk), torch.float32) >= PAIRWISE_MIN_BYTES
    for group_rank, (default, collectives, sent) in enumerate(per_rank):
        assert torch.equal(default, collectives) and torch.equal(default, per_rank[0][0])
        own = q8.payload_bytes(chunk[group_rank], torch.float32)
        # one peer at a time sends no pad (gloo's all-gather sends p-1 slots of the largest payload)
        assert sent == sum(q8.payload_bytes(n, torch.float32) for c, n in enumerate(chunk) if c != group_rank) + 2 * own


def test_long_payloads_go_pairwise_by_default_and_only_gloo_on_host_memory_does(process_group):
    topology, cpu = RingTopology(dist.group.WORLD), torch.device("cpu")
    topology.one_host = True  # what launched_on_one_host finds under torchrun on one node
    assert not topology.sends_pairwise(cpu, 1 << 30)  # no link for concurrent flows to share
    topology.one_host = False
    assert topology.sends_pairwise(cpu, PAIRWISE_MIN_BYTES) and not topology.sends_pairwise(cpu, PAIRWISE_MIN_BYTES - 1)
    topology.batched = True  # NCCL's way: its unbatched pairs can deadlock
    assert not topology.sends_pairwise(cpu, 1 << 30)


@pytest.mark.parametrize("environ, one_host", [
    ({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1"}, True),   # torchrun, one node
    ({"LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1"}, False),  # torchrun, four nodes
    ({"WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1"}, True), ({"WORLD_SIZE": "4", "MASTER_ADDR": "127.0.1.1"}, True),
    ({"WORLD_SIZE": "4", "MASTER_ADDR": "localhost"}, True), ({"WORLD_SIZE": "4", "MASTER_ADDR": "[::1]"}, True),
    ({"WORLD_SIZE": "4", "MASTER_ADDR": "node0.cluster"}, False), ({"WORLD_SIZE": "4"}, False), ({}, False)])
def test_the_launchers_environment_says_whether_every_rank_shares_one_host(environ, one_host):
    assert launched_on_one_host(environ) is one_host


def _stochastic_and_public_api(rank: int, world: int):
    out = {}
    for name in ("q8", "q4"):
        x = rank_data(rank, 5_000)
        exact = x.double().clone()
        dist.all_reduce(exact)
        exact /= world
        bound = x.abs().amax().double()
        dist.all_reduce(bound)  # S = sum_i max|x_i|
        got = alltoall_allreduce(x.clone(), compression=build(name, rank=rank, stochastic=True))
        gathered = [torch.empty_like(got) for _ in range(world)]
        dist.all_gather(gathered, got)
        identical = all(torch.equal(g, got) for g in gathered)
        out[name] = (identical, float((got.double() - exact).abs().max()), float(bound))
    # The public entry point: async as sync, a non-contiguous 2-D input keeps its shape, bf16 is summed in fp32.
    y = rank_data(rank, 777)
    out["async"] = torch.equal(alltoall_allreduce(y.clone(), async_op=True).wait(), alltoall_allreduce(y.clone()))
    z = rank_data(rank, 24).view(6, 4).t()
    expected = z.clone()
    dist.all_reduce(expected)
    got = alltoall_allreduce(z, op="sum")
    out["non-contiguous"] = got.shape == (4, 6) and torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
    b = rank_data(rank, 1000, torch.bfloat16)
    expected = b.float()
    dist.all_reduce(expected)
    got = alltoall_allreduce(b.clone(), op="sum")
    out["bf16"] = got.dtype == torch.bfloat16 and torch.allclose(got.float(), expected, rtol=2**-7, atol=1e-2)
    return out


@pytest.mark.slow
def test_stochastic_rounding_is_identical_on_every_rank_and_the_entry_point_keeps_its_contract():
    for out in in_one_world(3)["stochastic"]:
        for name in ("q8", "q4"):
            identical, max_err, s = out[name]
            # Each contribution and the mean are encoded once: |error| <= u * S / p * (p - 1) + u * S / p <= u * S
            # for round to nearest (see test_ring.UNIT_ERROR), twice that for stochastic rounding.
            assert identical and max_err <= 2 * UNIT_ERROR[name] * s, (name, max_err, s)
        assert out["async"] and out["non-contiguous"] and out["bf16"]


def feedback_gap(world: int, x: torch.Tensor, residual: torch.Tensor, reduce_) -> tuple[float, object]:
    """One mean all-reduce ``reduce_(flat, residual)`` of ``x`` with feedback; returns the largest gap of
    sum_i x_i + sum_i r_i(before) == p * mean + sum_i r_i(after) and what ``reduce_`` returned."""
    lhs = x + residual
    dist.all_reduce(lhs)
    flat = x.clone()
    returned = reduce_(flat, residual)
    rhs = residual.clone()
    dist.all_reduce(rhs)
    rhs += world * flat
    return float((lhs - rhs).abs().max()), returned


def feedback_rounds(rank: int, world: int, name: str, reduce_):
    """Two calls of ``reduce_(flat, compressor, topology, op, residual)`` with ``name``'s feedback on 100_003 fp64
    elements: yields each call's residual after it, its ``feedback_gap`` and what it returned."""
    feedback = ErrorFeedback(build(name))
    topology = RingTopology(dist.group.WORLD)
    for call in range(2):
        x = rank_data(rank + 10 * call, 100_003, torch.float64)
        residual = feedback.residual("bucket", x)
        gap, returned = feedback_gap(world, x, residual,
                                     lambda flat, r: reduce_(flat, feedback.compressor, topology, "mean", r))
        yield residual, gap, returned


def _feedback_conserves_the_sum(rank: int, world: int, name: str):
    """Two calls: the sum conserved (``feedback_gap``), worker and owner residuals alike."""
    gaps, owner_parts, worker_parts = [], [], []
    for residual, gap, _ in feedback_rounds(rank, world, name, alltoall_allreduce_):
        gaps.append(gap)
        lo, hi = rank * residual.numel() // world, (rank + 1) * residual.numel() // world
        owner_parts.append(float(residual[lo:hi].abs().max()))
        worker_parts.append(float(torch.cat([residual[:lo], residual[hi:]]).abs().max()))
    return gaps, owner_parts, worker_parts


def _feedback_for_each(rank: int, world: int):
    return [_feedback_conserves_the_sum(rank, world, name) for name in ("q4", "sign", "bf16")]


@pytest.mark.slow
def test_error_feedback_conserves_the_sum():
    for per_codec in in_one_world(3)["feedback"]:
        for gaps, owner_parts, worker_parts in per_codec:
            assert max(gaps) < 1e-9
            assert min(owner_parts) > 0 and min(worker_parts) > 0  # both encodes really dropped something


@pytest.mark.parametrize("reduce_,public", [(alltoall_allreduce_, alltoall_allreduce)])
def test_world_size_one_is_exact_sends_nothing_and_folds_the_residual(process_group, reduce_, public):
    x, r = torch.randn(100), torch.randn(100)
    flat, residual = x.clone(), r.clone()
    report = reduce_(flat, build("q4"), RingTopology(dist.group.WORLD), "mean", residual)
    assert torch.equal(flat, x + r) and torch.equal(residual, torch.zeros(100)) and report.bytes_sent == 0
    assert torch.equal(public(x.clone(), compression="sign"), x)


# The checks above that run on gloo ranks, by the world size they run at. Each size's ranks run all of its checks
# one after another in one world, started once for the module: starting a world costs more than most checks.
CHECKS = {"reference": _every_codec_and_size, "gathered": _gathered_by_alltoall, "staged": _staged,
          "straddling": _straddling, "pairwise": _sent_pairwise, "subgroup": _pairwise_on_a_subgroup,
          "stochastic": _stochastic_and_public_api, "feedback": _feedback_for_each}
WORLD_CHECKS = {2: ("reference", "gathered", "staged", "pairwise"),
                3: ("reference", "gathered", "straddling", "pairwise", "stochastic", "feedback"),
                4: ("reference", "gathered", "staged", "straddling", "pairwise", "subgroup")}


@functools.cache
def in_one_world(world: int) -> dict[str, list]:
    """Every check of ``world`` ranks (``WORLD_CHECKS``): its per-rank results, by check name."""
    return run_checks({name: (CHECKS[name],) for name in WORLD_CHECKS[world]}, world)
