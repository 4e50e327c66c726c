"""The 4-node comparison grid on the emulated cluster (issue 12, items 1 and 4); ``experiments/comparison.py``
drives it.

Per cell (one workload at one bandwidth), ``run_cell``:
  Step 1: bring the cluster up (tbf at the cell's rate, or unshaped) and measure TCP throughput node0 -> node1.
  Step 2: unless ``--no-model``, ``python -m pipesgd.measure calibrate`` inside the cluster with the cell's workload
          as the interference load (``fidelity.calibrate_argv``); its time and parameters go into the cell entry.
  Step 3: one ``pipesgd-train`` run per variant; its tidy record (``comparison_record``) and, from the cell's
          calibration and the run's own compute and update medians, the model's prediction
          (``timing_model.validation``; a ddp run borrows the compute of the cell's sync run) go into runs.json,
          which is re-written after every run. A failed run is recorded as failed with its log and the grid goes on.

``rescore`` re-makes every finished run's record and prediction from its raw metrics and its cell's calibration
(after a change to how a run is read or to the timing model), running nothing; ``calibrate_cell`` calibrates a
cell whose runs were measured without a model (``--no-model``), then predicts them.
"""
from __future__ import annotations

import json
import os
import sys
import time

from experiments.harness.breakdown import breakdown_record, trace_file, traced
from experiments.harness.comparison_config import GridConfig, Workload, cell_name
from experiments.harness.comparison_record import run_record
from experiments.harness.comparison_store import ResultStore
from experiments.harness.fidelity import BREAKDOWN, calibrate_argv, calibrate_in
from experiments.harness.loopback_cluster import LOOPBACK, LoopbackCluster
from pipesgd.cluster.cluster import Cluster
from pipesgd.cluster.netns import ClusterError
from pipesgd.cluster.units import parse_link
from experiments.harness.results import load_run
from timing_model.run_metrics import metrics_files, run_name
from timing_model.calibration import read_calibration
from timing_model.validation import predict_run, read_runs, validate_runs

__all__ = ["log", "run_grid", "run_cell", "calibrate_cell", "rescore", "predict", "failure_hint", "embeddable_calibration",
           "MODEL_FREE"]

# Variants the timing model cannot predict: it has no DDP communication hooks (it would predict plain ddp).
_NO_HOOKS = "the timing model has no DDP comm hooks"
MODEL_FREE = {"ddp+fp16": _NO_HOOKS, "ddp+powersgd": _NO_HOOKS}
# config keys timing_model.validation.scenario_for reads (kept in each prediction's inputs)
SCENARIO_KEYS = ("mode", "compression", "width", "error_feedback", "bucket_mb", "overlap_fraction", "servers",
                 "ps_colocated", "warmup_steps")
# what the grid records about a run beside its figures (kept by ``rescore``)
_RUN_KEYS = ("cell", "workload", "architecture", "bandwidth", "nodes", "variant", "flags", "metrics", "log", "status",
             "run_wall_s")
MAX_EMBEDDED_CALIBRATION = 16_000  # bytes of calibration kept per cell in runs.json (so a notebook can re-predict)


def log(message: str) -> None:
    print(f"[comparison] {message}", file=sys.stderr, flush=True)


def _model_flags(cfg: GridConfig, workload: Workload) -> list[str]:
    return ["--model", workload.model, "--input-shape", "1,8,8", "--num-classes", "10",
            "--batch-size", str(cfg.batch_size), "--threads", str(cfg.threads)]


_HINTS = ("pipesgd-train: error", "error:", "terminate called", "Killed", "Timeout", "timed out")


def failure_hint(log_path: str) -> str:
    """The first line of a failed run's log that says why (a trainer error, a crash at exit), '' if none."""
    try:
        with open(log_path, errors="replace") as handle:
            for line in handle:
                if any(h in line for h in _HINTS) and "File \"" not in line:
                    return line.strip()[:300]
    except OSError:
        pass
    return ""


