"""``pipesgd-timing recommend``: the width and codec to run on a cluster, and why (``timing_model.recommend``); where
no per-step all-reduce hides, periodic averaging beside it and its crossover (``timing_model.periodic``)."""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict

from timing_model.cli_conventions import UsageError
from timing_model.trainer_defaults import ADAM_FAMILY, SYNC_EVERY, auto_codec_limits, is_adam_family

from ..predict import Scenario
from ..periodic import Periodic
from ..recommend import HIDDEN_SHARE, NEAR_FASTEST, WIDER_GAIN, reason_time, recommend
from ..units import format_bandwidth, format_time
from .flags import add_scenario_flags, help_formatter, load_calibration, parse_flag, predict_modes, scenario_fields

__all__ = ["USAGE", "DESCRIPTION", "add_parser", "run", "why_points"]

USAGE = ("%(prog)s --nodes N --bandwidth RATE --params COUNT --compute TIME [...]\n"
         "       %(prog)s --calibration FILE --params COUNT [--compute TIME] [...]")
DESCRIPTION = ("Which Pipe-SGD width and gradient codec to run: the first, in an order of preference (width 1, "
               "then 2, uncompressed; then bf16, q8 + error feedback, q4 + error feedback at width 1, then at width "
               "2; then width 3 with each; without error feedback and nothing below q8 under --optimizer adam or "
               "adamw), "
               f"whose all-reduce the model predicts hides behind the step (at most {HIDDEN_SHARE:.0%} of the "
               f"iteration left exposed), or a narrower one predicted within {WIDER_GAIN:g}x of its iteration (a "
               f"stale gradient costs steps; of several, the first within {NEAR_FASTEST - 1:.0%} of the fastest of "
               f"them); else the first within {NEAR_FASTEST - 1:.0%} of the fastest, or again a narrower one "
               f"within {WIDER_GAIN:g}x of it. --width and --compression, "
               "when given, are kept. With --calibration FILE (from `pipesgd-timing calibrate`) the cluster comes "
               "from it: --nodes from its world size, the link from its fit, and --compute from the model it timed if "
               "any. Where nothing hides, periodic averaging (pipesgd-train --mode localsgd or diloco at "
               f"--sync-every) is predicted too and named when {WIDER_GAIN:g}x faster per iteration than the "
               "fastest per-step candidate, with the link rate (with --calibration: the compute time) below which "
               "it is; it changes the algorithm, so the loss per step differs.")


# The optimizers whose one-step-stale update cost validation loss on the character GPT (Adam's family; Muon at its
# own rate: experiments/results/accuracy/report.md), so a width above 1 comes with width 1's figure to compare
STALE_COSTLY = (*ADAM_FAMILY, "muon")


def add_parser(sub) -> None:
    p = sub.add_parser("recommend", help="the width and codec to run, and why", formatter_class=help_formatter,
                       usage=USAGE, description=DESCRIPTION)
    add_scenario_flags(p, sweep=False)
    p.set_defaults(width="auto", compression="auto", run=run)
    for action in p._actions:  # the shared flags' help names predict's defaults; here they are chosen
        if action.dest in ("nodes", "bandwidth"):  # or from --calibration (checked in run)
            action.required = False
            action.help += " (default: the calibration's)"
        elif action.dest == "width":
            action.help = "keep this Pipe-SGD width (default auto: recommended)"
        elif action.dest == "compression":
            action.help = "keep this codec: none|fp16|bf16|q8|q4|sign (default auto: recommended)"
        elif action.dest == "error_feedback":
            action.help = "with --compression: keep the codec's error (auto picks it for q8, q4 and sign)"
    p.add_argument("--max-width", default="3", metavar="K", help="widest pipeline to consider (default 3)")
    p.add_argument("--allow-sign", action="store_true",
                   help="consider 1-bit sign + error feedback (it cost accuracy in the study: docs/results.md)")
    p.add_argument("--optimizer", choices=STALE_COSTLY + ("sgd",), default="sgd", metavar="NAME",
                   help="the wrapped optimizer, sgd|adam|adamw|muon (default sgd, as pipesgd-train): under adam and "
                        "adamw the codecs go without error feedback and not below q8, as PipeSGD's "
                        "compression='auto' picks them; under adam, adamw and muon a width above 1 comes with "
                        "width 1's figure")
    p.add_argument("--sync-every", default=str(SYNC_EVERY), metavar="H",
                   help=f"periodic averaging, where nothing hides: inner steps between syncs (default {SYNC_EVERY}, "
                        "as pipesgd-train)")
    p.add_argument("--sync-delay", default="0", metavar="TAU",
                   help="periodic averaging: inner steps diloco's sync overlaps, below --sync-every (default 0)")
    p.add_argument("--format", choices=("markdown", "json"), default="markdown", metavar="FORMAT",
                   help="markdown|json (default markdown)")


