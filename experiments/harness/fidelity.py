"""Issue-5 fidelity run: per (bandwidth, nodes) cell of the emulated cluster, calibrate, train every variant,
and compare the timing model's prediction with each run. ``experiments/fidelity.py`` drives it.

Per cell (``run_cell``):
  Step 1: bring the cluster up (tc tbf shaping) and measure TCP throughput node0 -> node1 (for the record).
  Step 2: ``python -m pipesgd.measure calibrate`` inside the cluster (``calibrate``); the fit never sees the runs.
  Step 3: one ``pipesgd-train`` run per variant (own timeout; a failed run is reported and skipped).
  Step 4: ``timing_model.validation.validate_runs`` predicts each run from the cell's calibration and the run's own
          median compute and update time; ``point`` records predicted vs measured with both breakdowns.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

from timing_model.atomic import write_text_atomic
from timing_model.bandwidth import parse_bandwidth_bps
from experiments.harness.variants import trainer_flags
from pipesgd.cluster.cluster import Cluster
from experiments.harness.results import load_run
from timing_model.run_metrics import metrics_files
from timing_model.calibration import read_calibration
from timing_model.empirical.host_terms import host_terms
from timing_model.errors import error_summary
from timing_model.validation import predict_run, read_runs, validate_runs

__all__ = ["FidelitySettings", "BREAKDOWN", "log", "write_json_atomic", "calibrate_argv", "calibrate_in", "calibrate",
           "point", "check_skip",
           "run_cell", "summary"]

BREAKDOWN = ("compute_s", "straggler_s", "interference_s", "update_s", "handoff_s", "buffers_s", "host_s", "lockstep_s",
             "server_s", "exposed_comm_s", "codec_s", "comm_total_s", "anchor_s")


@dataclass(frozen=True, slots=True)
class FidelitySettings:
    """How each cell is calibrated and run (the script's flags)."""

    out: str  # output folder: calib-<cell>.json, <cell>/<variant>.rankN.jsonl
    name: str  # cluster name
    skip: int  # steps dropped per run before the median
    timeout_s: float  # per trainer run
    calib_sizes: str  # calibrate --sizes
    calib_repeats: int  # calibrate --repeats
    calib_warmup: int  # calibrate --warmup
    calib_timeout_s: float  # the whole calibration of one cell
    reuse_calibration: bool  # keep an existing calib-<cell>.json
    hidden: int  # the runs' MLP width (also the interference probe's model)
    features: int  # the runs' MLP input features
    batch_size: int  # per worker

    def __post_init__(self) -> None:
        if self.skip < 0 or self.calib_repeats < 1 or self.calib_warmup < 0:
            raise ValueError("skip and calibration warm-up must be >= 0 and calibration repeats >= 1")
        if self.timeout_s <= 0 or self.calib_timeout_s <= 0:
            raise ValueError("timeouts must be > 0 seconds")


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"[fidelity] {message}", file=sys.stderr, flush=True)


def write_json_atomic(path: str, data) -> None:
    """JSON (NaN refused, non-serialisable values as null) written atomically."""
    write_text_atomic(path, json.dumps(data, indent=2, allow_nan=False, default=lambda v: None) + "\n")


def calibrate_argv(path: str, sizes: str, repeats: int, warmup: int, compressions: str,
                   model_flags: list[str]) -> list[str]:
    """``python -m pipesgd.measure calibrate`` writing ``path``; ``model_flags`` (``--model ... --batch-size ...``)
    name the model whose forward+backward loads the cores in the interference probe (not the runs' metrics)."""
    return ["python", "-m", "pipesgd.measure", "calibrate", "--sizes", sizes, "--repeats", str(repeats),
            "--warmup", str(warmup), "--compressions", compressions, *model_flags, "--out", path]


def calibrate_in(cluster: Cluster, argv: list[str], path: str, timeout_s: float, logfile) -> bool:
    """Run a ``calibrate_argv`` command inside ``cluster``; False (and a log line) when it fails."""
    rc = cluster.run(argv, timeout_s=timeout_s, out=logfile, err=logfile)
    if rc != 0 or not os.path.exists(path):
        log(f"calibration failed (exit {rc}); see {logfile.name}")
        return False
    return True


def calibrate(cluster: Cluster, path: str, settings: FidelitySettings, logfile) -> bool:
    """The fidelity cell's calibration: the runs' MLP as the interference load."""
    model = ["--model", "mlp", "--hidden", str(settings.hidden), "--input-shape", str(settings.features),
             "--num-classes", "10", "--batch-size", str(settings.batch_size)]
    argv = calibrate_argv(path, settings.calib_sizes, settings.calib_repeats, settings.calib_warmup, "none,bf16,q8",
                          model)
    return calibrate_in(cluster, argv, path, settings.calib_timeout_s, logfile)


