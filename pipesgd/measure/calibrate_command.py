"""``pipesgd-timing calibrate``: measure this cluster under torchrun (``pipesgd.measure``) and fit the model to it
(``timing_model.fitting``); rank 0 writes the calibration JSON and prints the fits.

torch is imported where the measuring starts, so that bad flags are refused before it loads (``pipesgd.measure.cli``
registers this command onto the timing model's command line).
"""
from __future__ import annotations

import argparse
import gc
import datetime
import os

from pipesgd.runlog.output_paths import check_output_file
from timing_model import tables
from timing_model.calibration import Calibration, Sample, read_calibration, write_calibration
from timing_model.cli_conventions import RunFailure, UsageError, first_line
from timing_model.empirical.host_terms import host_terms
from timing_model.fitting import fit_calibration, host_record, overlap_sizes
from timing_model.params import CODEC_RATIOS
from timing_model.units import format_bandwidth, parse_bytes, parse_list, parse_size_range

__all__ = ["PROBES", "add_parser", "run", "run_calibration", "calibration_from", "add_probes", "report"]


def run_calibration(sizes_bytes: list[int], repeats: int = 20, warmup: int = 5,
                    compressions: tuple[str, ...] = ("none",), include_ring: bool = True, device: str = "cpu",
                    compute: dict | None = None, overlap: bool = True, min_fit_bytes: float = 0.0
                    ) -> Calibration | None:
    """Measure on every rank (``pipesgd.measure.calibrate``) inside an initialised process group, fit on rank 0; rank 0
    returns the ``Calibration``, other ranks ``None``. ``compute`` also times a trainer model; ``overlap`` also
    measures κ and κc (our ring); ``min_fit_bytes`` leaves smaller samples out of the fits (not the residuals)."""
    from pipesgd.measure.calibrate import measure_calibration  # torch: only once the flags are checked

    measured = measure_calibration(sizes_bytes, repeats, warmup, compressions, include_ring, device, compute,
                                   overlap, overlap_sizes(sizes_bytes))
    if measured is None:
        return None
    return calibration_from(measured, sizes_bytes, repeats, warmup, compressions, device, compute, min_fit_bytes)


def calibration_from(measured, sizes_bytes: list[int], repeats: int, warmup: int, compressions: tuple[str, ...],
                     device: str, compute: dict | None, min_fit_bytes: float = 0.0) -> Calibration:
    """Rank 0's ``CalibrationMeasurements`` (``pipesgd.measure.calibrate``) fitted into a ``Calibration``, with the
    grid it was measured on recorded in ``meta``; ``ValueError`` when no all-reduce could be fitted."""
    compute_record = None
    if compute:
        compute_record = {"model": compute["model"], "batch_size": compute["batch_size"],
                          "compute_s": measured.compute_s}
        if compute.get("hidden"):
            compute_record["hidden"] = compute["hidden"]
    meta = {"created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "backend": measured.backend, "device": device, "world_size": measured.world_size,
            "grid": {"nodes": measured.nodes, "sizes_bytes": list(sizes_bytes), "repeats": repeats,
                     "warmup": warmup, "compressions": list(compressions), "min_fit_bytes": min_fit_bytes},
            "notes": list(measured.notes)}
    return fit_calibration([Sample(**s) for s in measured.samples], measured.codecs, measured.feedback,
                           compute_record, host_record(measured.host), meta, min_fit_bytes)


BACKENDS = ("gloo", "nccl")  # the process-group backends calibrate runs on (cpu: gloo; cuda: nccl or gloo)
# what ``--probe-only`` can add to an existing calibration: probe name -> the host record it writes
PROBES = {"ps": "ps_service", "ps-sync": "ps_round", "feedback": "feedback_rings"}


