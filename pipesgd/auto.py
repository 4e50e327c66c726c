"""``PipeSGD(compression="auto", width="auto")``: width and codec chosen from the run's own measurements (issue 39).

Why: a user who does not know the cluster's bandwidth guesses the width and codec; no codec on a slow link costs
speed (2.7x slower than pipe+q8 on ResNet-20 at 100 Mbit/s), a lossy one or a width it does not need costs
accuracy. The first ``warmup_steps`` steps run synchronously anyway, so they can measure what the timing model needs.

What, at the last warm-up step (nothing in flight, every rank inside ``step()``):
  Step 1: ``StepClock`` has timed the warm-up steps: the caller's compute is the time between one ``step()``
          returning and the next starting, and the exchange of the whole gradient (uncompressed under
          ``compression="auto"``, else the user's codec) is the time the background worker spent on each warm-up
          step's exchange (``StepStats.t_comm_busy_s``); medians.
  Step 2: every rank makes the same timed calls: an uncompressed ``all_reduce`` at 1/64 of the gradient's size,
          and one encode and decode of each codec the choice may use on a tensor of the gradient's size (at most 4 M
          elements). ``link_terms`` finds the link's latency and bandwidth for which the timing model reproduces
          both all-reduces.
  Step 3: the measurements are all-reduced (max), so every rank holds the same numbers and reaches the same
          decision: ``timing_model.recommend`` over the knobs left to it (a width or codec the user named is kept).
The choice (width, codec, error feedback, reason, measurements) is logged once, kept in ``state_dict()`` (a resumed
run uses it without measuring again), readable as ``PipeSGD.auto_choice`` and in the step's ``StepStats``. Cost: the
warm-up steps, which run anyway, plus 4 all-reduces of 1/64 of the gradient and two encodes and decodes per codec.

Re-check (``auto_recheck_every=N``, off by default): every N steps after the warm-up it looks at the last N steps
(medians of their compute gaps, iterations, the exchange's busy time with the codec in use, and what ``step()``
blocked on communication; one small agreement all-reduce, no other traffic). It decides again only in a
configuration's first window, or when compute or the exchange moved ``CHANGED``-fold from that configuration's
first window by at least ``SWITCH_GAIN`` - 1 of the iteration (the cluster changed, not the noise). Then the same
decision as at the warm-up, from the latency and codec speeds the warm-up measured, with measured beating modelled:
a configuration that ran counts with its own iteration and blocked time, a codec that ran with its own exchange
time, and the model's error on the running configuration (measured iteration over modelled) scales the
predictions of the rest (under overlap the codecs and compute share the cores, which the model alone does not see).
It switches only for a predicted gain: to a less exact codec or a wider pipeline for a ``SWITCH_GAIN`` faster
iteration, to a more exact or narrower one when that one hides its all-reduce. So a run visits each configuration
at most once until something moves. A switch drains the pipeline first (every step in flight is applied, as
``flush()`` does, so replicas stay identical), then refills it as after the warm-up. Error-feedback residuals carry
over when the new codec keeps feedback on the same all-reduce (they are gradient values not yet sent, whatever the
codec); otherwise they are dropped (at most one step's rounding error).
"""
from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from pipesgd.compression import build
from pipesgd.compression.throughput import measure_codec_gbps
from pipesgd.grads.buckets import Bucket

AUTO = "auto"
CANDIDATES = ("bf16", "q8", "q4")  # the lossy rungs of timing_model.recommend's ladder (sign only when asked)
MAX_WIDTH = 3  # recommend's widest: the model never prefers a wider pipeline for speed alone
SMALL_FRACTION = 64  # the second all-reduce size: 1/64 of the gradient
REPEATS = 3
CODEC_SAMPLE = 4_000_000  # elements at most for a codec's timed encode and decode
SWITCH_GAIN = 1.25  # a re-check gives up exactness or narrowness only for a predicted 25 % faster iteration
CHANGED = 1.5  # a re-check decides again only when compute or the exchange moved this much (either way)

log = logging.getLogger("pipesgd")


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


