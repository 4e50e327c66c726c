"""The accuracy study (experiments/harness/accuracy.py) without training: records and summary statistics from hand-made
metrics files, resume skipping finished runs through a fake launcher, and one-line config errors."""
from __future__ import annotations

import json
import os

import pytest

from experiments.harness import accuracy
from experiments.harness.accuracy import (AccuracyConfig, RunSpec, load_config, plan, run_record, run_study, summarise,
                                    trainer_flags)
from experiments.harness.provenance import read_result
from tests.in_process import run_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_metrics(path: str, ranks: int, losses: list[list[float]], evals: list[tuple[int, float, float]]) -> None:
    """``losses[rank][step]``; ``evals`` = (step, accuracy, loss) written by rank 0, as the trainer does."""
    stem = path[: -len(".jsonl")]
    for rank in range(ranks):
        with open(f"{stem}.rank{rank}.jsonl", "w") as handle:
            if rank == 0:
                handle.write(json.dumps({"type": "config", "world_size": ranks}) + "\n")
            for step, loss in enumerate(losses[rank]):
                handle.write(json.dumps({"type": "step", "step": step, "rank": rank, "loss": loss}) + "\n")
            if rank == 0:
                for step, acc, loss in evals:
                    handle.write(json.dumps({"type": "eval", "step": step, "epoch": 0, "accuracy": acc,
                                             "loss": loss, "wall": 1.0}) + "\n")


def test_run_record_shape_and_values(tmp_path):
    path = str(tmp_path / "run.jsonl")
    # Two ranks, 6 steps; the mean over ranks is 6, 5, 4, 3, 2, 1.
    write_metrics(path, 2, [[7, 6, 5, 4, 3, 2], [5, 4, 3, 2, 1, 0]],
                  [(3, 0.5, 1.5), (6, 0.75, 0.9), (6, 0.75, 0.9)])  # the end-of-run eval repeats the last one
    spec = RunSpec("digits", 2, "q8", True, 1, "lookahead")
    rec = run_record(spec, ["--x"], path, loss_points=3, wall_s=4.04)
    assert rec["key"] == "digits width=2 q8+ef staleness=lookahead seed=1"
    assert rec["config"] == "digits width=2 q8+ef staleness=lookahead"
    assert (rec["task"], rec["width"], rec["codec"], rec["error_feedback"], rec["seed"], rec["staleness"]) == \
        ("digits", 2, "q8", True, 1, "lookahead")
    assert rec["flags"] == ["--x"] and rec["wall_s"] == 4.0 and rec["steps"] == 6
    assert rec["final_accuracy"] == 0.75 and rec["final_loss"] == 0.9
    assert rec["eval"] == {"step": [3, 6], "accuracy": [0.5, 0.75], "loss": [1.5, 0.9]}
    assert rec["train_loss"] == {"step": [0.5, 2.5, 4.5], "loss": [5.5, 3.5, 1.5]}


def test_run_record_without_eval_raises(tmp_path):
    path = str(tmp_path / "run.jsonl")
    write_metrics(path, 1, [[1.0]], [])
    with pytest.raises(ValueError, match="no eval records"):
        run_record(RunSpec("digits", 1, "none", False, 0), [], path, 5, 1.0)


def _rec(config: str, seed: int, acc: float, loss: float) -> dict:
    task, width, codec = config.split()
    name = codec.removesuffix("+ef")
    return {"key": f"{config} seed={seed}", "config": config, "task": task, "width": int(width.split("=")[1]),
            "codec": name, "error_feedback": codec != name, "seed": seed, "final_accuracy": acc, "final_loss": loss}


def test_summarise_statistics_per_configuration():
    runs = [_rec("digits width=1 none", 0, 0.90, 0.3), _rec("digits width=1 none", 1, 0.94, 0.2),
            _rec("digits width=1 none", 2, 0.98, 0.1), _rec("mnist1d width=2 q4+ef", 5, 0.5, 1.0)]
    first, second = summarise(runs)
    assert first["config"] == "digits width=1 none" and first["seeds"] == [0, 1, 2]
    assert first["accuracy"]["mean"] == pytest.approx(0.94)
    assert first["accuracy"]["std"] == pytest.approx(0.04)  # sample std: sqrt((0.04^2 * 2) / 2)
    assert (first["accuracy"]["min"], first["accuracy"]["max"]) == (0.90, 0.98)
    assert first["loss"]["mean"] == pytest.approx(0.2)
    assert (second["codec"], second["error_feedback"], second["width"]) == ("q4", True, 2)
    assert second["accuracy"] == {"mean": 0.5, "std": 0.0, "min": 0.5, "max": 0.5}