def add_probes(cal: Calibration | None, names: tuple[str, ...], compute: dict, compressions: tuple[str, ...],
               device: str) -> Calibration | None:
    """Every rank runs the named probes of ``PROBES`` (``ps``, ``ps-sync``, ``feedback``: ``pipesgd.measure.server``,
    ``ps_round``, ``feedback``); rank 0 adds their raw records and terms to ``cal``'s host record and returns it, other
    ranks ``None``."""
    from pipesgd.measure.feedback import measure_feedback_rings  # torch: only once the flags are checked
    from pipesgd.measure.ps_round import measure_ps_round
    from pipesgd.measure.server import measure_ps_service

    raw: dict = {}
    if "feedback" in names:
        raw.update(measure_feedback_rings(compute, compressions, device=device))
    if "ps" in names:
        raw.update(measure_ps_service(compute, device))
    if "ps-sync" in names:
        raw.update(measure_ps_round(compute, device=device))
    if cal is None:
        return None
    cal.host = {**(cal.host or {}), **host_record(raw)}
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    cal.meta.setdefault("notes", []).extend(f"{PROBES[name]} added by calibrate --probe-only {name} at {stamp}"
                                            for name in names)
    return cal


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="micro-benchmark this cluster (under torchrun) and fit the model")
    p.add_argument("--sizes", default="4KB:64MB",
                   help="message sizes in bytes: LOW:HIGH, each bound a power of two (4KB and 64MB count as 4 KiB and "
                        "64 MiB), or a list (default 4KB:64MB)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per point (median; default 20)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up calls per point (default 5)")
    p.add_argument("--out", default="calib.json",
                   help="calibration JSON to write, replaced if it exists (default calib.json); checked before "
                        "measuring")
    p.add_argument("--backend", choices=BACKENDS,
                   help="process-group backend (default: nccl with --device cuda, else gloo)")
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
    p.add_argument("--probe-only", metavar="NAMES",
                   help="run only these probes of --model and add them to the existing calibration --out (made "
                        "before they existed): ps (a short ps-async job), ps-sync (its synchronous rounds), "
                        "feedback (each lossy codec of --compressions in our ring with error feedback), or a "
                        "comma list")
    p.add_argument("--ps-probe-only", action="store_true", help="the same as --probe-only ps")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> str | int:
    # Step 1: every check before any rank measures (or joins the group), so bad input costs nothing.
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world < 2:
        raise UsageError("calibration needs >= 2 ranks (world size is 1): run it under "
                         "`torchrun --nproc-per-node 2 -m pipesgd.measure calibrate ...` or inside pipesgd-cluster")
    sizes = _flag_value("--sizes", args.sizes, lambda t: parse_size_range(t, require_unit=True))
    if args.repeats < 1 or args.warmup < 0:
        raise UsageError("--repeats must be >= 1 and --warmup >= 0")
    if args.threads < 1:
        raise UsageError("--threads must be >= 1")
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    if backend == "nccl" and args.device != "cuda":
        raise UsageError("--backend nccl needs --device cuda")
    min_fit_bytes = _flag_value("--fit-min-bytes", args.fit_min_bytes, lambda t: parse_bytes(t, allow_zero=True,
                                                                                        require_unit=True))
    compressions = tuple(_flag_value("--compressions", args.compressions, parse_list))
    for name in compressions:
        if name not in CODEC_RATIOS:
            raise UsageError(f"unknown compression {name!r}; valid: {', '.join(CODEC_RATIOS)}")
    compute = _compute(args)
    existing, probes = None, _probes(args)
    if probes:
        if compute is None:
            raise UsageError("--probe-only needs --model (the probes run that model's training steps or gradient)")
        if "feedback" in probes and all(name == "none" for name in compressions):
            raise UsageError("--probe-only feedback needs --compressions with a lossy codec, e.g. q8,sign")
        if int(os.environ.get("RANK", "0") or 0) == 0:
            existing = read_calibration(args.out)  # fail before any rank starts measuring
    check_output_file(args.out, "--out")
    # Step 2: measure on every rank; rank 0 fits and writes.
    import torch
    import torch.distributed as dist

    device = args.device
    if device == "cuda":
        from pipesgd.launch import rank_gpu
        gpu = rank_gpu(int(os.environ.get("LOCAL_RANK", "0")), backend,
                       int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))))
        torch.cuda.set_device(gpu)
        device = str(gpu)
    torch.set_num_threads(args.threads)
    dist.init_process_group(backend)
    failure: Exception | None = None
    try:
        try:
            if probes:
                cal = add_probes(existing, probes, compute, compressions, device)
            else:
                cal = run_calibration(sizes, args.repeats, args.warmup, compressions, not args.no_ring, device,
                                      compute, overlap=not args.no_overlap, min_fit_bytes=min_fit_bytes)
            if cal is not None:
                write_calibration(args.out, cal)
        except (ValueError, OSError) as err:  # rank 0's fit or write failed: still meet the others below
            # Its traceback holds the measuring frames and their gloo objects: freed after the process group
            # they could abort the process at exit (SIGABRT), so they go now.
            cal, failure = None, err.with_traceback(None)
        dist.barrier()  # rank 0 fits alone; leave together so no rank tears its links down under another
    finally:
        gc.collect()  # any gloo object still in a reference cycle goes before its process group
        dist.destroy_process_group()
    if failure is not None:  # measured, then failed: a run-time failure (exit 1), not bad input
        raise RunFailure(first_line(failure)) from failure
    if cal is None:
        return 0
    return report(cal, args.out)


def _flag_value(flag: str, text: str, parse):
    """``parse(text)``, its ``ValueError`` turned into a ``UsageError`` that names the flag."""
    try:
        return parse(text)
    except ValueError as err:
        raise UsageError(f"{flag}: {err}") from None


