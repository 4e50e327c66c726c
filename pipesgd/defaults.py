"""The defaults and choices that several layers share (the wrapper, the trainer's flags, the timing model).

One owner per fact: everything here is imported, never copied. Torch-free, so the analytic model can read
it without loading torch.
"""
from __future__ import annotations

# The facts the timing model costs too are owned there (the model imports nothing of pipesgd); the wrapper and the
# trainer read them here with the rest.
from timing_model.codec_sizes import QUANT_BLOCK_SIZE
from timing_model.trainer_defaults import (ADAM_AUTO_CODECS, ALLREDUCE_CHOICES, AUTO_ADAM_NOTE, BUCKET_MB,
                                           SYNC_EVERY, auto_codec_limits, is_adam_family, resolve_allreduce)

# Synchronous steps before the pipeline opens: staleness hurts most in the first steps, where loss and
# gradients change fastest (SAPipe and ChainerMN report accuracy lost to 1-stale gradients); a few
# synchronous steps cost a few iterations of exposed communication and nothing else.
WARMUP_STEPS = 10

# DiLoCo's outer optimizer, the paper's best setting (arXiv 2311.08105): SGD with Nesterov momentum, lr 0.7,
# momentum 0.9 (pipesgd.baselines.diloco and the trainer's --outer-lr / --outer-momentum).
OUTER_LR = 0.7
OUTER_MOMENTUM = 0.9

# p.grad as views into the flat buckets (pipesgd.grads.bucket_sets): no copy in or out of a step; K sets of
# gradient memory for width K instead of K + 1 (the K sets plus the gradients themselves).
GRADIENT_AS_BUCKET_VIEW = True

# What a pipeline of width K >= 2 does about its stale gradients (pipesgd.delay.lookahead): "lookahead" computes each
# gradient at the weights the K-1 updates in flight will produce (this rank's own gradients standing in for their
# averages), "none" is the paper's plain update, the gradient of weights K-1 updates old. Plain staleness costs
# momentum SGD much of its accuracy; look-ahead keeps it (experiments/results/accuracy/report.md).
STALENESS_MODES = ("lookahead", "none")
STALENESS = "lookahead"
# What stands in, during look-ahead, for the averages still in flight: "local", this rank's own gradients (free);
# "coarse-lowrank", the own gradients with every rank's average in a shared low-rank subspace of each weight matrix
# (pipesgd.delay.lowrank: one small all-reduce that the next forward waits for). "auto" (the default) is
# "coarse-lowrank" under Adam and AdamW, whose replay the own gradients' error costs most, and "local" under any
# other optimizer, where the own gradients keep width 1's accuracy and nothing waits. The codec averages of all
# gradients that once stood in here cost more time than synchronous training saved (docs/training.md).
LOOKAHEAD_STANDINS = ("auto", "local", "coarse-lowrank")
LOOKAHEAD_STANDIN = "auto"  # PipeSGD's and the trainer's default
UNSHARED_STANDINS = ("auto", "local")  # no all-reduce of their own: also valid (and idle) without look-ahead


def resolve_lookahead_standin(standin: str, optimizer: tuple | list) -> str:
    """The stand-in that ``standin`` names for an optimizer (``is_adam_family``'s argument): "auto" made concrete,
    any other choice kept."""
    if standin != "auto":
        return standin
    return "coarse-lowrank" if is_adam_family(optimizer) else "local"


# How long the end of a script waits for a background ring still in flight (pipesgd.lifecycle) before it leaves the
# thread running: the rings of every rank finish together unless a peer stopped answering.
EXIT_WAIT_S = 300.0

# Codecs that only converge with error feedback (1-bit SGD diverges without it).
NEEDS_ERROR_FEEDBACK = ("sign",)

