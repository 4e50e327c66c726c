"""The trainer's defaults that the timing model costs, owned here so that the model imports nothing of ``pipesgd``:
the bucket size, which all-reduce runs a bucket, what compression="auto" may choose per optimizer, and how often
the periodic-averaging modes sync.

``pipesgd.defaults`` imports these names for the wrapper and the trainer; everything else there is its own.
"""
from __future__ import annotations

__all__ = ["BUCKET_MB", "SYNC_EVERY", "ALLREDUCE_CHOICES", "resolve_allreduce", "ADAM_FAMILY", "is_adam_family",
           "ADAM_AUTO_CODECS", "AUTO_ADAM_NOTE", "auto_codec_limits"]

# Gradient bucket size in MiB: DDP's ``bucket_cap_mb`` default; each bucket is one collective call.
BUCKET_MB = 25.0

# Inner steps between two syncs of the periodic-averaging modes (localsgd, diloco): the paper's language models
# sync every 500 steps; the trainer's default runs are a few hundred steps long, so a few dozen syncs fit in one.
SYNC_EVERY = 16

# Which all-reduce runs a bucket. "ring": the paper's, the codec on every hop (a lossy codec re-encodes a growing
# partial sum p-1 times); "alltoall": two collectives, every contribution and every chunk's sum encoded once
# (pipesgd.comm.alltoall); "backend": the backend's own all_reduce, which cannot compress. "auto": the backend's for
# a lossless codec (its C++ ring has no per-hop Python round trip, which dominates small buckets); for a lossy one
# "alltoall", whose error does not grow with p and which was as fast or faster on most measured buckets, except
# where gloo carries CUDA tensors (every payload staged through host memory): there "ring"
# (experiments/results/bench_allreduce_choice/report.md, experiments/results/gpu/README.md). Neither wins everywhere
# (experiments/results/exchange_model/), so compression="auto" measures both in the warm-up
# (pipesgd.auto.allreduce_trial); a named codec keeps this rule.
ALLREDUCE_CHOICES = ("auto", "ring", "alltoall", "backend")


def resolve_allreduce(choice: str, lossless: bool, staged: bool = False) -> str:
    """"ring", "alltoall" or "backend" for an ``allreduce`` choice, whether the codec is lossless and whether the
    payloads are staged through host memory (gloo with CUDA tensors); ValueError if invalid."""
    if choice not in ALLREDUCE_CHOICES:
        raise ValueError(f"allreduce must be one of {ALLREDUCE_CHOICES}, got {choice!r}")
    if choice == "auto":
        return "backend" if lossless else "ring" if staged else "alltoall"
    if choice == "backend" and not lossless:
        raise ValueError("allreduce='backend' cannot compress; use 'alltoall', 'ring' or 'auto' with a lossy codec")
    return choice


ADAM_FAMILY = ("adam", "adamw")  # torch.optim.Adam, AdamW and their subclasses; the trainer's names


def is_adam_family(optimizer: tuple | list) -> bool:
    """Whether an optimizer known by its class and base classes (``__mro__``) or by the trainer's ``--optimizer``
    name (a one-element list) is Adam or AdamW."""
    return any(str(getattr(c, "__name__", c)).lower() in ADAM_FAMILY for c in optimizer)


# Error feedback where compression="auto" chooses the codec (pipesgd.auto): with q8 and q4 under momentum SGD (the
# ladder of timing_model.recommend; q4 and sign lose accuracy without it), none under Adam and AdamW, where it cost
# the GPT accuracy under look-ahead with either codec (experiments/results/accuracy). (1-bit Adam and Bagua's QAdam
# freeze Adam's second moment before compressing with error compensation: Adam depends on the gradient
# non-linearly.) Nor does the choice go below q8 there: q4 missed the GPT's accuracy target with or without
# feedback, and on the emulated cluster a re-check walked from q8 to q4 (experiments/results/charlm_time). A user
# who names the codec gets it, with error_feedback as given.
ADAM_AUTO_CODECS = ("none", "bf16", "q8")
AUTO_ADAM_NOTE = "no error feedback and nothing below q8 under Adam/AdamW (they cost the GPT accuracy under look-ahead)"


def auto_codec_limits(optimizer: tuple | list) -> tuple[bool | None, tuple[str, ...] | None, str]:
    """What compression="auto" may choose for an optimizer (``is_adam_family``'s argument): (error feedback, the
    codecs, why) = (False, ``ADAM_AUTO_CODECS``, ``AUTO_ADAM_NOTE``) under Adam and AdamW; (None, None, "") under any
    other (the ladder's feedback and codecs)."""
    return (False, ADAM_AUTO_CODECS, AUTO_ADAM_NOTE) if is_adam_family(optimizer) else (None, None, "")
