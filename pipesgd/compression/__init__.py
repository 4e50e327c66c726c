"""Per-hop gradient codecs for the ring AllReduce, behind a plain-dict registry.

``build("q8", block_size=1024)`` returns a :class:`Compressor`; ``available()`` lists the names.
Error feedback is a separate wrapper, :class:`ErrorFeedback`, that owns the residuals.
"""
from __future__ import annotations

from typing import Any, Callable

from pipesgd.compression.base import ChunkContext, Compressor, compression_ratio, context_of
from pipesgd.compression.cast import BFloat16Truncation, Float16Cast
from pipesgd.compression.error_feedback import ErrorFeedback
from pipesgd.compression.lossless import NoCompression
from pipesgd.compression.quantize import build_q4, build_q8
from pipesgd.compression.sign import SignCompressor

__all__ = [
    "ChunkContext",
    "Compressor",
    "ErrorFeedback",
    "available",
    "build",
    "compression_ratio",
    "context_of",
    "register",
]

_REGISTRY: dict[str, Callable[..., Compressor]] = {}


def register(name: str, factory: Callable[..., Compressor]) -> None:
    """Make ``build(name, **options)`` call ``factory(**options)``; a name can be registered once."""
    if name in _REGISTRY:
        raise ValueError(f"compressor {name!r} is already registered")
    _REGISTRY[name] = factory


def available() -> list[str]:
    """Registered compressor names, sorted."""
    return sorted(_REGISTRY)


def build(name: str, **options: Any) -> Compressor:
    """A new compressor ``name`` with ``options``; raises ``ValueError`` for an unknown name or bad option."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown compressor {name!r}; valid names: {', '.join(available())}")
    try:
        return factory(**options)
    except TypeError as err:  # an option the codec does not take
        raise ValueError(f"bad options for compressor {name!r}: {options} ({err})") from err


def _no_options(cls: type) -> Callable[[], Compressor]:
    return lambda: cls()


register("none", _no_options(NoCompression))
register("fp16", _no_options(Float16Cast))
register("bf16", _no_options(BFloat16Truncation))
register("q8", build_q8)
register("q4", build_q4)
register("sign", SignCompressor)
