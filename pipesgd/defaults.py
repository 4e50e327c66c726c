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


# What compression="auto" may choose under Adam and AdamW (pipesgd.auto): no error feedback and nothing below q8,
# which cost the character GPT accuracy under look-ahead (experiments/results/accuracy/report.md). Adam depends on
# the gradient non-linearly, so a residual fed back into its moments does not cancel as it does under SGD. A user
# who names the codec gets it, with error_feedback as given.
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
