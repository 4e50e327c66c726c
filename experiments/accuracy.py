"""Accuracy under staleness and compression (issue 12, item 3): final accuracy and loss curves of pipesgd-train
runs on 4 local gloo ranks, per pipeline width and per codec, over several seeds.
Logic in experiments/harness/accuracy.py.

    python experiments/accuracy.py --config experiments/configs/accuracy.toml            # full study, ~25 min
    python experiments/accuracy.py --config experiments/configs/accuracy.toml --resume   # skip runs already done
    python experiments/accuracy.py --tasks digits --seeds 0 --codecs q8+ef --epochs 3    # a quick look
    python experiments/accuracy.py --report                  # the committed result's table, nothing run
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.harness.accuracy import load_config, run_study, summary_markdown  # noqa: E402
from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.provenance import read_result  # noqa: E402


def _list(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list of {kind.__name__}: {text!r}") from None
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="accuracy", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="TOML file of AccuracyConfig fields (flags override it)")
    parser.add_argument("--resume", action="store_true", help="skip runs already in the result file")
    parser.add_argument("--report", action="store_true", help="print the table of the result file (--result) and stop")
    parser.add_argument("--tasks", type=_list(str), help="digits,mnist1d[,cifar10:DIR]")
    parser.add_argument("--widths", type=_list(int), help="widths without compression, e.g. 1,2,3,4")
    parser.add_argument("--stalenesses", type=_list(str), help="each width above 1 with each: none,lookahead")
    parser.add_argument("--codec-width", type=int, dest="codec_width")
    parser.add_argument("--codec-staleness", dest="codec_staleness", help="lookahead (default) or none")
    parser.add_argument("--codecs", type=_list(str), help="e.g. fp16,bf16,q8,q8+ef,q4,q4+ef,sign+ef")
    parser.add_argument("--seeds", type=_list(int))
    parser.add_argument("--ranks", type=int)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--warmup-steps", type=int, dest="warmup_steps")
    parser.add_argument("--extra-flags", dest="extra_flags", type=lambda t: t.split(),
                        help="further pipesgd-train flags for every run, quoted")
    parser.add_argument("--timeout", type=float, dest="timeout_s", help="seconds per run")
    parser.add_argument("--raw-dir", dest="raw_dir", help="per-rank metrics (default results/accuracy)")
    parser.add_argument("--result", help="committed result (default experiments/results/accuracy/accuracy.json)")
    args = vars(parser.parse_args(argv))
    path, resume, report = args.pop("config"), args.pop("resume"), args.pop("report")
    if report:
        try:
            print(summary_markdown(read_result(load_config(path, args).result)))
        except (OSError, ValueError) as exc:
            print(f"accuracy: error: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        cfg = load_config(path, args)
        result = run_study(cfg, resume=resume, log=lambda line: print(line, flush=True))
    except ValueError as exc:
        print(f"accuracy: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("accuracy: interrupted (finished runs are in the result; --resume continues)", file=sys.stderr)
        return 130
    print(summary_markdown(result))
    if result["failed"]:
        print(f"{len(result['failed'])} run(s) failed: " + "; ".join(f["key"] for f in result["failed"]))
        return 1
    print(f"result: {cfg.result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
