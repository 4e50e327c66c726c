"""The decision from the measurements: the link's latency and bandwidth that reproduce the measured all-reduces
(``link_terms``), the timing model's predictions with what ran and how much the times vary (``_predictor``), and
``timing_model.recommend``'s choice among the knobs left free, with a re-check's switch rule (``decide``)."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace

from pipesgd.auto.knobs import MAX_WIDTH, SMALL_FRACTION, SWITCH_GAIN, Knobs
from timing_model.core.straggler import expected_max_of_two
from timing_model.predict import Scenario, predict
from timing_model.recommend import WIDER_GAIN, _narrower_within_gain, choice_label, codec_label, recommend

log = logging.getLogger("pipesgd")


def codec_key(compression: str, error_feedback: bool) -> str:
    return compression + ("+ef" if error_feedback and compression != "none" else "")


def exchange_key(compression: str, error_feedback: bool) -> str:
    """A codec's measured exchange time in ``measured``: "q4+ef_exchange_s" (``first_choice``)."""
    return f"{codec_key(compression, error_feedback)}_exchange_s"


def run_key(width: int | None, compression: str, error_feedback: bool) -> str:
    """A configuration's key in ``ran``: "2:q8+ef"."""
    return f"{width}:{codec_key(compression, error_feedback)}"


BYTES_ORDER = ("none", "bf16", "fp16", "q8", "q4", "sign")  # most bytes on the wire first (``_predictor``'s floor)


def _floored(compression: str, measured_with: str) -> bool:
    """Whether the cores' floor read while ``measured_with`` ran bounds a configuration with ``compression``: only one
    that sends as many bytes or more (docs/auto.md, "The cores' floor")."""
    if compression in BYTES_ORDER and measured_with in BYTES_ORDER:
        return BYTES_ORDER.index(compression) <= BYTES_ORDER.index(measured_with)
    return compression == measured_with  # a codec of unknown size: only the one it was read with


def _predictor(measured: dict[str, float], ran: dict[str, dict] | None = None, scale: float = 1.0,
               as_measured: bool = True, measured_with: str = "none"):
    """Pipe-SGD's prediction for a scenario, from each codec's measured speed and exchange time, a configuration that
    ran as it ran (``as_measured``), every other one's times x ``scale``; a pipelined step as the expected maximum of
    its window and exchange (``_with_spread``), none under the cores' floor (docs/auto.md, steps 2 and 3)."""
    ran, floor = ran or {}, measured.get("cores_floor_s", 0.0)
    comm_of = {name.removesuffix("_exchange_s"): value for name, value in measured.items()
               if name.endswith("_exchange_s")}  # the warm-up's provisional codec
    comm_of.update({key.split(":", 1)[1]: seen["comm_s"] for key, seen in sorted(ran.items()) if "comm_s" in seen})

    def predict_pipe(case):
        if f"{case.compression}_encode_Bps" in measured:
            case = case.with_changes(encode_Bps=measured[f"{case.compression}_encode_Bps"],
                                     decode_Bps=measured[f"{case.compression}_decode_Bps"])
        codec = codec_key(case.compression, case.error_feedback)
        if codec in comm_of:
            case = case.with_changes(ring_anchor_s=comm_of[codec])
        result = _with_spread(predict(case, ("pipe",)).result("pipe"), measured)
        seen = ran.get(run_key(case.width, case.compression, case.error_feedback)) if as_measured else None
        if seen is not None:  # measured beats modelled
            return replace(result, iteration_s=seen["period_s"], exposed_comm_s=seen["wait_s"], codec_s=0.0)
        exposed = (result.exposed_comm_s + result.codec_s) * scale if result.staleness >= 1 else 0.0
        least = floor + exposed if _floored(case.compression, measured_with) else 0.0
        return replace(result, iteration_s=max(result.iteration_s * scale, least),
                       exposed_comm_s=result.exposed_comm_s * scale, codec_s=result.codec_s * scale)
    return predict_pipe


