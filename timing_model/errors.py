"""How far predictions lie from measurements, over a set of runs: the one summary every report prints
(``pipesgd-timing validate``, the fidelity study, the comparison grid), with a flag for a systematic bias.

An error is (predicted − measured) / measured: negative when the model predicts the run faster than it ran.
A spread of errors around zero is noise; errors that lean one way say a term is missing or mis-scaled. The
summary flags a **bias** when, over at least ``MIN_RUNS_FOR_BIAS`` runs, either

- every error has the same sign, or
- the signed mean lies beyond ±``BIAS_MEAN`` and at least ``BIAS_SHARE`` of the errors share its sign.
"""
from __future__ import annotations

import statistics
from typing import Sequence

__all__ = ["BIAS_MEAN", "BIAS_SHARE", "MIN_RUNS_FOR_BIAS", "error_summary", "bias", "summary_line"]

BIAS_MEAN = 0.02  # the signed mean the fidelity study holds the model to; further off, with one sign, is a lean
BIAS_SHARE = 0.75
MIN_RUNS_FOR_BIAS = 3  # two runs of one sign are a coin flipped twice


def bias(errors: Sequence[float]) -> str | None:
    """A sentence naming the bias of ``errors`` (see the module's rule), or None."""
    n = len(errors)
    if n < MIN_RUNS_FOR_BIAS:
        return None
    mean = statistics.fmean(errors)
    too_fast, too_slow = sum(e < 0 for e in errors), sum(e > 0 for e in errors)
    leaning, count = ("too fast", too_fast) if mean < 0 else ("too slow", too_slow)
    one_sign = too_fast == n or too_slow == n
    if one_sign or (abs(mean) > BIAS_MEAN and count >= BIAS_SHARE * n):
        return f"systematic bias: {count} of {n} predictions {leaning} (signed mean {100 * mean:+.1f} %)"
    return None


def error_summary(errors: Sequence[float], flag: float | None = None) -> dict:
    """``runs``, ``median_abs_error``, ``max_abs_error``, ``signed_mean_error``, ``too_fast``, ``too_slow`` and
    ``bias`` (None when there is none); with ``flag``, also ``over_flag`` (runs with |error| over it) and ``flag``.
    Statistics of no runs are None."""
    absolute = [abs(e) for e in errors]
    out = {"runs": len(errors),
           "median_abs_error": statistics.median(absolute) if errors else None,
           "max_abs_error": max(absolute) if errors else None,
           "signed_mean_error": statistics.fmean(errors) if errors else None,
           "too_fast": sum(e < 0 for e in errors), "too_slow": sum(e > 0 for e in errors),
           "bias": bias(errors)}
    if flag is not None:
        out.update(over_flag=sum(e > flag for e in absolute), flag=flag)
    return out


def summary_line(stats: dict) -> str:
    """``runs: N, median |error| a %, max |error| b %, signed mean c %`` and, on a new line, the bias if any."""
    if not stats["runs"]:
        return "runs: 0"
    line = (f"runs: {stats['runs']}, median |error| {100 * stats['median_abs_error']:.1f} %, "
            f"max |error| {100 * stats['max_abs_error']:.1f} %, signed mean {100 * stats['signed_mean_error']:+.1f} %")
    return line + (f"\n{stats['bias']}" if stats["bias"] else "")
