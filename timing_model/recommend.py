"""Which width and codec Pipe-SGD should run on a cluster: the timing model's answer.

A user who does not know their cluster guesses ``width``, ``compression`` and ``error_feedback``; a wrong guess
costs speed (no codec on a slow link) or accuracy (a codec or a width that loses it). ``recommend`` asks the model
instead: it predicts Pipe-SGD's iteration for each candidate in an order of preference (``candidate_knobs``: the
most exact and narrowest first) and takes the first whose all-reduce hides behind the step (what is left exposed is
at most ``HIDDEN_SHARE`` of the iteration). A narrower candidate tried before it wins where it is predicted within
``WIDER_GAIN`` of it, because a wider pipeline's stale gradient costs steps. If nothing hides, the earliest
candidate within ``NEAR_FASTEST`` of the fastest is taken (a codec that is barely faster is not worth its loss of
exactness), under the same narrower rule; the reason says which rule decided; there, given a periodic predictor,
the answer also says whether periodic averaging is predicted ``WIDER_GAIN`` faster (``timing_model.periodic``). A
knob the user fixed (``width``, ``compression``) is never changed. The all-reduce follows ``Scenario.allreduce``
as the trainer resolves it. The evidence for the order: docs/timing-model.md ("Which width and codec to run"),
with ``experiments/results/accuracy/report.md`` and ``experiments/results/auto_choice/report.md``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .modes import ModeResult
from .periodic import Periodic, alternative
from .predict import Scenario
from .units import format_time

__all__ = ["HIDDEN_SHARE", "WIDER_GAIN", "CODEC_LADDER", "Candidate", "Recommendation", "codec_label", "choice_label",
           "recommend"]

HIDDEN_SHARE = 0.05  # an all-reduce "hides" when what it leaves exposed is at most this share of the iteration
# A wider pipeline only for an iteration predicted (and, in pipesgd.auto, measured) this many times faster: its stale
# gradient costs steps to the target (experiments/results/auto_choice/report.md), so a few per cent per iteration
# does not pay for it. The margin is the one pipesgd.auto's re-checks use (``SWITCH_GAIN``), not fitted per optimizer.
WIDER_GAIN = 1.25
NEAR_FASTEST = 1.10  # when nothing hides: the earliest candidate at most this factor slower than the fastest
CODEC_LADDER = (("none", False), ("bf16", False), ("q8", True), ("q4", True))  # most exact first
SIGN = ("sign", True)
ALLREDUCE_WORDS = {"ring": "per-hop ring", "alltoall": "two-collective exchange",
                   "backend": "the backend's all_reduce"}


def codec_label(compression: str, error_feedback: bool) -> str:
    """"q8 + error feedback", "none": a codec as the decision's reasons and records name it."""
    return compression + (" + error feedback" if error_feedback else "")


def choice_label(width: int | None, compression: str, error_feedback: bool) -> str:
    """"width 2, q8 + error feedback" (the codec alone when no width is named)."""
    codec = codec_label(compression, error_feedback)
    return f"width {width}, {codec}" if width is not None else codec


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration and what the model predicts for it (seconds)."""

    width: int
    compression: str
    error_feedback: bool
    allreduce: str  # as the trainer resolves it: "ring", "alltoall" or "backend"
    iteration_s: float
    exposed_s: float  # communication and codec time not hidden behind compute
    comm_s: float  # all communication including the codec, hidden or not
    hidden: bool

    @property
    def label(self) -> str:
        return (f"{choice_label(self.width, self.compression, self.error_feedback)}, "
                f"{ALLREDUCE_WORDS.get(self.allreduce, self.allreduce)}")


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The chosen candidate, why, every candidate tried (in the order of preference), and where nothing hides and a
    periodic predictor was given, periodic averaging's prediction beside them (named or not)."""

    choice: Candidate
    reason: str
    candidates: tuple[Candidate, ...]
    periodic: Periodic | None = None

    def as_dict(self) -> dict:
        return {"choice": asdict(self.choice), "reason": self.reason,
                "candidates": [asdict(c) for c in self.candidates],
                "periodic": self.periodic.as_dict() if self.periodic is not None else None}


