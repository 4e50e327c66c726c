"""pipesgd: Pipe-SGD (NeurIPS 2018) for PyTorch — compute iteration t while iteration t-1's gradients are
ring-all-reduced (optionally compressed on every hop) in the background.

Data path: gradients -> flat buckets (``buckets``) -> codec and error feedback (``compression``) -> ring,
all-to-all or gather all-reduce on the background worker (``ring``, ``alltoall``, ``gather``, ``topology``;
``exchange`` runs one step's buckets on a ``channel``) -> which step is due (``pipeline``) -> delayed apply
(``optimizer.PipeSGD``, options in ``options``) -> the wrapped torch optimizer. Every way of averaging gradients
satisfies ``wrapper.OptimizerWrapper``.

The public names load on first use, so torch-free modules (``pipesgd.defaults``, ``pipesgd.runlog.run_files``)
can be imported by the analytic timing model without loading torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pipesgd.defaults import WARMUP_STEPS as DEFAULT_WARMUP_STEPS
from pipesgd.lazy_exports import load_export

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "PipeSGD": "pipesgd.optimizer",
    "PipeSGDOptions": "pipesgd.options",
    "NonFiniteGradientError": "pipesgd.optimizer",
    "ring_allreduce": "pipesgd.comm.ring",
    "alltoall_allreduce": "pipesgd.comm.alltoall",
    "gather_allreduce": "pipesgd.comm.gather",
    "StepStats": "pipesgd.accounting",
    "Work": "pipesgd.comm.handles",
    "CompletedWork": "pipesgd.comm.handles",
    "ReplicaDivergenceError": "pipesgd.grads.replica_check",
    "OptimizerWrapper": "pipesgd.wrapper",
}

__all__ = [*_EXPORTS, "compression", "DEFAULT_WARMUP_STEPS"]

if TYPE_CHECKING:
    from pipesgd import compression
    from pipesgd.accounting import StepStats
    from pipesgd.comm.handles import CompletedWork, Work
    from pipesgd.optimizer import NonFiniteGradientError, PipeSGD
    from pipesgd.options import PipeSGDOptions
    from pipesgd.grads.replica_check import ReplicaDivergenceError
    from pipesgd.wrapper import OptimizerWrapper
    from pipesgd.comm.ring import ring_allreduce
    from pipesgd.comm.alltoall import alltoall_allreduce
    from pipesgd.comm.gather import gather_allreduce


def __getattr__(name: str) -> Any:
    if name == "compression":
        return importlib.import_module("pipesgd.compression")
    return load_export(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
