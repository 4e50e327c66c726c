"""What the ``pipesgd-timing`` sub-commands share: the scenario flags and their parsers, the output formats, and
prediction with an optional calibration (the parser and usage error: ``pipesgd.cli_conventions``).
"""
from __future__ import annotations

import argparse

from pipesgd.cli_conventions import UsageError
from pipesgd.defaults import BUCKET_MB

from .. import tables
from ..calibration import Calibration, read_calibration
from ..modes import MODES
from ..params import CODEC_RATIOS, COLLECTIVES
from ..predict import Prediction, Scenario, predict
from ..units import parse_bandwidth, parse_bytes, parse_count, parse_fraction, parse_list, parse_time
from ..validation import calibrated_scenario

__all__ = ["FORMAT_FLAG", "SCENARIO_FLAGS", "SWEEPABLE", "add_scenario_flags", "parse_flag",
           "scenario_fields", "parse_modes", "predict_modes", "load_calibration"]

# --format of predict, sweep and validate
FORMAT_FLAG = dict(choices=tables.FORMATS, default="markdown", help="output format (default markdown)")
BUCKET_DEFAULT = f"{BUCKET_MB:g}MiB"  # the trainer's bucket size (pipesgd.defaults)


def _signed_time(text: str) -> float:
    """``parse_time`` that also takes a leading minus (``--lockstep=-2ms``: the step beat its parts)."""
    stripped = text.strip()
    return -parse_time(stripped[1:]) if stripped.startswith("-") else parse_time(stripped)


# flag → (Scenario field, parser); the sweepable ones accept comma lists in `sweep`.
SCENARIO_FLAGS = {
    "nodes": ("nodes", lambda s: _int_at_least(s, "nodes", 1)),
    "bandwidth": ("bandwidth_Bps", parse_bandwidth),
    "latency": ("latency_s", parse_time),
    "params": ("grad_bytes", lambda s: 4.0 * parse_count(s)),
    "bytes": ("grad_bytes", parse_bytes),
    "compression": ("compression", lambda s: _choice(s, "compression", tuple(CODEC_RATIOS))),
    "compute": ("compute_s", parse_time),
    "compute_std": ("compute_std_s", parse_time),
    "update": ("update_s", parse_time),
    "overhead": ("overhead_s", parse_time),
    "slowdown": ("slowdown", lambda s: parse_fraction(s, "slowdown", None)),
    "comm_slowdown": ("comm_slowdown", lambda s: parse_fraction(s, "comm slowdown", None)),
    "window_loss": ("window_loss", lambda s: parse_fraction(s, "window loss")),
    "copy_rate": ("copy_Bps", parse_bandwidth),
    "handoff": ("handoff_s", parse_time),
    "buffers": ("buffers_s", parse_time),
    "host": ("host_s", parse_time),
    "lockstep": ("lockstep_s", _signed_time),
    "ps_service": ("ps_service_s", parse_time),
    "ps_service_idle": ("ps_service_idle_s", parse_time),
    "ps_colocated_step": ("ps_colocated_step_s", parse_time),
    "ps_round": ("ps_round_s", parse_time),
    "reduce_rate": ("reduce_Bps", parse_bandwidth),
    "collective": ("collective", lambda s: _choice(s, "collective", COLLECTIVES)),
    "width": ("width", lambda s: _int_at_least(s, "width", 1)),
    "overlap_fraction": ("overlap_fraction", lambda s: parse_fraction(s, "overlap fraction")),
    "bucket": ("bucket_bytes", lambda s: parse_bytes(s, allow_zero=True)),
    "servers": ("servers", lambda s: _int_at_least(s, "servers", 1)),
    "server_bandwidth": ("server_bandwidth_Bps", parse_bandwidth),
    "batch_size": ("batch_size", lambda s: _int_at_least(s, "batch size", 1)),
    "compression_ratio": ("compression_ratio", lambda s: parse_fraction(s, "compression ratio", None)),
}
SWEEPABLE = ("nodes", "bandwidth", "latency", "params", "bytes", "compression", "compute", "width", "overhead")


def _int_at_least(text: str, what: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} {text!r}: not an integer") from None
    if value < low:
        raise ValueError(f"{what} {text!r}: must be >= {low}")
    return value


def _choice(text: str, what: str, valid: tuple[str, ...]) -> str:
    if text not in valid:
        raise ValueError(f"unknown {what} {text!r}; valid: {', '.join(valid)}")
    return text


def _codec_speeds(text: str) -> tuple[float, float]:
    """``--codec-gbps 5`` or ``5,8``: encode[,decode] throughput in 10^9 fp32 bytes/s."""
    parts = parse_list(text)
    if len(parts) > 2:
        raise ValueError(f"codec-gbps {text!r}: give ENCODE or ENCODE,DECODE")
    values = [parse_fraction(p, "codec-gbps", None) * 1e9 for p in parts]
    if any(v <= 0 for v in values):
        raise ValueError(f"codec-gbps {text!r}: must be > 0")
    return values[0], values[-1]