def _with_spread(result, measured: dict[str, float]):
    """A pipelined prediction's iteration as E[max(window, exchange)] of two normal times with the measured spreads;
    what it adds is exposed, split between transfer and codec as the model split it."""
    compute_spread, comm_cv = measured.get("compute_spread_s", 0.0), measured.get("comm_cv", 0.0)
    if result.staleness < 1 or not (compute_spread or comm_cv):
        return result
    exposed = result.exposed_comm_s + result.codec_s
    window, exchange = result.iteration_s - exposed, result.comm_total_s
    iteration = expected_max_of_two(window, exchange, math.hypot(compute_spread, comm_cv * exchange))
    codec_share = result.codec_s / exposed if exposed > 0 else 0.0
    more = max(iteration - window, 0.0)
    return replace(result, iteration_s=max(iteration, result.iteration_s), exposed_comm_s=more * (1 - codec_share),
                   codec_s=more * codec_share)


def decide(measured: dict[str, float], nodes: int, grad_bytes: float, knobs: Knobs,
           measured_with: tuple[str, bool] = ("none", False),
           now: tuple[int | None, str, bool] | None = None, ran: dict[str, dict] | None = None,
           max_width: int = MAX_WIDTH, hidden_only: bool = False, wider_gain: float = WIDER_GAIN) -> dict | None:
    """What ``timing_model.recommend`` picks among the knobs the user left free: {"width", "compression",
    "error_feedback", "reason", "measured"}, the same on every rank. With ``now`` (a re-check: what runs) None unless
    the switch rule holds; ``ran``: what configurations measured, by ``run_key``; the model's error on the running one
    scales the others' predictions; ``hidden_only``: None unless a candidate hides; ``wider_gain``: what a wider
    pipeline must be predicted to earn (the warm-up's choice asks less and holds a width on trial, docs/auto.md)."""
    link = link_terms(measured, nodes, grad_bytes, measured_with)
    scenario = Scenario(nodes=nodes, grad_bytes=grad_bytes, compute_s=measured["compute_s"],
                        update_s=measured.get("update_s", 0.0), lookahead_s=measured.get("lookahead_s", 0.0), **link)
    scale = 1.0
    if now is not None and ran and run_key(*now) in ran:
        width, codec, feedback = now
        modelled = _predictor(measured, ran, as_measured=False, measured_with=measured_with[0])(
            scenario.with_changes(width=width, compression=codec, error_feedback=feedback)).iteration_s
        scale = ran[run_key(*now)]["period_s"] / modelled if modelled > 0 else 1.0
    predict_pipe = _predictor(measured, ran, scale, measured_with=measured_with[0])
    answer = recommend(scenario, predict_pipe, max_width=max_width, width=knobs.width,
                       compression=knobs.compression, error_feedback=knobs.error_feedback, codecs=knobs.codecs,
                       wider_gain=wider_gain)
    new, why = _measured_before(answer, ran or {})
    hiding = any(c.hidden for c in answer.candidates)  # else the choice is only near the fastest (Step 3)
    if hidden_only and not hiding:
        return None
    if now is not None:
        keys = [(c.width, c.compression, c.error_feedback) for c in answer.candidates]
        if (new.width, new.compression, new.error_feedback) == now or now not in keys:
            return None
        running = answer.candidates[keys.index(now)]
        faster = new.iteration_s * SWITCH_GAIN <= running.iteration_s
        exacter = keys.index((new.width, new.compression, new.error_feedback)) < keys.index(now) and hiding
        if not (faster or exacter):
            return None
    spread = (f" (step to step ±{measured['compute_spread_s'] * 1e3:.2g} ms and ±{measured['comm_cv']:.0%})"
              if measured.get("compute_spread_s") or measured.get("comm_cv") else "")
    own = f" and {measured['update_s'] * 1e3:.3g} ms in step()" if measured.get("update_s") else ""
    if measured.get("lookahead_s"):
        own += f" (width 2 and up: {measured['lookahead_s'] * 1e3:.3g} ms more, the look-ahead's replay)"
    if measured.get("cores_floor_s"):  # pipesgd.auto.cores
        spread += (f"; the cores were {measured['cores_busy']:.0%} busy, so no iteration is predicted under "
                   f"{measured['cores_floor_s'] * 1e3:.3g} ms with as many bytes as {measured_with[0]} "
                   f"(a pipelined one: plus what its exchange leaves exposed)")
    trial = _on_trial(new, answer.candidates) if wider_gain < WIDER_GAIN else ""
    reason = (f"{why}{trial}; measured: compute {measured['compute_s'] * 1e3:.3g} ms per step{own}, an all-reduce of "
              f"the gradient ({codec_label(*measured_with)}) {measured['comm_s'] * 1e3:.3g} ms on {nodes} rank(s)"
              f"{spread}{'; ' + knobs.optimizer_note if knobs.optimizer_note else ''}")
    return {"width": new.width, "compression": new.compression, "error_feedback": new.error_feedback,
            "reason": reason, "measured": dict(measured)}