def embeddable_calibration(path: str) -> dict | None:
    """The calibration at ``path`` without its raw samples and residuals (the fits, codec speeds and host terms
    the predictions use: ~3 KB instead of ~30 KB), or None when even that exceeds ``MAX_EMBEDDED_CALIBRATION``."""
    with open(path) as handle:
        data = json.load(handle)
    slim = {k: v for k, v in data.items() if k not in ("samples", "residuals")}
    slim["dropped"] = {k: len(data.get(k) or []) for k in ("samples", "residuals")}
    return slim if len(json.dumps(slim)) <= MAX_EMBEDDED_CALIBRATION else None


def predict(done: dict[str, str], variant: str, calib_path: str, skip: int) -> dict:
    """The model's prediction of ``variant`` from the cell's calibration, with the cell's finished runs
    ``done`` (variant -> metrics path) as partners (a ddp run takes the sync run's compute)."""
    if variant in MODEL_FREE:
        return {"model": None, "model_note": MODEL_FREE[variant]}
    try:
        cal = read_calibration(calib_path)
        names = {v: p for v, p in done.items() if v not in MODEL_FREE}
        records = read_runs([f for p in names.values() for f in metrics_files(p)], skip)
        checks = {c.run: c for c in validate_runs(records, cal)}
        mine = next(r for r in records if r.name == run_name(done[variant]))
        check = checks[mine.name]
        override = None if check.compute_from == "own" else check.compute_s
        scenario, result = predict_run(mine, cal, compute_s=override)
    except (ValueError, KeyError, StopIteration) as error:
        return {"model": None, "model_note": f"no prediction: {error}"}
    # what the prediction used, so it can be re-made from the committed file (RunRecord of one step + calibration)
    inputs = {"mode": mine.mode, "nodes": mine.nodes, "grad_bytes": mine.grad_bytes, "compute_s": check.compute_s,
              "update_s": scenario.update_s, "buffers_s": scenario.empirical.buffers_s,
              "host_s": scenario.empirical.host_s,
              "ring_anchor_s": scenario.empirical.ring_anchor_s,
              "colocated_step_s": scenario.empirical.ps_colocated_step_s,
              "override": override is not None,
              "config": {k: mine.config[k] for k in SCENARIO_KEYS if k in mine.config}}
    return {"model": {"predicted_s": check.predicted_s, "measured_s": check.measured_s, "error": check.error,
                      "compute_from": os.path.basename(check.compute_from), "regime": result.regime,
                      "breakdown": {k: getattr(result, k) for k in BREAKDOWN}, "inputs": inputs}}


def _calibrate(cluster, cfg: GridConfig, workload: Workload, cell: str, cell_dir: str, store: ResultStore,
               resume: bool, logfile) -> str | None:
    """Step 2: the cell's calibration path (reused on --resume when present), or None when it failed."""
    path = os.path.abspath(os.path.join(cell_dir, "calib.json"))
    if resume and os.path.exists(path) and store.data["cells"].get(cell, {}).get("calibration"):
        log(f"{cell}: reusing {path}")
        return path
    repeats = workload.calib_repeats or cfg.calib_repeats
    argv = calibrate_argv(path, workload.calib_sizes, repeats, cfg.calib_warmup, cfg.calib_compressions,
                          _model_flags(cfg, workload))
    log(f"{cell}: calibrating ({workload.calib_sizes}, {repeats} repeats) -> {path}")
    t0 = time.monotonic()
    if not calibrate_in(cluster, argv, path, cfg.calib_timeout_s, logfile):
        store.put_cell(cell, {"calibration_error": f"calibration failed; see {logfile.name}"})
        return None
    seconds = time.monotonic() - t0
    embedded = embeddable_calibration(path)
    store.put_cell(cell, {"calibration_s": seconds, "calibration_argv": argv[2:], "calibration": embedded})
    log(f"{cell}: calibrated in {seconds:.0f} s")
    return path