def test_plan_covers_widths_and_codecs_once():
    cfg = AccuracyConfig(tasks=("digits",), widths=(1, 2, 3), codecs=("q8", "q8+ef"), seeds=(0, 1))
    keys = [s.config_key for s in plan(cfg) if s.seed == 0]
    # width 2 uncompressed with look-ahead is both a width and the codecs' reference: planned once
    assert keys == ["digits width=1 none", "digits width=2 none staleness=none",
                    "digits width=2 none staleness=lookahead", "digits width=3 none staleness=none",
                    "digits width=3 none staleness=lookahead", "digits width=2 q8 staleness=lookahead",
                    "digits width=2 q8+ef staleness=lookahead"]
    assert len(plan(cfg)) == 14
    flags = trainer_flags(plan(cfg)[2], cfg)
    assert flags[flags.index("--staleness") + 1] == "lookahead"
    assert "--staleness" not in trainer_flags(plan(cfg)[0], cfg)


class FakeLauncher:
    """Writes the metrics a run would (accuracy from the width and seed) and remembers what it launched."""

    def __init__(self, fail: set[str] = frozenset()):
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, flags, metrics, ranks, timeout_s, log_path):
        self.calls.append(flags)
        width, seed = int(flags[flags.index("--width") + 1]), int(flags[flags.index("--seed") + 1])
        if f"w{width}s{seed}" in self.fail:
            return 1
        acc = 0.9 - 0.1 * width + 0.01 * seed + (0.05 if "lookahead" in flags else 0.0)
        write_metrics(metrics, ranks, [[2.0, 1.0]] * ranks, [(1, acc - 0.1, 1.5), (2, acc, 1.0)])
        return 0


def _cfg(tmp_path, **kw) -> AccuracyConfig:
    return AccuracyConfig(tasks=("digits",), widths=(1, 2), codecs=("q8+ef",), seeds=(0, 1), ranks=2,
                          raw_dir=str(tmp_path / "raw"), result=str(tmp_path / "res" / "accuracy.json"), **kw)


def test_study_writes_result_and_resume_skips_done_runs(tmp_path):
    cfg = _cfg(tmp_path)
    fake, lines = FakeLauncher(), []
    run_study(cfg, log=lines.append, launcher=fake)
    assert len(fake.calls) == 8
    assert any(line.startswith("[1/8] digits width=1 none seed=0: 80.0 % in ") and "ETA" in line for line in lines)
    result = read_result(cfg.result)
    assert [r["key"] for r in result["runs"]][:2] == ["digits width=1 none seed=0", "digits width=1 none seed=1"]
    assert result["settings"]["seeds"] == [0, 1] and result["failed"] == []
    by_config = {c["config"]: c for c in result["summary"]}
    assert by_config["digits width=1 none"]["accuracy"]["mean"] == pytest.approx(0.805)
    assert "--error-feedback" in result["runs"][-1]["flags"] and "--warmup-steps" in result["runs"][-1]["flags"]

    again = FakeLauncher()
    run_study(cfg, resume=True, log=lines.append, launcher=again)
    assert again.calls == [] and lines[-1] == "nothing to run"

    # Drop one run from the file: resume runs exactly that one.
    result["runs"] = [r for r in result["runs"] if r["key"] != "digits width=2 none staleness=none seed=1"]
    from experiments.harness.provenance import write_result
    write_result(cfg.result, {k: v for k, v in result.items() if k != "provenance"}, origin=result["provenance"])
    third = FakeLauncher()
    run_study(cfg, resume=True, log=lines.append, launcher=third)
    assert len(third.calls) == 1 and third.calls[0][third.calls[0].index("--seed") + 1] == "1"
    resumed = read_result(cfg.result)
    assert len(resumed["runs"]) == 8
    assert resumed["earlier"] == [result["provenance"]]  # the invocation whose runs the resume kept

    # Without --resume everything runs again.
    fresh = FakeLauncher()
    run_study(cfg, log=lines.append, launcher=fresh)
    assert len(fresh.calls) == 8


def test_failed_run_is_reported_and_retried_on_resume(tmp_path):
    cfg = _cfg(tmp_path)
    lines = []
    run_study(cfg, log=lines.append, launcher=FakeLauncher(fail={"w1s1"}))
    result = read_result(cfg.result)
    assert [f["key"] for f in result["failed"]] == ["digits width=1 none seed=1"]
    assert len(result["runs"]) == 7 and any("FAILED (exit code 1" in line for line in lines)
    retry = FakeLauncher()
    run_study(cfg, resume=True, log=lines.append, launcher=retry)
    assert len(retry.calls) == 1 and read_result(cfg.result)["failed"] == []


