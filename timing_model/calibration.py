"""Fit the model's network terms (overhead, latency, bandwidth, reduction rate) to measured timings, and
read/write the calibration JSON.

The fit is ``fitting.fit_collective`` (least squares on relative error); this module holds what it produces
(``Fit``), the measured points it is fitted to (``Sample``) and everything ``calibrate`` wrote (``Calibration``).
The calibration file (``schema`` = ``pipesgd-timing/calibration/1``, written atomically) holds the fit of each
timed all-reduce, the codecs' isolated speeds with their in-ring factors and costs per call, the model's compute,
the host's interference and hand-off terms (``empirical.host_terms``), the samples and their residuals;
docs/timing-model.md ("The calibration file") lists its fields.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from timing_model.atomic import atomic_open
from timing_model.trainer_defaults import resolve_allreduce

from .core import collectives
from .core.equations import codec_passes, codec_time
from .empirical.host_terms import host_terms

__all__ = ["SCHEMA", "Sample", "Fit", "Calibration", "compressed_parts", "residual_table",
           "write_calibration", "read_calibration", "calibration_from_json", "BURST_BYTES"]

# Below this message size a tc-tbf shaped link may send the whole message at line rate out of its burst
# allowance, a regime training-size gradients never see; such samples are flagged (or dropped with min_bytes).
BURST_BYTES = 2**20

SCHEMA = "pipesgd-timing/calibration/1"


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured point: the slowest rank's median seconds for one call."""

    kind: str  # 'allreduce' (a collective over `nodes` ranks) or 'reduce' (local add_ of n_bytes)
    collective: str  # 'ring' (our ring), 'alltoall' (our exchange), 'backend' (the group's all_reduce) or 'local'
    compression: str  # codec on the ring ('none' for the fit)
    nodes: int  # ranks taking part
    n_bytes: float  # fp32 bytes of the tensor
    seconds: float  # measured time

    def __post_init__(self) -> None:
        if self.kind not in ("allreduce", "reduce"):
            raise ValueError(f"sample kind must be 'allreduce' or 'reduce', got {self.kind!r}")
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise ValueError(f"sample seconds must be positive and finite, got {self.seconds!r}")
        if self.nodes < 1 or self.n_bytes <= 0:
            raise ValueError(f"sample needs nodes >= 1 and n_bytes > 0, got {self.nodes}, {self.n_bytes}")


@dataclass(frozen=True, slots=True)
class Fit:
    """Fitted network terms of one collective implementation."""

    overhead_s: float  # c0 per call
    latency_s: float  # α per ring step
    bandwidth_Bps: float  # B = 1/β
    reduce_Bps: float  # 1/γ (inf: not identified or free)
    n_samples: int
    median_abs_rel_err: float
    max_abs_rel_err: float
    notes: tuple[str, ...] = field(default=())

    def predict(self, nodes: int, n_bytes: float, algorithm: str = "ring") -> float:
        """Predicted seconds of one uncompressed allreduce of ``n_bytes`` over ``nodes`` ranks."""
        gamma = 0.0 if math.isinf(self.reduce_Bps) else 1.0 / self.reduce_Bps
        return collectives.ALLREDUCE[algorithm](nodes, n_bytes, self.latency_s, 1.0 / self.bandwidth_Bps,
                                                gamma, self.overhead_s)

    def as_json(self) -> dict:
        out = asdict(self)
        out["reduce_Bps"] = None if math.isinf(self.reduce_Bps) else self.reduce_Bps
        out["notes"] = list(self.notes)
        return out

    @staticmethod
    def from_json(data: dict) -> "Fit":
        reduce_Bps = data.get("reduce_Bps")
        return Fit(float(data["overhead_s"]), float(data["latency_s"]), float(data["bandwidth_Bps"]),
                   math.inf if reduce_Bps is None else float(reduce_Bps), int(data.get("n_samples", 0)),
                   float(data.get("median_abs_rel_err", math.nan)), float(data.get("max_abs_rel_err", math.nan)),
                   tuple(data.get("notes", ())))


def compressed_parts(s: Sample, fit: Fit, algorithm: str, codecs: dict[str, tuple[float, float]] | None,
                      ratios: dict[str, float] | None) -> tuple[float, float]:
    """(wire seconds, isolated codec seconds) the per-hop model gives a compressed ring sample."""
    ratio = (ratios or {}).get(s.compression, 1.0)
    enc, dec = (codecs or {}).get(s.compression, (math.inf, math.inf))
    wire = Fit(fit.overhead_s, fit.latency_s, fit.bandwidth_Bps * ratio, fit.reduce_Bps, 0, 0.0, 0.0)
    return wire.predict(s.nodes, s.n_bytes, algorithm), codec_time(s.nodes, s.n_bytes, enc, dec, True)


