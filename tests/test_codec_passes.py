"""Cheaper codecs (issue 11): the sign codec packs its bits with one multiply per 8 elements; its payload is the
plain little-endian bit packing numpy gives, for sizes that fill, miss and straddle whole bytes and blocks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipesgd.compression import build


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 63, 64, 65, 4096, 4097, 100_003])
def test_sign_payload_is_numpy_little_endian_packbits(numel):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    x[::5] = 0.0  # zero counts as non-negative (bit set)
    x[1::7] = -0.0  # ... and so does -0.0 (x >= 0 holds)
    codec = build("sign", block_size=64)
    payload, _ = codec.compress(x)
    rows = -(-numel // 64)
    bits = np.packbits((x.numpy() >= 0).astype(np.uint8), bitorder="little")
    assert payload[4 * rows :].numpy().tobytes() == bits.tobytes()
    # Every bit pattern of a byte survives the multiply (its top bit too, which makes the product negative).
    patterns = torch.tensor([(b >> k) & 1 for b in range(256) for k in range(8)], dtype=torch.float32) * 2 - 1
    payload, _ = codec.compress(patterns)
    assert payload[4 * (2048 // 64) :].numpy().tolist() == list(range(256))
