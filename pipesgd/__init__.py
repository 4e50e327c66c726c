"""pipesgd: Pipe-SGD (NeurIPS 2018) for PyTorch — compute iteration t while iteration t-1's gradients are
ring-all-reduced (optionally compressed on every hop) in the background.

Data path: gradients -> flat buckets (``buckets``) -> codec and error feedback (``compression``) -> ring or
all-to-all all-reduce on the background worker (``ring``, ``alltoall``, ``topology``; ``exchange`` runs one step's
buckets on a ``channel``) -> which step is due (``pipeline``) -> delayed apply (``optimizer.PipeSGD``, options in
``options``) -> the wrapped torch optimizer. Every way of averaging gradients satisfies ``wrapper.OptimizerWrapper``.
"""
from __future__ import annotations

from pipesgd import compression
from pipesgd.accounting import StepStats
from pipesgd.comm.alltoall import alltoall_allreduce
from pipesgd.comm.handles import CompletedWork, Work
from pipesgd.comm.ring import ring_allreduce
from pipesgd.defaults import WARMUP_STEPS as DEFAULT_WARMUP_STEPS
from pipesgd.grads.replica_check import ReplicaDivergenceError
from pipesgd.optimizer import NonFiniteGradientError, PipeSGD
from pipesgd.options import PipeSGDOptions
from pipesgd.wrapper import OptimizerWrapper

__version__ = "0.1.0"

__all__ = ["PipeSGD", "PipeSGDOptions", "NonFiniteGradientError", "ring_allreduce", "alltoall_allreduce", "StepStats", "Work",
           "CompletedWork", "ReplicaDivergenceError", "OptimizerWrapper", "compression", "DEFAULT_WARMUP_STEPS"]