class StepClock:
    """When each ``step()`` began and ended (the caller's compute lies between one's end and the next), and the
    background worker's busy time on each exchange the steps applied."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._began: float | None = None
        self._ended: float | None = None
        self.gaps: list[float] = []
        self.periods: list[float] = []  # from one step()'s start to the next: the iteration
        self.comm_busy: list[float] = []
        self.waits: list[float] = []  # what step() blocked on communication (the exposed part)

    def begin(self) -> None:
        now = self._clock()
        if self._ended is not None:
            self.gaps.append(now - self._ended)
        if self._began is not None:
            self.periods.append(now - self._began)
        self._began = now

    def end(self, comm_busy_s: float | None = 0.0, wait_s: float = 0.0) -> None:
        self._ended = self._clock()
        self.waits.append(wait_s)
        if comm_busy_s is not None:  # None: the step applied nothing (the pipeline fills)
            self.comm_busy.append(comm_busy_s)

    def reset(self) -> None:
        """Start a new window (the gap right after a re-check, which includes its drain, is not compute)."""
        self._began, self._ended, self.gaps, self.periods, self.comm_busy, self.waits = None, None, [], [], [], []

    @property
    def compute_s(self) -> float:
        """Median time between steps (0 when fewer than two steps were timed, e.g. right after a resume)."""
        return statistics.median(self.gaps) if self.gaps else 0.0

    @property
    def comm_s(self) -> float:
        """Median busy time of an exchange of the whole gradient."""
        return statistics.median(self.comm_busy) if self.comm_busy else 0.0

    def window(self) -> dict[str, float]:
        """A re-check's medians: compute, exchange, iteration and the exposed wait."""
        median = lambda values: statistics.median(values) if values else 0.0  # noqa: E731
        return {"compute_s": self.compute_s, "comm_s": self.comm_s, "period_s": median(self.periods),
                "wait_s": median(self.waits)}


class AutoConfig:
    """A wrapper's ``width="auto"`` and/or ``compression="auto"``: times its steps, chooses at the last warm-up
    step and, with ``recheck_every``, again every that many steps (module doc)."""

    def __init__(self, buckets: list[Bucket], knobs: Knobs, warmup_steps: int, group: dist.ProcessGroup | None,
                 recheck_every: int = 0, codec_options: dict | None = None) -> None:
        self._buckets, self.knobs, self._warmup, self._group = buckets, knobs, warmup_steps, group
        self._every, self._codec_options = recheck_every, dict(codec_options or {})
        self.clock = StepClock()
        self.choice: dict | None = None  # made, or restored from a checkpoint
        import timing_model.recommend  # noqa: F401 - loaded now, not inside the warm-up's last step

    def _timing(self, step: int) -> bool:
        if self.choice is None:
            return step < self._warmup
        return bool(self._every) and step >= self._warmup

    def begin(self, step: int) -> None:
        if self._timing(step):
            self.clock.begin()

    def end(self, step: int, comm_busy_s: float | None, wait_s: float = 0.0) -> dict | None:
        """After ``step()``'s work (``comm_busy_s``: the applied exchange's time on the worker, None: nothing
        applied; ``wait_s``: what ``step()`` blocked on communication: that exchange and a blocking sync of the
        module buffers, which queues behind the exchange on a saturated link). Returns a choice to run from the next
        step on (the wrapper drains what is in flight first): at the warm-up's last step, and at a re-check that
        switches."""
        if not self._timing(step):
            return None
        self.clock.end(comm_busy_s, wait_s)
        if self.choice is None:
            if step < self._warmup - 1:
                return None
            self.choice = first_choice(self._buckets, self.knobs, self.clock, self._group, self._codec_options)
            self.choice["step"] = step
            return self.choice
        if (step + 1 - self._warmup) % self._every or not self.clock.comm_busy:
            return None
        new = recheck(self._buckets, self.knobs, self.choice, self.clock, self._group)
        self.clock.reset()
        if new is not None:
            new["step"] = step
            self.choice = new
        return new


