"""What the ``pipesgd-timing`` sub-commands share: the scenario flags and their parsers, the output formats, and
prediction with an optional calibration (the parser and usage error: ``timing_model.cli_conventions``).
"""
from __future__ import annotations

import argparse

from timing_model.cli_conventions import UsageError
from timing_model.trainer_defaults import BUCKET_MB

from .. import tables
from ..calibration import Calibration, read_calibration
from ..modes import MODES
from ..params import ALLREDUCES, CODEC_RATIOS, COLLECTIVES
from ..predict import Prediction, Scenario, predict
from ..units import parse_bandwidth, parse_bytes, parse_count, parse_fraction, parse_list, parse_time
from ..validation import calibrated_scenario

__all__ = ["FORMAT_FLAG", "SCENARIO_FLAGS", "SWEEPABLE", "MEASURED_HEADING", "help_formatter", "add_scenario_flags",
           "parse_flag", "scenario_fields", "parse_modes", "predict_modes", "load_calibration"]

# --format of predict, sweep and validate
FORMAT_FLAG = dict(choices=tables.FORMATS, default="markdown", metavar="FORMAT",
                   help=f"{'|'.join(tables.FORMATS)} (default markdown)")
BUCKET_DEFAULT = f"{BUCKET_MB:g}MiB"  # the trainer's bucket size (trainer_defaults)


def _time(text: str) -> float:
    """A time flag's seconds: a bare number other than 0 is refused, so ``--compute 120`` is not read as 2 minutes."""
    return parse_time(text, require_unit=True)


def _size(text: str) -> float:
    """A size flag's bytes (0 allowed where the flag means "none"); a bare number other than 0 is refused."""
    return parse_bytes(text, allow_zero=True, require_unit=True)


def _signed_time(text: str) -> float:
    """``_time`` that also takes a leading minus (``--lockstep=-2ms``: the step beat its parts)."""
    stripped = text.strip()
    if not stripped.startswith("-"):
        return _time(stripped)
    try:
        return -_time(stripped[1:])
    except ValueError as err:  # name the value as given, minus and all
        raise ValueError(str(err).replace(stripped[1:], stripped)) from None


def _params(text: str) -> float:
    """Gradient bytes of ``--params`` (fp32: 4 bytes a parameter); a size in bytes is pointed to ``--bytes``."""
    try:
        return 4.0 * parse_count(text)
    except ValueError as err:
        if text.strip().endswith(("B", "byte", "bytes")):  # failed as a count (1.5B is one): a size
            raise ValueError(f"{err}; a size in bytes goes to --bytes") from None
        raise


# flag → (Scenario field, parser); the sweepable ones accept comma lists in `sweep`.
SCENARIO_FLAGS = {
    "nodes": ("nodes", lambda s: _int_at_least(s, "nodes", 1)),
    "bandwidth": ("bandwidth_Bps", parse_bandwidth),
    "latency": ("latency_s", _time),
    "params": ("grad_bytes", _params),
    "bytes": ("grad_bytes", lambda s: parse_bytes(s, require_unit=True)),
    "compression": ("compression", lambda s: _choice(s, "compression", tuple(CODEC_RATIOS))),
    "compute": ("compute_s", _time),
    "compute_std": ("compute_std_s", _time),
    "update": ("update_s", _time),
    "lookahead": ("lookahead_s", _time),
    "overhead": ("overhead_s", _time),
    "slowdown": ("slowdown", lambda s: parse_fraction(s, "slowdown", None)),
    "comm_slowdown": ("comm_slowdown", lambda s: parse_fraction(s, "comm slowdown", None)),
    "window_loss": ("window_loss", lambda s: parse_fraction(s, "window loss")),
    "copy_rate": ("copy_Bps", parse_bandwidth),
    "handoff": ("handoff_s", _time),
    "buffers": ("buffers_s", _time),
    "host": ("host_s", _time),
    "lockstep": ("lockstep_s", _signed_time),
    "ps_service": ("ps_service_s", _time),
    "ps_service_idle": ("ps_service_idle_s", _time),
    "ps_colocated_step": ("ps_colocated_step_s", _time),
    "ps_round": ("ps_round_s", _time),
    "send_buffer": ("send_buffer_bytes", _size),
    "reduce_rate": ("reduce_Bps", parse_bandwidth),
    "collective": ("collective", lambda s: _choice(s, "collective", COLLECTIVES)),
    "allreduce": ("allreduce", lambda s: _choice(s, "allreduce", ALLREDUCES)),
    "width": ("width", lambda s: _int_at_least(s, "width", 1)),
    "overlap_fraction": ("overlap_fraction", lambda s: parse_fraction(s, "overlap fraction")),
    "bucket": ("bucket_bytes", _size),
    "servers": ("servers", lambda s: _int_at_least(s, "servers", 1)),
    "server_bandwidth": ("server_bandwidth_Bps", parse_bandwidth),
    "batch_size": ("batch_size", lambda s: _int_at_least(s, "batch size", 1)),
    "compression_ratio": ("compression_ratio", lambda s: parse_fraction(s, "compression ratio", None)),
}
SWEEPABLE = ("nodes", "bandwidth", "latency", "params", "bytes", "compression", "compute", "width", "overhead",
             "allreduce")


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


