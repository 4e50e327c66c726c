"""What ``width="auto"`` / ``compression="auto"`` may choose among, and what the user fixed (``Knobs``)."""
from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
CANDIDATES = ("bf16", "q8", "q4")  # the lossy rungs of timing_model.recommend's ladder (sign only when asked)
MAX_WIDTH = 3  # recommend's widest: the model never prefers a wider pipeline for speed alone
SMALL_FRACTION = 64  # the second all-reduce size: 1/64 of the gradient
SWITCH_GAIN = 1.25  # a re-check gives up exactness or narrowness only for a predicted 25 % faster iteration


@dataclass(frozen=True, slots=True)
class Knobs:
    """What the user fixed (None: left to the choice) and what the warm-up runs with."""

    width: int | None
    compression: str | None
    error_feedback: bool | None  # fixed with a named codec

    @classmethod
    def of(cls, width: int | str, compression: str, error_feedback: bool) -> "Knobs":
        """From a wrapper's arguments, "auto" meaning left to the choice."""
        named = compression != AUTO
        return cls(None if width == AUTO else width, compression if named else None,
                   error_feedback if named else None)

    def measured_with(self) -> tuple[str, bool]:
        """The codec of the warm-up's exchanges: the user's, else none."""
        return (self.compression, bool(self.error_feedback)) if self.compression is not None else ("none", False)

    def codecs_to_time(self) -> tuple[str, ...]:
        if self.compression is None:
            return CANDIDATES
        return () if self.compression == "none" else (self.compression,)
