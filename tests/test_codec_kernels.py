"""Issue 11 part 4: the cheaper q8 / q4 / sign kernels give, bit for bit, the payload bytes and decoded values of the
codecs they replaced (``tests/codec_reference.py``, a frozen copy), on every path: CPU tiles of several sizes, the
one-matrix path CUDA takes (forced here on CPU), q4's portable packing, and sign's torch bit packing."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import pipesgd.compression._blocks as blocks_module
import pipesgd.compression.quantize as quantize
import pipesgd.compression.sign as sign
from pipesgd.compression import build
from pipesgd.compression._blocks import may_be_non_finite
from tests.codec_reference import ReferenceScalarQuantizer, ReferenceSignCompressor

NAN, INF = float("nan"), float("inf")
FLOAT_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
              torch.bfloat16: torch.int16}
# (name, new codec options, reference factory): every codec and rounding mode.
CODECS = {
    "q8": lambda **o: (build("q8", **o), ReferenceScalarQuantizer(8, **o)),
    "q4": lambda **o: (build("q4", **o), ReferenceScalarQuantizer(4, **o)),
    "sign": lambda **o: (build("sign", **o), ReferenceSignCompressor(**o)),
}
STOCHASTIC = [("q8", False), ("q8", True), ("q4", False), ("q4", True), ("sign", False)]


def pair(name: str, stochastic: bool = False, **options):
    if stochastic:
        options = {**options, "stochastic": True, "seed": 1234}
    return CODECS[name](**options)


def data(kind: str, numel: int, block_size: int, seed: int = 0) -> torch.Tensor:
    """Random data with the features that have bitten codecs: zeros, -0.0, whole zero blocks, inf, NaN, rounding ties,
    all-negative blocks, subnormals, and sums of |x| that overflow fp32."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + numel)
    x = torch.randn(numel, generator=gen, dtype=torch.float64).to(torch.float32)
    if kind == "zeros":
        x[::5] = 0.0
        x[1::7] = -0.0
        x[block_size : 2 * block_size] = 0.0  # a whole zero block (when there is a second one)
        x[-min(numel, 3) :] = 0.0  # the (maybe short) last block ends in zeros
    elif kind == "special":
        x[numel // 3] = NAN
        x[(2 * numel) // 3] = INF
        x[-1] = -INF
        x[: min(numel, block_size)] = -x[: min(numel, block_size)].abs()  # an all-negative first block
    elif kind == "ties":
        # max|x| = 127 (q8) or 7 (q4) makes the scale 1, so x / scale sits exactly on .5: ties go to even.
        x = torch.arange(numel, dtype=torch.float32).remainder(15).sub(7).add(0.5)
        x[::block_size] = 127.0
    elif kind == "extremes":
        x = x * 3e38  # inf after scaling for many, and |x| sums far past fp32's range
        x[::3] = 1e-42  # subnormals
        x[1::11] = torch.finfo(torch.float32).max
    elif kind == "all_zero":
        x.zero_()
    elif kind == "huge_finite":
        x = x.clamp(-3, 3) * 1.1e38  # every value finite, but the scales' sum overflows: the check's false alarm
    return x


def assert_same(new, ref, x: torch.Tensor, encodes: int = 1) -> None:
    """Payload bytes, decoded bits, and (for a stochastic codec) the generator's state after each encode."""
    for _ in range(encodes):
        payload, ctx = new.compress(x)
        expected, expected_ctx = ref.compress(x)
        assert ctx == expected_ctx
        assert payload.dtype == torch.uint8 and payload.numel() == new.payload_bytes(x.numel())
        assert torch.equal(payload, expected), "payload bytes differ"
        bits = FLOAT_BITS[x.dtype]
        decoded, reference = new.decompress(payload, ctx), ref.decompress(expected, ctx)
        assert decoded.dtype == reference.dtype == x.dtype
        assert torch.equal(decoded.view(bits), reference.view(bits)), "decoded bits differ"
    if getattr(new, "stochastic", False):
        assert torch.equal(new.state_dict()["generators"]["cpu"], ref.state_dict()["generators"]["cpu"])


KINDS = ["randn", "zeros", "special", "ties", "extremes", "all_zero"]
# Below, at and above one block, odd and even counts; 3 * 4096 + 5 is several whole blocks and a short last one in
# one tile (padded whole, as every chunk up to a tile is); chunks of more than a tile have their own test below.
SIZES = [1, 2, 3, 7, 8, 63, 64, 65, 4095, 4096, 4097, 3 * 4096 + 5]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize(("name", "stochastic"), STOCHASTIC)
def test_default_block_size_matches_reference(name, stochastic, numel, kind):
    new, ref = pair(name, stochastic)
    assert_same(new, ref, data(kind, numel, 4096), encodes=3 if stochastic else 1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("numel", "block_size"), [(1000, 1), (999, 7), (1001, 64), (5000, 100), (333, 1000)])
@pytest.mark.parametrize(("name", "stochastic"), STOCHASTIC)
def test_other_block_sizes_match_reference(name, stochastic, numel, block_size, kind):
    new, ref = pair(name, stochastic, block_size=block_size)
    assert_same(new, ref, data(kind, numel, block_size), encodes=2 if stochastic else 1)


# Tile sizes (elements): tiles of a few rows and one not a whole number of rows, to cross tile and tail boundaries on
# small data, and one so big that every chunk is a single padded matrix (what CUDA does).
@pytest.mark.parametrize("tile_elements", [64, 200, 1 << 30])
@pytest.mark.parametrize("kind", ["randn", "zeros", "special"])
@pytest.mark.parametrize(("numel", "block_size"), [(64 * 9, 64), (64 * 9 + 1, 64), (64 * 10 + 63, 64), (701, 7),
                                                 (4 * 51 + 3, 4), (12 * 41 + 5, 12), (2 * 301, 2)])
@pytest.mark.parametrize(("name", "stochastic"), STOCHASTIC)
def test_every_tiling_matches_reference(name, stochastic, numel, block_size, kind, tile_elements, monkeypatch):
    monkeypatch.setattr(blocks_module, "_CPU_TILE_ELEMENTS", tile_elements)
    new, ref = pair(name, stochastic, block_size=block_size)
    assert_same(new, ref, data(kind, numel, block_size), encodes=2 if stochastic else 1)


@pytest.mark.parametrize("numel", [(1 << 18) - 1, 1 << 18, (1 << 18) + 1, 3 * (1 << 18) + 4096 * 5 + 17])
@pytest.mark.parametrize(("name", "stochastic"), STOCHASTIC)
def test_chunks_of_several_real_tiles_match_reference(name, stochastic, numel):
    new, ref = pair(name, stochastic)
    assert_same(new, ref, data("special", numel, 4096), encodes=2 if stochastic else 1)


# Both codecs convert the input to fp32 before splitting it into blocks and tiles, and decode in fp32 before the
# conversion back: one block and several cover each dtype; tiling is the fp32 tests' (several tiles: the chunks test).
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["randn", "zeros", "special"])
@pytest.mark.parametrize("numel", [5, 4097])
@pytest.mark.parametrize(("name", "stochastic"), STOCHASTIC)
def test_other_input_dtypes_match_reference(name, stochastic, numel, kind, dtype):
    new, ref = pair(name, stochastic)
    assert_same(new, ref, data(kind, numel, 4096).to(dtype), encodes=2 if stochastic else 1)


@pytest.mark.parametrize("kind", ["randn", "zeros", "special", "extremes"])
@pytest.mark.parametrize("numel", [1, 9, 4097, 300_001])
@pytest.mark.parametrize(("name", "stochastic"), STOCHASTIC)
def test_the_cuda_paths_forced_on_cpu_match_reference(name, stochastic, numel, kind, monkeypatch):
    """What a CUDA tensor takes: masks without asking (no host sync), one padded matrix (no tiles), sign's torch bit
    packing and unpacking instead of numpy's."""
    monkeypatch.setattr(quantize, "_ask_before_masking", lambda tensor: False)
    monkeypatch.setattr(quantize, "tile_rows", lambda block_size, device: None)
    monkeypatch.setattr(sign, "tile_rows", lambda block_size, device: None)
    monkeypatch.setattr(blocks_module, "_CPU_TILE_ELEMENTS", 1 << 62)
    monkeypatch.setattr(sign, "_on_host", lambda tensor: False)
    new, ref = pair(name, stochastic)
    assert_same(new, ref, data(kind, numel, 4096), encodes=2 if stochastic else 1)


@pytest.mark.parametrize("numel", [1, 2, 3, 4, 5, 4097, 300_003])
@pytest.mark.parametrize("stochastic", [False, True])
def test_q4_portable_nibble_code_matches_reference(numel, stochastic, monkeypatch):
    """The strided packing and unpacking a big-endian host would use (the word tricks read bytes little-endian)."""
    monkeypatch.setattr(quantize, "_LITTLE_ENDIAN", False)
    new, ref = pair("q4", stochastic)
    assert_same(new, ref, data("zeros", numel, 4096), encodes=2)


def test_q4_unpacks_every_byte():
    """All 256 byte values decode to the reference's codes (the widening trick carries nothing between nibbles)."""
    new, ref = pair("q4", block_size=512)
    payload = torch.cat([torch.ones(1).view(torch.uint8), torch.arange(256, dtype=torch.uint8)])
    ctx = new.compress(torch.zeros(512))[1]
    assert torch.equal(new.decompress(payload, ctx), ref.decompress(payload, ctx))


@pytest.mark.parametrize(("numel", "block_size"), [(10_000, 1), (10_001, 64), (100_003, 4096)])
@pytest.mark.parametrize(("name", "stochastic"), STOCHASTIC)
def test_finite_scales_whose_sum_overflows_match_reference(name, stochastic, numel, block_size):
    new, ref = pair(name, stochastic, block_size=block_size)
    assert_same(new, ref, data("huge_finite", numel, block_size), encodes=2 if stochastic else 1)


def test_the_non_finite_check_is_conservative_and_never_asks_when_told_not_to():
    assert not may_be_non_finite(torch.tensor([0.0, 1.0, 3e38]), ask=True)
    assert may_be_non_finite(torch.tensor([0.0, float("nan")]), ask=True)
    assert may_be_non_finite(torch.tensor([1.0, float("inf")]), ask=True)
    assert may_be_non_finite(torch.tensor([3e38, 3e38]), ask=True)  # finite, but the sum overflows: a false alarm
    assert may_be_non_finite(torch.tensor([1.0]), ask=False)  # CUDA: never reads the answer, always masks


@pytest.mark.parametrize(("name", "stochastic"), STOCHASTIC)
def test_decode_of_a_misaligned_payload_matches_reference(name, stochastic):
    new, ref = pair(name, stochastic)
    x = data("special", 10_007, 4096)
    payload, ctx = new.compress(x)
    buffer = torch.empty(payload.numel() + 1, dtype=torch.uint8)
    buffer[1:].copy_(payload)  # the scales start at an odd address: decoding copies them once instead of failing
    decoded = new.decompress(buffer[1:], ctx)
    assert torch.equal(decoded.view(torch.int32), ref.decompress(payload, ctx).view(torch.int32))


@pytest.mark.parametrize(("name", "stochastic"), STOCHASTIC)
def test_an_input_that_requires_grad_encodes_as_before(name, stochastic):
    """The old codecs took such a tensor; the out= kernels would refuse it without the detach."""
    new, ref = pair(name, stochastic)
    assert_same(new, ref, data("special", 300_001, 4096).requires_grad_(), encodes=2 if stochastic else 1)


def test_the_reference_is_not_the_code_under_test():
    """A bit-exactness test that compared the new code with itself could not fail."""
    assert type(build("q8")).compress is not ReferenceScalarQuantizer.compress
    assert type(build("sign")).compress is not ReferenceSignCompressor.compress
    # ... and the comparison notices a single changed byte.
    new, ref = pair("q8")
    x = data("randn", 5000, 4096)
    payload = new.compress(x)[0].clone()
    payload[-1] ^= 1
    assert not torch.equal(payload, ref.compress(x)[0])


# -- experiments/bench_codecs.py -------------------------------------------------------------------------------------


def _bench_main():
    path = Path(__file__).resolve().parent.parent / "experiments" / "bench_codecs.py"
    spec = importlib.util.spec_from_file_location("bench_codecs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("argv", [["--codecs", "q9"], ["--sizes", "3XB"], ["--sizes", "1B"], ["--repeats", "0"],
                                  ["--device", "tpu"], ["--bogus"]])
def test_bench_bad_flags_are_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _bench_main()(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("bench_codecs: error: "), err


def test_bench_prints_new_and_old_side_by_side(capsys):
    threads = torch.get_num_threads()
    try:
        assert _bench_main()(["--codecs", "q8,sign,bf16", "--sizes", "4KB,5KiB", "--repeats", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    rows = table[table.index(next(line for line in table if line.startswith("| codec"))) + 1 :]  # after the header
    assert [row.split(" | ")[0:2] for row in rows] == [["| q8", "4 KB"], ["| q8", "5.12 KB"], ["| sign", "4 KB"],
                                                       ["| sign", "5.12 KB"], ["| bf16", "4 KB"], ["| bf16", "5.12 KB"]]
    assert all(row.endswith("| yes |") for row in rows)


def test_bench_notices_codecs_that_disagree():
    from experiments.harness.codec_ab import CodecPair, measure_ab

    row = measure_ab(CodecPair("q8 vs q4", lambda: build("q8"), lambda: build("q4")), 5000, repeats=1)
    assert not row.same_bits and row.encode_new_gbps > 0 and row.decode_old_gbps > 0
