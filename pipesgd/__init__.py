"""pipesgd: Pipe-SGD (NeurIPS 2018) for PyTorch — compute iteration t while iteration t-1's gradients are
ring-all-reduced (optionally compressed on every hop) in the background.

Data path: gradients -> flat buckets (``buckets``) -> codec (``compression``) -> ring on a background
worker (``ring``, ``comm_worker``) -> delayed apply (``optimizer.PipeSGD``) -> the wrapped torch optimizer.
"""
from pipesgd import compression
from pipesgd.accounting import StepStats
from pipesgd.handles import CompletedWork, Work
from pipesgd.optimizer import DEFAULT_WARMUP_STEPS, NonFiniteGradientError, PipeSGD
from pipesgd.replica_check import ReplicaDivergenceError
from pipesgd.ring import ring_allreduce

__version__ = "0.1.0"

__all__ = [
    "PipeSGD",
    "ring_allreduce",
    "compression",
    "StepStats",
    "Work",
    "CompletedWork",
    "NonFiniteGradientError",
    "ReplicaDivergenceError",
    "DEFAULT_WARMUP_STEPS",
]