def _nearest(table: dict[str, dict[int, float]] | None, name: str, nodes: int, default: float) -> float:
    """The calibrated value of ``name`` at ``nodes`` ranks, else at the nearest calibrated size (ties: the larger),
    else ``default``."""
    by_nodes = (table or {}).get(name) or {}
    if not by_nodes:
        return default
    return by_nodes[min(by_nodes, key=lambda p: (abs(p - nodes), -p))]


def _ring_factor(factors: dict[str, dict[int, float]] | None, name: str, nodes: int) -> float:
    """The calibrated codec factor of ``name`` at (or nearest) ``nodes`` ranks, else 1 (the pure formula)."""
    return _nearest(factors, name, nodes, 1.0)


def _in_ring(speeds: tuple[float, float] | None, factor: float) -> tuple[float, float] | None:
    """One codec's (encode, decode) speeds as the ring sees them: isolated throughput / ring factor (0: free)."""
    if speeds is None:
        return None
    enc, dec = speeds
    return (enc / factor, dec / factor) if factor > 0 else (math.inf, math.inf)


def residual_table(samples: list[Sample], fit: Fit, algorithm: str = "ring",
                   codecs: dict[str, tuple[float, float]] | None = None,
                   ratios: dict[str, float] | None = None, factors: dict[str, dict[int, float]] | None = None,
                   call_s: dict[str, dict[int, float]] | None = None) -> list[dict]:
    """Measured vs predicted per allreduce sample; compressed ring samples use the per-hop codec model at the
    isolated codec speeds scaled by the ring ``factors`` of their cluster size (``fit_codec_costs``; none: 1)."""
    rows = []
    for s in samples:
        if s.kind != "allreduce":
            continue
        if s.compression == "none":
            predicted = fit.predict(s.nodes, s.n_bytes, algorithm)
        else:
            speeds = _in_ring((codecs or {}).get(s.compression), _ring_factor(factors, s.compression, s.nodes))
            predicted = sum(compressed_parts(s, fit, algorithm, {s.compression: speeds} if speeds else {}, ratios))
            predicted += ((call_s or {}).get(s.compression) or {}).get(s.nodes, 0.0)
        rows.append({"collective": s.collective, "compression": s.compression, "nodes": s.nodes,
                     "n_bytes": s.n_bytes, "measured_s": s.seconds, "predicted_s": predicted,
                     "rel_err": (predicted - s.seconds) / s.seconds})
    return rows


