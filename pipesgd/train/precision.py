"""Mixed precision of the trainer's forward/backward (``--amp``): the autocast dtype, and how a loss is scaled
before backward. bf16 needs no loss scaling; fp16 scales the loss with a ``torch.amp.GradScaler`` that
``PipeSGD`` drives (it unscales each delayed gradient with the scale of its own step and skips an overflow on
every rank), so fp16 is offered where gradients travel PipeSGD's ring only.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

AMP_DTYPES: dict[str, torch.dtype | None] = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
AMP_MODES = tuple(AMP_DTYPES)
SCALED_AMP_MODES = ("fp16",)  # the modes whose loss needs a GradScaler


@dataclass(frozen=True, slots=True)
class Precision:
    """How one forward/backward runs: under which autocast, with which loss scaler (None: unscaled)."""

    device_type: str  # "cpu" or "cuda": autocast is per device type
    dtype: torch.dtype | None = None  # autocast dtype; None runs in the parameters' dtype
    scaler: torch.amp.GradScaler | None = None  # fp16 only; the optimizer wrapper unscales and updates it

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype) if self.dtype is not None else nullcontext()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss


def build_precision(amp: str, device: torch.device) -> Precision:
    """The precision of ``--amp`` on ``device``; ValueError naming the choices for an unknown one."""
    if amp not in AMP_DTYPES:
        raise ValueError(f"unknown amp mode {amp!r} (valid: {', '.join(AMP_MODES)})")
    scaler = torch.amp.GradScaler(device.type) if amp in SCALED_AMP_MODES else None
    return Precision(device.type, AMP_DTYPES[amp], scaler)
