"""The training variants the experiments compare, as ``pipesgd-train`` flags: one table, so a variant means the
same run in every experiment."""
from __future__ import annotations

__all__ = ["TRAINER_FLAGS", "SPEED_VARIANTS", "ACCURACY_VARIANTS", "FIDELITY_VARIANTS", "DEFAULT_FIDELITY_VARIANTS",
           "trainer_flags"]

TRAINER_FLAGS: dict[str, list[str]] = {  # variant name: pipesgd-train flags
    "sync": ["--mode", "sync"],
    "pipe": ["--mode", "pipe", "--width", "2"],
    "pipe+bf16": ["--mode", "pipe", "--width", "2", "--compression", "bf16"],
    "pipe+q8": ["--mode", "pipe", "--width", "2", "--compression", "q8", "--error-feedback"],
    "sync+bf16": ["--mode", "sync", "--compression", "bf16"],
    "sync+q8": ["--mode", "sync", "--compression", "q8", "--error-feedback"],
    "ddp": ["--mode", "ddp"],
    "ddp+fp16": ["--mode", "ddp", "--ddp-hook", "fp16"],
    "ps-sync": ["--mode", "ps-sync"],
    "ps-async": ["--mode", "ps-async"],
}

# issue 4 (bench_cluster.py): Pipe-SGD against sync AllReduce and DDP, in table order
SPEED_VARIANTS = ("sync", "pipe", "pipe+bf16", "pipe+q8", "ddp", "ddp+fp16")
ACCURACY_VARIANTS = ("sync", "pipe", "pipe+bf16", "pipe+q8", "ddp", "ddp+fp16")
# issue 5 (fidelity.py): every mode the timing model predicts
FIDELITY_VARIANTS = ("sync", "pipe", "pipe+bf16", "pipe+q8", "sync+bf16", "sync+q8", "ddp", "ps-sync", "ps-async")
DEFAULT_FIDELITY_VARIANTS = ("sync", "pipe", "pipe+bf16", "pipe+q8", "ddp", "ps-sync")


def trainer_flags(variant: str) -> list[str]:
    """The ``pipesgd-train`` flags of ``variant``; an unknown name raises with the valid list."""
    if variant not in TRAINER_FLAGS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(TRAINER_FLAGS)}")
    return list(TRAINER_FLAGS[variant])
