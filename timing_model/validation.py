"""Predicted against measured iteration time for real runs: reads ``pipesgd-train`` metrics and a calibration.

Metrics files (JSONL, one object per line; ``pipesgd.train.metrics``): ``RUN.jsonl`` for one process or
``RUN.rankN.jsonl`` per rank; files that differ only in ``.rankN`` form one run. ``read_runs`` says which records
and fields it reads and how it reduces a run's steps over ranks; ``RunRecord.measured_s`` what a run is checked
against (the median step, an asynchronous job's mean pace).

The prediction uses the calibrated network terms, the codec speeds of the calibration and the run's own compute,
update, buffer sync and host work (``scenario_for``), so it tests the communication and overlap model only. A ddp
run's own compute holds its in-backward all-reduce, so it borrows a matching sync run's (``compute_overrides``).
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, replace

from timing_model.run_metrics import ASYNC_MODES, iteration_over_ranks, run_name, slowest_rank, t_iter_by_rank

from .calibration import Calibration
from .empirical.host_terms import host_terms
from .empirical.server import KERNEL_SEND_BUFFER_BYTES
from .errors import error_summary
from .modes import MODES, ModeResult
from .params import CODEC_RATIOS
from .predict import Scenario, predict

__all__ = ["RunRecord", "RunCheck", "read_runs", "calibrated_scenario", "scenario_for", "predict_run",
           "compute_overrides", "validate_runs", "summarise", "COMPUTE_KEYS"]

@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run's settings and per-step slowest-rank timings."""

    name: str  # the run's path without .rankN
    config: dict  # the config record (empty if none)
    mode: str
    nodes: int
    grad_bytes: float
    t_iter: tuple[float, ...]  # per kept step, mean over ranks (the step's period; ps-async: the slowest worker's)
    t_compute: tuple[float, ...]
    t_update: tuple[float, ...]
    t_buffers: tuple[float, ...] = ()  # per kept step, the fastest rank's buffer sync (see ``read_runs``)
    t_host: tuple[float, ...] = ()  # per kept step, the slowest rank's host work outside the above (``read_runs``)
    t_rank0: tuple[float, ...] = ()  # asynchronous runs: rank 0's own t_iter per kept step (its server's worker)

    @property
    def measured_s(self) -> float:
        """The iteration time the model is checked against: the median step, or for asynchronous workers the
        mean (the job's pace: the slowest worker's steps while the co-located one trains and after)."""
        return statistics.fmean(self.t_iter) if self.mode in ASYNC_MODES else statistics.median(self.t_iter)


@dataclass(frozen=True, slots=True)
class RunCheck:
    """Predicted vs measured median iteration time of one run."""

    run: str
    mode: str
    nodes: int
    compression: str
    steps: int
    measured_s: float
    predicted_s: float
    error: float  # (predicted − measured) / measured
    compute_s: float = math.nan  # compute (fwd+bwd+data) the prediction used
    compute_from: str = "own"  # 'own' (the run's t_compute) or the run whose t_compute was used


def _read_lines(path: str) -> list[dict]:
    try:
        with open(path) as handle:
            lines = handle.readlines()
    except FileNotFoundError:
        raise ValueError(f"metrics file {path!r} not found") from None
    except IsADirectoryError:
        raise ValueError(f"metrics path {path!r} is a directory, not a file") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: malformed JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object")
        records.append(record)
    return records


def _number(record: dict, key: str, where: str) -> float:
    value = record.get(key, record.get(f"{key}_s"))
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{where}: step record needs a finite number {key!r}, got {value!r}")
    return float(value)