def first_choice(buckets: list[Bucket], knobs: Knobs, clock: StepClock, group: dist.ProcessGroup | None,
                 codec_options: dict | None = None) -> dict:
    """Steps 2 and 3 at the last warm-up step; logs the choice once (on rank 0)."""
    numel, grad_bytes, device, dtype = _gradient(buckets)
    # measure()'s numbers win over the clock's (a test may give them all); the options belong to a named codec
    options = codec_options if knobs.compression is not None else None
    measured = agreed({"compute_s": clock.compute_s, "comm_s": clock.comm_s,
                       **measure(numel, device, dtype, group, knobs.codecs_to_time(), options)}, group, device)
    choice = decide(measured, dist.get_world_size(group), grad_bytes, knobs, knobs.measured_with())
    announce(choice, dist.get_rank(group))
    return choice


def recheck(buckets: list[Bucket], knobs: Knobs, current: dict, clock: StepClock,
            group: dist.ProcessGroup | None) -> dict | None:
    """The re-check: the last window's times (agreed) with the warm-up's latency and codec speeds; a new choice when
    it switches (module doc), else None. It decides only in a running configuration's first window or when a
    window moved ``CHANGED``-fold from that configuration's reference (its first window). What each configuration
    measured while it ran (``current["ran"]``, updated in place) stands in for the model's prediction of it."""
    _, grad_bytes, device, _ = _gradient(buckets)
    window = agreed(clock.window(), group, device)
    running = (current["compression"], bool(current["error_feedback"]))
    now = (current.get("width"), *running)
    key, ran = run_key(*now), current.setdefault("ran", {})
    reference = current.get("reference") or ({**window, "comm_s": ran[key]["comm_s"]} if key in ran else None)
    if reference is not None and not _moved(window, reference):
        current["reference"] = reference
        return None
    current["reference"], ran[key] = window, {k: window[k] for k in ("comm_s", "period_s", "wait_s")}
    choice = decide({**current["measured"], "compute_s": window["compute_s"], "comm_s": window["comm_s"]},
                    dist.get_world_size(group), grad_bytes, knobs, running, now=now, ran=ran)
    if choice is None:
        return None
    choice["reason"], choice["ran"] = f"re-check: {choice['reason']}", dict(ran)
    announce(choice, dist.get_rank(group))
    return choice


def _moved(window: dict[str, float], reference: dict[str, float]) -> bool:
    """A window's compute or exchange time ``CHANGED``-fold (either way) from the reference's, by a margin that could
    pay for a switch (at least ``SWITCH_GAIN`` - 1 of the iteration: a 1.5-fold change of a 1 ms all-reduce in a 4 ms
    step is this host's noise, not a cluster that changed)."""
    floor = (SWITCH_GAIN - 1) * max(window.get("period_s", 0.0), reference.get("period_s", 0.0))
    return any(max(window[k], reference[k]) > CHANGED * max(min(window[k], reference[k]), 1e-9)
               and abs(window[k] - reference[k]) >= floor for k in ("compute_s", "comm_s"))


def _gradient(buckets: list[Bucket]) -> tuple[int, float, torch.device, torch.dtype]:
    numel = sum(bucket.numel for bucket in buckets)
    grad_bytes = sum(bucket.numel * bucket.dtype.itemsize for bucket in buckets)
    device, dtype = (buckets[0].device, buckets[0].dtype) if buckets else (torch.device("cpu"), torch.float32)
    return numel, grad_bytes, device, dtype


