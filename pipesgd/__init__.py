"""pipesgd: Pipe-SGD (NeurIPS 2018) for PyTorch — compute iteration t while iteration t-1's gradients are
ring-all-reduced (optionally compressed on every hop) in the background.

Data path: gradients -> flat buckets (``buckets``) -> codec and error feedback (``compression``) -> ring or
all-to-all all-reduce on the background worker (``ring``, ``alltoall``, ``topology``; ``exchange`` runs one step's
buckets on a ``channel``) -> which step is due (``pipeline``) -> delayed apply (``optimizer.PipeSGD``, options in
``options``) -> the wrapped torch optimizer. Every way of averaging gradients satisfies ``wrapper.OptimizerWrapper``.
"""
from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec

# Each public name and the module that defines it, imported on first use (PEP 562), so that what needs no
# torch (``pipesgd-train --help``, the trainer's flags) runs without loading it.
_EXPORTS = {
    "PipeSGD": "pipesgd.optimizer", "NonFiniteGradientError": "pipesgd.optimizer",
    "PipeSGDOptions": "pipesgd.options", "ring_allreduce": "pipesgd.comm.ring",
    "alltoall_allreduce": "pipesgd.comm.alltoall", "StepStats": "pipesgd.accounting",
    "Work": "pipesgd.comm.handles", "CompletedWork": "pipesgd.comm.handles",
    "ReplicaDivergenceError": "pipesgd.grads.replica_check", "OptimizerWrapper": "pipesgd.wrapper",
    "compression": "pipesgd.compression", "DEFAULT_WARMUP_STEPS": "pipesgd.defaults",
}
_RENAMED = {"DEFAULT_WARMUP_STEPS": "WARMUP_STEPS"}

__version__ = "0.1.0"

__all__ = ["PipeSGD", "PipeSGDOptions", "NonFiniteGradientError", "ring_allreduce", "alltoall_allreduce", "StepStats", "Work",
           "CompletedWork", "ReplicaDivergenceError", "OptimizerWrapper", "compression", "DEFAULT_WARMUP_STEPS"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        # A subpackage reached as an attribute (``pipesgd.comm.ring`` after ``import pipesgd``) finds what the
        # eager imports this module once made bound: they run now, then the subpackage is returned.
        if not name.startswith("_") and find_spec(f"pipesgd.{name}") is not None:
            for module_name in _EXPORTS.values():
                import_module(module_name)
            return import_module(f"pipesgd.{name}")
        raise AttributeError(f"module 'pipesgd' has no attribute {name!r}")
    module = import_module(_EXPORTS[name])
    value = module if name == "compression" else getattr(module, _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