def run_cell(cfg: GridConfig, workload: Workload, bandwidth: str, store: ResultStore, *, resume: bool,
             model: bool, progress: list[int], total: int, started: float) -> None:
    """Steps 1-3 of one cell; ``progress[0]`` counts the runs handled so far."""
    cell = cell_name(workload.name, bandwidth)
    todo = [v for v in cfg.variants if not (resume and store.done(cell, v))]
    progress[0] += len(cfg.variants) - len(todo)
    if not todo:
        log(f"{cell}: all {len(cfg.variants)} runs already in {store.path}; skipped")
        return
    cell_dir = os.path.abspath(os.path.join(cfg.out, cell))
    os.makedirs(cell_dir, exist_ok=True)
    done = {v: os.path.join(cell_dir, f"{v}.jsonl") for v in cfg.variants
            if store.done(cell, v) and metrics_files(os.path.join(cell_dir, f"{v}.jsonl"))}
    with open(os.path.join(cell_dir, "cell.log"), "a") as logfile, _cluster(cfg, bandwidth) as cluster:
        # Step 1
        tcp = cluster.measure()
        store.put_cell(cell, {"workload": workload.name, "bandwidth": bandwidth, "nodes": cfg.nodes,
                              "cores_per_node": cfg.cores_per_node, "tcp_bps": tcp.measured_bps, "tcp": tcp.summary(),
                              "burst_bytes": getattr(getattr(cluster, "state", None), "burst_bytes", None)})
        log(f"{cell}: {tcp.summary()}")
        # Step 2
        calib = _calibrate(cluster, cfg, workload, cell, cell_dir, store, resume, logfile) if model else None
        # Step 3
        for variant in todo:
            progress[0] += 1
            metrics = os.path.join(cell_dir, f"{variant}.jsonl")
            run_log = os.path.join(cell_dir, f"{variant}.log")
            for stale in metrics_files(metrics):
                os.unlink(stale)
            argv = ["pipesgd-train", *cfg.run_flags(workload, bandwidth, variant)]
            flags = argv[1:]  # as recorded: without this machine's paths
            if cfg.trace_steps and traced(argv):
                window = f"{cfg.skip}:{cfg.skip + cfg.trace_steps}"
                argv += ["--trace", trace_file(metrics), "--trace-steps", window]
                flags += ["--trace", "TRACE", "--trace-steps", window]
            argv += ["--metrics", metrics]
            base = {"cell": cell, "workload": workload.name, "architecture": workload.model, "bandwidth": bandwidth,
                    "nodes": cfg.nodes, "variant": variant, "flags": flags,
                    "metrics": os.path.relpath(metrics), "log": os.path.relpath(run_log)}
            log(f"{progress[0]}/{total} {cell} {variant} ... (elapsed {(time.monotonic() - started) / 60:.1f} min)")
            t0 = time.monotonic()
            with open(run_log, "w") as out:
                rc = cluster.run(argv, timeout_s=cfg.timeout_s, out=out, err=out)
            seconds = time.monotonic() - t0
            if rc != 0 or not metrics_files(metrics):
                reason = "timeout" if rc == 124 else f"exit code {rc}"
                if metrics_files(metrics) and load_run(metrics).summary:
                    reason += " after the run wrote its summary (it trained to the end, then a process failed)"
                hint = failure_hint(run_log)
                reason += f": {hint}" if hint else ""
                store.put_run({**base, "status": "failed", "reason": reason, "run_wall_s": seconds})
                log(f"{progress[0]}/{total} {cell} {variant}: FAILED ({reason}, {seconds:.0f} s); see {run_log}")
                continue
            try:
                record = run_record(load_run(metrics), skip=cfg.skip, **_target(cfg.target_of(workload)))
                record["breakdown"] = breakdown_record(metrics, record["world_size"] or 1)
            except (ValueError, KeyError, json.JSONDecodeError) as error:
                store.put_run({**base, "status": "failed", "reason": f"unreadable metrics: {error}",
                               "run_wall_s": seconds})
                log(f"{progress[0]}/{total} {cell} {variant}: FAILED (unreadable metrics: {error})")
                continue
            done[variant] = metrics
            prediction = predict(done, variant, calib, cfg.skip) if calib else {
                "model": None, "model_note": "not predicted (--no-model or calibration failed)"}
            store.put_run({**base, "status": "ok", "run_wall_s": seconds, **record, **prediction})
            pred = prediction["model"]
            note = f", model {1e3 * pred['predicted_s']:.1f} ms ({100 * pred['error']:+.1f} %)" if pred else ""
            tta = record["time_to_target_s"]
            log(f"{progress[0]}/{total} {cell} {variant}: {1e3 * record['t_iter_s']:.1f} ms/iter{note}, "
                f"acc {record['final_accuracy']}, to target {'-' if tta is None else f'{tta:.1f} s'} "
                f"({seconds:.0f} s)")