def add_scenario_flags(parser: argparse.ArgumentParser, sweep: bool) -> None:
    many = " (comma list to sweep)" if sweep else ""
    add = parser.add_argument
    add("--nodes", required=True, help="workers p, e.g. 4" + many)
    add("--bandwidth", required=True, help="link bandwidth: 1gbit, 10GbE, 1.25GB/s, 100Mbit/s" + many)
    add("--latency", default="0", help="per-message latency α: 50us, 2ms (default 0)" + many)
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", help="parameter count (fp32): 25M, 61M" + many)
    size.add_argument("--bytes", help="gradient bytes: 100MB, 256MiB" + many)
    add("--compute", default="0", help="mean forward+backward per iteration: 120ms" + many)
    add("--compute-std", default="0", help="spread of compute across workers (straggler term)")
    add("--update", default="0", help="optimizer update time: 5ms")
    add("--overhead", default="0", help="fixed cost c0 per collective call" + many)
    add("--slowdown", default="0", help="κ: compute slow-down while communication overlaps it (0.2 or 20%%)")
    add("--comm-slowdown", default="0",
        help="κc: communication slow-down while compute overlaps it (0.15 or 15%%; default 0)")
    add("--window-loss",
        help="λ: pipe only, the share of each compute window that the ring beside it loses (0.3 or 30%%, at "
             "most 1); replaces κc for pipe; calibrate measures it (default: κc)")
    add("--copy-rate", help="gradient pack/unpack copy rate, e.g. 5GB/s (adds 2·M/rate per step; default: free)")
    add("--handoff", default="0", help="fixed per-step hand-off cost to the comm thread, e.g. 200us (default 0)")
    add("--buffers", default="0",
        help="blocking per-step buffer sync (BatchNorm statistics; sync and pipe), e.g. 5ms (default 0)")
    add("--host", default="0",
        help="per-step host work outside compute, update, buffer sync and the wait (the optimizer wrapper, "
             "zero_grad), e.g. 1ms; only what exceeds the hand-off adds (default 0)")
    add("--lockstep", default="0",
        help="what a blocking all-reduce right after compute costs beyond the two apart, on every step that ends "
             "in one (sync, ddp, width 1), e.g. 3ms, or --lockstep=-2ms where it beats them (a shaped link's "
             "bucket refilled during compute); calibrate measures it with --model (default 0)")
    add("--reduce-rate", help="local reduction rate (bytes/s, e.g. 10GB/s); default: free")
    add("--collective", default="ring", help=f"allreduce algorithm of sync/ddp: {'|'.join(COLLECTIVES)}")
    add("--compression", default="none", help=f"{'|'.join(CODEC_RATIOS)}" + many)
    add("--compression-ratio", help="override the compressor's raw/payload ratio")
    add("--codec-gbps", help="codec throughput ENCODE[,DECODE] in GB/s of fp32 input (default: infinite)")
    add("--error-feedback", action="store_true",
        help="the codec keeps its error (pipesgd-train --error-feedback): adds the calibrated feedback cost")
    add("--width", default="2", help="Pipe-SGD pipeline width K (default 2)" + many)
    add("--overlap-fraction", default="0.5", help="DDP: fraction φ of backward that may overlap (default 0.5)")
    add("--bucket", default=BUCKET_DEFAULT, help=f"bytes per collective call (default {BUCKET_DEFAULT}; 0 = one bucket)")
    add("--servers", default="1", help="parameter servers k (default 1)")
    add("--server-bandwidth", help="bandwidth of each server (default: the worker link)")
    add("--ps-pipelined", action="store_true", help="PS push and pull overlap (d = 1 instead of 2)")
    add("--ps-colocated", action="store_true", help="the server shares a machine with a worker")
    add("--ps-service", default="0",
        help="ps-async with --ps-colocated: the server's time per remote request while its co-located worker "
             "trains, e.g. 2ms (queueing model; calibrate measures it with --model; default 0: the link alone)")
    add("--ps-service-idle", default="0",
        help="the same after the co-located worker finished its steps (default 0: as --ps-service); ps-sync with "
             "--ps-colocated serves each remote worker in this time less --update")
    add("--ps-round", default="0",
        help="ps-sync with --ps-colocated: the round (pushes, the server's update, replies) less the update, e.g. "
             "30ms, in place of the link's push + pull (calibrate measures it with --model; default 0: the link)")
    add("--ps-colocated-step", default="0",
        help="ps-async with --ps-colocated: the co-located worker's own mean step, e.g. 3ms (a run's rank 0; "
             "default 0: the remote workers' compute + update + host)")
    add("--batch-size", help="samples per worker per iteration (adds samples/s)")
    add("--calibration", help="calibration JSON: network terms and codec speeds from `calibrate`")
    add("--modes", default=",".join(MODES), help="modes to predict (default: all)")


def parse_flag(flag: str, text: str):
    """The value of scenario flag ``flag`` (a ``SCENARIO_FLAGS`` key); a bad one is a ``UsageError`` naming it."""
    try:
        return SCENARIO_FLAGS[flag][1](text)
    except ValueError as err:
        raise UsageError(f"--{flag.replace('_', '-')}: {err}") from None


def scenario_fields(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict:
    fields = {}
    for flag, (name, _) in SCENARIO_FLAGS.items():
        value = getattr(args, flag, None)
        if value is None or flag in skip:
            continue
        fields[name] = parse_flag(flag, value)
    if args.codec_gbps:
        try:
            fields["encode_Bps"], fields["decode_Bps"] = _codec_speeds(args.codec_gbps)
        except ValueError as err:
            raise UsageError(f"--codec-gbps: {err}") from None
    fields["error_feedback"] = args.error_feedback
    fields["ps_serialised"] = not args.ps_pipelined
    fields["ps_colocated"] = args.ps_colocated
    return fields


def parse_modes(text: str) -> tuple[str, ...]:
    return tuple(_choice(m, "mode", MODES) for m in parse_list(text))


def predict_modes(scenario: Scenario, modes: tuple[str, ...], calibration: Calibration | None) -> Prediction:
    """All modes; with a calibration each mode takes the network terms of the fit that serves it."""
    if calibration is None:
        return predict(scenario, modes)
    results = tuple(predict(calibrated_scenario(scenario, calibration, m), (m,)).result(m) for m in modes)
    return Prediction(scenario, results)


def load_calibration(path: str | None) -> Calibration | None:
    if not path:
        return None
    return read_calibration(path)
