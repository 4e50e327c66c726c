"""experiments.harness: the experiments' variant table, the issue-4 speed table and the fidelity summary, on synthetic
runs (no cluster, no root)."""
from __future__ import annotations

import pytest

from experiments.harness.fidelity import summary
from experiments.harness.fidelity_report import markdown
from experiments.harness.speed import speed_table
from experiments.harness.comparison_config import load_config
from experiments.harness.variants import (ACCURACY_VARIANTS, AUTO_CHOICE_VARIANTS, CHARLM_SLOW_LINK_VARIANTS,
                                         CHARLM_TUNED_VARIANTS,
                                         CHARLM_TIME_VARIANTS, COMPARISON_VARIANTS, PERIODIC_VARIANTS,
                                         CONVENTIONAL_BASELINES, DDP_BASELINES, DEFAULT_FIDELITY_VARIANTS, SAME_CODEC_SYNC,
                                         FIDELITY_VARIANTS, PIPE_VARIANTS, SPEED_VARIANTS, TIME_TO_ACCURACY_VARIANTS,
                                         TRAINER_FLAGS, trainer_flags)
from experiments.harness.results import Run

AUTO_CHOICE_CONFIG = "experiments/configs/auto_choice.toml"
CHARLM_TIME_CONFIG = "experiments/configs/charlm_time.toml"
CHARLM_SLOW_LINKS_CONFIG = "experiments/configs/charlm_slow_links.toml"
CHARLM_TUNED_CONFIG = "experiments/configs/charlm_tuned.toml"


def test_variants_are_the_flags_the_experiments_ran():
    # the own gradient named: what "auto" picks under SGD, and what the GPT's committed "pipe" rows ran with
    assert trainer_flags("pipe+q8") == ["--mode", "pipe", "--width", "2", "--compression", "q8", "--error-feedback",
                                        "--lookahead-standin", "local"]
    assert trainer_flags("ddp+fp16") == ["--mode", "ddp", "--ddp-hook", "fp16"]
    assert trainer_flags("sync+bf16") == ["--mode", "sync", "--compression", "bf16"]
    assert SPEED_VARIANTS == ACCURACY_VARIANTS == ("sync", "pipe", "pipe+bf16", "pipe+q8", "ddp", "ddp+fp16")
    assert FIDELITY_VARIANTS == ("sync", "pipe", "pipe+bf16", "pipe+q8", "sync+bf16", "sync+q8", "ddp", "ps-sync",
                                 "ps-async")
    assert set(DEFAULT_FIDELITY_VARIANTS) <= set(FIDELITY_VARIANTS)
    # every variant of the table is run by some experiment (issue 12's grid added pipe+sign, pipe-w3, ddp+powersgd)
    assert set(SPEED_VARIANTS) | set(FIDELITY_VARIANTS) | set(TIME_TO_ACCURACY_VARIANTS) | set(
        AUTO_CHOICE_VARIANTS) | set(CHARLM_TIME_VARIANTS) | set(CHARLM_SLOW_LINK_VARIANTS) | set(
        CHARLM_TUNED_VARIANTS) == set(TRAINER_FLAGS)
    assert tuple(load_config(CHARLM_TIME_CONFIG).variants) == CHARLM_TIME_VARIANTS
    assert tuple(load_config(CHARLM_SLOW_LINKS_CONFIG).variants) == CHARLM_SLOW_LINK_VARIANTS
    assert tuple(load_config(CHARLM_TUNED_CONFIG).variants) == CHARLM_TUNED_VARIANTS
    assert trainer_flags("sync+q8+muon-lr1e-2") == [*trainer_flags("sync+q8+muon"), "--lr", "1e-2"]
    assert trainer_flags("pipe+q8+muon") == [*trainer_flags("pipe+q8"), "--optimizer", "muon"]
    assert trainer_flags("sync+q8+muon") == [*trainer_flags("sync+q8"), "--optimizer", "muon"]
    assert [trainer_flags(v)[1] for v in PERIODIC_VARIANTS] == ["localsgd", "diloco", "diloco"]
    assert not set(PERIODIC_VARIANTS) & (set(SAME_CODEC_SYNC) | set(SAME_CODEC_SYNC.values()))
    assert trainer_flags("pipe+q8+lowrank")[-2:] == ["--lookahead-standin", "coarse-lowrank"]
    assert trainer_flags("pipe+auto") == ["--mode", "pipe", "--width", "2", "--compression", "auto"]
    assert tuple(load_config(AUTO_CHOICE_CONFIG).variants) == AUTO_CHOICE_VARIANTS
    assert trainer_flags("pipe+sign") == ["--mode", "pipe", "--width", "2", "--compression", "sign", "--error-feedback"]
    assert trainer_flags("pipe-w3") == ["--mode", "pipe", "--width", "3"]
    assert trainer_flags("ddp+powersgd") == ["--mode", "ddp", "--ddp-hook", "powersgd"]
    twins = {SAME_CODEC_SYNC[p] for p in PIPE_VARIANTS}  # every Pipe-SGD row beside sync at its codec
    assert set(PIPE_VARIANTS) | set(CONVENTIONAL_BASELINES) | set(DDP_BASELINES) | twins == set(COMPARISON_VARIANTS)
    for pipe, twin in SAME_CODEC_SYNC.items():  # the twin: the pipe flags without width and staleness, at width 1
        flags, pipelined = trainer_flags(pipe), {"--width", "--staleness", "--lookahead-standin"}
        rest = [f for i, f in enumerate(flags) if f not in pipelined and (not i or flags[i - 1] not in pipelined)]
        assert rest[:2] == ["--mode", "pipe"] and trainer_flags(twin) == ["--mode", "sync", *rest[2:]], (pipe, twin)
    flags = trainer_flags("sync")
    flags.append("--oops")  # a caller's list never changes the table
    assert TRAINER_FLAGS["sync"] == ["--mode", "sync"]
    with pytest.raises(ValueError, match="unknown variant 'hogwild'; valid: sync, pipe"):
        trainer_flags("hogwild")