# the heading of the flags that set the empirical terms (``timing_model.empirical.terms``)
MEASURED_HEADING = "terms measured by calibrate (usually from --calibration FILE)"


def help_formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's formatter with a flag column wide enough for ``--ps-colocated-step TIME`` on one line."""
    return argparse.HelpFormatter(prog, max_help_position=30)


def add_scenario_flags(parser: argparse.ArgumentParser, sweep: bool) -> None:
    """The plain inputs first (under argparse's options, the ones a user knows), then the empirical terms under
    ``MEASURED_HEADING``, each with a one-line help."""
    many = " (a list)" if sweep else ""
    add = parser.add_argument
    # the cluster and the model: what "how much faster on my cluster" needs
    add("--nodes", required=True, metavar="N", help="workers, e.g. 4" + many)
    add("--bandwidth", required=True, metavar="RATE", help="link bandwidth: 1gbit, 10GbE, 1.25GB/s" + many)
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", metavar="COUNT", help="model parameters (fp32): 25M, 61M" + many)
    size.add_argument("--bytes", metavar="SIZE", help="or the gradient size: 100MB, 256MiB" + many)
    add("--latency", default="0", metavar="TIME", help="per-message latency: 50us (default 0)" + many)
    add("--compute", default="0", metavar="TIME", help="forward + backward per step: 120ms" + many)
    add("--update", default="0", metavar="TIME", help="optimizer step: 5ms (default 0)")
    add("--lookahead", default="0", metavar="TIME",
        help="pipe, width >= 2: the look-ahead's replay per step, about one optimizer step (default 0)")
    add("--compression", default="none", metavar="NAME", help=f"{'|'.join(CODEC_RATIOS)} (default none)" + many)
    add("--width", default="2", metavar="K", help="Pipe-SGD pipeline width (default 2)" + many)
    add("--calibration", metavar="FILE", help="network fit and measured terms from `calibrate`")
    # more plain inputs
    add("--compute-std", default="0", metavar="TIME", help="spread of compute across workers (default 0)")
    add("--overhead", default="0", metavar="TIME", help="fixed cost per collective call (default 0)" + many)
    add("--reduce-rate", metavar="RATE", help="local reduction rate: 10GB/s (default: free)")
    add("--collective", default="ring", metavar="NAME", help="sync/ddp all-reduce algorithm (default ring)")
    add("--allreduce", default="auto", metavar="NAME",
        help="pipe/sync: ring|alltoall|auto (default auto: alltoall for a lossy codec, as the trainer)" + many)
    add("--codec-gbps", metavar="E[,D]", help="codec encode[,decode] GB/s of fp32 (default: free)")
    add("--compression-ratio", metavar="R", help="override the codec's raw/payload size ratio")
    add("--error-feedback", action="store_true", help="the codec keeps its error (adds its measured cost)")
    add("--overlap-fraction", default="0.5", metavar="F", help="DDP: share of backward that overlaps (0.5)")
    add("--bucket", default=BUCKET_DEFAULT, metavar="SIZE",
        help=f"bytes per collective call ({BUCKET_DEFAULT}; 0: one)")
    add("--servers", default="1", metavar="K", help="parameter servers (default 1)")
    add("--server-bandwidth", metavar="RATE", help="each server's bandwidth (default: the link's)")
    add("--ps-pipelined", action="store_true", help="parameter server: push and pull overlap")
    add("--ps-colocated", action="store_true", help="parameter server on a worker's machine")
    add("--batch-size", metavar="N", help="samples per worker per step (adds samples/s)")
    add("--modes", default=",".join(MODES), metavar="LIST", help="modes to predict (default: all)")
    # what calibrate measures: one line each, written into the scenario's empirical terms
    measured = parser.add_argument_group(MEASURED_HEADING).add_argument
    measured("--slowdown", default="0", metavar="F", help="extra compute time while communication runs")
    measured("--comm-slowdown", default="0", metavar="F", help="extra communication time while compute runs")
    measured("--window-loss", metavar="F", help="pipe: share of a compute window its ring loses")
    measured("--copy-rate", metavar="RATE", help="copying gradients into buckets and back: 5GB/s")
    measured("--handoff", default="0", metavar="TIME", help="per-step hand-off to the communication thread")
    measured("--buffers", default="0", metavar="TIME", help="per-step buffer sync (BatchNorm statistics)")
    measured("--host", default="0", metavar="TIME", help="per-step host work beyond the hand-off")
    measured("--lockstep", default="0", metavar="TIME", help="extra cost of an all-reduce right after compute")
    measured("--ps-service", default="0", metavar="TIME", help="co-located server: time per request")
    measured("--ps-service-idle", default="0", metavar="TIME", help="the same once its own worker has finished")
    measured("--ps-round", default="0", metavar="TIME", help="co-located server: a ps-sync round less the update")
    measured("--ps-colocated-step", default="0", metavar="TIME", help="the co-located worker's own step")
    measured("--send-buffer", metavar="SIZE", help="bytes of a server reply the kernel takes at once")


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