@dataclass(slots=True)
class Calibration:
    """Everything ``calibrate`` measured and fitted; ``validate`` and ``predict --calibration`` read it."""

    fits: dict[str, Fit]  # 'ring', 'backend' and/or 'alltoall' (its α-β with ``collectives.allreduce_exchange``)
    codecs: dict[str, tuple[float, float]] = field(default_factory=dict)  # name → (encode_Bps, decode_Bps)
    compute: dict | None = None  # {'model', 'batch_size', 'compute_s'} when measured
    samples: list[Sample] = field(default_factory=list)
    residuals: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)  # created_utc, backend, device, world_size, grid, notes
    host: dict = field(default_factory=dict)  # κ, κc, copy_Bps, handoff_s and their raw timings ({}: none)
    codec_ring_factors: dict[str, dict[int, float]] = field(default_factory=dict)  # name → {p: f}, see
    # ``fit_codec_costs``
    codec_feedback: dict[str, float] = field(default_factory=dict)  # name → error-feedback bytes/s (isolated)
    codec_exchange_factors: dict[str, dict[int, float]] = field(default_factory=dict)  # the same for the exchange
    codec_ring_call_s: dict[str, dict[int, float]] = field(default_factory=dict)  # name → {p: seconds per call}
    codec_exchange_call_s: dict[str, dict[int, float]] = field(default_factory=dict)  # (``fit_codec_costs``)

    def codec_speeds(self, name: str, nodes: int = 2, allreduce: str = "ring") -> tuple[float, float]:
        """(encode_Bps, decode_Bps) of ``name`` inside our ``allreduce`` ("ring" or "alltoall") of ``nodes`` ranks:
        the isolated throughput divided by its calibrated factor (``_ring_factor``; the exchange lends the ring's
        when it has none); (inf, inf) for an uncalibrated codec (the pure formula)."""
        factors = self._own(self.codec_exchange_factors, self.codec_ring_factors, name, allreduce)
        speeds = _in_ring(self.codecs.get(name), _ring_factor(factors, name, nodes))
        return speeds or (math.inf, math.inf)

    def feedback_speed(self, name: str, nodes: int = 2, allreduce: str = "ring") -> float:
        """Error-feedback bytes/s of ``name`` inside our ``allreduce`` of ``nodes`` ranks (scaled like
        ``codec_speeds``); inf when not measured."""
        rate = self.codec_feedback.get(name)
        factor = _ring_factor(self._own(self.codec_exchange_factors, self.codec_ring_factors, name, allreduce),
                              name, nodes)
        return rate / factor if rate is not None and factor > 0 else math.inf

    def codec_call_s(self, name: str, nodes: int = 2, allreduce: str = "ring") -> float:
        """Seconds one call of our ``allreduce`` with ``name`` costs beyond its wire and codec bytes, at the nearest
        calibrated cluster size (``fit_codec_costs``; the exchange lends the ring's when it has none); 0 when not
        fitted."""
        return _nearest(self._own(self.codec_exchange_call_s, self.codec_ring_call_s, name, allreduce), name, nodes,
                        0.0)

    @staticmethod
    def _own(exchange: dict[str, dict[int, float]], ring: dict[str, dict[int, float]], name: str,
             allreduce: str) -> dict[str, dict[int, float]]:
        """Of a per-codec table kept for each all-reduce, ``allreduce``'s: the exchange's where it has ``name``,
        else the ring's (a calibration made before the exchange was timed)."""
        return exchange if allreduce == "alltoall" and name in exchange else ring

    def ring_anchor_s(self, mode: str, compression: str, grad_bytes: float, nodes: int) -> float:
        """The anchor of ``empirical.anchor.anchored``: seconds of the trainer's allreduce of ``compression`` alone at
        ``grad_bytes`` on ``nodes`` ranks, as the interference probe (``host['overlap']``, run at the model's
        gradient size by ``calibrate --model``) measured it; 0 when it did not (another size, world size or
        codec) or the mode runs another collective (parameter server; DDP with a comm hook)."""
        if mode not in ("sync", "pipe", "ddp") or (mode == "ddp" and compression != "none"):
            return 0.0
        row = self._probed("overlap", compression, grad_bytes, nodes)
        return float(row["ring_alone_s"]) if row and (row.get("ring_alone_s") or 0) > 0 else 0.0

    def ring_feedback_speed(self, mode: str, compression: str, grad_bytes: float, nodes: int) -> float | None:
        """Error-feedback bytes/s of our ring of ``compression`` at ``grad_bytes`` on ``nodes`` ranks as the
        feedback probe (``host['feedback_rings']``, ``pipesgd.measure.feedback``) measured it: the rate at which
        ``equations.codec_time``'s feedback term gives the probe's paired difference F (ring with feedback − without),
        E·(M/p)/F; inf when F <= 0 (within the noise); None when not probed (sync and pipe only: our ring)."""
        row = self._probed("feedback_rings", compression, grad_bytes, nodes) if mode in ("sync", "pipe") else None
        if row is None or row.get("feedback_s") is None:
            return None
        extra = float(row["feedback_s"])
        encodes, _ = codec_passes(nodes, True)
        return encodes * grad_bytes / nodes / extra if extra > 0 else math.inf

    def _probed(self, record: str, compression: str, grad_bytes: float, nodes: int) -> dict | None:
        """The row of host ``record`` for ``compression`` at ``grad_bytes`` (the model's size) when the calibration
        ran on ``nodes`` ranks; None otherwise."""
        if int(self.meta.get("world_size") or 0) != nodes:
            return None
        for row in (self.host or {}).get(record) or []:
            if row.get("compression") == compression and abs(float(row.get("n_bytes", -1)) - grad_bytes) <= max(
                    64.0, 1e-3 * grad_bytes):
                return row
        return None

    def fit_for(self, mode: str, compression: str = "none", allreduce: str = "auto") -> Fit:
        """The fit of the all-reduce that runs ``mode``'s buckets: for sync and pipe the one ``allreduce`` resolves
        to (``trainer_defaults.resolve_allreduce``: with "auto", the backend's all_reduce for the lossless codec and
        our two-collective exchange, ``'alltoall'``, for a lossy one, or the ring where the calibration ran gloo
        on CUDA tensors); the backend's for ddp and the parameter server. A calibration made before the exchange
        was timed lends it the ring's fit."""
        staged = self.meta.get("backend") == "gloo" and str(self.meta.get("device", "")).startswith("cuda")
        chosen = resolve_allreduce(allreduce, lossless=compression == "none", staged=staged) \
            if mode in ("sync", "pipe") else "backend"
        order = {"alltoall": ("alltoall", "ring", "backend"), "ring": ("ring", "backend")}.get(chosen, ("backend", "ring"))
        for name in order:
            if name in self.fits:
                return self.fits[name]
        raise ValueError("calibration has no fits")


