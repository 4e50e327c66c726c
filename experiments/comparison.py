"""Issue-12 4-node comparison on the emulated cluster (root): workloads x bandwidths x variants from a TOML config,
the speedup tables and the timing model against every run.

    python experiments/comparison.py --loopback                     # quick profile: no root, lenet, 20 steps, ~3 min
    python experiments/comparison.py --resume                       # the whole grid of the config (hours; resumable)
    python experiments/comparison.py --cells lenet-1gbit --variants sync,pipe --resume
    python experiments/comparison.py --report                       # tables from the committed runs.json, no runs
    python experiments/comparison.py --estimate                     # the grid's wall time from the runs.json
    python experiments/comparison.py --rescore                      # re-make records + predictions from raw metrics
    python experiments/comparison.py --calibrate --cells alexnet-1gbit   # calibrate a cell run with --no-model
    python experiments/comparison.py --calibrate --probe ps,feedback      # add newer probes to their calibrations

Per cell: cluster up and TCP throughput, one calibration (``--no-model`` skips it), one ``pipesgd-train`` run per
variant; runs.json (committed, ``experiments/results/comparison/``) is re-written after every run, raw metrics and
logs go under ``results/comparison/<cell>/``. See ``experiments/harness/comparison.py`` for the steps.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.comparison import calibrate_cell, rescore, run_grid
from experiments.harness.comparison_config import load_config, select
from experiments.harness.comparison_report import estimate_table, report
from experiments.harness.comparison_store import ResultStore, estimate_wall
from experiments.harness.loopback_cluster import LOOPBACK
from pipesgd.cluster.netns import ClusterError
from pipesgd.measure.calibrate_command import PROBES
from experiments.harness.provenance import read_result

QUICK_STEPS = 20
QUICK_OUT = os.path.join("results", "comparison-quick")
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "comparison.toml")


class _Terminated(BaseException):
    """SIGTERM as an exception, so the cluster's context manager tears the namespaces down."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _names(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def main() -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="grid TOML (default experiments/configs/comparison.toml)")
    parser.add_argument("--cells", help="comma list of WORKLOAD-BANDWIDTH cells, e.g. lenet-1gbit")
    parser.add_argument("--workloads", help="comma list of the config's workloads")
    parser.add_argument("--bandwidths", help="comma list of the config's bandwidths")
    parser.add_argument("--variants", help="comma list of the config's variants")
    parser.add_argument("--nodes", type=int, help="override the config's node count")
    parser.add_argument("--cores-per-node", type=int, default=0,
                        help="pin each emulated node to this many cores of its own (default 0: nodes share the cores)")
    parser.add_argument("--steps", type=int, help="override every run's length with this step budget (smoke runs)")
    parser.add_argument("--seed", type=int, help="override the config's seed (model init and data order: "
                        "another trajectory)")
    parser.add_argument("--target-loss", type=float,
                        help="time to this validation loss for every workload (default: each workload's target_loss, "
                             "else the config's target accuracy)")
    parser.add_argument("--result", help="runs.json to write (default: the config's result)")
    parser.add_argument("--out", help="raw metrics folder (default: the config's out)")
    parser.add_argument("--resume", action="store_true", help="skip runs already recorded as ok in the result")
    parser.add_argument("--fresh", action="store_true", help="start the result empty (default: merge into it)")
    parser.add_argument("--no-model", action="store_true", help="no calibration, no predictions")
    parser.add_argument("--loopback", action="store_true",
                        help="quick profile, no root: local ranks over loopback (no shaping, no model), --steps "
                             f"{QUICK_STEPS} and --workloads lenet unless given; result and raw metrics under "
                             f"{QUICK_OUT}")
    parser.add_argument("--report", action="store_true", help="print the tables of the result; run nothing")
    parser.add_argument("--estimate", action="store_true", help="print the config grid's wall time from the result")
    parser.add_argument("--rescore", action="store_true",
                        help="re-make every finished run's record and prediction from its raw metrics under --out "
                             "and its cell's calibration (after a model change); run nothing")
    parser.add_argument("--calibrate", action="store_true",
                        help="(root) calibrate the selected cells (replacing a calibration) and predict their finished "
                             "runs; no training run")
    parser.add_argument("--probe", metavar="NAMES",
                        help="with --calibrate: only add these probes of `calibrate --probe-only` (ps, ps-sync, "
                             "feedback) to each cell's existing calibration (made before they existed), then predict "
                             "the cell's runs again")
    parser.add_argument("--ps-probe", action="store_true", help="the same as --probe ps")
    parser.add_argument("--estimate-from", help="comma list of runs.json files to estimate from (default: the result)")
    args = parser.parse_args()
    try:
        cfg = select(load_config(args.config), workloads=_names(args.workloads), bandwidths=_names(args.bandwidths),
                     variants=_names(args.variants), cells=_names(args.cells), nodes=args.nodes)
        if args.loopback:
            if args.cells or args.bandwidths or args.calibrate:
                raise ValueError("--loopback runs its own loopback cells: drop --cells, --bandwidths and --calibrate")
            cfg = replace(select(cfg, workloads=_names(args.workloads) or ["lenet"]), bandwidths=(LOOPBACK,),
                          result=os.path.join(QUICK_OUT, "runs.json"), out=QUICK_OUT)
            args.steps = QUICK_STEPS if args.steps is None else args.steps
            args.no_model = True
        if args.cores_per_node:
            if args.loopback:
                raise ValueError("--cores-per-node pins emulated nodes; it does not apply to --loopback")
            cfg = replace(cfg, cores_per_node=args.cores_per_node)
        if args.steps is not None:
            if args.steps <= cfg.skip:
                raise ValueError(f"--steps ({args.steps}) must exceed the skipped steps ({cfg.skip})")
            cfg = replace(cfg, workloads=tuple(replace(w, steps={b: args.steps for b in cfg.bandwidths})
                                               for w in cfg.workloads))
        if args.seed is not None:
            cfg = replace(cfg, seed=args.seed)
        if args.target_loss is not None:
            if not args.target_loss > 0:
                raise ValueError(f"--target-loss must be > 0, got {args.target_loss}")
            cfg = replace(cfg, workloads=tuple(replace(w, target_loss=args.target_loss) for w in cfg.workloads))
        cfg = replace(cfg, result=args.result or cfg.result, out=args.out or cfg.out)
        probes = tuple(dict.fromkeys([*(_names(args.probe) or []), *(["ps"] if args.ps_probe else [])]))
        if probes and not args.calibrate:
            raise ValueError("--probe goes with --calibrate")
        unknown = [name for name in probes if name not in PROBES]
        if unknown:
            raise ValueError(f"unknown probe {unknown[0]!r}; valid: {', '.join(PROBES)}")
    except ValueError as error:
        parser.error(str(error))
    if args.report or args.estimate:
        sources = _names(args.estimate_from) or [cfg.result]
        try:
            loaded = [read_result(path) for path in sources]
        except (OSError, ValueError) as error:
            print(f"comparison: {error}", file=sys.stderr)
            return 1
        if args.report:
            print(report(loaded[0]))
        if args.estimate:
            runs = [r for d in loaded for r in d["runs"]]
            cells = {k: v for d in loaded for k, v in d["cells"].items()}
            print(estimate_table(*estimate_wall(cfg, runs, cells)))
        return 0
    if args.rescore:
        try:
            store = ResultStore(cfg.result, cfg)
            remade, kept = rescore(store, cfg.skip, cfg.target_accuracy, targets=cfg.targets())
        except (OSError, ValueError) as error:
            print(f"comparison: {error}", file=sys.stderr)
            return 1
        for why in kept:
            print(f"comparison: kept as recorded: {why}", file=sys.stderr)
        print(f"comparison: re-made {remade} runs in {cfg.result}; {len(kept)} kept as recorded", file=sys.stderr)
        print(report(store.data | {"provenance": store.origin}))
        return 0
    if os.geteuid() != 0 and not args.loopback:
        print("comparison: the emulated cluster needs root (ip netns, tc); --report and --estimate do not",
              file=sys.stderr)
        return 1
    try:
        store = ResultStore(cfg.result, cfg, fresh=args.fresh)
    except (OSError, ValueError) as error:
        print(f"comparison: {error}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _on_sigterm)
    if args.calibrate:
        try:
            failed = [f"{w.name}-{b}" for w, b in cfg.cells() if not calibrate_cell(cfg, w, b, store, probes)]
        except (KeyboardInterrupt, _Terminated):
            print("comparison: stopped; the calibrations finished so far are kept", file=sys.stderr)
            return 130
        except ClusterError as error:
            print(f"comparison: cluster error: {error}", file=sys.stderr)
            return 1
        if failed:
            print(f"comparison: calibration failed for {', '.join(failed)}", file=sys.stderr)
        print(report(store.data | {"provenance": store.origin}))
        return 1 if failed else 0
    try:
        failed = run_grid(cfg, store, resume=args.resume, model=not args.no_model)
    except (KeyboardInterrupt, _Terminated):
        print(f"comparison: stopped; {len(store.data['runs'])} runs kept in {cfg.result} (continue with --resume)",
              file=sys.stderr)
        return 130
    print(report(store.data | {"provenance": store.origin}))
    print(estimate_table(*estimate_wall(load_config(args.config), store.data["runs"], store.data["cells"])))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
