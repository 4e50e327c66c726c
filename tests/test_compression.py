"""Invariants of the per-hop codecs (pipesgd.compression) and of the error-feedback wrapper.

Single process, CPU (plus one CUDA check that is skipped without a GPU). The quantizers are checked
bit for bit against independent numpy re-implementations, the way BytePS tests its compressors.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipesgd.compression import (
    ChunkContext,
    Compressor,
    ErrorFeedback,
    available,
    build,
    compression_ratio,
    context_of,
)

SIZES = [0, 1, 7, 4095, 4096, 4097, 100003]
DTYPES = [torch.float32, torch.float64]
# (registry name, options): every codec, and the quantizers in both rounding modes.
CODECS = [
    ("none", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("q8", {}),
    ("q8", {"stochastic": True}),
    ("q4", {}),
    ("q4", {"stochastic": True}),
    ("sign", {}),
]
CODEC_IDS = [name + ("-stochastic" if opts else "") for name, opts in CODECS]
NAN = float("nan")


def randn(numel: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=gen, dtype=torch.float64).to(dtype)


def round_trip(codec: Compressor, x: torch.Tensor) -> torch.Tensor:
    payload, ctx = codec.compress(x)
    return codec.decompress(payload, ctx)


def block_scales(x: np.ndarray, block_size: int, reduce) -> np.ndarray:
    """Per-element value of a per-block statistic, in float64 (an independent reference)."""
    out = np.empty_like(x, dtype=np.float64)
    for start in range(0, x.size, block_size):
        out[start : start + block_size] = reduce(x[start : start + block_size].astype(np.float64))
    return out


# -- contract: sizes, dtypes, payload shape --------------------------------------------------------


def test_registry_lists_every_codec_and_only_none_is_lossless():
    assert available() == sorted(["none", "fp16", "bf16", "q8", "q4", "sign"])
    for name in available():
        codec = build(name)
        assert isinstance(codec, Compressor)
        assert codec.name == name
        assert codec.lossless == (name == "none")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize(("name", "options"), CODECS, ids=CODEC_IDS)
def test_round_trip_payload_size_and_error_bound(name, options, numel, dtype):
    codec = build(name, **options)
    x = randn(numel, dtype, seed=numel)
    payload, ctx = codec.compress(x)
    assert ctx == context_of(x) == ChunkContext(numel, dtype, x.device)
    assert payload.dtype == torch.uint8 and payload.dim() == 1 and payload.is_contiguous()
    assert payload.numel() == codec.payload_bytes(numel, dtype)
    # The receiver rebuilds ctx from (numel, dtype, device) alone and decodes a copy of the bytes.
    y = codec.decompress(payload.clone(), ChunkContext(numel, dtype, torch.device("cpu")))
    assert y.dtype == dtype and y.shape == (numel,)
    check_error_bound(name, options, x, y)


def check_error_bound(name: str, options: dict, x: torch.Tensor, y: torch.Tensor) -> None:
    if x.numel() == 0:
        return
    if name == "none":
        assert torch.equal(x, y)
        return
    # Lossy codecs work on the fp32 value of the input.
    x32 = x.to(torch.float32).double().numpy()
    y64 = y.double().numpy()
    err = np.abs(y64 - x32)
    if name == "fp16":
        # Round to nearest with an 11-bit significand: relative error <= 2^-11 in the normal range
        # (|x| >= 2^-14); below it, fp16 subnormals are spaced 2^-24, so the error is <= 2^-25.
        normal = np.abs(x32) >= 2.0**-14
        assert np.all(err[normal] <= 2.0**-11 * np.abs(x32[normal]))
        assert np.all(err[~normal] <= 2.0**-25)
    elif name == "bf16":
        # Truncation to 8 significant bits drops less than one unit in the 8th bit: relative error
        # < 2^-7, and toward zero only, so the sign is kept and |decoded| <= |x|.
        assert np.all(err <= 2.0**-7 * np.abs(x32))
        assert np.all(np.abs(y64) <= np.abs(x32))
        assert np.all((y64 == 0) | (np.sign(y64) == np.sign(x32)))
    elif name in ("q8", "q4"):
        qmax = 127 if name == "q8" else 7
        scale = block_scales(x32, 4096, lambda b: np.abs(b).max() / qmax)
        # Round to nearest is off by at most half a step; stochastic rounding by less than one step.
        # The slack 2e-5 * scale covers the two fp32 roundings (x / scale and code * scale), each at
        # most 2^-24 * qmax * scale.
        step = 1.0 if options.get("stochastic") else 0.5
        assert np.all(err <= scale * (step + 2e-5))
    elif name == "sign":
        # Every element decodes to +-mean|x| of its block, with the sign of x (x >= 0 -> +).
        mean_abs = block_scales(x32, 4096, lambda b: np.abs(b).mean())
        np.testing.assert_allclose(np.abs(y64), mean_abs, rtol=1e-5)
        assert np.all((y64 >= 0) == (x32 >= 0))
    else:  # pragma: no cover
        raise AssertionError(name)


@pytest.mark.parametrize("numel", [0, 1, 7, 4097])
def test_payload_bytes_formulas(numel):
    blocks = math.ceil(numel / 4096)
    assert build("none").payload_bytes(numel) == 4 * numel
    assert build("none").payload_bytes(numel, torch.float64) == 8 * numel
    for name in ("fp16", "bf16"):
        assert build(name).payload_bytes(numel, torch.float64) == 2 * numel
    assert build("q8").payload_bytes(numel) == 4 * blocks + numel
    assert build("q4").payload_bytes(numel) == 4 * blocks + math.ceil(numel / 2)
    assert build("sign").payload_bytes(numel) == 4 * blocks + math.ceil(numel / 8)
    assert compression_ratio(build("q8"), 4096) == pytest.approx(4 * 4096 / (4 + 4096))


# -- independent references ------------------------------------------------------------------------


@pytest.mark.parametrize("numel", SIZES)
def test_bf16_matches_bit_level_reference(numel):
    x = randn(numel) * 1e3
    payload, ctx = build("bf16").compress(x)
    bits = x.numpy().view(np.uint32)
    upper = (bits >> np.uint32(16)).astype(np.uint16)  # logical shift of the unsigned word
    assert payload.numpy().tobytes() == upper.astype("<u2").tobytes()
    expected = (upper.astype(np.uint32) << np.uint32(16)).view(np.float32)
    decoded = build("bf16").decompress(payload, ctx)
    assert np.array_equal(decoded.numpy().view(np.uint32), expected.view(np.uint32))


def numpy_quantize(x: np.ndarray, bits: int, block_size: int) -> tuple[bytes, np.ndarray]:
    """Plain numpy re-implementation of the block quantizer: (payload bytes, decoded values)."""
    qmax = np.float32(2 ** (bits - 1) - 1)
    x = x.astype(np.float32)
    scales, codes = [], []
    for start in range(0, x.size, block_size):
        block = x[start : start + block_size]
        scale = np.float32(np.max(np.abs(block)) / qmax)
        codes.append(np.clip(np.rint(block / (scale if scale > 0 else np.float32(1))), -qmax, qmax))
        scales.append(scale)
    scales = np.array(scales, dtype=np.float32)
    # Through integers, as the payload does (a code of -0.0 decodes as +0.0).
    codes = (np.concatenate(codes) if codes else np.zeros(0)).astype(np.int32).astype(np.float32)
    decoded = codes * np.repeat(scales, block_size)[: x.size]
    if bits == 8:
        code_bytes = codes.astype(np.int8).tobytes()
    else:
        nibbles = (codes + 8).astype(np.uint8)
        if nibbles.size % 2:
            nibbles = np.append(nibbles, np.uint8(8))  # pad with code 0
        code_bytes = (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()
    return scales.astype("<f4").tobytes() + code_bytes, decoded.astype(np.float32)


@pytest.mark.parametrize("block_size", [4096, 100, 7])
@pytest.mark.parametrize("numel", SIZES + [21])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantizer_matches_numpy_oracle_exactly(bits, numel, block_size):
    if block_size == 7 and numel > 5000:
        pytest.skip("the oracle loops over blocks in Python; small sizes cover block_size 7")
    codec = build(f"q{bits}", block_size=block_size)
    x = randn(numel, seed=bits + numel)
    if numel > 10:
        x[3:10] = 0.0  # an all-zero short run, and a whole zero block when block_size is 7
    payload, ctx = codec.compress(x)
    expected_payload, expected = numpy_quantize(x.numpy(), bits, block_size)
    assert payload.numpy().tobytes() == expected_payload
    decoded = codec.decompress(payload, ctx)
    assert np.array_equal(decoded.numpy().view(np.uint32), expected.view(np.uint32))


# -- stochastic rounding ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["q8", "q4"])
def test_stochastic_rounding_is_unbiased(name):
    # 4000 copies of one 64-element block, each its own block: same scale s, independent draws.
    draws, width = 4000, 64
    x = torch.rand(width, generator=torch.Generator().manual_seed(1)) * 2 - 1
    repeated = x.repeat(draws)
    y = round_trip(build(name, block_size=width, stochastic=True), repeated).view(draws, width)
    scale = float(x.abs().max()) / (127 if name == "q8" else 7)
    # Each draw is within one step s of x with mean x, so its std is <= s / 2, and the mean of N draws
    # has std <= s / (2 sqrt N); 6 of those bounds a 64-element max with room to spare.
    tolerance = 6 * scale / (2 * math.sqrt(draws))
    assert (y.mean(dim=0) - x).abs().max() <= tolerance
    # The test has teeth: deterministic rounding is biased by far more than the tolerance somewhere.
    y_det = round_trip(build(name, block_size=width), repeated).view(draws, width)
    assert (y_det.mean(dim=0) - x).abs().max() > 4 * tolerance


def test_stochastic_rounding_is_reproducible_and_seeded():
    x = randn(5000)
    first = build("q4", stochastic=True, seed=3).compress(x)[0]
    again = build("q4", stochastic=True, seed=3).compress(x)[0]
    other = build("q4", stochastic=True, seed=4).compress(x)[0]
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_stochastic_generator_state_resumes_identically():
    x = randn(5000)
    codec = build("q8", stochastic=True, seed=7)
    codec.compress(x)
    state = codec.state_dict()
    expected = [codec.compress(x)[0] for _ in range(2)]
    resumed = build("q8", stochastic=True, seed=7)
    resumed.load_state_dict(state)
    assert all(torch.equal(p, resumed.compress(x)[0]) for p in expected)


# -- special values, determinism -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "options"), CODECS, ids=CODEC_IDS)
def test_non_finite_input_is_visible_not_raised(name, options):
    blocked = name in ("q8", "q4", "sign")
    codec = build(name, **({"block_size": 16, **options} if blocked else options))
    x = randn(40)  # blocks [0, 16), [16, 32), [32, 40)
    x[20], x[35] = NAN, -float("inf")
    y = round_trip(codec, x)
    if blocked:
        # The whole block is poisoned; the finite block is untouched by its neighbours.
        assert torch.isnan(y[16:]).all()
        assert torch.isfinite(y[:16]).all()
        if not options:  # deterministic: the first block codes exactly as it would alone
            assert torch.equal(y[:16], round_trip(build(name, block_size=16), x[:16].clone()))
    else:
        assert torch.isnan(y[20]) and torch.isinf(y[35]) and y[35] < 0
        assert torch.isfinite(y[:20]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("name", "options"), CODECS, ids=CODEC_IDS)
def test_all_zero_input_decodes_to_exact_zeros(name, options, dtype):
    y = round_trip(build(name, **options), torch.zeros(5000, dtype=dtype))
    assert torch.equal(y, torch.zeros(5000, dtype=dtype))


@pytest.mark.parametrize(("name", "options"), CODECS, ids=CODEC_IDS)
def test_decompress_is_deterministic_and_alignment_free(name, options):
    codec = build(name, **options)
    x = randn(4097)
    payload, ctx = codec.compress(x)
    first = codec.decompress(payload, ctx).clone()
    assert torch.equal(codec.decompress(payload, ctx), first)
    # A receive buffer slice at an odd byte offset (cannot be viewed as fp32 in place).
    buffer = torch.zeros(payload.numel() + 1, dtype=torch.uint8)
    buffer[1:].copy_(payload)
    assert torch.equal(codec.decompress(buffer[1:], ctx).view(torch.int32), first.view(torch.int32))


def test_decompress_rejects_a_payload_of_the_wrong_size():
    codec = build("q8")
    payload, ctx = codec.compress(randn(100))
    with pytest.raises(ValueError, match="104 bytes"):
        codec.decompress(payload[:-2], ctx)


# -- build errors ----------------------------------------------------------------------------------


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown compressor 'q2'.*bf16, fp16, none, q4, q8, sign"):
        build("q2")


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("q8", {"block_size": 0}, "block_size"),
        ("q4", {"block_size": -5}, "block_size"),
        ("sign", {"block_size": 2.5}, "block_size"),
        ("q8", {"block_size": True}, "block_size"),
        ("q8", {"seed": -1}, "seed"),
        ("q4", {"stochastic": "yes"}, "stochastic"),
        ("q8", {"bits": 4}, "bad options"),
        ("none", {"block_size": 16}, "bad options"),
        ("sign", {"stochastic": True}, "bad options"),
    ],
)
def test_bad_options_raise_value_error(name, options, message):
    with pytest.raises(ValueError, match=message):
        build(name, **options)


# -- error feedback --------------------------------------------------------------------------------


def test_residual_is_persistent_zero_initialised_and_per_key():
    ef = ErrorFeedback(build("sign"))
    assert ef.residual_norm() == 0.0
    like = torch.ones(10, dtype=torch.float64)
    r = ef.residual("a", like)
    assert torch.equal(r, torch.zeros_like(like)) and r.dtype == torch.float64
    r.add_(2.0)
    assert ef.residual("a", like) is r
    assert torch.equal(ef.residual("b", like), torch.zeros_like(like))
    assert ef.residual_norm() == pytest.approx(math.sqrt(10 * 4.0))


def test_residual_shape_or_dtype_mismatch_raises():
    ef = ErrorFeedback(build("q8"))
    ef.residual(0, torch.zeros(8))
    with pytest.raises(ValueError, match="shape"):
        ef.residual(0, torch.zeros(9))
    with pytest.raises(ValueError, match="dtype"):
        ef.residual(0, torch.zeros(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="float32 or float64"):
        ef.residual(1, torch.zeros(8, dtype=torch.float16))


def test_reset_all_or_only_non_finite_buffers():
    ef = ErrorFeedback(build("q4"))
    good, bad = ef.residual("good", torch.zeros(4)), ef.residual("bad", torch.zeros(4))
    good.fill_(1.0)
    bad.fill_(1.0)[2] = NAN
    assert math.isnan(ef.residual_norm())
    ef.reset(nonfinite_only=True)
    assert torch.equal(good, torch.ones(4)) and torch.equal(bad, torch.zeros(4))
    ef.reset()
    assert ef.residual_norm() == 0.0


def test_error_feedback_state_dict_round_trip():
    ef = ErrorFeedback(build("q8", stochastic=True, seed=5))
    ef.residual("w", torch.zeros(6)).copy_(torch.arange(6.0))
    x = randn(300)
    ef.compressor.compress(x)
    state = ef.state_dict()
    expected = ef.compressor.compress(x)[0]

    restored = ErrorFeedback(build("q8", stochastic=True, seed=5))
    restored.load_state_dict(state)
    assert torch.equal(restored.residual("w", torch.zeros(6)), torch.arange(6.0))
    assert torch.equal(restored.compressor.compress(x)[0], expected)
    state["residuals"]["w"].zero_()  # the restored buffers do not alias the checkpoint
    assert restored.residual_norm() > 0
    assert "compressor" not in ErrorFeedback(build("sign")).state_dict()


@pytest.mark.parametrize(("name", "options"), [("sign", {"block_size": 16}), ("q4", {"block_size": 16})])
def test_error_feedback_running_mean_converges_to_the_true_gradient(name, options):
    codec = build(name, **options)
    ef = ErrorFeedback(codec)
    gradient = randn(64, seed=11)
    steps = 1000
    total = torch.zeros(64)
    for _ in range(steps):
        # Exactly what the ring does: add and clear the residual, send, keep what was lost.
        residual = ef.residual("bucket", gradient)
        x = gradient + residual
        residual.zero_()
        decoded = round_trip(codec, x)
        residual.add_(x - decoded)
        total += decoded
    total_without_ef = steps * round_trip(codec, gradient)
    # mean(decoded) - g = -residual_T / T, and the residual stays bounded (about 7 max|g| for sign on this
    # data, 0.07 max|g| for q4), so the error falls like 1/T: 0.02 max|g| leaves sign a 3x margin at T=1000.
    err = (total / steps - gradient).abs().max()
    err_without = (total_without_ef / steps - gradient).abs().max()
    assert err <= 0.02 * gradient.abs().max()
    assert err_without > 10 * err  # without feedback the codec's bias never goes away


# -- GPU -------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["none", "fp16", "bf16", "q8", "q4", "sign"])
def test_cuda_matches_cpu_bits(name):
    codec = build(name)
    x = randn(10007)
    cpu_payload, _ = codec.compress(x)
    gpu_payload, ctx = codec.compress(x.cuda())
    assert ctx.device.type == "cuda" and gpu_payload.device.type == "cuda"
    assert torch.equal(gpu_payload.cpu(), cpu_payload)
    assert torch.equal(codec.decompress(gpu_payload, ctx).cpu(), round_trip(codec, x))