def write_calibration(path: str, cal: Calibration) -> None:
    """Write the calibration JSON atomically (``timing_model.atomic``: a temporary file in the same folder, then
    rename)."""
    data = {"schema": SCHEMA, **cal.meta,
            "fits": {name: fit.as_json() for name, fit in cal.fits.items()},
            "codecs": {name: {"encode_Bps": e, "decode_Bps": d, "feedback_Bps": cal.codec_feedback.get(name),
                              "ring_factor_by_nodes": {str(p): f
                                                       for p, f in cal.codec_ring_factors.get(name, {}).items()},
                              "exchange_factor_by_nodes": {str(p): f for p, f in
                                                           cal.codec_exchange_factors.get(name, {}).items()},
                              "ring_call_s_by_nodes": {str(p): h for p, h in
                                                       cal.codec_ring_call_s.get(name, {}).items()},
                              "exchange_call_s_by_nodes": {str(p): h for p, h in
                                                           cal.codec_exchange_call_s.get(name, {}).items()}}
                       for name, (e, d) in cal.codecs.items()},
            "compute": cal.compute, "host": cal.host, "samples": [asdict(s) for s in cal.samples],
            "residuals": cal.residuals}
    with atomic_open(path, "w") as out:
        json.dump(data, out, indent=2, allow_nan=False, default=lambda v: None)
        out.write("\n")


def read_calibration(path: str) -> Calibration:
    """Read a calibration JSON; a missing file, bad JSON or wrong schema raises ``ValueError``."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"calibration file {path!r} not found") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"calibration file {path!r} is not valid JSON ({err.msg}, line {err.lineno})") from None
    return calibration_from_json(data, f"calibration file {path!r}")


def calibration_from_json(data, where: str = "calibration") -> Calibration:
    """A calibration from its JSON object (a file's, or one embedded in a results file); ``where`` names it in the
    ``ValueError`` that a wrong schema or a malformed record raises."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{where}: expected schema {SCHEMA!r}")
    try:
        fits = {name: Fit.from_json(fit) for name, fit in data["fits"].items()}
        codecs = {name: (float(c["encode_Bps"]), float(c["decode_Bps"])) for name, c in data.get("codecs", {}).items()}
        feedback = {name: float(c["feedback_Bps"]) for name, c in data.get("codecs", {}).items()
                    if c.get("feedback_Bps") is not None}
        factors = {name: {int(p): float(f) for p, f in c["ring_factor_by_nodes"].items()}
                   for name, c in data.get("codecs", {}).items() if c.get("ring_factor_by_nodes")}
        exchange, ring_call, exchange_call = ({name: {int(p): float(f) for p, f in c[key].items()}
                                               for name, c in data.get("codecs", {}).items() if c.get(key)}
                                              for key in ("exchange_factor_by_nodes", "ring_call_s_by_nodes",
                                                          "exchange_call_s_by_nodes"))
        samples = [Sample(**s) for s in data.get("samples", [])]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: malformed ({err})") from None
    if not fits:
        raise ValueError(f"{where}: no fits")
    host = data.get("host") or {}
    if not isinstance(host, dict):
        raise ValueError(f"{where}: malformed host record")
    try:
        for compression in ("none", *(host.get("comm_slowdown_by_codec") or {})):
            host_terms(host, compression)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: malformed host record ({err})") from None
    meta = {k: v for k, v in data.items()
            if k not in ("schema", "fits", "codecs", "compute", "host", "samples", "residuals")}
    if any(not (f >= 0 and math.isfinite(f)) for table in (factors, exchange, ring_call, exchange_call)
           for by_nodes in table.values() for f in by_nodes.values()):
        raise ValueError(f"{where}: a codec's ring_factor_by_nodes, exchange_factor_by_nodes and call_s_by_nodes "
                         f"must hold finite numbers >= 0")
    if any(not rate > 0 for rate in feedback.values()):
        raise ValueError(f"{where}: codec feedback_Bps must be > 0")
    return Calibration(fits, codecs, data.get("compute"), samples, data.get("residuals", []), meta, host, factors,
                       feedback, exchange, ring_call, exchange_call)
