"""Ring AllReduce against the backend's all_reduce (the oracle), on p = 1..4 gloo processes on CPU."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

import pipesgd
from pipesgd.compression import ErrorFeedback, build
from pipesgd.comm.ring import MAX_PIECES, PIECE_ELEMENTS, RingTopology, chunk_bounds, piece_bounds, ring_allreduce_
from tests.distributed import run_checks

SIZES = [0, 1, 2, 3, 5, 17, 1000, 4097, 10_001]

# Per-element error bound of a lossy ring mean, as a multiple of S = sum_i max|x_i| (S bounds every partial
# sum). Each of the p-1 reduce-scatter encodes of a partial sum adds at most u*S, the owner's encode of the
# mean at most u*S/p, so |ring mean - exact mean| <= ((p-1)*u*S + u*S) / p = u*S, with u the codec's
# per-encode error relative to its block's max: fp16 2^-11 (round to nearest), bf16 truncation 2^-7
# (7 kept mantissa bits, toward zero), q8 1/(2*127), q4 1/(2*7) (round to nearest, one scale per block).
UNIT_ERROR = {"fp16": 2.0**-11, "bf16": 2.0**-7, "q8": 1 / 254, "q4": 1 / 14}


def rank_data(rank: int, numel: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return (torch.randn(numel, generator=g, dtype=torch.float64) * (rank + 1)).to(dtype)


def _ring_matches_backend(rank: int, world: int):
    failures = []
    for numel in SIZES:
        for dtype, rtol, atol in ((torch.float32, 1e-5, 1e-5), (torch.float64, 1e-12, 1e-12)):
            x = rank_data(rank, numel, dtype)
            expected = x.clone()
            dist.all_reduce(expected)
            for op, want in (("sum", expected), ("mean", expected / world)):
                got = pipesgd.ring_allreduce(x.clone(), op=op)
                if not torch.allclose(got, want, rtol=rtol, atol=atol):
                    failures.append((numel, str(dtype), op, float((got - want).abs().max())))
        # bf16 input: summed in fp32, cast back once.
        x = rank_data(rank, numel, torch.bfloat16)
        expected = x.float()
        dist.all_reduce(expected)
        got = pipesgd.ring_allreduce(x.clone(), op="sum")
        if got.dtype != torch.bfloat16 or not torch.allclose(got.float(), expected, rtol=2**-7, atol=1e-2):
            failures.append((numel, "bf16", "sum"))
    # A 2-D, non-contiguous input keeps its shape and comes back reduced.
    x = rank_data(rank, 6 * 4).view(6, 4).t()
    expected = x.clone()
    dist.all_reduce(expected)
    got = pipesgd.ring_allreduce(x, op="sum")
    if got.shape != (4, 6) or not torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
        failures.append(("non-contiguous",))
    # The asynchronous handle gives the same result.
    y = rank_data(rank, 777)
    handle = pipesgd.ring_allreduce(y.clone(), async_op=True)
    if not torch.equal(handle.wait(), pipesgd.ring_allreduce(y.clone())):
        failures.append(("async",))
    return failures


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.slow
def test_ring_equals_backend_all_reduce(world):
    for failures in in_one_world(world)["backend"]:
        assert failures == []


def _lossy_ring(rank: int, world: int, name: str, sizes: tuple[int, ...], stochastic: bool):
    return [_lossy_ring_once(rank, world, name, numel, stochastic) for numel in sizes]


def _lossy_ring_once(rank: int, world: int, name: str, numel: int, stochastic: bool):
    options = {"stochastic": True, "seed": rank} if stochastic else {}
    x = rank_data(rank, numel)
    exact = x.double().clone()
    dist.all_reduce(exact)
    exact /= world
    bound = x.abs().amax().double() if numel else torch.zeros((), dtype=torch.float64)
    dist.all_reduce(bound)  # S = sum_i max|x_i|
    got = pipesgd.ring_allreduce(x.clone(), compression=build(name, **options), op="mean")
    gathered = [torch.empty_like(got) for _ in range(world)]
    dist.all_gather(gathered, got)
    identical = all(torch.equal(g, gathered[0]) for g in gathered)
    max_err = float((got.double() - exact).abs().max()) if numel else 0.0
    return identical, max_err, float(bound)


LOSSY = ("fp16", "bf16", "q8", "q4", "sign")
LOSSY_SIZES = (0, 5, 9_001, 1_600_003)  # the last one travels in several pieces per hop


def _every_lossy_ring(rank: int, world: int):
    deterministic = {name: _lossy_ring(rank, world, name, LOSSY_SIZES, False) for name in LOSSY}
    stochastic = {name: _lossy_ring(rank, world, name, (5_000,), True) for name in ("q8", "q4")}
    return deterministic, stochastic


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_lossy_ring_is_bounded_and_identical_on_every_rank(world):
    for deterministic, stochastic in in_one_world(world)["lossy"]:
        for name, per_size in deterministic.items():
            for numel, (identical, max_err, s) in zip(LOSSY_SIZES, per_size):
                assert identical, f"{name}: ranks disagree"
                if name in UNIT_ERROR:
                    assert max_err <= UNIT_ERROR[name] * s * (1 + 1e-6), (name, numel, max_err, s)
        for name, [(identical, max_err, s)] in stochastic.items():
            # Stochastic rounding: every rank still applies the same bits, and it errs by less than
            # one quantization step (twice the round-to-nearest bound).
            assert identical, f"{name} stochastic: ranks disagree"
            assert max_err <= 2 * UNIT_ERROR[name] * s, (name, max_err, s)


def _feedback_conserves_the_sum(rank: int, world: int, name: str):
    """sum_i x_i == p * mean_result + sum_i residual_i: feedback keeps exactly what the codec dropped."""
    x = rank_data(rank, 1_600_003, torch.float64)  # several pieces per hop
    feedback = ErrorFeedback(build(name))
    residual = feedback.residual("bucket", x)
    flat = x.clone()
    topology = RingTopology(dist.group.WORLD)
    ring_allreduce_(flat, feedback.compressor, topology, "mean", residual)
    lhs = x.clone()
    dist.all_reduce(lhs)
    rhs = residual.clone()
    dist.all_reduce(rhs)
    rhs += world * flat
    return float((lhs - rhs).abs().max()), float(residual.abs().max())


def _feedback_conserves_the_sum_for_each(rank: int, world: int):
    return [_feedback_conserves_the_sum(rank, world, name) for name in ("q4", "sign", "bf16")]


@pytest.mark.slow
def test_error_feedback_conserves_the_sum():
    for per_codec in in_one_world(3)["feedback"]:
        for gap, residual_size in per_codec:
            assert gap < 1e-9
            assert residual_size > 0  # the codec really dropped something


class _ForwardingOnCpu(RingTopology):
    """The all-gather's forwarding from host memory (gloo + CUDA only) taken on CPU, to check its bookkeeping."""

    def __init__(self, group) -> None:
        super().__init__(group)
        self.marked = 0

    def forwards_on_host(self, device: torch.device) -> bool:
        return True

    def forwarded(self, device: torch.device) -> None:
        self.marked += 1


