"""What ``width="auto"`` / ``compression="auto"`` may choose among, and what the user fixed (``Knobs``)."""
from __future__ import annotations

from dataclasses import dataclass

from timing_model.trainer_defaults import auto_codec_limits
from timing_model.recommend import CODEC_LADDER

AUTO = "auto"
CANDIDATES = ("bf16", "q8", "q4")  # the lossy rungs of timing_model.recommend's ladder (sign only when asked)
MAX_WIDTH = 3  # recommend's widest: the model never prefers a wider pipeline for speed alone
SMALL_FRACTION = 64  # the second all-reduce size: 1/64 of the gradient
SWITCH_GAIN = 1.25  # a re-check gives up exactness or narrowness only for an iteration predicted this much faster
# The warm-up's choice tries a wider pipeline predicted this much faster than the narrower choice, and the hold keeps
# it only where it ran recommend's WIDER_GAIN faster, measured: the prediction is of a few noisy warm-up steps and
# misses both ways (docs/auto.md, "Held against width 1"), and a trial costs only the held steps. The early hold
# sends back a pipeline whose fastest iteration was not even this much faster than the warm-up's.
TRIAL_GAIN = 1.05


@dataclass(frozen=True, slots=True)
class Knobs:
    """What the user fixed (None: left to the choice) and what the warm-up runs with."""
    width: int | None
    compression: str | None
    error_feedback: bool | None  # fixed with a named codec, or for the optimizer (``of``)
    codecs: tuple[str, ...] | None = None  # the codecs the choice may take when the optimizer limits them (``of``)
    optimizer_note: str = ""  # why, when the optimizer fixed either (the choice's reason says so)
    lookahead: bool = False  # width 2 and up replay the optimizer's rule each step (``staleness="lookahead"``)

    @classmethod
    def of(cls, width: int | str, compression: str, error_feedback: bool, optimizer: tuple | list = (),
           lookahead: bool = False) -> "Knobs":
        """From a wrapper's arguments, "auto" meaning left to the choice; under ``compression="auto"`` the wrapped
        optimizer (its ``__mro__``) may fix error feedback and limit the codecs (``defaults.auto_codec_limits``)."""
        width = None if width == AUTO else width
        if compression != AUTO:
            return cls(width, compression, error_feedback, lookahead=lookahead)
        return cls(width, None, *auto_codec_limits(optimizer), lookahead=lookahead)

    def lookahead_s(self, optimizer_s: float) -> float:
        """The look-ahead's replay per step at width 2 and up, priced as one step of the wrapped optimizer (its rule on
        the same parameters, so of the same order as one optimizer step; docs/auto.md, Step 1); 0 without look-ahead."""
        return optimizer_s if self.lookahead else 0.0

    def measured_with(self) -> tuple[str, bool]:
        """The codec of the warm-up's exchanges: the user's, else none."""
        return (self.compression, bool(self.error_feedback)) if self.compression is not None else ("none", False)

    def fastest_codec(self) -> tuple[str, bool]:
        """The most compressed rung of ``timing_model.recommend``'s ladder the choice may take, with its error
        feedback (the optimizer's, when it fixed it): the warm-up's provisional codec (``pipesgd.auto``)."""
        codec, feedback = [(c, f) for c, f in CODEC_LADDER if c in self.codecs_to_time()][-1]
        return codec, feedback if self.error_feedback is None else self.error_feedback

    def codecs_to_time(self) -> tuple[str, ...]:
        if self.compression is None:
            return tuple(c for c in CANDIDATES if self.codecs is None or c in self.codecs)
        return () if self.compression == "none" else (self.compression,)
