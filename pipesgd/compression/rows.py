"""Several chunks through a codec in one call: each payload exactly ``compress(chunk)``'s, each decoded chunk exactly
``decompress(payload)``'s, bit for bit, in a fixed number of codec calls instead of one per chunk.

Why: the two-collective exchange (``pipesgd.comm.alltoall``) encodes and decodes p-1 chunks per bucket at a time,
and a codec call costs a fixed share of Python and small kernels whatever its size, so small chunks paid it p-fold.

How, for q8 and q4 with round-to-nearest, and sign: the chunks are copied into the zero-padded rows of one matrix
whose row length is a whole number of blocks, and the matrix is encoded in one call; zero padding changes neither a
block's scale nor any real element's code, so row j's scales and first codes are chunk j's payload. Decoding copies
the payloads into that layout and decodes once. Chunks whose block counts differ go in separate calls. fp16 and
bf16 work element by element, so chunks side by side in memory go through one call over their span, with no copy.
Where it pays, and why longer CPU chunks and stochastic rounding go one by one: docs/architecture.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pipesgd.compression.base import ChunkContext, Compressor, decode_into
from timing_model.codec_sizes import SCALE_BYTES, n_blocks

__all__ = ["CPU_BATCH_ELEMENTS", "compress_rows", "decompress_rows", "decompress_rows_into", "follows", "views_at"]

CPU_BATCH_ELEMENTS = 1 << 15  # the longest CPU chunk batched (docs/architecture.md)

@dataclass(frozen=True, slots=True)
class _Layout:
    """A payload of ``SCALE_BYTES`` per block of ``block`` elements, then the codes at ``bits`` per element packed
    to whole bytes."""

    block: int
    bits: int

    def blocks(self, numel: int) -> int:
        return n_blocks(numel, self.block)

    def code_bytes(self, numel: int) -> int:
        return (numel * self.bits + 7) // 8

    def row_length(self, numel: int) -> int:
        """A padded row for a chunk of ``numel``: whole blocks (whole bytes of codes at every row start)."""
        return n_blocks(numel, self.block) * self.block


def _layout(codec: Compressor) -> _Layout | None:
    """The codec's payload layout where batching is bit-exact and pays (module doc), else None."""
    from pipesgd.compression.quantize import ScalarQuantizer
    from pipesgd.compression.sign import SignCompressor

    if isinstance(codec, ScalarQuantizer) and not codec.stochastic:
        bits = codec.bits
    elif isinstance(codec, SignCompressor):
        bits = 1
    else:
        return None
    if (codec.block_size * bits) % 8:
        return None  # a row length of whole blocks would end a row in the middle of a byte
    return _Layout(block=codec.block_size, bits=bits)


def _groups(layout: _Layout | None, numels: Sequence[int], device: torch.device) -> list[list[int]]:
    """Indices of the chunks to encode or decode together: by their number of scales where batching pays, else one
    by one."""
    if layout is None or len(numels) < 2:
        return [[j] for j in range(len(numels))]
    together: dict[int, list[int]] = {}
    alone = []
    for j, numel in enumerate(numels):
        if numel == 0 or (device.type == "cpu" and numel > CPU_BATCH_ELEMENTS):
            alone.append([j])
        else:
            together.setdefault(layout.blocks(numel), []).append(j)  # headers of one size
    return list(together.values()) + alone


def _is_cast(codec: Compressor) -> bool:
    from pipesgd.compression.cast import BFloat16Truncation, Float16Cast

    return isinstance(codec, (Float16Cast, BFloat16Truncation))