def _compute(args: argparse.Namespace) -> dict | None:
    """The ``compute`` record of ``--model`` and its shape flags (None without ``--model``)."""
    if not args.model:
        return None
    from pipesgd.train.models import MODELS

    if args.model not in MODELS:
        raise UsageError(f"unknown model {args.model!r}; valid: {', '.join(MODELS)}")
    if args.batch_size < 1 or args.num_classes < 2 or (args.hidden is not None and args.hidden < 1):
        raise UsageError("--batch-size and --hidden must be >= 1 and --num-classes >= 2")
    shape = _flag_value("--input-shape", args.input_shape, _shape)
    return {"model": args.model, "input_shape": shape, "num_classes": args.num_classes,
            "batch_size": args.batch_size, "hidden": args.hidden}


def _shape(text: str) -> tuple[int, ...]:
    """``'3,32,32'`` -> (3, 32, 32): positive integers."""
    try:
        shape = tuple(int(x) for x in parse_list(text))
    except ValueError:
        raise ValueError(f"{text!r} is not a list of integers, e.g. 3,32,32 or 64") from None
    if any(n < 1 for n in shape):
        raise ValueError(f"{text!r}: every dimension must be >= 1")
    return shape


def _probes(args: argparse.Namespace) -> tuple[str, ...]:
    """The probes of ``--probe-only`` (and ``--ps-probe-only``), checked against ``PROBES``."""
    names = list(parse_list(args.probe_only)) if args.probe_only else []
    if args.ps_probe_only:
        names.append("ps")
    for name in names:
        if name not in PROBES:
            raise UsageError(f"unknown probe {name!r}; valid: {', '.join(PROBES)}")
    return tuple(dict.fromkeys(names))


def report(cal: Calibration, out_path: str) -> str:
    """The table of fits and the host and codec terms ``calibrate`` prints after writing ``out_path``."""
    rows = [{"collective": name, "overhead_s": f.overhead_s, "latency_s": f.latency_s,
             "bandwidth": format_bandwidth(f.bandwidth_Bps), "bandwidth_Bps": f.bandwidth_Bps,
             "median_abs_rel_err": f.median_abs_rel_err, "max_abs_rel_err": f.max_abs_rel_err,
             "samples": f.n_samples} for name, f in cal.fits.items()]
    out = tables.render(rows, "markdown", title=f"Calibration written to {out_path}")
    if cal.host:
        terms = host_terms(cal.host)
        copy = "free" if terms["copy_Bps"] == float("inf") else f"{terms['copy_Bps'] / 1e9:.2f} GB/s"
        by_codec = cal.host.get("comm_slowdown_by_codec") or {}
        per_codec = "".join(f", {name} {value:.3f}" for name, value in by_codec.items() if name != "none")
        out += (f"\nκ (compute slow-down) {terms['slowdown']:.3f}, κc (comm slow-down) {terms['comm_slowdown']:.3f}"
                f"{per_codec}, copy {copy}, hand-off {1e6 * terms['handoff_s']:.0f} µs"
                f" (load: {cal.host.get('load', 'matmul')})\n")
        losses = cal.host.get("window_loss_by_codec") or {}
        if losses:
            out += "λ (pipe: share of a compute window the ring loses) " + ", ".join(
                f"{name} {value:.3f}" for name, value in losses.items()) + "\n"
        if terms["ddp_step_s"] > 0:
            out += (f"DDP probe: {1e3 * terms['ddp_step_s']:.2f} ms per step of the model under DDP, "
                    f"{1e3 * terms['ddp_compute_s']:.2f} ms its forward + backward alone\n")
        if terms["ps_service_s"] > 0:
            out += (f"parameter server (co-located, ps-async): {1e3 * terms['ps_service_s']:.2f} ms per remote request "
                    f"while its worker trains, {1e3 * terms['ps_service_idle_s']:.2f} ms after\n")
        if terms["ps_round_s"] > 0:
            rounds = cal.host["ps_round"]
            out += (f"ps-sync probe: the round took {1e3 * terms['ps_round_s']:.2f} ms beyond the slowest compute and "
                    f"the server's update ({rounds['nodes']} ranks, {rounds['grad_bytes'] / 1e6:.2f} MB)\n")
    rings = (cal.host or {}).get("feedback_rings") or []
    if rings:
        out += "error feedback adds to the ring at the model's size: " + ", ".join(
            f"{r['compression']} {1e3 * r['feedback_s']:+.2f} ms ({1e3 * r['ring_alone_s']:.2f} ms without)"
            for r in rings) + f" at {rings[0]['n_bytes'] / 1e6:.2f} MB\n"
    for where, factors, calls in (("the ring", cal.codec_ring_factors, cal.codec_ring_call_s),
                                  ("the exchange", cal.codec_exchange_factors, cal.codec_exchange_call_s)):
        if factors:
            out += f"codec cost inside {where} / alone, + fixed per call: " + ", ".join(
                f"{name} {factor:.2f} + {1e3 * (calls.get(name) or {}).get(p, 0.0):.2f} ms at {p} ranks"
                for name, by_nodes in factors.items() for p, factor in by_nodes.items()) + "\n"
    return out
