"""Per-hop gradient codecs for the ring AllReduce, behind a plain-dict registry.

``build("q8", block_size=1024)`` returns a :class:`Compressor`; ``available()`` lists the names;
``build(name, rank=r, ...)`` gives rank r its own stream of rounding noise. Error feedback is a separate
wrapper, :class:`ErrorFeedback`, that owns the residuals and their arithmetic (``open_encoder``).

The codecs and the public names load on first use, so the torch-free ``pipesgd.compression.sizes`` (how many
bytes each codec sends) can be imported by the analytic timing model without loading torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

from pipesgd.lazy_exports import load_export

if TYPE_CHECKING:
    from pipesgd.compression.base import (ChunkContext, Compressor, StatefulCodec, codec_state, compression_ratio,
                                          context_of, load_codec_state)
    from pipesgd.compression.error_feedback import ErrorFeedback, HopEncoder, open_encoder

# public name -> the module that defines it
_EXPORTS = {
    "ChunkContext": "pipesgd.compression.base",
    "Compressor": "pipesgd.compression.base",
    "StatefulCodec": "pipesgd.compression.base",
    "codec_state": "pipesgd.compression.base",
    "compression_ratio": "pipesgd.compression.base",
    "context_of": "pipesgd.compression.base",
    "load_codec_state": "pipesgd.compression.base",
    "ErrorFeedback": "pipesgd.compression.error_feedback",
    "HopEncoder": "pipesgd.compression.error_feedback",
    "open_encoder": "pipesgd.compression.error_feedback",
}

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


def __getattr__(name: str) -> Any:
    return load_export(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


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


def _loaded(module: str, factory: str) -> Callable[..., Compressor]:
    """A factory that imports ``module`` (and torch) on its first call, then calls its ``factory``."""
    def build_loaded(**options: Any) -> Compressor:
        return getattr(importlib.import_module(module), factory)(**options)
    return build_loaded


register("none", _loaded("pipesgd.compression.lossless", "NoCompression"))
register("fp16", _loaded("pipesgd.compression.cast", "Float16Cast"))
register("bf16", _loaded("pipesgd.compression.cast", "BFloat16Truncation"))
register("q8", _loaded("pipesgd.compression.quantize", "build_q8"))
register("q4", _loaded("pipesgd.compression.quantize", "build_q4"))
register("sign", _loaded("pipesgd.compression.sign", "SignCompressor"))
