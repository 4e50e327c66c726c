"""Batched codec calls (pipesgd.compression.rows) give every chunk's payload and decoded values bit for bit as one
call per chunk would, for every codec, block size, dtype and mix of chunk lengths, non-finite values included; and
they batch (fewer codec calls) exactly where the module doc says: q8, q4 and sign chunks of one block count up
to CPU_BATCH_ELEMENTS on CPU."""
from __future__ import annotations

import pytest
import torch

from pipesgd.compression import build
from pipesgd.compression.base import ChunkContext
from pipesgd.compression.rows import CPU_BATCH_ELEMENTS, compress_rows, decompress_rows

CODECS = [("none", {}), ("fp16", {}), ("bf16", {}), ("q8", {}), ("q4", {}), ("sign", {}), ("q8", {"block_size": 7}),
          ("q4", {"block_size": 7}), ("q4", {"block_size": 8}), ("q8", {"stochastic": True}),
          ("q4", {"stochastic": True}), ("sign", {"block_size": 7}), ("sign", {"block_size": 8}),
          ("sign", {"block_size": 24})]
LENGTHS = [[5000, 5000, 5001], [1, 2, 3], [0, 5, 4096, 4097], [4096, 4096], [8191, 8192, 8193], [17, 17, 16],
           [300_000, 3], [40_000, 40_000, 3], [9]]


