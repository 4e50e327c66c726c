"""Baselines the paper compares against (parameter servers, sync and Downpour async; PyTorch DDP) and the periodic
averaging practitioners use on slow links (PyTorch's post-local SGD, DiLoCo)."""
from pipesgd.baselines.ddp import DDPOptimizer
from pipesgd.baselines.diloco import DiLoCo
from pipesgd.baselines.local_sgd import LocalSGD
from pipesgd.baselines.parameter_server import ParameterServer

__all__ = ["ParameterServer", "DDPOptimizer", "LocalSGD", "DiLoCo"]