def _optional(record: dict, key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _grad_bytes(config: dict, steps: list[dict], nodes: int, mode: str, where: str) -> float:
    if config.get("grad_bytes"):
        return float(config["grad_bytes"])
    if config.get("params"):
        return 4.0 * float(config["params"])
    sent = [s.get("bytes_sent") for s in steps if s.get("bytes_sent")]
    if sent and mode in ("sync", "pipe") and config.get("compression", "none") == "none" and nodes > 1:
        return statistics.median(sent) * nodes / (2 * (nodes - 1))  # ring sends 2(p−1)/p of the gradient
    raise ValueError(f"{where}: no gradient size (config grad_bytes or params, or uncompressed ring bytes_sent)")


def _host(record: dict, where: str) -> float:
    """One rank's step time outside data, compute, the wait for communication, the update and the buffer sync."""
    inside = sum(_optional(record, key) for key in ("t_data", "t_wait", "t_buffers"))
    return max(0.0, _number(record, "t_iter", where) - _number(record, "t_compute", where)
               - _number(record, "t_update", where) - inside)


def read_runs(paths: list[str], skip: int = 3) -> list[RunRecord]:
    """Group files into runs and reduce each to per-step timings over its ranks.

    Records read (other types are skipped):

    - ``{"type": "config", ...}``: run settings, once per run (rank 0's file, first line). Fields read: ``mode``
      (ps-sync | ps-async | sync | ddp | pipe), ``world_size``, ``num_workers`` (ranks that compute; default
      world_size), ``width``, ``compression``, ``error_feedback``, ``grad_bytes`` or ``params`` (fp32: four bytes
      each), ``bucket_mb`` (MiB per bucket), ``overlap_fraction`` (DDP φ), ``servers`` (as ``pipesgd-train``: 0 =
      rank 0 serves and trains, k > 0 dedicated), ``ps_colocated``. All optional except the gradient size, which
      may instead come from ``bytes_sent`` of uncompressed ring steps.
    - ``{"type": "step", "step", "rank", "mode", "t_iter", "t_compute", "t_wait", "t_update", "bytes_sent"}``.

    The first ``skip`` steps are dropped (for pipe, at least the config's ``warmup_steps``). A step's period is the
    **mean over ranks** of t_iter: in lockstep training every rank's step times add up to the same wall-clock, so the
    mean is the step's period, while the per-step maximum adds each step's jitter (experiments/RESULTS.md).
    Asynchronous workers (ps-async) are not in lockstep: every per-step figure is the slowest worker's own
    (``experiments.harness.results.Run.pace_s`` says why). The model's inputs count each step's slowest rank for compute
    (t_compute + t_data: the straggler gates a synchronous step, and batch loading is local work like compute) and
    update, each step's *fastest* rank's ``t_buffers`` (the blocking buffer sync, ``--buffers``), and each step's
    slowest rank's host work outside all of these (``t_host`` = t_iter − t_data − t_compute − t_wait − t_update −
    t_buffers, floored at 0: the optimizer wrapper's packing, hand-off, bookkeeping and zero_grad, of which the
    calibrated hand-off covers a fraction)."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        groups.setdefault(run_name(path), []).append(path)
    runs = []
    for name, files in groups.items():
        config: dict = {}
        steps: list[dict] = []
        for path in files:
            for record in _read_lines(path):
                if record.get("type") == "config":
                    config = {**config, **record}
                elif record.get("type") == "step":
                    steps.append(record)
        # synchronous warm-up steps of pipe mode are not steady state either
        first = max(skip, int(config.get("warmup_steps") or 0) if config.get("mode") == "pipe" else skip)
        mode = config.get("mode") or (steps[0].get("mode") if steps else None)
        # asynchronous workers are not in lockstep: the slowest worker's own steps (``experiments.harness.results``)
        only = slowest_rank(steps, first) if mode in ASYNC_MODES else None
        by_step: dict[int, list[dict]] = {}
        for record in steps:
            step = record.get("step")
            if isinstance(step, int) and step >= first and (only is None or record.get("rank") == only):
                by_step.setdefault(step, []).append(record)
        if not by_step:
            raise ValueError(f"run {name!r}: no step records after skipping the first {first} steps")
        if mode not in MODES:
            raise ValueError(f"run {name!r}: unknown mode {mode!r}; valid: {', '.join(MODES)}")
        ranks = {r.get("rank") for r in steps}
        nodes = int(config.get("num_workers") or config.get("world_size") or len(ranks))
        order = sorted(by_step)
        pick = lambda key: tuple(max(_number(r, key, name) for r in by_step[s]) for s in order)  # noqa: E731
        over_ranks = iteration_over_ranks(mode)
        period = tuple(over_ranks(_number(r, "t_iter", name) for r in by_step[s]) for s in order)
        local = tuple(max(_number(r, "t_compute", name) + _optional(r, "t_data") for r in by_step[s]) for s in order)
        # the rank that reached the buffer sync last waits least: its time is the sync's own cost; the other
        # ranks' extra wait there is the straggler, which the slowest rank's compute already carries
        buffers = tuple(min(_optional(r, "t_buffers") for r in by_step[s]) for s in order)
        host = tuple(max(_host(r, name) for r in by_step[s]) for s in order)
        rank0 = tuple(t_iter_by_rank(steps, first).get(0, {}).values()) if only is not None else ()
        runs.append(RunRecord(name, config, mode, nodes, _grad_bytes(config, steps, nodes, mode, name),
                              period, local, pick("t_update"), buffers, host, rank0))
    return runs


def calibrated_scenario(scenario: Scenario, cal: Calibration, mode: str) -> Scenario:
    """``scenario`` with the network terms of the fit that serves ``mode`` (with ``scenario.allreduce``), the
    calibrated in-ring codec speeds and error-feedback rate (the feedback probe's at this size when it ran,
    ``Calibration.ring_feedback_speed``), and the empirical terms: the anchor of that allreduce at the scenario's
    gradient size (``Calibration.ring_anchor_s``, when the scenario runs the trainer's own choice), the calibrated
    host terms κ, κc, λ, lockstep, the DDP probe's step, the ps-sync probe's round (at the scenario's ranks and
    gradient only), copy rate, hand-off and the server's service time, and the kernel's socket buffer of a Linux
    host (codec speeds and terms given in the scenario win)."""
    fit = cal.fit_for(mode, scenario.compression, scenario.allreduce)
    ours = scenario.resolved_allreduce if mode in ("sync", "pipe") else "ring"  # what the codec runs inside
    encode, decode = cal.codec_speeds(scenario.compression, scenario.nodes, ours)
    # what feedback added to the ring in the calibration's paired probe, else the isolated rate scaled to the ring
    feedback = cal.ring_feedback_speed(mode, scenario.compression, scenario.grad_bytes, scenario.nodes)
    if feedback is None:
        feedback = cal.feedback_speed(scenario.compression, scenario.nodes, ours)
    # the lockstep term beyond the uncompressed all-reduce that its probe ran, as the anchor measured it
    host = host_terms(cal.host, scenario.compression,
                      cal.ring_anchor_s(mode, "none", scenario.grad_bytes, scenario.nodes), scenario.nodes,
                      scenario.grad_bytes)
    given = scenario.empirical
    # the probe timed the all-reduce the trainer ran when it calibrated ("auto" there): it anchors no other choice;
    # a calibration made before the exchange existed timed the ring, which every lossy codec then ran
    as_trainer = fit is cal.fit_for(mode, scenario.compression, "auto")
    anchor = given.ring_anchor_s or (cal.ring_anchor_s(mode, scenario.compression, scenario.grad_bytes,
                                                       scenario.nodes) if as_trainer else 0.0)
    # our compressed all-reduce's own cost per call, fitted per codec and cluster size (sync and pipe only)
    call = cal.codec_call_s(scenario.compression, scenario.nodes, ours) if mode in ("sync", "pipe") else 0.0
    terms = replace(given, ring_anchor_s=anchor, codec_call_s=given.codec_call_s or call,
                    slowdown=given.slowdown or host["slowdown"],
                    lockstep_s=given.lockstep_s or host["lockstep_s"],
                    comm_slowdown=given.comm_slowdown or host["comm_slowdown"],
                    window_loss=host["window_loss"] if given.window_loss is None else given.window_loss,
                    ddp_step_s=given.ddp_step_s or host["ddp_step_s"],
                    ddp_compute_s=given.ddp_compute_s or host["ddp_compute_s"],
                    copy_Bps=host["copy_Bps"] if math.isinf(given.copy_Bps) else given.copy_Bps,
                    handoff_s=given.handoff_s or host["handoff_s"],
                    ps_service_s=given.ps_service_s or host["ps_service_s"],
                    ps_service_idle_s=given.ps_service_idle_s or host["ps_service_idle_s"],
                    ps_round_s=given.ps_round_s or host["ps_round_s"],
                    send_buffer_bytes=given.send_buffer_bytes or KERNEL_SEND_BUFFER_BYTES)
    return replace(scenario, bandwidth_Bps=fit.bandwidth_Bps, latency_s=fit.latency_s, overhead_s=fit.overhead_s,
                   reduce_Bps=fit.reduce_Bps,
                   encode_Bps=encode if math.isinf(scenario.encode_Bps) else scenario.encode_Bps,
                   decode_Bps=decode if math.isinf(scenario.decode_Bps) else scenario.decode_Bps,
                   feedback_Bps=feedback if math.isinf(scenario.feedback_Bps) else scenario.feedback_Bps,
                   empirical=terms)


def scenario_for(run: RunRecord, cal: Calibration, base: Scenario | None = None,
                 compute_s: float | None = None) -> Scenario:
    """The scenario of a run: calibrated network and host terms, the run's settings and its measured compute
    (or ``compute_s`` when given, e.g. a sync run's compute for a ddp run).

    Like compute and update, the buffer sync and the host work are the run's own measurements: the model predicts
    the gradient communication and its overlap around them. Of the calibration's host terms, κc (comm slow-down
    next to compute), the copy rate and the hand-off cost apply to every run, the lockstep term (a blocking
    all-reduce right after compute, beyond the two apart) to sync, ddp and width-1 runs. κ (compute slow-down next
    to the ring) is *not* applied to a pipe run with its own compute: its measured t_compute already ran next to
    the ring."""
    cfg = run.config
    compression = cfg.get("compression", "none") or "none"
    if compression not in CODEC_RATIOS:
        raise ValueError(f"run {run.name!r}: unknown compression {compression!r}; valid: {', '.join(CODEC_RATIOS)}")
    scenario = base or Scenario(nodes=1, grad_bytes=0.0, bandwidth_Bps=1.0)
    width = int(cfg.get("width") or 2) if run.mode == "pipe" else 1
    # the statistic of ``measured_s``: a lockstep step's median, an asynchronous job's mean pace (whose queue,
    # ``server.closed_queue_response``, is a mean-value analysis: its think time is a mean too)
    typical = statistics.fmean if run.mode in ASYNC_MODES else statistics.median
    changes = dict(
        nodes=run.nodes, grad_bytes=run.grad_bytes,
        compute_s=typical(run.t_compute) if compute_s is None else compute_s,
        compute_std_s=0.0, update_s=typical(run.t_update), compression=compression, width=width,
        error_feedback=bool(cfg.get("error_feedback")),
        # the run's own per-step work beside compute, measured like compute (empirical terms)
        buffers_s=statistics.median(run.t_buffers) if run.t_buffers and run.mode in ("sync", "pipe") else 0.0,
        host_s=typical(run.t_host) if run.t_host else 0.0,
    )
    if run.mode in ("sync", "pipe"):
        # what ran the buckets, as the trainer records it ("backend" is what "auto" runs lossless);
        # a run without it predates the two-collective exchange, when every lossy codec ran on our ring
        ran = cfg.get("allreduce") or ("backend" if compression == "none" else "ring")
        changes["allreduce"] = "auto" if ran == "backend" else ran
    if cfg.get("bucket_mb"):
        changes["bucket_bytes"] = float(cfg["bucket_mb"]) * 2**20
    if cfg.get("overlap_fraction") is not None:
        changes["overlap_fraction"] = float(cfg["overlap_fraction"])
    if run.mode.startswith("ps-") and cfg.get("servers") is not None:
        # pipesgd-train: servers = 0 means rank 0 serves and trains (co-located); k > 0 dedicated ranks
        changes["servers"] = max(1, int(cfg["servers"]))
        changes["ps_colocated"] = int(cfg["servers"]) == 0
    if cfg.get("ps_colocated") is not None:
        changes["ps_colocated"] = bool(cfg["ps_colocated"])
    if run.mode == "ps-async" and run.t_rank0 and changes.get("ps_colocated", scenario.ps_colocated):
        # the co-located worker never waits on the link: its whole step is local work, measured like compute
        changes["ps_colocated_step_s"] = statistics.fmean(run.t_rank0)
    out = calibrated_scenario(scenario.with_changes(**changes), cal, run.mode)
    if run.mode == "pipe" and compute_s is None:  # its t_compute already ran next to the ring: κ is inside it
        out = out.with_changes(slowdown=scenario.empirical.slowdown)
    return out


def predict_run(run: RunRecord, cal: Calibration, base: Scenario | None = None,
                compute_s: float | None = None) -> tuple[Scenario, ModeResult]:
    """The scenario of ``run`` (``scenario_for``) and the model's prediction of its mode."""
    scenario = scenario_for(run, cal, base, compute_s)
    return scenario, predict(scenario, (run.mode,)).result(run.mode)


# config keys that fix a run's compute; a sync run lends its compute to a ddp run only if all that both have agree
COMPUTE_KEYS = ("model", "hidden", "batch_size", "threads", "dataset", "synthetic_features", "input_shape",
                "num_classes", "params", "device", "dtype")


def compute_overrides(runs: list[RunRecord]) -> dict[str, tuple[float, str]]:
    """For each ddp run, (median compute, name) of an uncompressed sync run of the same configuration in the
    same folder (same workers, gradient bytes and ``COMPUTE_KEYS``): DDP's own t_compute contains its
    in-backward allreduce, which the model adds again; predicted from the partner's compute, κ applies to the
    overlapped part. ddp runs without such a partner are left out."""
    syncs = [r for r in runs if r.mode == "sync" and (r.config.get("compression") or "none") == "none"]
    out = {}
    for run in runs:
        if run.mode != "ddp":
            continue
        for other in syncs:
            same = (os.path.dirname(other.name) == os.path.dirname(run.name) and other.nodes == run.nodes
                    and other.grad_bytes == run.grad_bytes
                    and all(other.config[k] == run.config[k] for k in COMPUTE_KEYS
                            if k in other.config and k in run.config))
            if same:
                out[run.name] = (statistics.median(other.t_compute), other.name)
                break
    return out


def validate_runs(runs: list[RunRecord], cal: Calibration, base: Scenario | None = None,
                  compute_override: dict[str, float] | None = None, pair_ddp: bool = True) -> list[RunCheck]:
    """Predict each run's iteration time and compare with its measured median.

    ``compute_override`` maps run names to the compute seconds to predict them with; with ``pair_ddp`` a ddp
    run not in it takes the compute of a matching sync run (``compute_overrides``)."""
    sources = {name: (seconds, "override") for name, seconds in (compute_override or {}).items()}
    if pair_ddp:
        sources = {**compute_overrides(runs), **sources}
    checks = []
    for run in runs:
        compute_s, source = sources.get(run.name, (None, "own"))
        scenario, result = predict_run(run, cal, base, compute_s)
        predicted = result.iteration_s
        measured = run.measured_s
        checks.append(RunCheck(run.name, run.mode, run.nodes, scenario.compression, len(run.t_iter), measured,
                               predicted, (predicted - measured) / measured if measured > 0 else math.inf,
                               scenario.compute_s, source))
    return checks


def summarise(checks: list[RunCheck]) -> dict:
    """``errors.error_summary`` of the runs' errors: median and max |error|, signed mean, bias."""
    return error_summary([c.error for c in checks])