def point(run, check, cal, cell: dict, variant: str, metrics: str) -> dict:
    """One fidelity point: predicted vs measured, the model's breakdown and the measured one."""
    override = None if check.compute_from == "own" else check.compute_s
    _, result = predict_run(run, cal, compute_s=override)
    med = statistics.median
    measured_exposed = med([i - c - u for i, c, u in zip(run.t_iter, run.t_compute, run.t_update)])
    raw = load_run(metrics)  # diagnostics only (not used by the prediction): in-run comm time and waits
    extra = {}
    for key in ("t_comm_busy", "t_wait"):
        try:
            extra[f"{key[2:]}_s"] = raw.median(key, check_skip(run, raw))
        except ValueError:
            extra[f"{key[2:]}_s"] = None
    out = {**cell, "variant": variant, "mode": run.mode, "compression": check.compression, "metrics": metrics,
           "steps_kept": check.steps, "grad_bytes": run.grad_bytes,
           "measured_s": check.measured_s, "predicted_s": check.predicted_s, "error": check.error,
           "predicted": {k: getattr(result, k) for k in BREAKDOWN} | {"regime": result.regime},
           "measured": {"compute_s": med(run.t_compute), "update_s": med(run.t_update),
                        "exposed_s": measured_exposed, "iter_min_s": min(run.t_iter), "iter_max_s": max(run.t_iter),
                        **extra}}
    if override is not None:  # also the plain validation (DDP's own t_compute, which contains its allreduce)
        out["compute_from"] = check.compute_from
        out["predicted_own_compute_s"] = predict_run(run, cal)[1].iteration_s
    return out


def check_skip(run, raw) -> int:
    """The first step ``read_runs`` kept (its step numbers are not in the RunRecord)."""
    steps = sorted({r["step"] for r in raw.steps})
    return steps[len(steps) - len(run.t_iter)] if len(run.t_iter) <= len(steps) else 0


def run_cell(bandwidth: str, nodes: int, variants: list[str], settings: FidelitySettings, train_flags: list[str],
             counter: list[int], total: int, logfile) -> tuple[list[dict], list[dict], dict]:
    """One (bandwidth, nodes) cell, Steps 1-4: (points, failures, cell info). ``counter[0]`` counts runs done."""
    cell_name = f"{bandwidth}-{nodes}n"
    cell = {"bandwidth": bandwidth, "nodes": nodes}
    cell_dir = os.path.join(settings.out, cell_name)
    os.makedirs(cell_dir, exist_ok=True)
    calib_path = os.path.abspath(os.path.join(settings.out, f"calib-{cell_name}.json"))
    points, failures, info = [], [], dict(cell)
    done: list[tuple[str, str, object]] = []  # (variant, metrics, RunRecord) of the runs that finished
    with Cluster.up(nodes, parse_bandwidth_bps(bandwidth), name=settings.name, force=True) as cluster:
        info["tcp"] = cluster.measure().summary()
        log(f"{cell_name}: {info['tcp']}")
        t0 = time.monotonic()
        log(f"{cell_name}: calibrating ({settings.calib_sizes}, {settings.calib_repeats} repeats) -> {calib_path}")
        reuse = settings.reuse_calibration and os.path.exists(calib_path)
        if not reuse and not calibrate(cluster, calib_path, settings, logfile):
            failures += [{**cell, "variant": v, "reason": "calibration failed"} for v in variants]
            counter[0] += len(variants)
            return points, failures, info
        info["calibration_s"] = time.monotonic() - t0
        cal = read_calibration(calib_path)
        info["calibration"] = calib_path
        info["fits"] = {name: fit.as_json() for name, fit in cal.fits.items()}
        info["host"] = host_terms(cal.host)
        log(f"{cell_name}: host terms {info['host']}")
        for variant in variants:
            counter[0] += 1
            metrics = os.path.abspath(os.path.join(cell_dir, f"{variant}.jsonl"))
            for stale in metrics_files(metrics):
                os.unlink(stale)
            log(f"{counter[0]}/{total} {variant} {nodes} nodes {bandwidth} ...")
            t0 = time.monotonic()
            rc = cluster.run(["pipesgd-train", *trainer_flags(variant), *train_flags, "--metrics", metrics],
                             timeout_s=settings.timeout_s, out=logfile, err=logfile)
            seconds = time.monotonic() - t0
            files = metrics_files(metrics)
            if rc != 0 or not files:
                reason = "timeout" if rc == 124 else f"exit code {rc}"
                log(f"{counter[0]}/{total} {variant} {nodes} nodes {bandwidth}: FAILED ({reason}, {seconds:.0f} s); "
                    f"see {logfile.name}")
                failures.append({**cell, "variant": variant, "reason": reason})
                continue
            try:
                (run,) = read_runs(files, settings.skip)
            except ValueError as error:
                log(f"{counter[0]}/{total} {variant}: cannot read: {error}")
                failures.append({**cell, "variant": variant, "reason": str(error)})
                continue
            done.append((variant, metrics, run))
            log(f"{counter[0]}/{total} {variant} {nodes} nodes {bandwidth}: measured "
                f"{1e3 * statistics.median(run.t_iter):.1f} ms ({seconds:.0f} s)")
    # Step 4, once the cell's runs are in: the library pairs each ddp run with the cell's sync run.
    try:
        checks = validate_runs([run for _, _, run in done], cal)
    except ValueError as error:
        log(f"{cell_name}: cannot validate: {error}")
        failures += [{**cell, "variant": variant, "reason": str(error)} for variant, _, _ in done]
        return points, failures, info
    for (variant, metrics, run), check in zip(done, checks):
        points.append(point(run, check, cal, cell, variant, metrics))
        source = "" if check.compute_from == "own" else f" (compute of {os.path.basename(check.compute_from)})"
        log(f"{variant} {nodes} nodes {bandwidth}: measured {1e3 * check.measured_s:.1f} ms, "
            f"predicted {1e3 * check.predicted_s:.1f} ms, error {100 * check.error:+.1f} %{source}")
    return points, failures, info


def summary(points: list[dict], flag: float) -> dict:
    """``timing_model.errors.error_summary`` of the points, with how many lie over ``flag``."""
    return error_summary([p["error"] for p in points], flag)