def _add_probes(cluster, cfg: GridConfig, workload: Workload, cell: str, cell_dir: str, probes: tuple[str, ...],
                logfile) -> bool:
    """``calibrate --probe-only PROBES`` on the cell's calibration (one made before those probes existed)."""
    path = os.path.abspath(os.path.join(cell_dir, "calib.json"))
    if not os.path.exists(path):
        log(f"{cell}: no calibration at {path} to add the {','.join(probes)} probes to")
        return False
    argv = ["python", "-m", "pipesgd.measure", "calibrate", "--probe-only", ",".join(probes),
            "--compressions", cfg.calib_compressions, *_model_flags(cfg, workload), "--out", path]
    log(f"{cell}: adding the {','.join(probes)} probes -> {path}")
    return calibrate_in(cluster, argv, path, cfg.calib_timeout_s, logfile)


def calibrate_cell(cfg: GridConfig, workload: Workload, bandwidth: str, store: ResultStore,
                   probes: tuple[str, ...] = ()) -> bool:
    """Step 1 and 2 of a cell (cluster, calibration; a calibration already there is replaced, or with ``probes``
    only those probes of ``calibrate --probe-only`` added to it), then the predictions of its finished runs
    (``rescore``). False when the calibration failed."""
    cell = cell_name(workload.name, bandwidth)
    cell_dir = os.path.abspath(os.path.join(cfg.out, cell))
    os.makedirs(cell_dir, exist_ok=True)
    with open(os.path.join(cell_dir, "cell.log"), "a") as logfile, \
            Cluster.up(cfg.nodes, parse_link(bandwidth), name=cfg.cluster_name, force=True,
                       cores_per_node=cfg.cores_per_node, burst_bytes=cfg.burst_bytes) as cluster:
        tcp = cluster.measure()
        log(f"{cell}: {tcp.summary()}")
        store.put_cell(cell, {"calibration_tcp": tcp.summary()})
        if probes:
            if not _add_probes(cluster, cfg, workload, cell, cell_dir, probes, logfile):
                return False
        elif _calibrate(cluster, cfg, workload, cell, cell_dir, store, False, logfile) is None:
            return False
    remade, kept = rescore(store, cfg.skip, cfg.target_accuracy, cells={cell}, targets=cfg.targets())
    log(f"{cell}: {remade} runs predicted" + (f"; kept as recorded: {'; '.join(kept)}" if kept else ""))
    return True


def _target(value_and_metric: tuple[float, str]) -> dict:
    """``run_record``'s target arguments from ``GridConfig.target_of``."""
    return {"target": value_and_metric[0], "metric": value_and_metric[1]}


