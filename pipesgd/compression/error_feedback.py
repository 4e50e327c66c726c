"""Error feedback: the wrapper that owns per-bucket residuals and all of their arithmetic.

One ring over one bucket uses it through a :class:`HopEncoder` (``open_encoder``):

1. at the start of the ring: ``x += r``; ``r = 0`` — last step's compression error is sent now;
2. at every encode of a chunk at ``position``: ``r[position:] += chunk - decompress(compress(chunk))``
   (in "sum" units: the owner's error on a mean counts once per rank it averages over);
3. the decoded values go on as usual; over many steps nothing the compressor dropped is lost.
The ring only calls ``fold_`` / ``encode`` / ``settle_`` / ``decode`` / ``drain``; it never touches a residual.
It opens the encoder deferred, so 1 runs chunk by chunk and 2 runs while the ring waits on the wire.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Hashable

import torch

from pipesgd.runlog import phases
from pipesgd.compression.base import ChunkContext, Compressor, codec_state, decode_into, load_codec_state
from pipesgd.compression.rows import compress_rows, decompress_rows, decompress_rows_into, views_at
from pipesgd.grads.finite import all_finite, l2_norm

_WORKING_DTYPES = (torch.float32, torch.float64)


class ErrorFeedback:
    """Persistent, zero-initialised residual buffers by bucket key, next to the compressor they serve."""

    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor
        self._residuals: dict[Hashable, torch.Tensor] = {}

    def residual(self, key: Hashable, like: torch.Tensor) -> torch.Tensor:
        """The residual for bucket ``key``, created as zeros shaped like ``like`` on first use.

        A bucket's shape and dtype are fixed for the life of the run; a mismatch means the caller mixed
        up buckets, so it raises. A buffer on another device (e.g. loaded from a CPU checkpoint) moves.
        """
        if like.dtype not in _WORKING_DTYPES:
            raise ValueError(f"residuals are float32 or float64, got {like.dtype} for bucket {key!r}")
        buf = self._residuals.get(key)
        if buf is None:
            buf = self._residuals[key] = torch.zeros_like(like, memory_format=torch.contiguous_format)
        elif buf.shape != like.shape or buf.dtype != like.dtype:
            raise ValueError(
                f"bucket {key!r} has a residual of shape {tuple(buf.shape)} and dtype {buf.dtype}, "
                f"but was asked for shape {tuple(like.shape)} and dtype {like.dtype}"
            )
        elif buf.device != like.device:
            buf = self._residuals[key] = buf.to(like.device)
        return buf

    def residual_norm(self) -> float:
        """L2 norm over all residual buffers (0.0 when there are none); inf or NaN if one is non-finite."""
        total = 0.0
        for buf in self._residuals.values():
            total += l2_norm(buf) ** 2
        return total**0.5

    def reset(self, nonfinite_only: bool = False) -> None:
        """Zero the residuals; with ``nonfinite_only``, only buffers that hold inf or NaN (after a bad step)."""
        for buf in self._residuals.values():
            if not nonfinite_only or not all_finite(buf):
                buf.zero_()

    # -- checkpointing: residuals alone (a wrapper that saves its codec itself), or with the codec ----
    def residuals_state(self) -> dict[Hashable, torch.Tensor]:
        return {key: buf.clone() for key, buf in self._residuals.items()}

    def load_residuals_state(self, residuals: dict[Hashable, torch.Tensor]) -> None:
        self._residuals = {key: buf.clone() for key, buf in residuals.items()}

    def state_dict(self) -> dict[str, Any]:
        """The residuals and, for a stateful codec, its state (so this object alone resumes identically)."""
        state: dict[str, Any] = {"residuals": self.residuals_state()}
        compressor_state = codec_state(self.compressor)
        if compressor_state:
            state["compressor"] = compressor_state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_residuals_state(state["residuals"])
        load_codec_state(self.compressor, state.get("compressor"))

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.compressor!r}, buckets={len(self._residuals)})"


class HopEncoder:
    """Encodes and decodes the chunks of one ring over one flat tensor, without error feedback.

    ``deferred``: work that only has to be done before the ring hands its result back (settling a final chunk;
    with feedback, booking an encode's error) is queued instead of done at once, and ``drain()`` does it. The ring
    drains while it waits on the wire, so that work never delays a send; the ring's last call is a drain."""

    def __init__(self, compressor: Compressor, flat: torch.Tensor, deferred: bool = False) -> None:
        self.compressor = compressor
        self._dtype, self._device = flat.dtype, flat.device
        self._deferred = deferred
        self._pending: list[Callable[[], None]] = []

    def fold_(self, x: torch.Tensor, position: int) -> None:
        """Bring last ring's residual for ``x`` into it (a deferred encoder folds chunk by chunk; see
        :class:`FeedbackEncoder`). Without feedback there is nothing to fold."""

    def encode(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """The payload of ``x``, the slice of the flat tensor that starts at element ``position``."""
        with phases.timed("codec"):
            payload, _ = self.compressor.compress(x)
        return payload

    def encode_chunks(self, xs: list[torch.Tensor], positions: list[int]) -> list[torch.Tensor]:
        """``encode`` of each slice ``xs[j]`` (starting at element ``positions[j]``), in as few codec calls as
        ``pipesgd.compression.rows`` allows; the same payloads bit for bit."""
        with phases.timed("codec"):
            return compress_rows(self.compressor, xs)

    def decode_chunks(self, payloads: list[torch.Tensor], likes: list[torch.Tensor]) -> list[torch.Tensor]:
        """``decode`` of each payload for a chunk shaped like ``likes[j]``, batched as ``encode_chunks`` is."""
        with phases.timed("codec"):
            return decompress_rows(self.compressor, payloads, [like.numel() for like in likes], self._dtype)

    def decode_chunks_into(self, payloads: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        """``decode_chunks``' values written into ``targets``, each decoded chunk straight in where the codec can."""
        with phases.timed("codec"):
            decompress_rows_into(self.compressor, payloads, targets)

    def settle_(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """The payload of a final chunk, which is replaced by its decoded value in place so the owner
        applies exactly the bits every other rank decodes (at once, or at the next ``drain`` if deferred)."""
        with phases.timed("codec"):
            payload, _ = self.compressor.compress(x)
        self._later(partial(self._settle_now, x, position, payload))
        return payload

    def decode(self, payload: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Decode a received payload for a chunk shaped like ``like`` (what a receiver knows unasked)."""
        with phases.timed("codec"):
            return self.compressor.decompress(payload, ChunkContext(like.numel(), self._dtype, self._device))

    def decode_into(self, payload: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``target.copy_(self.decode(payload, target))``, written straight into ``target`` where the codec can."""
        with phases.timed("codec"):
            return decode_into(self.compressor, payload, target)

    def drain(self) -> None:
        """Do the work deferred so far, oldest first."""
        pending, self._pending = self._pending, []
        for work in pending:
            work()

    def _later(self, work: Callable[[], None]) -> None:
        if self._deferred:
            self._pending.append(work)
        else:
            work()

    def _settle_now(self, x: torch.Tensor, position: int, payload: torch.Tensor) -> None:
        self.decode_into(payload, x)


class FeedbackEncoder(HopEncoder):
    """A :class:`HopEncoder` that books every encode's error into a residual buffer of the flat tensor.

    Eager (the default), it folds the whole residual in when opened. Deferred, the ring folds each chunk with
    ``fold_`` before that chunk is encoded or receives anything, which gives the same sums bit for bit, and the
    error of each encode is booked at the next ``drain`` (the encoded slice and its payload stay untouched until
    then: the ring drains within the hop that sent them)."""

    def __init__(self, compressor: Compressor, flat: torch.Tensor, residual: torch.Tensor, mean_over: int,
                 deferred: bool = False) -> None:
        super().__init__(compressor, flat, deferred)
        if residual.shape != flat.shape:
            raise ValueError(f"a residual of shape {tuple(residual.shape)} cannot serve a tensor of "
                             f"{tuple(flat.shape)}")
        self._residual = residual
        # Final chunks hold sum / mean_over; the residual is kept in sum units.
        self._mean_over = mean_over
        if not deferred:
            self._fold_now(flat, 0)

    def fold_(self, x: torch.Tensor, position: int) -> None:
        if self._deferred:
            self._fold_now(x, position)

    def _fold_now(self, x: torch.Tensor, position: int) -> None:
        # Step 1: last ring's compression error travels in this one.
        with phases.timed("error_feedback"):
            residual = self._residual[position : position + x.numel()]
            x.add_(residual)
            residual.zero_()

    def encode(self, x: torch.Tensor, position: int) -> torch.Tensor:
        payload = super().encode(x, position)
        self._later(partial(self._book, x, position, payload))
        return payload

    def encode_chunks(self, xs: list[torch.Tensor], positions: list[int]) -> list[torch.Tensor]:
        payloads = super().encode_chunks(xs, positions)
        self._later(partial(self._book_chunks, xs, positions, payloads))
        return payloads

    def _book_chunks(self, xs: list[torch.Tensor], positions: list[int], payloads: list[torch.Tensor]) -> None:
        # Step 2: what these encodes dropped, kept for the next ring (the decodes batched, booked as feedback's cost).
        with phases.timed("error_feedback"):
            sizes = [x.numel() for x in xs]
            decoded = decompress_rows(self.compressor, payloads, sizes, self._dtype)
            # residual + (x - decoded), bit for bit, in place: decoded - x is exactly -(x - decoded), and no
            # temporary the size of the bucket is allocated (on CPU each one is fresh pages to fault in)
            torch._foreach_sub_(decoded, xs)
            torch._foreach_sub_(views_at(self._residual, positions, sizes), decoded)

    def _book(self, x: torch.Tensor, position: int, payload: torch.Tensor) -> None:
        self._book_chunks([x], [position], [payload])

    def _settle_now(self, x: torch.Tensor, position: int, payload: torch.Tensor) -> None:
        decoded = self.decode(payload, x)
        with phases.timed("error_feedback"):  # residual + (x - decoded) * mean_over, computed in x's own memory
            x.sub_(decoded).mul_(self._mean_over)
            self._residual[position : position + x.numel()].add_(x)
        x.copy_(decoded)


def open_encoder(
    compressor: Compressor, flat: torch.Tensor, residual: torch.Tensor | None = None, mean_over: int = 1,
    deferred: bool = False,
) -> HopEncoder:
    """The encoder for one ring over ``flat``; with a ``residual`` (from ``ErrorFeedback.residual``) it first
    folds the residual into ``flat``. ``mean_over``: the divisor the ring applied to its final chunks.
    ``deferred``: fold chunk by chunk (``fold_``) and put work off until ``drain`` (see :class:`HopEncoder`)."""
    if residual is None:
        return HopEncoder(compressor, flat, deferred)
    return FeedbackEncoder(compressor, flat, residual, mean_over, deferred)
