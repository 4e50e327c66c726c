"""Per-hop gradient codecs for the ring AllReduce, behind a plain-dict registry.

``build("q8", block_size=1024)`` returns a :class:`Compressor`; ``available()`` lists the names;
``build(name, rank=r, ...)`` gives rank r its own stream of rounding noise. Error feedback is a separate
wrapper, :class:`ErrorFeedback`, that owns the residuals and their arithmetic (``open_encoder``).

How many bytes each codec sends is ``timing_model.codec_sizes``'s (the timing model costs it too).
"""
from __future__ import annotations

from typing import Any, Callable

from pipesgd.compression.base import (ChunkContext, Compressor, StatefulCodec, codec_state, compression_ratio,
                                      context_of, load_codec_state)
from pipesgd.compression.cast import BFloat16Truncation, Float16Cast
from pipesgd.compression.error_feedback import ErrorFeedback, HopEncoder, open_encoder
from pipesgd.compression.lossless import NoCompression
from pipesgd.compression.quantize import build_q4, build_q8
from pipesgd.compression.sign import SignCompressor

__all__ = [
    "ChunkContext",
    "Compressor",
    "ErrorFeedback",
    "HopEncoder",
    "StatefulCodec",
    "available",
    "build",
    "codec_state",
    "compression_ratio",
    "context_of",
    "load_codec_state",
    "open_encoder",
    "register",
]

# Seeds of different ranks lie this far apart (a prime), so their rounding streams never coincide.
_SEED_STRIDE_PER_RANK = 1_000_003

_REGISTRY: dict[str, Callable[..., Compressor]] = {}


def register(name: str, factory: Callable[..., Compressor]) -> None:
    """Make ``build(name, **options)`` call ``factory(**options)``; a name can be registered once."""
    if name in _REGISTRY:
        raise ValueError(f"compressor {name!r} is already registered")
    _REGISTRY[name] = factory


def available() -> list[str]:
    """Registered compressor names, sorted."""
    return sorted(_REGISTRY)


def build(name: str, rank: int | None = None, **options: Any) -> Compressor:
    """A new compressor ``name`` with ``options``; raises ``ValueError`` for an unknown name or bad option.

    ``rank``: the calling process's rank. With ``stochastic=True`` it is folded into ``seed``, so every rank
    draws independent rounding noise (shared noise would make the ranks' errors add up coherently in the
    sum). Without stochastic rounding the rank changes nothing, so every rank builds the same codec.
    """
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown compressor {name!r}; valid names: {', '.join(available())}")
    if rank is not None and options.get("stochastic"):
        options = {**options, "seed": int(options.get("seed", 0)) + _SEED_STRIDE_PER_RANK * rank}
    try:
        return factory(**options)
    except TypeError as err:  # an option the codec does not take
        raise ValueError(f"bad options for compressor {name!r}: {options} ({err})") from err


register("none", NoCompression)
register("fp16", Float16Cast)
register("bf16", BFloat16Truncation)
register("q8", build_q8)
register("q4", build_q4)
register("sign", SignCompressor)