def rescore(store: ResultStore, skip: int, target: float, cells: set[str] | None = None,
            targets: dict[str, tuple[float, str]] | None = None) -> tuple[int, list[str]]:
    """Re-make the record and prediction of every finished run in ``store`` whose raw metrics are on this machine
    (its cell's ``calib.json`` beside them), keeping what the grid recorded about the run (flags, paths, wall time);
    saved once at the end; only ``cells`` when given. Time to target is to ``target`` accuracy, or to a workload's
    own target in ``targets`` (workload -> (value, metric), ``GridConfig.targets``). Returns (runs re-made, why
    each other finished run was kept as it was)."""
    remade, kept = 0, []
    runs = [r for r in store.data["runs"] if r.get("status") == "ok" and (cells is None or r["cell"] in cells)]
    present = {(r["cell"], r["variant"]): r["metrics"] for r in runs if metrics_files(r["metrics"])}
    for old in runs:
        key = (old["cell"], old["variant"])
        if key not in present:
            kept.append(f"{old['cell']} {old['variant']}: no raw metrics at {old['metrics']}")
            continue
        done = {v: path for (cell, v), path in present.items() if cell == old["cell"]}
        calib = os.path.join(os.path.dirname(old["metrics"]), "calib.json")
        try:
            goal = (targets or {}).get(old.get("workload"), (target, "accuracy"))
            record = run_record(load_run(old["metrics"]), skip=skip, **_target(goal))
            record["breakdown"] = breakdown_record(old["metrics"], record["world_size"] or 1)
        except (ValueError, KeyError, json.JSONDecodeError) as error:
            kept.append(f"{old['cell']} {old['variant']}: unreadable metrics: {error}")
            continue
        prediction = predict(done, old["variant"], calib, skip) if os.path.exists(calib) else {
            "model": None, "model_note": "not predicted (no calibration)"}
        base = {k: old[k] for k in _RUN_KEYS if k in old}
        store.data["runs"] = [r if (r["cell"], r["variant"]) != key else {**base, **record, **prediction}
                              for r in store.data["runs"]]
        remade += 1
    for cell, folder in {cell: os.path.dirname(path) for (cell, _), path in present.items()}.items():
        calib = os.path.join(folder, "calib.json")
        if os.path.exists(calib) and store.data["cells"].get(cell, {}).get("calibration"):
            store.data["cells"][cell]["calibration"] = embeddable_calibration(calib)
    store.save()
    return remade, kept


def _cluster(cfg: GridConfig, bandwidth: str):
    """The cell's cluster: local ranks for the quick profile's ``loopback`` cells, else the emulated one (root)."""
    if bandwidth == LOOPBACK:
        return LoopbackCluster(cfg.nodes)
    return Cluster.up(cfg.nodes, parse_link(bandwidth), name=cfg.cluster_name, force=True,
                       cores_per_node=cfg.cores_per_node, burst_bytes=cfg.burst_bytes)


def run_grid(cfg: GridConfig, store: ResultStore, *, resume: bool, model: bool) -> int:
    """Every cell of ``cfg``; the number of failed runs in the store afterwards. A cell whose cluster cannot be
    built records its runs as failed and the grid goes on."""
    total = len(cfg.cells()) * len(cfg.variants)
    progress, started = [0], time.monotonic()
    log(f"{total} runs: {len(cfg.cells())} cells x {len(cfg.variants)} variants, {cfg.nodes} nodes; "
        f"raw metrics under {cfg.out}, result {store.path}")
    for workload, bandwidth in cfg.cells():
        try:
            run_cell(cfg, workload, bandwidth, store, resume=resume, model=model, progress=progress, total=total,
                     started=started)
        except ClusterError as error:
            cell = cell_name(workload.name, bandwidth)
            log(f"{cell}: cluster error: {error}")
            for variant in cfg.variants:
                if not store.done(cell, variant):
                    store.put_run({"cell": cell, "workload": workload.name, "bandwidth": bandwidth,
                                   "nodes": cfg.nodes, "variant": variant, "status": "failed",
                                   "reason": f"cluster: {error}"})
    log(f"done in {(time.monotonic() - started) / 60:.1f} min: {store.path}")
    return sum(r.get("status") != "ok" for r in store.data["runs"])
