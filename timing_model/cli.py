"""``pipesgd-timing``: predict, sweep, calibrate, validate. Parses flags, calls the model, formats tables.

Bad input never shows a traceback: one line ``pipesgd-timing: error: ...`` on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from . import tables
from .modes import MODES
from .params import CODEC_RATIOS, COLLECTIVES
from .predict import Prediction, Scenario, predict
from .units import parse_bandwidth, parse_bytes, parse_count, parse_fraction, parse_list, parse_time

PROG = "pipesgd-timing"
EXIT_USAGE = 2
PREDICT_COLUMNS = ["mode", "iteration_s", "compute_s", "straggler_s", "interference_s", "update_s",
                   "handoff_s", "exposed_comm_s", "codec_s", "hidden_comm_s", "throughput_it_s", "speedup_vs_sync",
                   "speedup_vs_one", "staleness", "regime"]
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
    "copy_rate": ("copy_Bps", parse_bandwidth),
    "handoff": ("handoff_s", parse_time),
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


class UsageError(Exception):
    """Bad command line; reported as one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse hook
        raise UsageError(message)


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


def _add_scenario_flags(parser: argparse.ArgumentParser, sweep: bool) -> None:
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
    add("--copy-rate", help="gradient pack/unpack copy rate, e.g. 5GB/s (adds 2·M/rate per step; default: free)")
    add("--handoff", default="0", help="fixed per-step hand-off cost to the comm thread, e.g. 200us (default 0)")
    add("--reduce-rate", help="local reduction rate (bytes/s, e.g. 10GB/s); default: free")
    add("--collective", default="ring", help=f"allreduce algorithm of sync/ddp: {'|'.join(COLLECTIVES)}")
    add("--compression", default="none", help=f"{'|'.join(CODEC_RATIOS)}" + many)
    add("--compression-ratio", help="override the compressor's raw/payload ratio")
    add("--codec-gbps", help="codec throughput ENCODE[,DECODE] in GB/s of fp32 input (default: infinite)")
    add("--error-feedback", action="store_true",
        help="the codec keeps its error (pipesgd-train --error-feedback): adds the calibrated feedback cost")
    add("--width", default="2", help="Pipe-SGD pipeline width K (default 2)" + many)
    add("--overlap-fraction", default="0.5", help="DDP: fraction φ of backward that may overlap (default 0.5)")
    add("--bucket", default="25MiB", help="bytes per collective call (default 25MiB; 0 = one bucket)")
    add("--servers", default="1", help="parameter servers k (default 1)")
    add("--server-bandwidth", help="bandwidth of each server (default: the worker link)")
    add("--ps-pipelined", action="store_true", help="PS push and pull overlap (d = 1 instead of 2)")
    add("--ps-colocated", action="store_true", help="the server shares a machine with a worker")
    add("--batch-size", help="samples per worker per iteration (adds samples/s)")
    add("--calibration", help="calibration JSON: network terms and codec speeds from `calibrate`")
    add("--modes", default=",".join(MODES), help="modes to predict (default: all)")


def _scenario_fields(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict:
    fields = {}
    for flag, (name, parse) in SCENARIO_FLAGS.items():
        value = getattr(args, flag, None)
        if value is None or flag in skip:
            continue
        fields[name] = parse(value)
    if args.codec_gbps:
        fields["encode_Bps"], fields["decode_Bps"] = _codec_speeds(args.codec_gbps)
    fields["error_feedback"] = args.error_feedback
    fields["ps_serialised"] = not args.ps_pipelined
    fields["ps_colocated"] = args.ps_colocated
    return fields


def _modes(text: str) -> tuple[str, ...]:
    return tuple(_choice(m, "mode", MODES) for m in parse_list(text))


def _predict(scenario: Scenario, modes: tuple[str, ...], calibration) -> Prediction:
    """All modes; with a calibration each mode takes the network terms of the fit that serves it."""
    if calibration is None:
        return predict(scenario, modes)
    from .validation import calibrated_scenario

    results = tuple(predict(calibrated_scenario(scenario, calibration, m), (m,)).result(m) for m in modes)
    return Prediction(scenario, results)


def _load_calibration(path: str | None):
    if not path:
        return None
    from .calibration import read_calibration

    return read_calibration(path)


def cmd_predict(args: argparse.Namespace) -> str:
    for flag in SWEEPABLE:
        value = getattr(args, flag, None)
        if value is not None and "," in value:
            raise ValueError(f"--{flag.replace('_', '-')} {value!r}: predict takes one value; use `sweep` for lists")
    scenario = Scenario(**_scenario_fields(args))
    prediction = _predict(scenario, _modes(args.modes), _load_calibration(args.calibration))
    rows = prediction.rows()
    if args.format == "markdown":
        return tables.render(rows, "markdown", PREDICT_COLUMNS)
    return tables.render(rows, args.format)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Pipe-SGD timing model: predict, sweep, calibrate, validate.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    fmt = dict(choices=tables.FORMATS, default="markdown", help="output format (default markdown)")
    p = sub.add_parser("predict", help="iteration time and breakdown of every mode")
    _add_scenario_flags(p, sweep=False)
    p.add_argument("--format", **fmt)
    p.set_defaults(run=cmd_predict)
    from .commands import add_calibrate_parser, add_sweep_parser, add_validate_parser

    add_sweep_parser(sub, fmt)
    add_calibrate_parser(sub)
    add_validate_parser(sub, fmt)
    return parser


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--bandwidth -1gbit`` → ``--bandwidth=-1gbit`` so a negative value reaches its parser (and its
    clear error) instead of argparse's "expected one argument"."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"^-[\d.]", token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pipesgd-timing`` and ``python -m timing_model``."""
    try:
        args = build_parser().parse_args(_join_negative_values(sys.argv[1:] if argv is None else list(argv)))
        output = args.run(args)
    except (UsageError, ValueError, OSError, KeyError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if isinstance(err, KeyError):
            message = f"missing field {message}"
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(output, int):
        return output
    try:
        sys.stdout.write(output)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
