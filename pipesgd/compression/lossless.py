"""The ``none`` codec: the chunk's raw bytes, zero-copy both ways (the lossless baseline)."""
from __future__ import annotations

import torch

from pipesgd.compression._blocks import check_payload, view_bytes_as
from pipesgd.compression.base import ChunkContext, context_of
from timing_model.codec_sizes import payload_bytes


class NoCompression:
    """Sends the working dtype's bytes as they are (float32 or float64).

    Both directions alias memory: the payload is a view of the input and the decoded tensor a view of the
    payload (unless the payload is misaligned). Callers must not overwrite either while the other is in use.
    """

    name = "none"
    lossless = True

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ChunkContext]:
        return tensor.view(torch.uint8), context_of(tensor)

    def decompress(self, payload: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
        check_payload(payload, self.payload_bytes(ctx.numel, ctx.dtype), self.name)
        return view_bytes_as(payload, ctx.dtype)

    def payload_bytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return payload_bytes(self.name, numel, element_bytes=torch.empty((), dtype=dtype).element_size())

    def __repr__(self) -> str:
        return "NoCompression()"