def _on_trial(new, candidates) -> str:
    """What the reason adds when ``new`` was taken on a smaller gain than ``WIDER_GAIN`` and that rule would have kept
    a narrower candidate tried before it (the ladder's order, as ``recommend`` sees it: an uncompressed width 2 is not
    on trial against a lossy width 1 tried after it): a width on trial, which the hold keeps only if it runs that much
    faster (``pipesgd.auto.hold``)."""
    narrower = _narrower_within_gain(list(candidates[:candidates.index(new)]), new, WIDER_GAIN)
    if narrower is None:
        return ""
    return (f"; on trial: predicted {narrower.iteration_s / new.iteration_s:.2f}x faster than {narrower.label}, under "
            f"the {WIDER_GAIN:g}x a stale gradient must earn, so it is kept only if it runs {WIDER_GAIN:g}x faster "
            f"than the warm-up")


def _measured_before(answer, ran: dict[str, dict]):
    """``recommend``'s choice, or an earlier candidate of its ladder that ran no slower than the choice is predicted:
    measured beats a prediction (shared cores slow the compute beside an exchange, which the model does not see)."""
    new = answer.choice
    earlier = [c for c in answer.candidates[:answer.candidates.index(new)]
               if run_key(c.width, c.compression, c.error_feedback) in ran and c.iteration_s <= new.iteration_s]
    if not earlier:
        return new, answer.reason
    return earlier[0], (f"{earlier[0].label} ran at {earlier[0].iteration_s * 1e3:.3g} ms per iteration, no slower "
                        f"than {new.iteration_s * 1e3:.3g} ms for {new.label}, the first whose all-reduce "
                        f"{'hides' if new.hidden else 'came near the fastest'}")


def uncompressed_hides(measured: dict[str, float], nodes: int, grad_bytes: float, knobs: Knobs,
                       ran: dict[str, dict] | None = None, wider_gain: float = WIDER_GAIN) -> dict | None:
    """``decide``'s choice where it needs neither the link's latency nor any codec's speed: an uncompressed all-reduce is
    predicted as measured, so if width 1 or 2 uncompressed hides, the link's probes are skipped (docs/auto.md, step 4).
    None when none hides; computed on every rank from agreed numbers, so nothing is broadcast."""
    if knobs.compression not in (None, "none"):
        return None
    widths = min(2, MAX_WIDTH) if knobs.width is None else knobs.width
    choice = decide({**measured, "small_allreduce_s": 0.0}, nodes, grad_bytes, replace(knobs, compression="none"),
                    ran=ran, max_width=widths, hidden_only=True, wider_gain=wider_gain)
    if choice is None:
        return None
    del choice["measured"]["small_allreduce_s"]  # not measured: a re-check that decides measures it (``recheck``)
    choice["reason"] += "; no codec needed, so neither the link's latency nor the codecs were timed"
    return choice