def _host_forwarding_keeps_the_bits(rank: int, world: int):
    plain, forwarding = RingTopology(dist.group.WORLD), _ForwardingOnCpu(dist.group.WORLD)
    mismatches = []
    for name in ("q8", "q4", "sign"):
        for numel in (1000, 10_001, 3 * PIECE_ELEMENTS * world + 5):  # one piece per hop, then several
            for call in range(2):  # the second reuses the first's slots
                x = rank_data(rank + 10 * call, numel)
                feedback = [ErrorFeedback(build(name)) for _ in range(2)]
                results = []
                for topology, fb in zip((plain, forwarding), feedback):
                    flat = x.clone()
                    ring_allreduce_(flat, fb.compressor, topology, "mean", fb.residual("b", flat))
                    results.append((flat, fb.residual("b", flat)))
                (a, ra), (b, rb) = results
                if not (torch.equal(a, b) and torch.equal(ra, rb)):
                    mismatches.append((name, numel, call))
    return mismatches, forwarding.marked


@pytest.mark.slow
def test_forwarding_the_all_gather_from_host_memory_keeps_the_ring_s_bits():
    for mismatches, marked in in_one_world(3)["forwarding"]:
        assert mismatches == []
        # every received piece marked after its copy out of a slot: at least p-1 per ring, 3 codecs x 3 sizes x 2 calls
        assert marked >= 3 * 3 * 2 * 2


def test_chunk_bounds_cover_everything_evenly():
    for numel in (0, 1, 2, 7, 100):
        for parts in (1, 2, 3, 4, 7):
            b = chunk_bounds(numel, parts)
            sizes = [b[i + 1] - b[i] for i in range(parts)]
            assert b[0] == 0 and b[-1] == numel and max(sizes) - min(sizes) <= 1


def test_a_hop_is_pieces_on_cpu_and_one_piece_on_a_gpu():
    # On CPU the codec overlaps the wire piece by piece; on a GPU each piece cost a sync and launches (H100: the
    # q8 all-reduce of ResNet-18 70.4 ms in 8 pieces, 14.3 ms in one), so a GPU hop is one piece.
    big = 4 * MAX_PIECES * PIECE_ELEMENTS
    assert len(piece_bounds(big)) - 1 == MAX_PIECES
    assert len(piece_bounds(3 * PIECE_ELEMENTS)) - 1 == 3
    assert piece_bounds(PIECE_ELEMENTS // 2) == [0, PIECE_ELEMENTS // 2]
    assert piece_bounds(big, on_gpu=True) == [0, big]


def test_world_size_one_is_exact_and_sends_nothing():
    x = torch.randn(100)
    flat = x.clone()
    report = ring_allreduce_(flat, build("q4"), RingTopology(None))
    assert torch.equal(flat, x) and report.bytes_sent == 0


def test_bad_arguments_raise_clearly():
    with pytest.raises(ValueError, match="op must be"):
        pipesgd.ring_allreduce(torch.ones(3), op="max")
    with pytest.raises(ValueError, match="floating-point"):
        pipesgd.ring_allreduce(torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="valid names"):
        pipesgd.ring_allreduce(torch.ones(3), compression="zip")
    with pytest.raises(TypeError):
        pipesgd.ring_allreduce([1.0, 2.0])


# The checks above that run on gloo ranks, by the world size they run at. Each size's ranks run all of its checks
# one after another in one world, started once for the module: starting a world costs more than most checks.
CHECKS = {"backend": _ring_matches_backend, "lossy": _every_lossy_ring,
          "feedback": _feedback_conserves_the_sum_for_each, "forwarding": _host_forwarding_keeps_the_bits}
WORLD_CHECKS = {1: ("backend",), 2: ("backend", "lossy"), 3: ("backend", "lossy", "feedback", "forwarding"),
                4: ("backend",)}


@functools.cache
def in_one_world(world: int) -> dict[str, list]:
    """Every check of ``world`` ranks (``WORLD_CHECKS``): its per-rank results, by check name."""
    return run_checks({name: (CHECKS[name],) for name in WORLD_CHECKS[world]}, world)
