"""Issue-5 fidelity benchmark: the timing model's predicted iteration time against end-to-end runs on the
emulated cluster (root; `ip` and `tc`).

    python experiments/fidelity.py                       # 2 bandwidths × 2 node counts × 6 variants = 24 runs
    python experiments/fidelity.py --nodes 2 --bandwidths 1gbit --variants sync,pipe --steps 8 --warmup-steps 2

Per (bandwidth, nodes) cell:
  Step 1: bring the cluster up (tc tbf shaping) and measure TCP throughput node0 -> node1 (for the record).
  Step 2: `python -m timing_model calibrate` inside the cluster: micro-benchmarks of our ring and the
          backend all_reduce, the local reduction and the codecs, and the interference of each allreduce
          with the runs' model (its forward+backward on random data beside its gradient-sized allreduce);
          the fit is written to calib-<cell>.json. The fit never sees the end-to-end runs below.
  Step 3: one `pipesgd-train` run per variant (own timeout; a failed run is reported and skipped).
  Step 4: `timing_model.validation.validate_runs` predicts each run from the cell's calibration (network
          fit, codec speeds, host terms κ, κc, copy rate, hand-off) and the run's own median compute and
          update time, and compares with its median iteration time (slowest rank). A ddp run is predicted
          from the compute of the cell's sync run (the library's `compute_overrides`: DDP's t_compute
          holds its in-backward allreduce).
Then: per-run table, median and max |error|, the breakdown of every point over --flag (10 %), and
fidelity.json (atomic), fidelity.md and, if matplotlib imports, fidelity.png under --out.
Targets (issue 5, REFERENCES §3.9): median |error| <= 5 %, max <= 15 %, every point > 10 % explained.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pipesgd.cluster.cluster import Cluster
from pipesgd.cluster.netns import ClusterError
from pipesgd.cluster.units import parse_bandwidth
from pipesgd.results import load_run, rank_files
from timing_model.calibration import read_calibration
from timing_model.calibration import host_terms
from timing_model.validation import predict_run, read_runs, validate_runs
from pipesgd.atomic import write_text_atomic

VARIANTS = {  # name: trainer flags
    "sync": ["--mode", "sync"],
    "pipe": ["--mode", "pipe", "--width", "2"],
    "pipe+bf16": ["--mode", "pipe", "--width", "2", "--compression", "bf16"],
    "pipe+q8": ["--mode", "pipe", "--width", "2", "--compression", "q8", "--error-feedback"],
    "sync+bf16": ["--mode", "sync", "--compression", "bf16"],
    "sync+q8": ["--mode", "sync", "--compression", "q8", "--error-feedback"],
    "ddp": ["--mode", "ddp"],
    "ps-sync": ["--mode", "ps-sync"],
    "ps-async": ["--mode", "ps-async"],
}
DEFAULT_VARIANTS = "sync,pipe,pipe+bf16,pipe+q8,ddp,ps-sync"
BREAKDOWN = ("compute_s", "straggler_s", "interference_s", "update_s", "handoff_s", "exposed_comm_s", "codec_s",
             "comm_total_s")


def log(message: str) -> None:
    print(f"[fidelity] {message}", file=sys.stderr, flush=True)


def write_json_atomic(path: str, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, allow_nan=False, default=lambda v: None) + "\n")


def calibrate(cluster: Cluster, path: str, args, logfile) -> bool:
    argv = ["python", "-m", "timing_model", "calibrate", "--sizes", args.calib_sizes, "--repeats",
            str(args.calib_repeats), "--warmup", str(args.calib_warmup), "--compressions", "none,bf16,q8",
            # the interference probe loads the cores with this model's forward+backward (not the runs' metrics)
            "--model", "mlp", "--hidden", str(args.hidden), "--input-shape", str(args.features),
            "--num-classes", "10", "--batch-size", str(args.batch_size), "--out", path]
    rc = cluster.run(argv, timeout_s=args.calib_timeout, out=logfile, err=logfile)
    if rc != 0 or not os.path.exists(path):
        log(f"calibration failed (exit {rc}); see {logfile.name}")
        return False
    return True


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


def run_cell(bandwidth: str, nodes: int, variants: list[str], args, train_flags: list[str], counter: list[int],
             total: int, logfile) -> tuple[list[dict], list[dict], dict]:
    cell_name = f"{bandwidth}-{nodes}n"
    cell = {"bandwidth": bandwidth, "nodes": nodes}
    cell_dir = os.path.join(args.out, cell_name)
    os.makedirs(cell_dir, exist_ok=True)
    calib_path = os.path.abspath(os.path.join(args.out, f"calib-{cell_name}.json"))
    points, failures, info = [], [], dict(cell)
    done: list[tuple[str, str, object]] = []  # (variant, metrics, RunRecord) of the runs that finished
    with Cluster.up(nodes, parse_bandwidth(bandwidth), name=args.name, force=True) as cluster:
        info["tcp"] = cluster.measure().summary()
        log(f"{cell_name}: {info['tcp']}")
        t0 = time.monotonic()
        log(f"{cell_name}: calibrating ({args.calib_sizes}, {args.calib_repeats} repeats) -> {calib_path}")
        if not (args.reuse_calibration and os.path.exists(calib_path)) and not calibrate(cluster, calib_path, args,
                                                                                        logfile):
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
            for stale in rank_files(metrics):
                os.unlink(stale)
            log(f"{counter[0]}/{total} {variant} {nodes} nodes {bandwidth} ...")
            t0 = time.monotonic()
            rc = cluster.run(["pipesgd-train", *VARIANTS[variant], *train_flags, "--metrics", metrics],
                             timeout_s=args.timeout, out=logfile, err=logfile)
            seconds = time.monotonic() - t0
            files = rank_files(metrics)
            if rc != 0 or not files:
                reason = "timeout" if rc == 124 else f"exit code {rc}"
                log(f"{counter[0]}/{total} {variant} {nodes} nodes {bandwidth}: FAILED ({reason}, {seconds:.0f} s); "
                    f"see {logfile.name}")
                failures.append({**cell, "variant": variant, "reason": reason})
                continue
            try:
                (run,) = read_runs(files, args.skip)
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
    errors = [abs(p["error"]) for p in points]
    return {"runs": len(points), "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "over_flag": sum(e > flag for e in errors), "flag": flag}


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}"


def opt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else ms(seconds)


def markdown(points: list[dict], failures: list[dict], stats: dict, header: str) -> str:
    lines = [header, "", "| bandwidth | nodes | variant | measured ms | predicted ms | error | regime |",
             "|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['bandwidth']} | {p['nodes']} | {p['variant']} | {ms(p['measured_s'])} | "
                     f"{ms(p['predicted_s'])} | {100 * p['error']:+.1f} % | {p['predicted']['regime']} |")
    if stats["runs"]:
        lines += ["", f"runs: {stats['runs']}, median |error| {100 * stats['median_abs_error']:.1f} %, "
                      f"max |error| {100 * stats['max_abs_error']:.1f} % (targets: 5 % / 15 %)"]
    flagged = [p for p in points if abs(p["error"]) > stats["flag"]]
    if flagged:
        lines += ["", f"## Points over {100 * stats['flag']:.0f} %: model breakdown vs measured (ms)", "",
                  "| bandwidth | nodes | variant | error | pred compute | pred update | pred hand-off | pred exposed comm | "
                  "pred codec | pred comm total | meas compute | meas update | meas exposed (iter-compute-update) | "
                  "meas comm busy | meas wait |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in flagged:
            pr, me = p["predicted"], p["measured"]
            lines.append(f"| {p['bandwidth']} | {p['nodes']} | {p['variant']} | {100 * p['error']:+.1f} % | "
                         f"{ms(pr['compute_s'])} | {ms(pr['update_s'])} | {ms(pr['handoff_s'])} | "
                         f"{ms(pr['exposed_comm_s'])} | "
                         f"{ms(pr['codec_s'])} | {ms(pr['comm_total_s'])} | {ms(me['compute_s'])} | "
                         f"{ms(me['update_s'])} | {ms(me['exposed_s'])} | {opt_ms(me.get('comm_busy_s'))} | "
                         f"{opt_ms(me.get('wait_s'))} |")
    if failures:
        lines += ["", "## Failed runs (skipped)", ""] + [
            f"- {f['bandwidth']} {f['nodes']} nodes {f['variant']}: {f['reason']}" for f in failures]
    return "\n".join(lines) + "\n"


def scatter(points: list[dict], path: str, flag: float) -> str | None:
    """predicted vs measured, y = x and the ±flag band; None (and a reason) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no scatter plot (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(6, 6))
    measured = [1e3 * p["measured_s"] for p in points]
    predicted = [1e3 * p["predicted_s"] for p in points]
    lo, hi = 0.8 * min(measured + predicted), 1.25 * max(measured + predicted)
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="y = x")
    ax.fill_between([lo, hi], [lo * (1 - flag), hi * (1 - flag)], [lo * (1 + flag), hi * (1 + flag)],
                    color="0.85", label=f"±{100 * flag:.0f} %")
    markers = {2: "o", 4: "s", 8: "^"}
    for variant in dict.fromkeys(p["variant"] for p in points):
        for nodes in sorted({p["nodes"] for p in points if p["variant"] == variant}):
            sel = [p for p in points if p["variant"] == variant and p["nodes"] == nodes]
            ax.scatter([1e3 * p["measured_s"] for p in sel], [1e3 * p["predicted_s"] for p in sel],
                       marker=markers.get(nodes, "D"), label=f"{variant}, {nodes} nodes", zorder=3)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms / iteration",
           ylabel="predicted ms / iteration", title="Timing model fidelity (emulated cluster)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bandwidths", default="1gbit,200mbit", help="comma list of link rates")
    parser.add_argument("--nodes", default="2,4", help="comma list of node counts")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=5, help="pipe warm-up (all modes run it as --warmup-steps)")
    parser.add_argument("--skip", type=int, help="steps dropped per run (default warmup-steps + 2)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--features", type=int, default=256, help="MLP input features (1024x1024 hidden: ~1.3 M params)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per trainer run")
    parser.add_argument("--calib-sizes", default="1MB:16MB",
                        help="calibration message sizes; below ~1 MB the tbf burst (500 KB at 1gbit) lets messages "
                             "leave at veth speed, a regime the runs never use, which biases the fit")
    parser.add_argument("--calib-repeats", type=int, default=10)
    parser.add_argument("--calib-warmup", type=int, default=2)
    parser.add_argument("--calib-timeout", type=float, default=900.0)
    parser.add_argument("--reuse-calibration", action="store_true", help="keep an existing calib-<cell>.json")
    parser.add_argument("--flag", type=float, default=0.10, help="|error| above which a point is broken down")
    parser.add_argument("--name", default="psgd-fid", help="cluster name")
    parser.add_argument("--out", default="results/fidelity")
    args = parser.parse_args()
    try:
        bandwidths = [b.strip() for b in args.bandwidths.split(",") if b.strip()]
        for b in bandwidths:
            parse_bandwidth(b)
        node_counts = [int(n) for n in args.nodes.split(",") if n.strip()]
    except ValueError as error:
        parser.error(str(error))
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; valid: {', '.join(VARIANTS)}")
    if args.skip is None:
        args.skip = args.warmup_steps + 2
    if args.steps <= args.skip:
        parser.error(f"--steps ({args.steps}) must exceed the skipped steps ({args.skip})")
    os.makedirs(args.out, exist_ok=True)
    train_flags = ["--model", "mlp", "--hidden", str(args.hidden), "--dataset", "synthetic",
                   "--synthetic-features", str(args.features),
                   "--synthetic-samples", str(args.batch_size * max(node_counts) * (args.steps + 2) * 2),
                   "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--threads", "1",
                   "--warmup-steps", str(args.warmup_steps), "--eval-every", "0", "--lr", "0.01",
                   "--timeout", "120"]
    total = len(bandwidths) * len(node_counts) * len(variants)
    counter, points, failures, cells = [0], [], [], []
    started = time.monotonic()
    log(f"{total} runs: {', '.join(variants)} x nodes {node_counts} x {bandwidths}; out {args.out}")
    with open(os.path.join(args.out, "fidelity.log"), "w") as logfile:
        for bandwidth in bandwidths:
            for nodes in node_counts:
                try:
                    p, f, info = run_cell(bandwidth, nodes, variants, args, train_flags, counter, total, logfile)
                except ClusterError as error:
                    log(f"{bandwidth} {nodes} nodes: cluster error: {error}")
                    p, f, info = [], [{"bandwidth": bandwidth, "nodes": nodes, "variant": v,
                                       "reason": f"cluster: {error}"} for v in variants], {}
                points += p
                failures += f
                cells.append(info)
    stats = summary(points, args.flag)
    header = (f"# Timing-model fidelity: {len(points)} of {total} runs; MLP {args.features}-{args.hidden}-"
              f"{args.hidden}-10, batch {args.batch_size}/worker, {args.steps} steps, median after step {args.skip}")
    text = markdown(points, failures, stats, header)
    png_note = scatter(points, os.path.join(args.out, "fidelity.png"), args.flag) if points else "no points"
    if png_note:
        text += f"\n{png_note}\n"
        log(png_note)
    print(text)
    with open(os.path.join(args.out, "fidelity.md"), "w") as handle:
        handle.write(text)
    write_json_atomic(os.path.join(args.out, "fidelity.json"), {
        "schema": "pipesgd/fidelity/1",
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:], "train_flags": train_flags, "skip": args.skip, "wall_s": time.monotonic() - started,
        "summary": stats, "cells": cells, "points": points, "failures": failures})
    log(f"done in {time.monotonic() - started:.0f} s: {args.out}/fidelity.json, fidelity.md"
        + ("" if png_note else ", fidelity.png"))
    return 0 if points else 1


if __name__ == "__main__":
    sys.exit(main())
