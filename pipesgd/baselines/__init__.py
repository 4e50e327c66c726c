"""Baselines the paper compares against: parameter servers (sync, Downpour async) and PyTorch DDP."""
from pipesgd.baselines.ddp import DDPOptimizer
from pipesgd.baselines.parameter_server import ParameterServer

__all__ = ["ParameterServer", "DDPOptimizer"]