def run(args: argparse.Namespace) -> str:
    try:
        max_width = int(args.max_width)
    except ValueError:
        raise UsageError(f"--max-width {args.max_width!r}: not an integer") from None
    if max_width < 1:
        raise UsageError(f"--max-width {max_width}: must be >= 1")
    fixed_width = None if args.width == "auto" else parse_flag("width", args.width)
    fixed_codec = None if args.compression == "auto" else parse_flag("compression", args.compression)
    calibration = load_calibration(args.calibration)
    fields = scenario_fields(args, skip=("width", "compression"))
    fields.pop("error_feedback")
    _cluster_from(fields, calibration)
    if fields.get("compute_s", 0.0) <= 0:
        raise UsageError("recommend needs --compute, the forward + backward time of one step (e.g. 120ms): "
                         "whether the all-reduce hides depends on it")
    feedback = True if args.error_feedback else None  # the flag can only fix it on
    codecs, note = None, ""
    if fixed_codec is None and feedback is None:  # the codec is chosen: the optimizer may fix its feedback and range
        feedback, codecs, note = auto_codec_limits([args.optimizer])
    every, delay = _sync_flags(args)
    fields.update(sync_every=every, sync_delay=delay)
    scenario = Scenario.of(**fields)
    mode = _periodic_mode(every, delay, args.optimizer)
    answer = recommend(scenario, lambda case: predict_modes(case, ("pipe",), calibration).result("pipe"),
                       max_width=max_width, allow_sign=args.allow_sign, width=fixed_width,
                       compression=fixed_codec, error_feedback=feedback, codecs=codecs,
                       predict_periodic=lambda case: predict_modes(case, (mode,), calibration).result(mode),
                       crossover_axis="bandwidth_Bps" if calibration is None else "compute_s")
    synchronous = _width_1_to_target(answer, args.optimizer, fixed_width)
    if args.format == "json":
        left_out = ["lowrank_standin_allreduce"] if _sends_standin(answer, args.optimizer) else []
        return json.dumps({**answer.as_dict(), "width_1_to_target": synchronous and asdict(synchronous),
                           "not_predicted": left_out}, indent=2) + "\n"
    why = answer.reason + (f"; {note}" if note else "")
    longest = max(c.iteration_s for c in answer.candidates)  # one unit down each column
    lines = [f"recommended: {answer.choice.label}", "why: - " + "\n     - ".join(why_points(why)), "",
             *(periodic_lines(answer.periodic) + [""] if answer.periodic is not None else []),
             *(_width_1_lines(synchronous, answer.choice, args.optimizer) + [""] if synchronous is not None else []),
             *(_standin_lines(args.optimizer) + [""] if _sends_standin(answer, args.optimizer) else []),
             "| width | compression | error feedback | all-reduce | iteration | exposed | hides |",
             "|---|---|---|---|---|---|---|"]
    for c in answer.candidates:
        lines.append(f"| {c.width} | {c.compression} | {'yes' if c.error_feedback else 'no'} | {c.allreduce} | "
                     f"{format_time(c.iteration_s, like=longest)} | {format_time(c.exposed_s, like=longest)} | "
                     f"{'yes' if c.hidden else 'no'} |")
    return "\n".join(lines) + "\n"


def _width_1_to_target(answer, optimizer: str, fixed_width: int | None):
    """Under Adam, AdamW or Muon, a width chosen above 1 beside the fastest width-1 candidate (None otherwise): the
    model predicts iterations, and a one-step-stale update of these optimizers learns less per step, so time to a
    target loss can favour width 1 where the iteration favours width 2 (experiments/results/charlm_slow_links)."""
    if fixed_width is not None or answer.choice.width < 2 or optimizer not in STALE_COSTLY:
        return None
    return min((c for c in answer.candidates if c.width == 1), key=lambda c: c.iteration_s, default=None)


def _width_1_lines(synchronous, choice, optimizer: str) -> list[str]:
    return [f"to a target loss under {optimizer}: also try {synchronous.label}, predicted "
            f"{reason_time(synchronous.iteration_s)} per iteration "
            f"({synchronous.iteration_s / choice.iteration_s:.2f}x the choice's)",
            f"  - a one-step-stale {optimizer} update learns less per step than a fresh one, so the faster "
            "iteration can reach a target loss later: compare the loss of both before choosing"]


def _sends_standin(answer, optimizer: str) -> bool:
    """Whether the choice runs look-ahead with the trainer's default stand-in under Adam or AdamW, the low-rank one,
    whose own all-reduce the predictions leave out (``pipesgd.defaults.resolve_lookahead_standin``)."""
    return answer.choice.width >= 2 and is_adam_family([optimizer])


