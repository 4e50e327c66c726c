"""The defaults and choices that several layers share (the wrapper, the trainer's flags, the timing model).

One owner per fact: everything here is imported, never copied. Torch-free, so the analytic model can read
it without loading torch.
"""
from __future__ import annotations

# Gradient bucket size in MiB: DDP's ``bucket_cap_mb`` default; each bucket is one collective call.
BUCKET_MB = 25.0

# Synchronous steps before the pipeline opens: staleness hurts most in the first steps, where loss and
# gradients change fastest (SAPipe and ChainerMN report accuracy lost to 1-stale gradients); a few
# synchronous steps cost a few iterations of exposed communication and nothing else.
WARMUP_STEPS = 10

# Elements per fp32 scale in the q8/q4/sign payloads.
QUANT_BLOCK_SIZE = 4096

# Which all-reduce runs a bucket. "ring": the paper's, the codec on every hop (a lossy codec re-encodes a growing
# partial sum p-1 times); "alltoall": two collectives, every contribution and every chunk's sum encoded once
# (pipesgd.comm.alltoall); "gather": one all-gather of every rank's whole payload, each rank decoding all p
# (pipesgd.comm.gather: one collective call, p-1 payloads per rank on the wire, so for small buckets where calls and
# not bytes set the time: LeNet's q8 all-reduce on the H100 host 2.50 ms against the ring's 4.72 and the exchange's
# 5.81, ResNet-18's 26.6 against 15.1, experiments/results/gather/report.md; but in training beside the step it won
# nothing reliable, LeNet's Pipe-SGD q8 iteration 9.02 against 8.34 ms on the ring, then 11.52 against 12.40: a
# user's choice, never "auto"'s);
# "backend": the backend's own all_reduce, which cannot compress. "auto": the backend's for a
# lossless codec (its C++ ring has no per-hop Python round trip, which dominates small buckets); for a lossy one
# "alltoall", except where gloo carries CUDA tensors (every payload staged through host memory): there "ring".
# Why, measured (experiments/results/allreduce_choice/report.md): on loopback the exchange was 1.2-7x faster for
# 0.25 MiB buckets and as fast or faster for 25 MiB ones but fp16 at 2-3 ranks, and its error does not grow with p
# (q8 at p = 8: 0.93 % against 1.56 %); on the H100 host, 4
# ranks sharing the GPU over gloo, the ring's q8 all-reduce took 10.5-12.5 ms against 14.0-18.5 for ResNet-18 in four
# sittings and Pipe-SGD q8 ran 1.43-1.61x DDP on it against 0.99-1.15x (experiments/results/gpu/README.md). Open: on
# 200 Mbit/s emulated links the ring ran q8 iterations 1.03-1.08x faster (1.23-1.29x while the exchange used gloo's
# collectives, which send to every peer at once; between hosts it now goes one peer at a time,
# pipesgd.comm.topology.PAIRWISE_MIN_BYTES), and at 2 ranks on loopback the ring was 1.2-1.7x faster for 25 MiB
# buckets (experiments/results/exchange_model/): no static rule wins everywhere, so compression="auto" measures both
# in the warm-up (pipesgd.auto.allreduce_trial); a named codec keeps this rule.
ALLREDUCE_CHOICES = ("auto", "ring", "alltoall", "gather", "backend")

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
ADAM_FAMILY = ("adam", "adamw")  # torch.optim.Adam, AdamW and their subclasses; the trainer's names


def is_adam_family(optimizer: tuple | list) -> bool:
    """Whether an optimizer known by its class and base classes (``__mro__``) or by the trainer's ``--optimizer``
    name (a one-element list) is Adam or AdamW."""
    return any(str(getattr(c, "__name__", c)).lower() in ADAM_FAMILY for c in optimizer)


def resolve_lookahead_standin(standin: str, optimizer: tuple | list) -> str:
    """The stand-in that ``standin`` names for an optimizer (``is_adam_family``'s argument): "auto" made concrete,
    any other choice kept."""
    if standin != "auto":
        return standin
    return "coarse-lowrank" if is_adam_family(optimizer) else "local"


# Error feedback where compression="auto" chooses the codec (pipesgd.auto): with q8 and q4 under momentum SGD (the
# ladder of timing_model.recommend; q4 and sign lose accuracy without it), none under Adam and AdamW. On the AdamW
# GPT at width 2 with look-ahead it cost accuracy with either codec: q8 +0.7 % of width 1's validation loss without
# it, +1.1 % with it (six seeds; 5 of 6 worse with it), q4 +2.4 % and +5.2 % (3 of 3) (experiments/results/accuracy).
# (1-bit Adam and Bagua's QAdam freeze Adam's second moment before compressing with error compensation: Adam depends
# on the gradient non-linearly.) Nor does the choice go below q8 there: q4 missed the GPT's 1 % with or without
# feedback, and on the emulated cluster a re-check walked from q8 to q4 (experiments/results/charlm_time). A user who
# names the codec gets it, with error_feedback as given.
ADAM_AUTO_CODECS = ("none", "bf16", "q8")
AUTO_ADAM_NOTE = "no error feedback and nothing below q8 under Adam/AdamW (they cost the GPT accuracy under look-ahead)"


def auto_codec_limits(optimizer: tuple | list) -> tuple[bool | None, tuple[str, ...] | None, str]:
    """What compression="auto" may choose for an optimizer (``is_adam_family``'s argument): (error feedback, the
    codecs, why) = (False, ``ADAM_AUTO_CODECS``, ``AUTO_ADAM_NOTE``) under Adam and AdamW; (None, None, "") under any
    other (the ladder's feedback and codecs)."""
    return (False, ADAM_AUTO_CODECS, AUTO_ADAM_NOTE) if is_adam_family(optimizer) else (None, None, "")

# How long the end of a script waits for a background ring still in flight (pipesgd.lifecycle) before it leaves the
# thread running: the rings of every rank finish together unless a peer stopped answering.
EXIT_WAIT_S = 300.0

# Codecs that only converge with error feedback (1-bit SGD diverges without it).
NEEDS_ERROR_FEEDBACK = ("sign",)


def resolve_allreduce(choice: str, lossless: bool, staged: bool = False) -> str:
    """"ring", "alltoall", "gather" or "backend" for an ``allreduce`` choice, whether the codec is lossless and whether
    the payloads are staged through host memory (gloo with CUDA tensors); ValueError if invalid."""
    if choice not in ALLREDUCE_CHOICES:
        raise ValueError(f"allreduce must be one of {ALLREDUCE_CHOICES}, got {choice!r}")
    if choice == "auto":
        return "backend" if lossless else "ring" if staged else "alltoall"
    if choice == "backend" and not lossless:
        raise ValueError("allreduce='backend' cannot compress; use 'alltoall', 'ring', 'gather' or 'auto' with a "
                         "lossy codec")
    return choice
