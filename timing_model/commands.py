"""The ``sweep``, ``calibrate`` and ``validate`` sub-commands of ``pipesgd-timing`` (``predict`` is in ``cli``)."""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
from dataclasses import asdict, replace

from . import tables
from .units import format_bandwidth, parse_bytes, parse_list, parse_size_range

__all__ = ["add_sweep_parser", "add_calibrate_parser", "add_validate_parser"]


# ---------------------------------------------------------------- sweep
def add_sweep_parser(sub, fmt: dict) -> None:
    from .cli import _add_scenario_flags

    p = sub.add_parser("sweep", help="Pipe-SGD speedup tables and the winning mode over a grid")
    _add_scenario_flags(p, sweep=True)
    p.add_argument("--format", **fmt)
    p.set_defaults(run=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> str:
    from .cli import SCENARIO_FLAGS, SWEEPABLE, _load_calibration, _modes, _predict, _scenario_fields
    from .predict import Scenario

    # Step 1: split every sweepable flag into its values; the first value of each goes into the base scenario.
    raw = {flag: parse_list(getattr(args, flag)) for flag in SWEEPABLE if getattr(args, flag, None) is not None}
    first = copy.copy(args)
    for flag, values in raw.items():
        setattr(first, flag, values[0])
    base = Scenario(**_scenario_fields(first))
    axes = {flag: values for flag, values in raw.items() if len(values) > 1}
    parsed = {flag: [SCENARIO_FLAGS[flag][1](v) for v in values] for flag, values in axes.items()}
    modes = _modes(args.modes)
    calibration = _load_calibration(args.calibration)
    # Step 2: predict every grid point.
    rows = []
    for combo in itertools.product(*(range(len(v)) for v in axes.values())):
        changes = {SCENARIO_FLAGS[flag][0]: parsed[flag][i] for flag, i in zip(axes, combo)}
        prediction = _predict(replace(base, **changes), modes, calibration)
        row = {flag.replace("_", "-"): axes[flag][i] for flag, i in zip(axes, combo)}
        for res in prediction.results:
            row[f"{res.mode}_s"] = res.iteration_s
        if "pipe" in modes:
            for other in modes:
                if other != "pipe":
                    row[f"pipe_vs_{other}"] = prediction.speedup("pipe", other)
        row["winner"] = prediction.winner()
        rows.append(row)
    if args.format != "markdown":
        return tables.render(rows, args.format)
    # Step 3: markdown: the speedup table, then the "which mode wins here" map.
    keys = [k.replace("_", "-") for k in axes]
    speed_cols = keys + [k for k in rows[0] if k.startswith("pipe_vs_")]
    out = tables.render(rows, "markdown", speed_cols, "Pipe-SGD speedup over each baseline (>1: Pipe-SGD faster)")
    if len(keys) == 2:
        first_key, second_key = keys
        columns = list(dict.fromkeys(r[second_key] for r in rows))
        pivot = {}
        for r in rows:
            pivot.setdefault(r[first_key], {first_key: r[first_key]})[f"{second_key}={r[second_key]}"] = r["winner"]
        win_cols = [first_key] + [f"{second_key}={c}" for c in columns]
        out += "\n" + tables.render(list(pivot.values()), "markdown", win_cols, "Which mode wins here")
    else:
        out += "\n" + tables.render(rows, "markdown", keys + ["winner"], "Which mode wins here")
    return out


# ---------------------------------------------------------------- calibrate
def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="micro-benchmark this cluster (under torchrun) and fit the model")
    p.add_argument("--sizes", default="4KB:64MB", help="message sizes: LOW:HIGH powers of two, or a list")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per point (median; default 20)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up calls per point (default 5)")
    p.add_argument("--out", default="calib.json", help="calibration JSON to write (default calib.json)")
    p.add_argument("--backend", help="process-group backend (default: nccl with --device cuda, else gloo)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="tensor device (default cpu)")
    p.add_argument("--compressions", default="none", help="codecs to time: none,bf16,q8 (default none)")
    p.add_argument("--no-ring", action="store_true", help="time only the backend all_reduce")
    p.add_argument("--model", help="also time forward+backward of this trainer model")
    p.add_argument("--input-shape", default="3,32,32", help="model input shape without batch (default 3,32,32)")
    p.add_argument("--num-classes", type=int, default=10, help="model classes (default 10)")
    p.add_argument("--batch-size", type=int, default=32, help="batch for the compute timing (default 32)")
    p.add_argument("--hidden", type=int, help="hidden width of --model mlp, as the trainer's --hidden")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per rank, as the trainer's --threads (default 1: ranks share the cores)")
    p.add_argument("--fit-min-bytes", default="0",
                   help="leave allreduce samples below this size out of the fit, e.g. 1MB on a tc-tbf shaped link "
                        "whose burst sends small messages at line rate (default 0: fit all)")
    p.add_argument("--no-overlap", action="store_true",
                   help="skip the interference measurement (κ, κc: the allreduce beside a compute load vs alone; "
                        "the load is --model's forward+backward at its gradient size per codec, else a matmul loop)")
    p.set_defaults(run=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> str | int:
    from .params import CODEC_RATIOS

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world < 2:
        raise ValueError("calibration needs >= 2 ranks (world size is 1): run it under "
                         "`torchrun --nproc-per-node 2 -m timing_model calibrate ...` or inside pipesgd-cluster")
    sizes = parse_size_range(args.sizes)
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError("--repeats must be >= 1 and --warmup >= 0")
    if args.threads < 1:
        raise ValueError("--threads must be >= 1")
    min_fit_bytes = parse_bytes(args.fit_min_bytes, allow_zero=True)
    compressions = tuple(parse_list(args.compressions))
    for name in compressions:
        if name not in CODEC_RATIOS:
            raise ValueError(f"unknown compression {name!r}; valid: {', '.join(CODEC_RATIOS)}")
    compute = None
    if args.model:
        from pipesgd.train.models import MODELS

        if args.model not in MODELS:
            raise ValueError(f"unknown model {args.model!r}; valid: {', '.join(MODELS)}")
        if args.batch_size < 1 or args.num_classes < 2 or (args.hidden is not None and args.hidden < 1):
            raise ValueError("--batch-size and --hidden must be >= 1 and --num-classes >= 2")
        shape = tuple(int(x) for x in parse_list(args.input_shape))
        compute = {"model": args.model, "input_shape": shape, "num_classes": args.num_classes,
                   "batch_size": args.batch_size, "hidden": args.hidden}
    import torch
    import torch.distributed as dist

    from .benchmarks import run_calibration
    from .calibration import write_calibration

    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    device = args.device
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = f"cuda:{torch.cuda.current_device()}"
    torch.set_num_threads(args.threads)
    dist.init_process_group(backend)
    failure: Exception | None = None
    try:
        try:
            cal = run_calibration(sizes, args.repeats, args.warmup, compressions, not args.no_ring, device, compute,
                                  overlap=not args.no_overlap, min_fit_bytes=min_fit_bytes)
            if cal is not None:
                write_calibration(args.out, cal)
        except (ValueError, OSError) as err:  # rank 0's fit or write failed: still meet the others below
            cal, failure = None, err
        dist.barrier()  # rank 0 fits alone; leave together so no rank tears its links down under another
    finally:
        dist.destroy_process_group()
    if failure is not None:
        raise failure
    if cal is None:
        return 0
    rows = [{"collective": name, "overhead_s": f.overhead_s, "latency_s": f.latency_s,
             "bandwidth": format_bandwidth(f.bandwidth_Bps), "bandwidth_Bps": f.bandwidth_Bps,
             "median_abs_rel_err": f.median_abs_rel_err, "max_abs_rel_err": f.max_abs_rel_err,
             "samples": f.n_samples} for name, f in cal.fits.items()]
    out = tables.render(rows, "markdown", title=f"Calibration written to {args.out}")
    if cal.host:
        from .calibration import host_terms

        terms = host_terms(cal.host)
        copy = "free" if terms["copy_Bps"] == float("inf") else f"{terms['copy_Bps'] / 1e9:.2f} GB/s"
        by_codec = cal.host.get("comm_slowdown_by_codec") or {}
        per_codec = "".join(f", {name} {value:.3f}" for name, value in by_codec.items() if name != "none")
        out += (f"\nκ (compute slow-down) {terms['slowdown']:.3f}, κc (comm slow-down) {terms['comm_slowdown']:.3f}"
                f"{per_codec}, copy {copy}, hand-off {1e6 * terms['handoff_s']:.0f} µs"
                f" (load: {cal.host.get('load', 'matmul')})\n")
    if cal.codec_ring_factors:
        out += "codec cost inside the ring / alone: " + ", ".join(
            f"{name} {factor:.2f} at {p} ranks" for name, by_nodes in cal.codec_ring_factors.items()
            for p, factor in by_nodes.items()) + "\n"
    return out


# ---------------------------------------------------------------- validate
def add_validate_parser(sub, fmt: dict) -> None:
    p = sub.add_parser("validate", help="predicted vs measured iteration time of real runs")
    p.add_argument("metrics", nargs="+", help="metrics JSONL files of pipesgd-train runs (RUN.jsonl, RUN.rankN.jsonl)")
    p.add_argument("--calibration", required=True, help="calibration JSON written by `calibrate`")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps to drop per run (default 3)")
    p.add_argument("--ddp-own-compute", action="store_true",
                   help="predict ddp runs from their own t_compute (which holds DDP's allreduce) instead of the "
                        "compute of an uncompressed sync run of the same configuration in the same folder")
    p.add_argument("--format", **fmt)
    p.set_defaults(run=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> str:
    from .calibration import read_calibration
    from .validation import read_runs, summarise, validate_runs

    if args.skip < 0:
        raise ValueError("--skip must be >= 0")
    calibration = read_calibration(args.calibration)
    checks = validate_runs(read_runs(args.metrics, args.skip), calibration, pair_ddp=not args.ddp_own_compute)
    rows = [asdict(c) for c in checks]
    summary = summarise(checks)
    if args.format == "json":
        return json.dumps({"runs": rows, "summary": summary}, indent=2) + "\n"
    if args.format == "csv":
        extra = [{"run": "(median |error|)", "error": summary["median_abs_error"]},
                 {"run": "(max |error|)", "error": summary["max_abs_error"]}]
        return tables.render(rows + extra, "csv")
    return (tables.render(rows, "markdown", title="Predicted vs measured median iteration time")
            + f"\nruns: {summary['runs']}, median |error|: {100 * summary['median_abs_error']:.2f} %, "
              f"max |error|: {100 * summary['max_abs_error']:.2f} %\n")