def candidate_knobs(max_width: int, allow_sign: bool, width: int | None = None,
                    compression: str | None = None, error_feedback: bool | None = None,
                    allowed: tuple[str, ...] | None = None) -> list[tuple[int, str, bool]]:
    """(width, codec, error feedback) in the order of preference, keeping every knob the user fixed; ``allowed``:
    the ladder's codecs the caller limits the choice to (None: all).

    The order follows what the accuracy study measured (``experiments/results/accuracy/report.md``):

    - uncompressed width 1 (synchronous SGD, when the all-reduce is that small beside the step), then uncompressed
      width 2: where width 2 hides uncompressed, no codec is taken where none is needed;
    - the codecs from the most to the least exact (``CODEC_LADDER``: bf16, then q8 and q4 with error feedback, each
      within the seed spread of uncompressed width 2 on every task), then sign with error feedback only when the
      user allows it (it lost much accuracy there); each at width 1 (synchronous SGD with a codec hides nothing,
      but its gradient is not stale, so the narrower rule takes it over width 2 where it is predicted near it),
      then each at width 2;
    - width 3 and up to ``max_width`` with each codec, last: a third width cost AdamW more validation loss than
      any codec up to q4 with error feedback did.

    Under Adam and AdamW the caller fixes error feedback off and stops at q8 (``allowed``, from
    ``trainer_defaults.auto_codec_limits``: feedback and q4 cost the GPT accuracy under look-ahead)."""
    ladder = dict(CODEC_LADDER + (SIGN,))
    if compression is not None:
        codecs = [(compression, ladder.get(compression, False))]
    else:
        codecs = [(c, f) for c, f in CODEC_LADDER if allowed is None or c in allowed] + ([SIGN] if allow_sign else [])
    if error_feedback is not None:
        codecs = [(codec, error_feedback) for codec, _ in codecs]
    widths = [width] if width is not None else list(range(1, max_width + 1))
    narrow, wide = [w for w in widths if w <= 2], [w for w in widths if w > 2]
    exact = [(w, codec, feedback) for w in narrow for codec, feedback in codecs if codec == "none"]
    lossy = [(w, codec, feedback) for w in narrow for codec, feedback in codecs if codec != "none"]
    knobs = exact + lossy + [(w, codec, feedback) for w in wide for codec, feedback in codecs]
    return [(w, codec, feedback and codec != "none") for w, codec, feedback in knobs]


def recommend(scenario: Scenario, predict_pipe, *, max_width: int = 3, allow_sign: bool = False,
              width: int | None = None, compression: str | None = None,
              error_feedback: bool | None = None, codecs: tuple[str, ...] | None = None,
              predict_periodic=None, crossover_axis: str = "bandwidth_Bps",
              wider_gain: float = WIDER_GAIN) -> Recommendation:
    """The first candidate whose all-reduce hides (module doc). ``predict_pipe(scenario) -> ModeResult`` is
    Pipe-SGD's prediction for one scenario (with or without a calibration: the caller's choice); ``codecs`` limits
    the ladder (Adam and AdamW: ``trainer_defaults.ADAM_AUTO_CODECS``). ``predict_periodic(scenario) ->
    ModeResult``, where given, is one periodic-averaging mode's prediction at the scenario's ``sync_every`` and
    ``sync_delay``, asked where nothing hides, with its crossover along ``crossover_axis``
    (``periodic.alternative``). ``wider_gain``: the margin a wider candidate must be predicted to earn over a narrower
    one (``pipesgd.auto``'s first choice asks less, then holds the width it tries to ``WIDER_GAIN`` measured)."""
    if max_width < 1:
        raise ValueError(f"max width {max_width}: must be >= 1")
    knobs = candidate_knobs(max_width, allow_sign, width, compression, error_feedback, codecs)
    tried = _tried(scenario, predict_pipe, knobs)
    hiding = next((c for c in tried if c.hidden), None)
    if hiding is not None:
        before = tried[:tried.index(hiding)]
        narrower = _narrower_within_gain(before, hiding, wider_gain)
        if narrower is not None:
            why = f"{hiding.label} would hide its all-reduce at {reason_time(hiding.iteration_s)} per iteration"
            return Recommendation(narrower, _narrower_reason(why, narrower, wider_gain), tuple(tried))
        why = (f"its all-reduce ({reason_time(hiding.comm_s)}) hides behind the step (exposed "
               f"{reason_time(hiding.exposed_s)} of {reason_time(hiding.iteration_s)})")
        if before:
            leave = "the one tried before it" if len(before) == 1 else f"the {len(before)} tried before it"
            why += (f"; {leave} (narrower or more exact) leave{'s' if len(before) == 1 else ''} up to "
                    f"{reason_time(max(c.exposed_s for c in before))} exposed")
        return Recommendation(hiding, why, tuple(tried))
    near = _first_near_fastest(tried)
    fastest = min(c.iteration_s for c in tried)
    narrower = _narrower_within_gain(tried[:tried.index(near)], near, wider_gain)
    periodic = None if predict_periodic is None else alternative(
        scenario, predict_periodic, lambda case: min(c.iteration_s for c in _tried(case, predict_pipe, knobs)),
        WIDER_GAIN, crossover_axis)
    if narrower is not None:
        why = (f"nothing tried hides its all-reduce; {near.label}, the first within {NEAR_FASTEST - 1:.0%} of the "
               f"fastest prediction, takes {reason_time(near.iteration_s)} per iteration")
        return Recommendation(narrower, _narrower_reason(why, narrower, wider_gain), tuple(tried), periodic)
    why = (f"nothing tried hides its all-reduce; this is the first within {NEAR_FASTEST - 1:.0%} of the fastest "
           f"prediction ({reason_time(near.iteration_s)} per iteration against {reason_time(fastest)}); "
           f"{reason_time(near.exposed_s)} of its iteration is exposed communication")
    return Recommendation(near, why, tuple(tried), periodic)