def _standin_lines(optimizer: str) -> list[str]:
    return [f"not in these predictions: under {optimizer} look-ahead's default stand-in (low-rank) all-reduces "
            "rank x (rows + cols) fp32 numbers per weight matrix before each exchange, on the same link",
            "  - where the link sets the pace they add to every iteration; pipesgd-train's bytes per step show them "
            "(docs/timing-model.md)"]


def _sync_flags(args: argparse.Namespace) -> tuple[int, int]:
    """--sync-every H (>= 1) and --sync-delay τ (0 <= τ < H), as pipesgd-train checks them."""
    values = []
    for flag, text in (("--sync-every", args.sync_every), ("--sync-delay", args.sync_delay)):
        try:
            values.append(int(text))
        except ValueError:
            raise UsageError(f"{flag} {text!r}: not an integer") from None
    every, delay = values
    if every < 1:
        raise UsageError(f"--sync-every {every}: must be >= 1")
    if not 0 <= delay < every:
        raise UsageError(f"--sync-delay {delay}: must be in [0, --sync-every) = [0, {every})")
    return every, delay


def _periodic_mode(every: int, delay: int, optimizer: str) -> str:
    """diloco where only it runs (an overlapped sync, a sync every step) or under Adam and AdamW (the paper's inner
    optimizer); else localsgd, torch's own, the same time per iteration as diloco without a delay."""
    return "diloco" if delay > 0 or every < 2 or is_adam_family([optimizer]) else "localsgd"


def periodic_lines(periodic: Periodic) -> list[str]:
    """Periodic averaging's block in the text output: named (with the crossover and the caveat) or why not."""
    where = _crossover_words(periodic)
    if not periodic.named:
        return [f"periodic averaging ({periodic.flags}) is not named: predicted {reason_time(periodic.iteration_s)} "
                f"per iteration against {reason_time(periodic.per_step_s)} for the fastest candidate below, not "
                f"{periodic.margin:g}x faster" + (f"; it would be {where}" if where else "")]
    lines = [f"instead: periodic averaging, pipesgd-train {periodic.flags}",
             f"  - predicted {reason_time(periodic.iteration_s)} per iteration against "
             f"{reason_time(periodic.per_step_s)} for the fastest candidate below, at least {periodic.margin:g}x "
             f"faster (one sync's all-reduce: "
             f"{reason_time(periodic.sync_s)})"]
    if where:
        lines.append(f"  - predicted {where}")
    return lines + [f"  - {periodic.caveat}"]


def _crossover_words(periodic: Periodic) -> str:
    """The crossover in words: "faster below" a link rate (or "while" a compute time is under one), or at every
    one tried; empty where no crossover was found."""
    at, ratio = periodic.crossover, periodic.crossover_ratio
    link = periodic.crossover_axis == "bandwidth_Bps"
    if at is None:
        return ""
    if at == float("inf"):
        return f"faster at every {'link rate' if link else 'compute time'} tried above this one"
    value = f"below {format_bandwidth(at)}" if link else f"while forward + backward takes under {reason_time(at)}"
    there = f" (where one sync's all-reduce takes {ratio:.3g} times compute + update)" if ratio is not None else ""
    return f"faster {value}{there}"


# where a reason's clauses meet (``timing_model.recommend`` joins them with "; "): each is a point of its own
_CLAUSE_BREAKS = re.compile(r";\s+")


def why_points(reason: str) -> list[str]:
    """``reason``'s clauses, one short point each, in its order."""
    return [clause.strip() for clause in _CLAUSE_BREAKS.split(reason) if clause.strip()]


def _cluster_from(fields: dict, calibration) -> None:
    """The scenario's nodes, bandwidth (and compute, when the calibration timed a model) from ``calibration`` where
    no flag gave them; without one, --nodes and --bandwidth are required."""
    if calibration is None:
        flags = (("--nodes", "nodes"), ("--bandwidth", "bandwidth_Bps"))
        missing = [flag for flag, name in flags if name not in fields]
        if missing:
            raise UsageError(f"recommend needs {' and '.join(missing)}, or --calibration FILE to take them from")
        return
    fields.setdefault("nodes", int(calibration.meta.get("world_size") or 0) or max(calibration.meta["grid"]["nodes"]))
    # a stand-in: the calibration's own fit replaces the link in every prediction
    fields.setdefault("bandwidth_Bps", calibration.fit_for("pipe").bandwidth_Bps)
    measured = (calibration.compute or {}).get("compute_s")
    if not fields.get("compute_s") and measured:
        fields["compute_s"] = float(measured)