@pytest.mark.parametrize("toml, overrides, message", [
    ("widths = [0, 1]", {}, "widths must be >= 1"),
    ("seeds = []", {}, "seeds must be a non-empty list"),
    ("widths = 3", {}, "widths must be a list"),
    ("colour = 1", {}, "unknown config key(s) colour"),
    ("codecs = ['q9']", {}, "unknown codec 'q9'"),
    ("codecs = ['sign']", {}, "refuses it without error feedback"),
    ("tasks = ['imagenet']", {}, "unknown task 'imagenet'"),
    ("tasks = ['cifar10:']", {}, "unknown task"),
    ("epochs = 0", {}, "epochs must be an integer >= 1"),
    ("epochs = [", {}, "accuracy.toml"),
    ("epochs = 3", {"epochs": -1}, "epochs must be an integer >= 1"),  # the flag wins over the file
])
def test_config_errors(tmp_path, toml, overrides, message):
    path = tmp_path / "accuracy.toml"
    path.write_text(toml + "\n")
    with pytest.raises(ValueError) as info:
        load_config(str(path), overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_config_file_then_flags():
    cfg = load_config(os.path.join(ROOT, "experiments", "configs", "accuracy.toml"), {"seeds": [4], "epochs": None})
    assert cfg.seeds == (4,) and cfg.epochs == 20 and "sign+ef" in cfg.codecs
    assert accuracy.task_flags("cifar10:/data/c") == ["--dataset", "cifar10:/data/c", "--model", "lenet"]


@pytest.mark.parametrize("task", sorted(accuracy.TASKS))
def test_every_task_is_a_valid_trainer_run(task):
    """Each task's flags, as the study passes them (task first, then epochs, width, ...), resolve in the trainer."""
    from pipesgd.train.flags import resolve

    cfg = AccuracyConfig(tasks=(task,))
    train = resolve(accuracy.trainer_flags(RunSpec(task, 3, "q8", True, 1), cfg))
    assert (train.width, train.compression, train.error_feedback, train.seed) == (3, "q8", True, 1)
    if task == "charlm":  # a fixed step budget whatever the study's epochs
        assert (train.steps, train.optimizer, train.lr_schedule, train.model) == (300, "adamw", "cosine", "gpt")


@pytest.mark.parametrize("args", [["--codecs", "sign"], ["--config", "/nonexistent.toml"], ["--widths", "a,b"],
                                  ["--report", "--result", "/nonexistent.json"]])
def test_driver_bad_input_is_one_line(args):
    done = run_in_process(os.path.join(ROOT, "experiments", "accuracy.py"), *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("accuracy: error: ")


def test_driver_report_prints_the_table_of_a_result_without_running(tmp_path):
    cfg = _cfg(tmp_path)
    run_study(cfg, log=lambda line: None, launcher=FakeLauncher())
    done = run_in_process(os.path.join(ROOT, "experiments", "accuracy.py"), "--report", "--result", cfg.result)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == accuracy.summary_markdown(read_result(cfg.result)).strip()
    assert "| digits | 1 |" in done.stdout


@pytest.mark.slow
def test_plots_and_readings_from_a_result(tmp_path):
    cfg = _cfg(tmp_path)
    result = run_study(cfg, log=lambda line: None, launcher=FakeLauncher())
    from experiments.harness import accuracy_plot
    assert accuracy_plot.describe_widths(result) == (
        "digits: width 1 reaches 80.5 % (loss 1.0000); none, against it (points / loss): K=2 -10.0 / +0.0 %\n"
        "digits: width 1 reaches 80.5 % (loss 1.0000); lookahead, against it (points / loss): K=2 -5.0 / +0.0 %")
    assert accuracy_plot.describe_codecs(result) == ("digits: uncompressed width 2 reaches 75.5 %; "
                                                     "against it (points): q8+ef +0.0")
    steps, loss = accuracy_plot.mean_curve(result, "digits width=1 none")
    assert steps == [1, 2] and loss == [1.5, 1.0]
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    for fig in (accuracy_plot.figure_widths(result), accuracy_plot.figure_codecs(result),
                accuracy_plot.figure_loss_curves(result, by="codec", curve="train_loss")):
        assert fig.axes and fig.axes[0].has_data()