def chunks_of(lengths: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(sum(lengths))
    xs = [torch.randn(n, generator=generator, dtype=dtype) * 10.0 ** (j - 1) for j, n in enumerate(lengths)]
    if lengths[0] > 10:  # a NaN in one block and an inf in another chunk: their blocks decode as non-finite
        xs[0][7] = float("nan")
        xs[-1][-1] = float("inf")
    return xs


@pytest.mark.parametrize("name,options", CODECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_payload_and_decode_is_the_one_chunk_calls_bit_for_bit(name, options, dtype):
    for lengths in LENGTHS:
        xs = chunks_of(lengths, dtype)
        one_by_one, batched = build(name, **options), build(name, **options)  # same seeds for stochastic rounding
        want = [one_by_one.compress(x)[0] for x in xs]
        got = compress_rows(batched, xs)
        for w, g, n in zip(want, got, lengths):
            assert torch.equal(w, g), (name, options, lengths, n)
        decoded_want = [one_by_one.decompress(w, ChunkContext(x.numel(), dtype)) for w, x in zip(want, xs)]
        decoded = decompress_rows(batched, want, lengths, dtype)
        for w, g, n in zip(decoded_want, decoded, lengths):
            assert w.dtype == g.dtype == dtype and w.shape == g.shape, (name, lengths, n)
            assert torch.equal(w.isnan(), g.isnan()) and torch.equal(w.nan_to_num(7.0), g.nan_to_num(7.0)), (
                name, options, lengths, n)


class CountingCodec:
    """Counts a codec's calls."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, attribute):
        return getattr(self.inner, attribute)

    def compress(self, tensor):
        self.calls += 1
        return self.inner.compress(tensor)

    def decompress(self, payload, ctx):
        self.calls += 1
        return self.inner.decompress(payload, ctx)


def counting(codec) -> CountingCodec:
    counter = CountingCodec(codec)
    if hasattr(codec, "compress_padded_rows"):  # sign encodes padded rows itself: count that call too
        def compress_padded_rows(matrix, lengths):
            counter.calls += 1
            return codec.compress_padded_rows(matrix, lengths)
        counter.compress_padded_rows = compress_padded_rows
    return counter


@pytest.mark.parametrize("name,calls,mixed_calls", [("q8", 1, 2), ("q4", 1, 2), ("bf16", 3, 3), ("fp16", 3, 3),
                                                   ("sign", 1, 2)])
def test_chunks_of_one_block_count_share_one_call_and_the_rest_go_one_by_one(name, calls, mixed_calls, monkeypatch):
    import pipesgd.compression.rows as rows

    real = rows._layout
    monkeypatch.setattr(rows, "_layout", lambda codec: real(codec.inner))
    codec = counting(build(name))
    xs = chunks_of([5000, 5000, 5001], torch.float32)  # two blocks of 4096 each
    payloads = compress_rows(codec, xs)
    assert codec.calls == calls
    codec.calls = 0
    decompress_rows(codec, payloads, [5000, 5000, 5001])
    assert codec.calls == calls
    codec.calls = 0
    compress_rows(codec, chunks_of([4096, 4097, 1], torch.float32))  # scales 1, 2, 1
    assert codec.calls == mixed_calls
    codec.calls = 0
    compress_rows(codec, chunks_of([CPU_BATCH_ELEMENTS] * 2 + [CPU_BATCH_ELEMENTS + 1], torch.float32))  # one too long
    assert codec.calls == mixed_calls


@pytest.mark.parametrize("name", ["q8", "q4", "sign"])
def test_rows_of_one_tensor_are_read_in_place_with_the_same_bits(name):
    """Whole-block chunks side by side in one flat tensor (encoded as a view of it), payloads that are the slots of
    one buffer (decoded through one strided view) and chunks with a gap between them (copied)."""
    codec = build(name)
    flat = torch.randn(5 * 4096, generator=torch.Generator().manual_seed(3))
    for chunks in (list(flat.split(4096))[:3], [flat[:4096], flat[2 * 4096 : 3 * 4096], flat[3 * 4096 : 4 * 4096]],
                   [flat[:4096], flat[2 * 4096 : 3 * 4096], flat[4 * 4096 :]]):
        want = [codec.compress(x)[0] for x in chunks]
        assert all(torch.equal(w, g) for w, g in zip(want, compress_rows(codec, chunks)))
        size = want[0].numel()
        for slot in (size, size + 5):  # packed, and slots with room to spare (an all-gather's padding)
            buffer = torch.zeros(len(want) * slot, dtype=torch.uint8)
            slots = [buffer[k * slot : k * slot + size] for k in range(len(want))]
            for s, w in zip(slots, want):
                s.copy_(w)
            decoded = decompress_rows(codec, slots, [4096] * len(want))
            for w, g in zip(want, decoded):
                assert torch.equal(codec.decompress(w, ChunkContext(4096)), g)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_casts_of_chunks_side_by_side_take_one_call_over_their_span(name, monkeypatch):
    """fp16 and bf16 work element by element: chunks that lie side by side (any lengths) share one call, bit for bit;
    a gap, an empty chunk or a separate tensor starts a new call."""
    import pipesgd.compression.rows as rows

    real = rows._is_cast
    monkeypatch.setattr(rows, "_is_cast", lambda codec: real(codec.inner))
    codec = counting(build(name))
    flat = torch.randn(10_001, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    bounds = [0, 2500, 5000, 5000, 7500, 10_001]
    chunks = [flat[a:b] for a, b in zip(bounds, bounds[1:])]  # the third is empty
    for picked, calls in (([0, 1], 1), ([0, 1, 2, 3, 4], 3), ([0, 3, 4], 2), ([1, 3], 1), ([1, 4], 2)):
        xs = [chunks[k] for k in picked]
        want = [codec.inner.compress(x)[0] for x in xs]
        codec.calls = 0
        got = compress_rows(codec, xs)
        assert codec.calls == calls, (picked, codec.calls)
        assert all(torch.equal(w, g) for w, g in zip(want, got)), picked
        codec.calls = 0
        decoded = decompress_rows(codec, got, [x.numel() for x in xs], torch.float64)
        assert codec.calls == calls, (picked, codec.calls)  # the payloads of one call lie side by side too
        for w, g, x in zip(want, decoded, xs):
            assert torch.equal(codec.inner.decompress(w, ChunkContext(x.numel(), torch.float64)), g)


def test_views_at_gives_the_slices_in_one_call_and_overlaps_slice_by_slice():
    from torch.utils._python_dispatch import TorchDispatchMode

    from pipesgd.compression.rows import views_at

    class Calls(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Calls.count += 1
            return func(*args, **(kwargs or {}))

    flat = torch.arange(20.0)
    for starts, sizes in (([0, 5, 5, 12], [5, 0, 7, 8]), ([2, 9], [3, 4]), ([0], [20]), ([], [])):
        Calls.count = 0
        with Calls():
            got = views_at(flat, starts, sizes)
        assert Calls.count == 1
        assert [g.tolist() for g in got] == [flat[a : a + n].tolist() for a, n in zip(starts, sizes)]
        assert all(g.data_ptr() == flat[a:].data_ptr() for g, a in zip(got, starts) if g.numel())  # views
    overlapping = views_at(flat, [0, 3], [5, 5])
    assert [g.tolist() for g in overlapping] == [flat[:5].tolist(), flat[3:8].tolist()]