def link_terms(measured: dict[str, float], nodes: int, grad_bytes: float,
               measured_with: tuple[str, bool] = ("none", False)) -> dict[str, float]:
    """The link's latency and bandwidth for which the model predicts both measured all-reduces: the gradient with
    ``measured_with``'s codec (``comm_s``, which fixes the bandwidth) and 1/64 of it uncompressed
    (``small_allreduce_s``, the latency); a few rounds settle both. A measured exchange of that codec is left out: as an
    anchor it would pin the modelled time whatever the link. One rank: an infinitely fast link."""
    if nodes < 2:
        return {"bandwidth_Bps": float("inf"), "latency_s": 0.0}
    predict_pipe = _predictor({k: v for k, v in measured.items() if k != exchange_key(*measured_with)})
    hops = 2 * (nodes - 1)
    small_bytes = max(grad_bytes / SMALL_FRACTION, 4.0)
    codec, feedback = measured_with
    base = Scenario(nodes=nodes, grad_bytes=grad_bytes, bandwidth_Bps=1.0, compression=codec, error_feedback=feedback)

    def comm_at(bandwidth: float, latency: float) -> float:
        return predict_pipe(base.with_changes(bandwidth_Bps=bandwidth, latency_s=latency)).comm_total_s

    latency, bandwidth = measured["small_allreduce_s"] / hops, math.inf
    for _ in range(6):  # each round shrinks the latency's error ~64-fold (the large all-reduce is mostly bytes)
        bandwidth = _bandwidth_for(lambda b: comm_at(b, latency), measured["comm_s"])
        settled = latency
        latency = max(measured["small_allreduce_s"] - hops * small_bytes / (nodes * bandwidth), 0.0) / hops
        if abs(latency - settled) <= 1e-12 * max(latency, 1e-9):
            break
    return {"bandwidth_Bps": bandwidth, "latency_s": latency}


def _bandwidth_for(comm_at: Callable[[float], float], seconds: float) -> float:
    """The bandwidth (1e3 to 1e14 bytes/s) at which ``comm_at``, falling as it grows, takes ``seconds``: regula falsi
    (Illinois) on log(time) against log(bandwidth), nearly straight, so a dozen predictions inside a training step."""
    low, high = math.log(1e3), math.log(1e14)
    f_low, f_high = (math.log(comm_at(math.exp(x)) / seconds) for x in (low, high))
    if f_high >= 0:
        return math.exp(high)
    if f_low <= 0:
        return math.exp(low)
    side = 0
    for _ in range(100):
        x = (low * f_high - high * f_low) / (f_high - f_low)
        f = math.log(comm_at(math.exp(x)) / seconds)
        if abs(f) <= 1e-13 or high - low <= 1e-13:
            return math.exp(x)
        if f > 0:  # still too slow: the root lies at a higher bandwidth
            low, f_low = x, f
            f_high, side = (f_high / 2, side) if side == 1 else (f_high, 1)
        else:
            high, f_high = x, f
            f_low, side = (f_low / 2, side) if side == -1 else (f_low, -1)
    return math.exp(x)


def describe(choice: dict) -> str:
    """"width 2, q4 + error feedback" (", ring" when the warm-up measured the all-reduce); "warm-up: q8" if provisional."""
    label = choice_label(choice.get("width"), choice["compression"], bool(choice["error_feedback"]))
    if choice.get("allreduce"):  # measured in the warm-up (pipesgd.auto.allreduce_trial)
        label += f", {choice['allreduce']}"
    return f"warm-up: {label}" if choice.get("provisional") else label


def announce(choice: dict, rank: int) -> None:
    """The one log line (rank 0)."""
    if rank == 0:
        log.info("PipeSGD auto chose %s: %s", describe(choice), choice["reason"])