def _run(name: str, t_iter: float, t_compute: float, t_update: float = 0.002, ranks: int = 2, steps: int = 6) -> Run:
    """A run whose rank 1 is the slower one by 1 ms in every field."""
    records = [{"type": "step", "step": s, "rank": r, "t_iter": t_iter - 1e-3 * (1 - r),
                "t_compute": t_compute - 1e-3 * (1 - r), "t_update": t_update, "t_wait": 0.004,
                "bytes_sent": 2e6, "t_cpu": t_iter} for s in range(steps) for r in range(ranks)]
    return Run(f"{name}.jsonl", config={"world_size": ranks}, steps=records)


def test_speed_table_takes_the_period_and_compares_with_ddp():
    """Iteration times: the mean over ranks per step (0.5 ms under the slower rank); compute and the sync run's
    allreduce: the slowest rank per step."""
    runs = {"sync": _run("sync", 0.100, 0.040), "pipe": _run("pipe", 0.062, 0.050),
            "pipe+bf16": _run("pipe+bf16", 0.050, 0.045), "pipe+q8": _run("pipe+q8", 0.048, 0.045),
            "ddp": _run("ddp", 0.080, 0.075), "ddp+fp16": _run("ddp+fp16", 0.060, 0.055)}
    text, figures = speed_table(runs, skip=2)
    assert figures["t_iter_s"] == pytest.approx({"sync": 0.0995, "pipe": 0.0615, "pipe+bf16": 0.0495,
                                                 "pipe+q8": 0.0475, "ddp": 0.0795, "ddp+fp16": 0.0595})
    assert figures["compute_only_s"] == pytest.approx(0.040)
    assert figures["allreduce_only_s"] == pytest.approx(0.0995 - 0.040 - 0.002)
    assert figures["pipe_over_bound"] == pytest.approx(0.0615 / 0.0575)
    assert figures["ceiling"] == pytest.approx({"vs_ddp": 0.0795 / 0.040, "vs_ddp_fp16": 0.0595 / 0.040})
    # CPU busy: both ranks' CPU seconds over what the cores offer in a step
    cores = figures["cpu_count"]
    assert figures["cpu_busy"]["sync"] == pytest.approx(2 * 0.100 / (cores * 0.0995))
    assert "| pipe | 61.5 | 50.0 | 4.0 | 2.00 |" in text and "| 1.29x | 0.97x |" in text
    assert "pipe+bf16 is 1.61x faster than ddp; pipe+q8 is 1.25x faster than ddp+fp16" in text


def _point(variant: str, measured: float, predicted: float) -> dict:
    return {"bandwidth": "1gbit", "nodes": 2, "variant": variant, "measured_s": measured, "predicted_s": predicted,
            "error": (predicted - measured) / measured,
            "predicted": {"regime": "bandwidth-bound", "compute_s": 0.01, "update_s": 0.001, "handoff_s": 0.0,
                          "exposed_comm_s": 0.02, "codec_s": 0.0, "comm_total_s": 0.03},
            "measured": {"compute_s": 0.011, "update_s": 0.001, "exposed_s": 0.02, "comm_busy_s": None,
                         "wait_s": 0.002}}


def test_fidelity_summary_and_report_flag_the_points_over_the_threshold():
    points = [_point("sync", 0.100, 0.104), _point("pipe", 0.050, 0.060), _point("ddp", 0.080, 0.078)]
    stats = summary(points, 0.10)
    assert stats == {"runs": 3, "median_abs_error": pytest.approx(0.04), "max_abs_error": pytest.approx(0.2),
                     "signed_mean_error": pytest.approx((0.04 + 0.2 - 0.025) / 3), "too_fast": 1, "too_slow": 2,
                     "bias": None, "over_flag": 1, "flag": 0.10}
    text = markdown(points, [{"bandwidth": "1gbit", "nodes": 4, "variant": "pipe", "reason": "timeout"}], stats,
                    "# header")
    assert "| 1gbit | 2 | pipe | 50.0 | 60.0 | +20.0 % | bandwidth-bound |" in text
    assert "runs: 3, median |error| 4.0 %, max |error| 20.0 %" in text
    over = text.split("## Points over 10 %")[1]
    assert "| 1gbit | 2 | pipe | +20.0 % |" in over and "| sync |" not in over and "| - | 2.0 |" in over
    assert "- 1gbit 4 nodes pipe: timeout" in text
    assert summary([], 0.1)["median_abs_error"] is None