def measure(numel: int, device: torch.device, dtype: torch.dtype, group: dist.ProcessGroup | None,
            codecs: tuple[str, ...] = CANDIDATES, codec_options: dict | None = None) -> dict[str, float]:
    """Step 2 on this rank: seconds of an uncompressed all-reduce of 1/64 of ``numel`` elements of the buckets'
    ``dtype``, and encode/decode throughput (fp32 bytes/s) of every codec in ``codecs`` (built with
    ``codec_options``)."""
    x = torch.zeros(max(numel // SMALL_FRACTION, 1), dtype=dtype, device=device)
    dist.all_reduce(x, group=group)  # the first call sets up what the next ones reuse
    times = []
    for _ in range(REPEATS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(x, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    measured = {"small_allreduce_s": statistics.median(times)}
    for codec in codecs:
        encode, decode = measure_codec_gbps(build(codec, **(codec_options or {})), numel=min(numel, CODEC_SAMPLE),
                                            repeats=1, device=device)
        measured[f"{codec}_encode_Bps"], measured[f"{codec}_decode_Bps"] = encode * 1e9, decode * 1e9
    return measured


def agreed(measured: dict[str, float], group: dist.ProcessGroup | None, device: torch.device) -> dict[str, float]:
    """Step 3's agreement: the largest of every rank's numbers (the slowest rank's times set the pace; a codec
    speed taken as its largest is harmless beside that), identical on every rank."""
    names = sorted(measured)
    values = torch.tensor([measured[n] for n in names], dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
    return dict(zip(names, values.tolist()))


def codec_key(compression: str, error_feedback: bool) -> str:
    return compression + ("+ef" if error_feedback and compression != "none" else "")


def run_key(width: int | None, compression: str, error_feedback: bool) -> str:
    """A configuration's key in ``ran``: "2:q8+ef"."""
    return f"{width}:{codec_key(compression, error_feedback)}"


def _predictor(measured: dict[str, float], ran: dict[str, dict] | None = None, scale: float = 1.0,
               as_measured: bool = True):
    """Pipe-SGD's prediction for a scenario: with each codec's measured speed, its exchange time as measured while
    the pipeline ran (any width; the model's anchor, ``timing_model.empirical.anchor``) and, ``as_measured``, a
    configuration that ran as it ran (its iteration and exposed wait); every other prediction's times x ``scale``."""
    from timing_model.predict import predict

    ran = ran or {}
    comm_of = {key.split(":", 1)[1]: seen["comm_s"] for key, seen in sorted(ran.items())}

    def predict_pipe(case):
        if f"{case.compression}_encode_Bps" in measured:
            case = case.with_changes(encode_Bps=measured[f"{case.compression}_encode_Bps"],
                                     decode_Bps=measured[f"{case.compression}_decode_Bps"])
        codec = codec_key(case.compression, case.error_feedback)
        if codec in comm_of:
            case = case.with_changes(ring_anchor_s=comm_of[codec])
        result = predict(case, ("pipe",)).result("pipe")
        seen = ran.get(run_key(case.width, case.compression, case.error_feedback)) if as_measured else None
        if seen is not None:  # measured beats modelled
            return replace(result, iteration_s=seen["period_s"], exposed_comm_s=seen["wait_s"], codec_s=0.0)
        return replace(result, iteration_s=result.iteration_s * scale, exposed_comm_s=result.exposed_comm_s * scale,
                       codec_s=result.codec_s * scale)
    return predict_pipe


def decide(measured: dict[str, float], nodes: int, grad_bytes: float, knobs: Knobs,
           measured_with: tuple[str, bool] = ("none", False),
           now: tuple[int | None, str, bool] | None = None, ran: dict[str, dict] | None = None) -> dict | None:
    """What ``timing_model.recommend`` picks from the measurements (the same on every rank), among the knobs the user
    left free: {"width", "compression", "error_feedback", "reason", "measured"}. ``measured["comm_s"]`` is an
    exchange of the whole gradient with ``measured_with``'s codec. With ``now`` (a re-check: the width, codec and
    feedback running) None unless the switch rule of the module doc holds; ``ran``: what configurations measured
    while the pipeline ran, by ``run_key`` (``_predictor``). The model's error on the running configuration
    (its measured iteration over the model's) scales the predictions of the ones that have not run."""
    from timing_model.predict import Scenario
    from timing_model.recommend import codec_label, recommend

    link = link_terms(measured, nodes, grad_bytes, measured_with, _predictor(measured))
    scenario = Scenario(nodes=nodes, grad_bytes=grad_bytes, compute_s=measured["compute_s"], **link)
    scale = 1.0
    if now is not None and ran and run_key(*now) in ran:
        width, codec, feedback = now
        modelled = _predictor(measured, ran, as_measured=False)(
            scenario.with_changes(width=width, compression=codec, error_feedback=feedback)).iteration_s
        scale = ran[run_key(*now)]["period_s"] / modelled if modelled > 0 else 1.0
    predict_pipe = _predictor(measured, ran, scale)
    answer = recommend(scenario, predict_pipe, max_width=MAX_WIDTH, width=knobs.width,
                       compression=knobs.compression, error_feedback=knobs.error_feedback)
    new = answer.choice
    if now is not None:
        keys = [(c.width, c.compression, c.error_feedback) for c in answer.candidates]
        if (new.width, new.compression, new.error_feedback) == now or now not in keys:
            return None
        running = answer.candidates[keys.index(now)]
        faster = new.iteration_s * SWITCH_GAIN <= running.iteration_s
        exacter = keys.index((new.width, new.compression, new.error_feedback)) < keys.index(now) and new.hidden
        if not (faster or exacter):
            return None
    reason = (f"{answer.reason}; measured: compute {measured['compute_s'] * 1e3:.3g} ms per step, an all-reduce of "
              f"the gradient ({codec_label(*measured_with)}) {measured['comm_s'] * 1e3:.3g} ms on {nodes} rank(s)")
    return {"width": new.width, "compression": new.compression, "error_feedback": new.error_feedback,
            "reason": reason, "measured": dict(measured)}


def link_terms(measured: dict[str, float], nodes: int, grad_bytes: float,
               measured_with: tuple[str, bool] = ("none", False), predict_pipe=None) -> dict[str, float]:
    """The link's per-message latency and bandwidth for which the timing model predicts both measured all-reduces:
    the whole gradient with ``measured_with``'s codec (``comm_s``) and 1/64 of it uncompressed
    (``small_allreduce_s``, the ring's T = 2(p-1) latency + 2(p-1)/p M / B). The large one fixes the bandwidth
    given the latency (bisection: the predicted time falls as the bandwidth grows), the small one the latency given
    the bandwidth; a few rounds settle both. One rank (nothing sent): an infinitely fast link."""
    if nodes < 2:
        return {"bandwidth_Bps": float("inf"), "latency_s": 0.0}
    from timing_model.predict import Scenario

    predict_pipe = predict_pipe or _predictor(measured)
    hops = 2 * (nodes - 1)
    small_bytes = max(grad_bytes / SMALL_FRACTION, 4.0)
    codec, feedback = measured_with
    base = Scenario(nodes=nodes, grad_bytes=grad_bytes, bandwidth_Bps=1.0, compression=codec, error_feedback=feedback)

    def comm_at(bandwidth: float, latency: float) -> float:
        return predict_pipe(base.with_changes(bandwidth_Bps=bandwidth, latency_s=latency)).comm_total_s

    latency, bandwidth = measured["small_allreduce_s"] / hops, math.inf
    for _ in range(6):  # each round shrinks the error by the small size's share of the small all-reduce
        low, high = 1e3, 1e14  # bytes/s: from a stalled link to far beyond any NIC
        if comm_at(high, latency) >= measured["comm_s"]:
            bandwidth = high
        elif comm_at(low, latency) <= measured["comm_s"]:
            bandwidth = low
        else:
            for _ in range(48):  # halves log(high/low) = 25 each time: to 1e-13 relative
                mid = math.sqrt(low * high)
                low, high = (mid, high) if comm_at(mid, latency) > measured["comm_s"] else (low, mid)
            bandwidth = math.sqrt(low * high)
        latency = max(measured["small_allreduce_s"] - hops * small_bytes / (nodes * bandwidth), 0.0) / hops
    return {"bandwidth_Bps": bandwidth, "latency_s": latency}


def describe(choice: dict) -> str:
    """"width 2, q4 + error feedback" (the width only when it was chosen)."""
    from timing_model.recommend import choice_label

    return choice_label(choice.get("width"), choice["compression"], bool(choice["error_feedback"]))


def announce(choice: dict, rank: int) -> None:
    """The one log line (rank 0)."""
    if rank == 0:
        log.info("PipeSGD auto chose %s: %s", describe(choice), choice["reason"])