def _tried(scenario: Scenario, predict_pipe, knobs: list[tuple[int, str, bool]]) -> list[Candidate]:
    """Each of ``knobs`` (width, codec, error feedback) as a ``Candidate`` with Pipe-SGD's prediction for it."""
    tried = []
    for w, codec, feedback in knobs:
        result: ModeResult = predict_pipe(scenario.with_changes(width=w, compression=codec, error_feedback=feedback))
        exposed = result.exposed_comm_s + result.codec_s
        tried.append(Candidate(w, codec, feedback, result.allreduce, result.iteration_s, exposed,
                               result.comm_total_s, exposed <= HIDDEN_SHARE * result.iteration_s))
    return tried


def _narrower_within_gain(before: list[Candidate], chosen: Candidate,
                          wider_gain: float = WIDER_GAIN) -> Candidate | None:
    """Of the candidates tried before ``chosen``, narrower and predicted within the margin of its iteration, the
    first within ``NEAR_FASTEST`` of the fastest of them (as where nothing hides: a more exact codec only for a
    small price; the first narrower one whatever its speed can be a far slower exact codec that costs more time to
    the target than its exactness saves). The margin is ``wider_gain`` against width 1 and ``WIDER_GAIN`` between
    wider ones: a trial (``pipesgd.auto``) is held against width 1 only, so it may leave width 1, not go wider."""
    return _first_near_fastest([c for c in before if c.width < chosen.width
                                and c.iteration_s <= _margin(c, wider_gain) * chosen.iteration_s])


def _margin(narrower: Candidate, wider_gain: float) -> float:
    """The gain a wider candidate must be predicted to earn over ``narrower`` (``_narrower_within_gain``)."""
    return wider_gain if narrower.width == 1 else max(wider_gain, WIDER_GAIN)


def _first_near_fastest(candidates: list[Candidate]) -> Candidate | None:
    """The first of ``candidates`` predicted within ``NEAR_FASTEST`` of the fastest of them (None if there are none)."""
    fastest = min((c.iteration_s for c in candidates), default=0.0)
    return next((c for c in candidates if c.iteration_s <= NEAR_FASTEST * fastest), None)


def _narrower_reason(why: str, narrower: Candidate, wider_gain: float = WIDER_GAIN) -> str:
    gain = _margin(narrower, wider_gain)
    return (f"{why}; but {narrower.label} is predicted at {reason_time(narrower.iteration_s)}, within {gain:g}x; a "
            f"wider pipeline's stale gradient costs steps, so it is taken only for a {gain:g}x faster iteration")


def reason_time(seconds: float) -> str:
    """A time in a reason: three digits, in ms below 10 s (``format_time``), ``0 ms`` for none."""
    return format_time(seconds, digits=3) if seconds else "0 ms"
