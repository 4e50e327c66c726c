"""Error feedback's arithmetic behind the encoder the ring calls, and per-rank codec seeding in build()."""
from __future__ import annotations

import pytest
import torch

from pipesgd.compression import ErrorFeedback, HopEncoder, build, open_encoder


def randn(numel: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


def round_trip(codec, x: torch.Tensor) -> torch.Tensor:
    payload, ctx = codec.compress(x)
    return codec.decompress(payload, ctx)


def test_opening_an_encoder_folds_the_residual_in_and_zeroes_it():
    codec = build("q4", block_size=16)
    x, r = randn(64), randn(64, seed=1)
    flat, residual = x.clone(), r.clone()
    open_encoder(codec, flat, residual, mean_over=3)
    assert torch.equal(flat, x + r) and torch.equal(residual, torch.zeros(64))


def test_encode_books_what_the_codec_dropped_at_its_position_only():
    codec = build("sign", block_size=16)
    flat, residual = randn(64), torch.zeros(64)
    encoder = open_encoder(codec, flat, residual)
    piece = flat[16:40]
    payload = encoder.encode(piece, 16)
    assert torch.equal(payload, codec.compress(piece)[0])
    assert torch.equal(residual[16:40], piece - round_trip(codec, piece))
    assert torch.equal(residual[:16], torch.zeros(16)) and torch.equal(residual[40:], torch.zeros(24))
    assert torch.equal(encoder.decode(payload, piece), round_trip(codec, piece))


def test_settle_replaces_a_final_chunk_by_its_decoded_value_and_books_its_error_in_sum_units():
    codec = build("q4", block_size=16)
    flat, residual = randn(48), torch.zeros(48)
    original = flat[8:24].clone()
    encoder = open_encoder(codec, flat, residual, mean_over=3)
    payload = encoder.settle_(flat[8:24], 8)
    decoded = round_trip(codec, original)
    assert torch.equal(flat[8:24], decoded) and torch.equal(payload, codec.compress(original)[0])
    assert torch.equal(residual[8:24], (original - decoded) * 3)


def test_without_a_residual_the_encoder_only_encodes():
    codec = build("bf16")
    flat = randn(10)
    encoder = open_encoder(codec, flat)
    assert type(encoder) is HopEncoder
    assert torch.equal(encoder.encode(flat, 0), codec.compress(flat)[0])
    with pytest.raises(ValueError, match="cannot serve"):
        open_encoder(codec, flat, torch.zeros(11))


def test_a_ring_of_one_hop_conserves_what_was_dropped():
    """x = decode(payload) + residual after an encode: nothing is lost, only delayed."""
    codec = build("sign", block_size=8)
    feedback = ErrorFeedback(codec)
    x = randn(40)
    flat = x.clone()
    encoder = open_encoder(codec, flat, feedback.residual("b", flat))
    payload = encoder.encode(flat, 0)
    assert torch.allclose(encoder.decode(payload, flat) + feedback.residual("b", flat), x, rtol=0, atol=1e-6)


def test_error_feedback_state_keeps_the_codec_state_apart_from_the_residuals():
    feedback = ErrorFeedback(build("q8", stochastic=True, seed=1))
    feedback.residual(0, torch.zeros(4)).fill_(2.0)
    feedback.compressor.compress(randn(100))
    residuals = feedback.residuals_state()
    assert list(residuals) == [0]  # the codec state is not among them
    other = ErrorFeedback(build("q8", stochastic=True, seed=1))
    other.load_residuals_state(residuals)
    residuals[0].zero_()  # no aliasing with the saved state
    assert torch.equal(other.residual(0, torch.zeros(4)), torch.full((4,), 2.0))


def test_build_folds_the_rank_into_the_seed_of_stochastic_rounding_only():
    x = randn(5000)
    plain = build("q8", stochastic=True, seed=3).compress(x)[0]
    assert torch.equal(build("q8", rank=0, stochastic=True, seed=3).compress(x)[0], plain)
    assert not torch.equal(build("q8", rank=1, stochastic=True, seed=3).compress(x)[0], plain)
    assert build("q8", rank=1, stochastic=True, seed=3).seed == 3 + 1_000_003
    assert build("q8", rank=5).seed == 0  # deterministic rounding: every rank builds the same codec
    assert torch.equal(build("sign", rank=2).compress(x)[0], build("sign").compress(x)[0])
    with pytest.raises(ValueError, match="bad options"):
        build("sign", rank=1, stochastic=True)
