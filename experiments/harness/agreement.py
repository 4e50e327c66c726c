"""What the per-step agreement on who still trains (``pipesgd.comm.uneven``, ``PipeSGD(check_uneven=...)``) costs a
Pipe-SGD iteration, measured side by side in one run; ``experiments/bench_agreement.py`` launches it.

Every rank, for each round and codec variant: a width-2 ``PipeSGD`` with the agreement on and one with it off,
in alternating order from round to round (so a drift of the shared machine does not favour one side), each timed
over ``steps`` iterations (zero_grad, forward, backward, step) after 3 untimed ones; the slowest rank's median.
Rank 0 writes one JSON record per variant: the per-round times on and off, their medians and the ratio on/off.
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from experiments.harness.pipeline import VARIANTS, WORKLOADS, Job, parse_variant
from pipesgd.options import PipeSGDOptions
from experiments.harness.rank_launch import run_on_ranks
from pipesgd.launch import exit_process
from pipesgd.measure.timing import time_collective
from pipesgd.optimizer import PipeSGD

__all__ = ["AgreementSettings", "markdown", "run", "run_rank", "settings_json"]


@dataclass(frozen=True, slots=True)
class AgreementSettings:
    """One A/B run; rank 0 appends a JSON record per variant to ``out_json``."""

    out_json: str
    workload: str = "mlp1.9m"
    variants: tuple[str, ...] = ("none", "q8", "q4+ef")
    rounds: int = 4
    steps: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "variants", tuple(self.variants))
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; valid: {', '.join(WORKLOADS)}")
        if not self.variants:
            raise ValueError(f"at least one variant is needed; valid: {', '.join(VARIANTS)}")
        for name in self.variants:
            parse_variant(name)
        for name in ("rounds", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _iteration_s(job: Job, variant: str, check_uneven: bool, steps: int) -> float:
    codec, feedback = parse_variant(variant)
    opt = PipeSGD(torch.optim.SGD(job.model.parameters(), lr=1e-5), job.model, width=2, compression=codec,
                  error_feedback=feedback, warmup_steps=1, options=PipeSGDOptions(check_uneven=check_uneven))

    def iteration() -> None:
        opt.zero_grad()
        F.cross_entropy(job.model(job.x), job.y).backward()
        opt.step()

    try:
        return time_collective(iteration, repeats=steps, warmup=3)
    finally:
        opt.flush()
        opt.close()


def run_rank(rank: int, world: int, settings: AgreementSettings) -> None:
    job = Job(WORKLOADS[settings.workload], rank)
    times: dict[tuple[str, bool], list[float]] = {}
    for round_index in range(settings.rounds):
        order = (True, False) if round_index % 2 == 0 else (False, True)
        for variant in settings.variants:
            for check_uneven in order:
                seconds = _iteration_s(job, variant, check_uneven, settings.steps)
                times.setdefault((variant, check_uneven), []).append(seconds)
    if rank != 0:
        return
    with open(settings.out_json, "a") as out:
        for variant in settings.variants:
            on, off = times[(variant, True)], times[(variant, False)]
            record = {"workload": settings.workload, "variant": variant, "ranks": world, "on_s": on, "off_s": off,
                      "on_median_s": statistics.median(on), "off_median_s": statistics.median(off),
                      "ratio": statistics.median(on) / statistics.median(off)}
            out.write(json.dumps(record) + "\n")


def markdown(records: list[dict], title: str) -> str:
    lines = [f"# {title}", "",
             "| workload | variant | agreement on ms (per round) | off ms (per round) | on median | off median | "
             "on / off |", "|---|---|---|---|---|---|---|"]
    for r in records:
        per_round = [", ".join(f"{s * 1e3:.1f}" for s in r[key]) for key in ("on_s", "off_s")]
        lines.append(f"| {r['workload']} | {r['variant']} | {per_round[0]} | {per_round[1]} | "
                     f"{r['on_median_s'] * 1e3:.1f} | {r['off_median_s'] * 1e3:.1f} | {r['ratio']:.3f} |")
    lines += ["", "Pipe-SGD width 2, per iteration: the slowest rank's median over the timed iterations of a round; "
                  "on and off alternate their order from round to round. on / off = ratio of the medians over rounds."]
    return "\n".join(lines)


def run(settings: AgreementSettings, ranks: int) -> None:
    """``run_rank`` on every rank: under torchrun as launched, else on ``ranks`` spawned loopback processes."""
    run_on_ranks(run_rank, ranks, settings, threads=1)


def settings_json(settings: AgreementSettings) -> str:
    return json.dumps(asdict(settings))


def main(argv: list[str] | None = None) -> int:
    """Under torchrun inside the cluster: ``python -m experiments.harness.agreement SETTINGS_JSON``."""
    args = sys.argv[1:] if argv is None else argv
    run(AgreementSettings(**json.loads(args[0])), ranks=0)
    return 0


if __name__ == "__main__":
    exit_process(main())
