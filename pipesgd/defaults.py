"""The defaults and choices that several layers share (the wrapper, the trainer's flags, the timing model).

One owner per fact: everything here is imported, never copied. Torch-free, so the analytic model can read
it without loading torch.
"""
from __future__ import annotations

# The facts the timing model costs too are owned there (the model imports nothing of pipesgd); the wrapper and the
# trainer read them here with the rest.
from timing_model.codec_sizes import QUANT_BLOCK_SIZE
from timing_model.trainer_defaults import (ADAM_AUTO_CODECS, ALLREDUCE_CHOICES, AUTO_ADAM_NOTE, BUCKET_MB,
                                           auto_codec_limits, is_adam_family, resolve_allreduce)

# Synchronous steps before the pipeline opens: staleness hurts most in the first steps, where loss and
# gradients change fastest (SAPipe and ChainerMN report accuracy lost to 1-stale gradients); a few
# synchronous steps cost a few iterations of exposed communication and nothing else.
WARMUP_STEPS = 10

# p.grad as views into the flat buckets (pipesgd.grads.bucket_sets): no copy in or out of a step; K sets of
# gradient memory for width K instead of K + 1 (the K sets plus the gradients themselves).
GRADIENT_AS_BUCKET_VIEW = True

# What a pipeline of width K >= 2 does about its stale gradients (pipesgd.delay.lookahead): "lookahead" computes each
# gradient at the weights the K-1 updates in flight will produce (this rank's own gradients standing in for their
# averages), "none" is the paper's plain update, the gradient of weights K-1 updates old. One step of staleness
# cost 20-27 accuracy points with momentum 0.9 in the plain update; look-ahead kept widths 2-4 within a seed spread
# of width 1 (experiments/results/accuracy/report.md).
STALENESS_MODES = ("lookahead", "none")
STALENESS = "lookahead"
# What stands in, during look-ahead, for the averages still in flight: "local", this rank's own gradients (free);
# "coarse-q8" and "coarse-q4", every rank's averaged with that codec before the exact exchange (pipesgd.delay.coarse:
# an all-reduce per step that the next forward waits for). On the AdamW character GPT at width 3 (4 ranks) the own
# gradients left +6.2 % validation loss, the q4 average +2.2 %, the q8 average +0.2 % (experiments/results/accuracy),
# but waiting for it cost more time than synchronous q8 all-reduce. "local-then-q8": the own gradients for the newest
# step in flight, the q8 average for the older ones (it arrives during a compute phase: no forward waits for it);
# width 3 and more (at width 2 it is "local"). "coarse-lowrank": the own gradients with every rank's average in a
# shared subspace of each weight matrix, rank 4 per step in flight (pipesgd.delay.lowrank: one small all-reduce the
# next forward waits for and one after it, about a twentieth of the uncompressed bytes on the GPT; in simulation as
# good as the q4 average of all).
# "auto" (the default): "coarse-lowrank" under Adam and AdamW, where the own gradients' error costs most (the GPT:
# +1.8 % at width 2, against +0.5 % with the low-rank stand-in), "local" under any other optimizer (momentum SGD:
# within a seed spread of width 1 with the own gradients, and nothing to wait for).
LOOKAHEAD_STANDINS = ("auto", "local", "coarse-q8", "coarse-q4", "local-then-q8", "coarse-lowrank")
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

