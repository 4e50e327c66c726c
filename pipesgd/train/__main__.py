"""``python -m pipesgd.train`` (and ``torchrun -m pipesgd.train``): the same entry as ``pipesgd-train``."""
from pipesgd.train import entry

entry()