def follows(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether 1-D ``b`` starts where 1-D ``a`` ends, in one storage (neither empty)."""
    return (a.numel() > 0 and b.numel() > 0 and a.dim() == b.dim() == 1 and a.stride(0) == b.stride(0) == 1
            and a.dtype == b.dtype and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and b.data_ptr() == a.data_ptr() + a.numel() * a.element_size())


def _cast_runs(tensors: Sequence[torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """Runs of tensors side by side in memory, each with one 1-D view spanning it: a cast works element by element,
    so one call over the span gives each tensor's payload (or values) as a slice."""
    runs: list[list[int]] = []
    for j, tensor in enumerate(tensors):
        if runs and follows(tensors[runs[-1][-1]], tensor):
            runs[-1].append(j)
        else:
            runs.append([j])
    return [(run, tensors[run[0]] if len(run) == 1 else
             torch.as_strided(tensors[run[0]], (sum(tensors[j].numel() for j in run),), (1,))) for run in runs]


def compress_rows(codec: Compressor, chunks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``[codec.compress(chunk)[0] for chunk in chunks]``, bit for bit, in as few codec calls as the module doc
    allows. The chunks are 1-D, of one dtype and device, of any lengths."""
    if _is_cast(codec):
        payloads = []
        for run, span in _cast_runs(chunks):
            encoded, _ = codec.compress(span)
            payloads += encoded.split([codec.payload_bytes(chunks[j].numel()) for j in run])
        return payloads
    payloads: list[torch.Tensor | None] = [None] * len(chunks)
    device = chunks[0].device if chunks else torch.device("cpu")
    layout = _layout(codec)
    for group in _groups(layout, [c.numel() for c in chunks], device):
        if len(group) == 1:
            payloads[group[0]] = codec.compress(chunks[group[0]])[0]
            continue
        lengths = [chunks[j].numel() for j in group]
        length = layout.row_length(max(lengths))
        matrix = _rows_view([chunks[j] for j in group], length) if chunks[group[0]].dtype == torch.float32 else None
        if matrix is None or not matrix.is_contiguous():  # else copied in, zeros to each row's end
            matrix = torch.empty(len(group), length, dtype=torch.float32, device=device)
            starts, pads = _row_parts(matrix, lengths)
            torch._foreach_copy_(starts, [chunks[j] for j in group])
            torch._foreach_zero_(pads)
        encoded = _encode(codec, matrix, lengths)
        headers, codes = _split(encoded, layout, len(group), length)
        head, bodies = headers.shape[1], [layout.code_bytes(n) for n in lengths]
        if min(lengths) == max(lengths):  # payloads of one size: two copies for all of them
            out = torch.empty(len(group), head + bodies[0], dtype=torch.uint8, device=device)
            out[:, :head].copy_(headers)
            out[:, head:].copy_(codes[:, : bodies[0]])
            parts = out.unbind(0)
        else:  # back to back in one buffer, each its row's scales then its codes: one copy call for all of them
            out = torch.empty(len(group) * head + sum(bodies), dtype=torch.uint8, device=device)
            fields = out.split([size for body in bodies for size in (head, body)])
            sources = [field for pair in zip(headers.unbind(0), _row_parts(codes, bodies)[0]) for field in pair]
            torch._foreach_copy_(list(fields), sources)
            parts = out.split([head + body for body in bodies])
        for j, payload in zip(group, parts):
            payloads[j] = payload
    return payloads


def decompress_rows(codec: Compressor, payloads: Sequence[torch.Tensor], numels: Sequence[int],
                    dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """``[codec.decompress(payload, ChunkContext(numel, dtype, device)) ...]``, bit for bit, in as few codec calls as
    the module doc allows (each result may be a view into one shared buffer)."""
    device = payloads[0].device if payloads else torch.device("cpu")
    if _is_cast(codec):
        decoded = []
        for run, span in _cast_runs(payloads):
            total = sum(numels[j] for j in run)
            decoded += codec.decompress(span, ChunkContext(total, dtype, device)).split([numels[j] for j in run])
        return decoded
    chunks: list[torch.Tensor | None] = [None] * len(payloads)
    layout = _layout(codec)
    for group in _groups(layout, numels, device):
        if len(group) == 1:
            j = group[0]
            chunks[j] = codec.decompress(payloads[j], ChunkContext(numels[j], dtype, device))
            continue
        length = layout.row_length(max(numels[j] for j in group))
        rows = len(group)
        total = rows * (SCALE_BYTES * layout.blocks(length) + layout.code_bytes(length))
        # Unwritten code bytes decode to values that are never read (each row keeps its first numel elements).
        encoded = torch.empty(total, dtype=torch.uint8, device=device)
        headers, codes = _split(encoded, layout, rows, length)
        head = headers.shape[1]  # every row of a group has as many scales
        one_size = all(numels[j] == numels[group[0]] for j in group)
        same = _rows_view([payloads[j] for j in group], payloads[group[0]].numel()) if one_size else None
        if same is not None:  # e.g. the slots of one all-to-all's buffer
            same_codes = layout.code_bytes(numels[group[0]])
            headers.copy_(same[:, :head])
            codes[:, :same_codes].copy_(same[:, head:])
        else:  # every payload's scales and codes into its row, in one copy call
            bodies = [layout.code_bytes(numels[j]) for j in group]
            fields = [field for j in group for field in payloads[j].split([head, payloads[j].numel() - head])]
            targets = [field for pair in zip(headers.unbind(0), _row_parts(codes, bodies)[0]) for field in pair]
            torch._foreach_copy_(targets, fields)
        decoded = codec.decompress(encoded, ChunkContext(rows * length, dtype, device)).view(rows, length)
        for j, chunk in zip(group, _row_parts(decoded, [numels[j] for j in group])[0]):
            chunks[j] = chunk
    return chunks


def decompress_rows_into(codec: Compressor, payloads: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> None:
    """``decompress_rows``' values written into ``targets`` (one per payload, 1-D, of its chunk's length): a chunk
    decoded alone goes straight into its target (``decode_into``), a batch through ``decompress_rows`` and one copy."""
    if not targets:
        return
    numels = [t.numel() for t in targets]
    batched = []
    for group in _groups(None if _is_cast(codec) else _layout(codec), numels, targets[0].device):
        if len(group) == 1:
            decode_into(codec, payloads[group[0]], targets[group[0]])
        else:
            batched += group
    if batched:
        decoded = decompress_rows(codec, [payloads[j] for j in batched], [numels[j] for j in batched],
                                  targets[0].dtype)
        torch._foreach_copy_([targets[j] for j in batched], decoded)


def _row_parts(matrix: torch.Tensor, lengths: Sequence[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Of a contiguous ``(rows, width)`` matrix: the first ``lengths[row]`` elements of each row, and the rest of
    each row, as 1-D views made in one call (slicing row by row would be a few calls per row)."""
    width = matrix.shape[1]
    parts = matrix.view(-1).split([size for n in lengths for size in (n, width - n)])
    return list(parts[0::2]), list(parts[1::2])


def _rows_view(tensors: list[torch.Tensor], size: int) -> torch.Tensor | None:
    """The 1-D ``tensors`` as the rows of one ``(len, size)`` view when each has ``size`` elements and they lie at one
    stride of at least ``size`` in one storage (the chunks of a flat tensor, the slots of a collective's buffer); else
    None. Saves a copy per tensor."""
    first = tensors[0]
    if any(t.numel() != size or t.dim() != 1 or t.stride(0) != 1 or t.dtype != first.dtype for t in tensors):
        return None
    if len(tensors) == 1:
        return first.view(1, size)
    step = tensors[1].data_ptr() - first.data_ptr()
    storage = first.untyped_storage().data_ptr()
    if step < size * first.element_size() or step % first.element_size():
        return None
    for a, b in zip(tensors, tensors[1:]):
        if b.data_ptr() - a.data_ptr() != step or b.untyped_storage().data_ptr() != storage:
            return None
    return torch.as_strided(first, (len(tensors), size), (step // first.element_size(), 1))


def _encode(codec: Compressor, matrix: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The payload of the padded rows in one call; a codec whose payload depends on the real length (sign: the
    short last block's scale is a mean over its real elements) encodes them itself (``compress_padded_rows``)."""
    own_way = getattr(codec, "compress_padded_rows", None)
    if own_way is not None:
        return own_way(matrix, lengths)
    return codec.compress(matrix.view(-1))[0]


def _split(encoded: torch.Tensor, layout: _Layout, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A payload of ``rows`` x ``length`` elements as its per-row header bytes ``(rows, 4 x blocks)`` and per-row code
    bytes ``(rows, code bytes)``: views, so writing them writes the payload."""
    head = SCALE_BYTES * layout.blocks(length)
    headers = encoded[: rows * head].view(rows, head)
    codes = encoded[rows * head :].view(rows, layout.code_bytes(length))
    return headers, codes


def views_at(tensor: torch.Tensor, starts: Sequence[int], sizes: Sequence[int]) -> list[torch.Tensor]:
    """``[tensor[start : start + size] ...]`` of a 1-D tensor, in one call where the starts ascend without overlap
    (a chunk list, a collective's slots), else slice by slice."""
    pieces, at = [], 0
    for start, size in zip(starts, sizes):
        if start < at:
            return [tensor[start : start + size] for start, size in zip(starts, sizes)]
        pieces += [start - at, size]
        at = start + size
    return list(tensor.split([*pieces, tensor.numel() - at])[1::2])
