"""The comparison grid's logic without a cluster: tidy records from hand-made metrics files, speedup tables,
resume/skip of the result store, the wall-time estimate, config validation and the driver's refusals."""
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from experiments.harness.comparison import MODEL_FREE, predict
from experiments.harness.comparison_config import GridConfig, Workload, cell_name, load_config, select, split_cell
from experiments.harness.comparison_record import curve, run_record, step_split, time_to_target
from experiments.harness.comparison_report import model_summary, report
from experiments.harness.comparison_store import ResultStore, estimate_wall
from experiments.harness.provenance import read_result
from experiments.harness.comparison_report import where_the_time_went
from experiments.harness.speedup import SAME_CODEC, cell_speedups, headline, markdown_tables, same_codec_speedup
from experiments.harness.results import load_run
from pipesgd.train.flags import resolve
from tests.in_process import run_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "experiments", "configs", "comparison.toml")


def write_metrics(path, steps=8, ranks=2, t_iter=(0.10, 0.12), compute=(0.04, 0.05), update=0.01, sent=1000,
                  evals=((4, 1.5, 0.5), (8, 3.0, 0.93)), batch=32, mode="sync", sync_every=0):
    """A 2-rank run: rank r's step times are t_iter[r] etc., evals (step, wall, accuracy); ``sync_every`` > 0: a
    periodic run's steps, which send (``sent``) and take 0.5 s longer only every ``sync_every``-th step."""
    stem = str(path)[:-len(".jsonl")]
    for rank in range(ranks):
        lines = []
        if rank == 0:
            lines.append({"type": "config", "world_size": ranks, "num_workers": ranks, "batch_size": batch,
                          "params": 250, "grad_bytes": 1000, "mode": mode, "warmup_steps": 0})
        for step in range(steps):
            syncs = not sync_every or (step + 1) % sync_every == 0
            lines.append({"type": "step", "step": step, "rank": rank,
                          "t_iter": t_iter[rank] + step * 1e-3 + (0.5 if sync_every and syncs else 0.0),
                          "t_compute": compute[rank], "t_data": 0.001, "t_update": update,
                          "bytes_sent": sent if syncs else 0, "wall": step * 0.1})
        if rank == 0:
            lines += [{"type": "eval", "step": s, "wall": w, "accuracy": a, "loss": 1 - a} for s, w, a in evals]
            lines.append({"type": "summary", "wall": 3.5, "accuracy": evals[-1][2] if evals else None})
        with open(f"{stem}.rank{rank}.jsonl", "w") as handle:
            handle.write("\n".join(json.dumps(line) for line in lines) + "\n")
    return str(path)


# ------------------------------------------------------------------------------------------------------------
# Tidy records
def test_step_split_takes_the_mean_over_ranks_and_medians_after_skip(tmp_path):
    run = load_run(write_metrics(tmp_path / "a.jsonl"))
    split = step_split(run, skip=2)
    assert split["steps_kept"] == 6
    # mean over the ranks: t_iter (0.10 + 0.12) / 2 + step ms, steps 2..7 -> median of 0.112..0.117 = 0.1145
    assert split["t_iter_s"] == pytest.approx(0.1145)
    assert split["compute_s"] == pytest.approx(0.046)  # mean of the ranks' t_compute + t_data
    assert split["update_s"] == pytest.approx(0.01)
    assert split["exposed_comm_s"] == pytest.approx(0.1145 - 0.046 - 0.01)
    assert split["bytes_per_iter"] == 2000  # all ranks' bytes per step
    with pytest.raises(ValueError, match="no step records"):
        step_split(run, skip=8)


def test_a_periodic_runs_split_is_the_mean_so_its_syncs_count(tmp_path):
    """localsgd/diloco send only every H-th step: a median would be a local step's and hide the sync."""
    for mode in ("localsgd", "diloco"):
        run = load_run(write_metrics(tmp_path / f"{mode}.jsonl", steps=10, mode=mode, sync_every=4))
        split = step_split(run, skip=2)  # steps 2..9, of which 3 and 7 sync
        local = [0.11 + 1e-3 * s for s in range(2, 10)]
        assert split["t_iter_s"] == pytest.approx(sum(local) / 8 + 2 * 0.5 / 8)
        assert split["bytes_per_iter"] == pytest.approx(2 * 2000 / 8)
        assert split["exposed_comm_s"] == pytest.approx(split["t_iter_s"] - 0.046 - 0.01)
    sync = step_split(load_run(write_metrics(tmp_path / "sync.jsonl", steps=10, sync_every=4)), skip=2)
    assert sync["t_iter_s"] == pytest.approx(0.117)  # per-step modes keep the median (of local-length steps)


def test_step_split_is_the_period_of_a_lockstep_run_whose_wait_moves_between_ranks(tmp_path):
    """Two ranks in lockstep, 0.1 s per step: the wait lands on rank 0 on even steps and on rank 1 on odd ones.
    Each step's slowest rank says 0.12 s; the period is 0.1 s, which the mean over ranks gives."""
    stem = tmp_path / "lockstep"
    for rank in range(2):
        lines = [{"type": "config", "world_size": 2, "mode": "sync", "grad_bytes": 1000}] if rank == 0 else []
        for step in range(10):
            long = (step + rank) % 2 == 0
            lines.append({"type": "step", "step": step, "rank": rank, "t_iter": 0.12 if long else 0.08,
                          "t_compute": 0.03, "t_update": 0.01, "wall": 0.1 * (step + 1)})
        (tmp_path / f"lockstep.rank{rank}.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    run = load_run(str(stem) + ".jsonl")
    assert max(run.per_step("t_iter")) == pytest.approx(0.12)  # what the slowest rank per step would report
    assert step_split(run, skip=0)["t_iter_s"] == pytest.approx(0.1)
    assert run.iteration_s() == pytest.approx(0.1)


def test_run_record_throughput_accuracy_and_time_to_target(tmp_path):
    rec = run_record(load_run(write_metrics(tmp_path / "a.jsonl")), skip=2, target=0.9)
    assert rec["throughput_sps"] == pytest.approx(2 * 32 / 0.1145)
    assert rec["final_accuracy"] == 0.93 and rec["final_loss"] == pytest.approx(0.07)
    assert rec["time_to_target_s"] == 3.0 and rec["reached_target"]
    assert rec["steps"] == 8 and rec["params"] == 250 and rec["train_wall_s"] == 3.5
    missed = run_record(load_run(write_metrics(tmp_path / "b.jsonl")), skip=2, target=0.95)
    assert missed["time_to_target_s"] is None and not missed["reached_target"]


def test_autos_own_time_is_each_steps_least_over_its_ranks_summed(tmp_path):
    """``t_auto`` (``StepStats.t_auto_s``): rank 0 waited 50 ms at step 0 in an agreement rank 1 reached last (10 ms
    of its own); step 2 took 20 and 30 ms: auto cost 10 + 20 ms, not a rank's own sum."""
    path = write_metrics(tmp_path / "a.jsonl")
    auto = {(0, 0): 0.05, (0, 1): 0.01, (2, 0): 0.02, (2, 1): 0.03}
    for rank in range(2):
        rank_path = tmp_path / f"a.rank{rank}.jsonl"
        lines = [json.loads(line) for line in rank_path.read_text().splitlines()]
        for line in lines:
            if line["type"] == "step":
                line["t_auto"] = auto.get((line["step"], rank), 0.0)
        rank_path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert run_record(load_run(path), skip=2, target=0.9)["auto_s"] == pytest.approx(0.03)
    assert "auto_s" not in run_record(load_run(write_metrics(tmp_path / "b.jsonl")), skip=2, target=0.9)


def test_time_to_a_loss_target_is_the_first_evaluation_at_or_below_it(tmp_path):
    # evals (step, wall, accuracy) with loss = 1 - accuracy: 0.5 at 1.5 s, 0.07 at 3.0 s
    rec = run_record(load_run(write_metrics(tmp_path / "a.jsonl")), skip=2, target=0.5, metric="loss")
    assert rec["time_to_target_s"] == 1.5 and rec["reached_target"] and rec["target_loss"] == 0.5
    assert "target_accuracy" not in rec
    missed = run_record(load_run(write_metrics(tmp_path / "b.jsonl")), skip=2, target=0.05, metric="loss")
    assert missed["time_to_target_s"] is None and not missed["reached_target"]
    assert time_to_target([{"loss": 2.0, "wall_s": 1.0}, {"loss": None, "wall_s": 2.0}], 1.9, "loss") is None


def test_curve_is_thinned_and_keeps_the_last_point(tmp_path):
    evals = tuple((s, 0.1 * s, min(1.0, 0.01 * s)) for s in range(1, 201))
    run = load_run(write_metrics(tmp_path / "c.jsonl", evals=evals))
    points = curve(run, max_points=10)
    assert len(points) == 10 and points[-1]["step"] == 200 and points[0]["step"] == 1
    assert time_to_target(points, 2.0) is None
    assert time_to_target([{"accuracy": 0.5, "wall_s": 1.0}, {"accuracy": 0.9, "wall_s": 2.0}], 0.9) == 2.0


# ------------------------------------------------------------------------------------------------------------
# Speedups
def rec(cell, variant, t_iter, tta=None, workload="lenet", bandwidth="1gbit", status="ok"):
    return {"cell": cell, "variant": variant, "t_iter_s": t_iter, "time_to_target_s": tta, "workload": workload,
            "bandwidth": bandwidth, "status": status}


def test_cell_speedups_and_headline_pick_the_largest_with_its_setup():
    runs = [rec("lenet-1gbit", "sync", 0.2, 10.0), rec("lenet-1gbit", "pipe", 0.1, 4.0),
            rec("lenet-1gbit", "pipe+q8", 0.08, None), rec("lenet-1gbit", "ddp", 0.3, 9.0),
            rec("alex-100mbit", "sync", 4.0, None, "alex", "100mbit"),
            rec("alex-100mbit", "pipe+q8", 1.0, None, "alex", "100mbit"),
            rec("alex-100mbit", "ps-sync", 9.0, None, "alex", "100mbit", status="failed")]
    rows = {(r["pipe"], r["baseline"]): r for r in cell_speedups(
        {r["variant"]: r for r in runs if r["cell"] == "lenet-1gbit"})}
    assert rows[("pipe", "sync")]["per_iter"] == pytest.approx(2.0)
    assert rows[("pipe", "sync")]["to_target"] == pytest.approx(2.5)
    assert rows[("pipe+q8", "sync")]["to_target"] is None  # pipe+q8 never reached the target
    best = headline(runs)
    assert best["sync"]["per_iter"] == {"speedup": pytest.approx(4.0), "cell": "alex-100mbit", "workload": "alex",
                                        "bandwidth": "100mbit", "variant": "pipe+q8"}
    assert best["sync"]["to_target"]["speedup"] == pytest.approx(2.5)
    assert best["ddp"]["per_iter"]["speedup"] == pytest.approx(0.3 / 0.08)
    assert "ps-sync" not in best  # its only run failed: no ratio, never a guess
    text = markdown_tables(runs)
    assert "4.00x" in text and "5.4x" in text


def test_same_codec_sync_credits_pipelining_alone():
    # DDP 0.3 s, sync+q8 0.12 s, pipe+q8 0.08 s: 3.75x over DDP, of which pipelining buys 1.5x
    runs = [rec("c", "ddp", 0.3, 9.0), rec("c", "sync", 0.2, 6.0), rec("c", "sync+q8", 0.12, 5.0),
            rec("c", "pipe+q8", 0.08, 2.0), rec("c", "pipe", 0.1, None), rec("c", "pipe+bf16", 0.09, 3.0)]
    cell = {r["variant"]: r for r in runs}
    rows = {(r["pipe"], r["baseline"]): r for r in cell_speedups(cell)}
    assert rows[("pipe+q8", SAME_CODEC)]["per_iter"] == pytest.approx(1.5)
    assert rows[("pipe+q8", SAME_CODEC)]["against"] == "sync+q8"
    assert rows[("pipe+q8", SAME_CODEC)]["to_target"] == pytest.approx(2.5)
    assert rows[("pipe", SAME_CODEC)]["per_iter"] == pytest.approx(2.0)  # uncompressed: against plain sync
    assert ("pipe+bf16", SAME_CODEC) not in rows  # sync+bf16 was not run: no ratio, never a guess
    assert same_codec_speedup(cell, "pipe+bf16") is None
    best = headline(runs)
    assert best["ddp"]["per_iter"]["variant"] == "pipe+q8"
    assert best[SAME_CODEC]["per_iter"]["speedup"] == pytest.approx(2.0)  # pipe over sync
    text = markdown_tables(runs)
    head = next(line for line in text.splitlines() if line.startswith("| ddp |"))
    assert "3.75x" in head and "1.50x" in head  # the gain over DDP and, beside it, pipelining's share


def test_report_breaks_traced_runs_down_against_the_same_codec_sync():
    parts = {"compute_s": 0.04, "step_s": 0.02, "update_s": 0.002, "exchange_s": 0.03, "wire_s": 0.02}
    sync = dict(rec("c", "sync+q8", 0.07), breakdown=parts, t_iter_s=0.07)
    pipe = dict(rec("c", "pipe+q8", 0.06), breakdown=dict(parts, step_s=0.004), t_iter_s=0.06)
    lines = where_the_time_went([sync, pipe, rec("c", "ddp", 0.1)], {"cores_per_node": 0})
    row = next(line for line in lines if line.startswith("| pipe+q8 |"))
    # limit = max(compute + update + exchange CPU (shared core), exchange) = max(0.052, 0.03)
    assert "| 52.0 |" in row and row.rstrip(" |").endswith("0.87")
    assert not any(line.startswith("| ddp |") for line in lines)  # not traced: not broken down
    assert where_the_time_went([rec("c", "ddp", 0.1)], {}) == []
    # on a shaped link, never below each node's share of the bytes at the measured rate: 2 nodes, 1.5 MB in all,
    # 100 Mbit/s -> 60 ms
    shaped = [dict(run, bytes_per_iter=1.5e6, nodes=2, workers=2) for run in (sync, pipe)]
    row = next(line for line in where_the_time_went(shaped, {"cores_per_node": 0, "tcp_bps": 1e8, "nodes": 2})
               if line.startswith("| pipe+q8 |"))
    assert "| 60.0 |" in row and row.rstrip(" |").endswith("1.00")
    # ranks sharing a node send some bytes over loopback: no floor from them
    shared = [dict(run, workers=4) for run in shaped]
    row = next(line for line in where_the_time_went(shared, {"cores_per_node": 0, "tcp_bps": 1e8, "nodes": 2})
               if line.startswith("| pipe+q8 |"))
    assert "| 52.0 |" in row


def test_the_report_breaks_steps_down_in_the_breakdowns_columns():
    """The report's table is ``breakdown.markdown``'s: step()'s own work apart from the wait; a record made before
    the trace had wait spans (no ``wait_s``) says its own-work time holds the wait and leaves the wait empty."""
    parts = {"compute_s": 0.04, "step_s": 0.02, "update_s": 0.002, "exchange_s": 0.03, "wire_s": 0.02}
    new = dict(rec("c", "pipe+q8", 0.06), breakdown=dict(parts, wait_s=0.015), t_iter_s=0.06)
    old = dict(rec("c", "pipe", 0.06), breakdown=parts, t_iter_s=0.06)
    lines = where_the_time_went([new, old], {"cores_per_node": 0})
    head = next(line for line in lines if line.startswith("| variant |"))
    assert "| step(): the wrapper's own work | update | waited for the exchange |" in head
    assert "beyond update" not in head
    assert "| 40.0 | 3.0 | 2.0 | 15.0 | 30.0 |" in next(line for line in lines if line.startswith("| pipe+q8 |"))
    assert "| 40.0 | 18.0 (the wait in it) | 2.0 | - | 30.0 |" in next(
        line for line in lines if line.startswith("| pipe |"))


# ------------------------------------------------------------------------------------------------------------
# Config
def test_config_file_loads_and_builds_flags():
    cfg = load_config(CONFIG)
    assert len(cfg.cells()) == 9 and cfg.nodes == 4 and cfg.warmup_steps == 3
    assert "ddp+powersgd" in cfg.variants and "pipe-w3" in cfg.variants
    flags = cfg.train_flags(cfg.workload("alexnet"), "100mbit")
    assert flags[flags.index("--steps") + 1] == "12" and "--epochs" not in flags
    assert "--epochs" in cfg.train_flags(cfg.workload("lenet"), "1gbit")
    assert flags[flags.index("--warmup-steps") + 1] == "3"
    assert flags[flags.index("--eval-every") + 1] == "1" and "--eval-deferred" not in flags  # every epoch, live


def test_the_charlm_config_trains_the_transformer_to_a_loss_target():
    cfg = load_config(os.path.join(ROOT, "experiments", "configs", "charlm_time.toml"))
    charlm = cfg.workload("charlm")
    assert cfg.target_of(charlm) == (charlm.target_loss, "loss") and charlm.target_loss > 0
    assert cfg.targets() == {"charlm": (charlm.target_loss, "loss")}
    flags = cfg.train_flags(charlm, "100mbit")
    assert flags[flags.index("--dataset") + 1] == "pysrc" and flags[flags.index("--steps") + 1] == "300"
    assert flags[-len(charlm.flags):] == list(charlm.flags)
    parsed = resolve([*flags, "--mode", "pipe", "--width", "2"])  # flags the trainer takes
    assert parsed.optimizer == "adamw" and parsed.lr_schedule == "cosine"
    lenet = load_config(CONFIG).workload("lenet")
    assert load_config(CONFIG).target_of(lenet) == (0.9, "accuracy") and lenet.dataset == "digits"


def test_the_slow_links_config_puts_each_variants_own_flags_last():
    """Muon and local SGD's warm-up are variant flags over a workload's --optimizer adamw and the grid's warm-up:
    the trainer keeps a flag's last value, so the variant's must come after the shared ones."""
    cfg = load_config(os.path.join(ROOT, "experiments", "configs", "charlm_slow_links.toml"))
    charlm = cfg.workload("charlm")
    assert cfg.bandwidths == ("100mbit", "1gbit") and cfg.nodes == 4
    assert all(charlm.steps[b] == 300 for b in cfg.bandwidths) and "--optimizer" in charlm.flags
    muon = cfg.run_flags(charlm, "100mbit", "pipe+q8+muon")
    assert muon[-2:] == ["--optimizer", "muon"]
    assert muon[:len(cfg.train_flags(charlm, "100mbit"))] == cfg.train_flags(charlm, "100mbit")
    parsed = resolve(muon)
    assert parsed.optimizer == "muon" and parsed.mode == "pipe" and parsed.compression == "q8"
    assert parsed.lr == 1e-3 and parsed.lr_schedule == "cosine"  # the workload's rate and schedule stay
    assert resolve(cfg.run_flags(charlm, "1gbit", "sync+q8+muon")).optimizer == "muon"
    assert resolve(cfg.run_flags(charlm, "1gbit", "pipe+q8")).optimizer == "adamw"
    local = resolve(cfg.run_flags(charlm, "1gbit", "localsgd"))
    assert local.mode == "localsgd" and local.warmup_steps == 15 and local.optimizer == "adamw"
    delayed = resolve(cfg.run_flags(charlm, "1gbit", "diloco+delay"))
    assert delayed.mode == "diloco" and delayed.sync_delay == 1
    # evaluation points on the periodic variants' syncs: diloco after steps H, 2H, ...; localsgd after W + 1 + nH
    for name in ("localsgd", "diloco", "diloco+delay"):
        run = resolve(cfg.run_flags(charlm, "100mbit", name))
        first = run.warmup_steps + 1 if run.mode == "localsgd" else run.sync_every
        assert first % cfg.eval_steps == 0 and run.sync_every % cfg.eval_steps == 0, name
    for variant in cfg.variants:  # every run of the grid is one the trainer takes
        resolve(cfg.run_flags(charlm, "100mbit", variant))


def test_reports_take_rows_without_a_same_codec_twin():
    """Local SGD and DiLoCo have no synchronous twin at their codec: the tables skip that column, nothing breaks."""
    runs = [rec("c", "ddp", 0.3, 9.0), rec("c", "sync+q8", 0.12, 5.0), rec("c", "pipe+q8", 0.08, 4.0),
            rec("c", "sync+q8+muon", 0.13, None), rec("c", "pipe+q8+muon", 0.09, None), rec("c", "localsgd", 0.05, 3.0),
            rec("c", "diloco", 0.05, 3.5), rec("c", "diloco+delay", 0.045, 3.2)]
    assert "### c" in markdown_tables(runs)
    parts = {"compute_s": 0.04, "step_s": 0.02, "update_s": 0.002, "exchange_s": 0.03, "wire_s": 0.02}
    traced = [dict(rec("c", v, 0.07), breakdown=parts) for v in ("sync+q8+muon", "pipe+q8+muon")]
    lines = where_the_time_went(traced + runs, {"cores_per_node": 0})
    assert any(line.startswith("| pipe+q8+muon |") for line in lines)
    assert not any(line.startswith("| localsgd |") for line in lines)


def test_the_auto_choice_configs_alexnet_trains_with_adamw_to_its_own_accuracy_target():
    """Under the comparison's SGD the AlexNet-like model stays at chance on digits: the benchmark of the automatic
    choice (issue 39) trains it with AdamW to an accuracy of its own."""
    cfg = load_config(os.path.join(ROOT, "experiments", "configs", "auto_choice.toml"))
    alexnet = cfg.workload("alexnet")
    assert cfg.target_of(alexnet) == (0.75, "accuracy") and cfg.target_of(cfg.workload("resnet20")) == (0.9, "accuracy")
    assert resolve(cfg.train_flags(alexnet, "1gbit") + ["--mode", "sync"]).optimizer == "adamw"


def test_eval_steps_evaluates_copies_every_n_steps_after_the_run():
    cfg = replace(load_config(CONFIG), eval_steps=2)
    flags = cfg.train_flags(cfg.workload("lenet"), "1gbit")
    assert flags[flags.index("--eval-steps") + 1] == "2" and "--eval-deferred" in flags
    assert flags[flags.index("--eval-every") + 1] == "0"
    assert resolve([*flags, "--mode", "pipe"]).eval_deferred  # flags the trainer takes


@pytest.mark.parametrize("text,needle", [
    ("nodes = 4\n", "no \\[workload"),
    ("colour = 1\n[workload.a]\nmodel='lenet'\n", "unknown keys \\['colour'\\]"),
    ("variants=['nope']\n[workload.a]\nmodel='lenet'\n", "unknown variants"),
    ("variants=['sync']\nbandwidths=['fast']\n[workload.a]\nmodel='lenet'\n", "bandwidth 'fast'"),
    ("variants=['sync']\n[workload.a]\nmodel='lenet'\nsteps={'2gbit'=3}\n", "not in the grid"),
    ("variants=['sync']\n[workload.a]\nmodel='lenet'\nshape=3\n", "unknown keys"),
    ("variants=['sync']\n[workload.a]\nmodel='lenet'\nepochs=0\n", "epochs"),
    ("variants=['sync']\nnodes=1\n[workload.a]\nmodel='lenet'\n", "nodes"),
    ("variants=['sync']\ncores_per_node=-2\n[workload.a]\nmodel='lenet'\n", "cores_per_node must be >= 0"),
    ("variants=['sync']\nburst='6 frames'\n[workload.a]\nmodel='lenet'\n", "bad size '6 frames'"),
    ("variants=['sync']\nburst=6152\n[workload.a]\nmodel='lenet'\n", "burst must be a size in quotes"),
    ("variants=['sync']\nseed=-1\n[workload.a]\nmodel='lenet'\n", "seed must be an integer >= 0"),
    ("variants=['sync']\neval_steps=-1\n[workload.a]\nmodel='lenet'\n", "eval_steps must be an integer >= 0"),
    ("variants=['sync']\n[workload.a]\nmodel='lenet'\ntarget_loss=-1\n", "target_loss must be >= 0"),
    ("variants=['sync']\n[workload.a]\nmodel='lenet'\ntarget_accuracy=1.5\n", "target_accuracy must be in"),
    ("variants=['sync']\n[workload.a]\nmodel='lenet'\nflags=[1]\n", "flags must be a list of strings"),
    ("variants=['sync'\n", "not valid TOML"),
])
def test_config_errors_name_the_problem(tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle):
        load_config(str(path))


def test_select_subsets_and_refuses_unknown_names():
    cfg = load_config(CONFIG)
    sub = select(cfg, cells=["lenet-1gbit", "alexnet-100mbit"], variants=["sync", "pipe"])
    assert [cell_name(w.name, b) for w, b in sub.cells()] == ["lenet-1gbit", "alexnet-100mbit"]
    assert sub.variants == ("sync", "pipe")
    assert split_cell("resnet20-unshaped") == ("resnet20", "unshaped")
    for kwargs, needle in (({"cells": ["lenet-2gbit"]}, "unknown cells"), ({"variants": ["x"]}, "not in the grid"),
                           ({"workloads": ["vgg"]}, "unknown workload"),
                           ({"bandwidths": ["5mbit"]}, "unknown bandwidths")):
        with pytest.raises(ValueError, match=needle):
            select(cfg, **kwargs)


@pytest.mark.parametrize("argv,needle", [
    (["--variants", "nope", "--report"], "not in the grid"),
    (["--config", "/nonexistent.toml", "--report"], "cannot read config"),
    (["--steps", "3", "--report"], "must exceed"),
    (["--report", "--result", "/nonexistent/runs.json"], "No such file"),
    (["--loopback", "--cells", "lenet-1gbit"], "--loopback runs its own loopback cells"),
    (["--loopback", "--cores-per-node", "2"], "does not apply to --loopback"),
    (["--target-loss", "0", "--report"], "--target-loss must be > 0"),
])
def test_driver_refusals_are_one_line(argv, needle):
    # in-process: every refusal comes from the flags alone, before the driver starts a run or a signal handler
    done = run_in_process(os.path.join(ROOT, "experiments", "comparison.py"), *argv, cwd=ROOT)
    assert done.returncode != 0 and needle in done.stderr and "Traceback" not in done.stderr


# ------------------------------------------------------------------------------------------------------------
# Result store: resume, replacement, provenance; the estimate
def small_cfg(tmp_path, **kw):
    return GridConfig(workloads=(Workload("lenet", "lenet", epochs=2),), bandwidths=("1gbit", "100mbit"),
                      variants=("sync", "pipe"), result=str(tmp_path / "runs.json"), **kw)


def test_store_resume_skips_ok_runs_only_and_keeps_everything_on_disk(tmp_path):
    cfg = small_cfg(tmp_path)
    store = ResultStore(cfg.result, cfg)
    store.put_run({"cell": "lenet-1gbit", "variant": "sync", "status": "ok", "t_iter_s": 0.1})
    store.put_run({"cell": "lenet-1gbit", "variant": "pipe", "status": "failed", "reason": "exit code 1"})
    again = ResultStore(cfg.result, cfg)  # a new invocation reads what the last one wrote
    assert again.done("lenet-1gbit", "sync") and not again.done("lenet-1gbit", "pipe")
    again.put_run({"cell": "lenet-1gbit", "variant": "pipe", "status": "ok", "t_iter_s": 0.05})
    data = read_result(cfg.result)
    assert [(r["variant"], r["status"]) for r in data["runs"]] == [("sync", "ok"), ("pipe", "ok")]
    assert data["provenance"]["command"] and len(data["earlier"]) == 1
    assert ResultStore(cfg.result, cfg, fresh=True).data["runs"] == []


def test_estimate_uses_measured_then_fallbacks(tmp_path):
    cfg = small_cfg(tmp_path)
    runs = [{"cell": "lenet-1gbit", "workload": "lenet", "variant": "sync", "status": "ok", "steps": 10,
             "train_wall_s": 5.0, "run_wall_s": 25.0}]
    total, rows = estimate_wall(cfg, runs, {"lenet-1gbit": {"calibration_s": 30.0}})
    by = {(r["cell"], r["variant"]): r for r in rows}
    assert by[("lenet-1gbit", "sync")]["seconds"] == pytest.approx(20 + 22 * 0.5)  # startup + 2 epochs x 11 steps
    assert by[("lenet-1gbit", "sync")]["source"] == "measured"
    assert by[("lenet-1gbit", "pipe")]["source"].startswith("same cell")
    assert by[("lenet-100mbit", "sync")]["source"].startswith("same variant")
    assert total == pytest.approx(4 * (20 + 11.0) + 2 * (8.0 + 30.0))


def test_report_from_hand_made_result(tmp_path):
    cfg = small_cfg(tmp_path)
    store = ResultStore(cfg.result, cfg)
    base = run_record(load_run(write_metrics(tmp_path / "a.jsonl")), skip=2, target=0.9)
    for variant, error in (("sync", 0.05), ("pipe", -0.2)):
        store.put_run({"cell": "lenet-1gbit", "workload": "lenet", "bandwidth": "1gbit", "variant": variant,
                       "status": "ok", **base, "model": {"predicted_s": 0.1, "measured_s": 0.1, "error": error}})
    data = read_result(cfg.result)
    assert model_summary(data)["over_flag"] == 1
    assert model_summary(data)["median_abs_error"] == pytest.approx(0.125)
    text = report(data)
    assert "| pipe | 114.5 |" in text and "Headline" in text


def test_rescore_remakes_records_from_raw_metrics_and_keeps_the_rest(tmp_path, monkeypatch):
    from experiments.harness.comparison import rescore

    monkeypatch.chdir(tmp_path)  # records hold metrics paths relative to the repository root
    cfg = small_cfg(tmp_path)
    store = ResultStore(cfg.result, cfg)
    os.makedirs("cell")
    write_metrics(tmp_path / "cell" / "sync.jsonl", t_iter=(0.20, 0.30))
    stale = {"cell": "lenet-1gbit", "workload": "lenet", "bandwidth": "1gbit", "variant": "sync", "status": "ok",
             "flags": ["--mode", "sync"], "metrics": "cell/sync.jsonl", "run_wall_s": 9.0, "t_iter_s": 1.0,
             "model": {"predicted_s": 1.0}}
    gone = {**stale, "variant": "pipe", "metrics": "cell/pipe.jsonl"}
    failed = {"cell": "lenet-1gbit", "variant": "ddp", "status": "failed", "reason": "exit code 1"}
    for record in (stale, gone, failed):
        store.put_run(record)
    assert rescore(store, skip=2, target=0.9, cells={"lenet-100mbit"}) == (0, [])  # another cell: nothing
    assert read_result(cfg.result)["runs"][0]["t_iter_s"] == 1.0
    remade, kept = rescore(store, skip=2, target=0.9)
    assert remade == 1 and len(kept) == 1 and "pipe" in kept[0] and "no raw metrics" in kept[0]
    by = {r["variant"]: r for r in read_result(cfg.result)["runs"]}
    assert by["sync"]["t_iter_s"] == pytest.approx(0.2545)  # re-read: (0.20 + 0.30) / 2 + step 4.5 ms
    assert by["sync"]["flags"] == ["--mode", "sync"] and by["sync"]["run_wall_s"] == 9.0
    assert by["sync"]["model"] is None and "no calibration" in by["sync"]["model_note"]
    assert by["pipe"] == gone and by["ddp"] == failed


def test_predict_leaves_ddp_hooks_to_a_note(tmp_path):
    for variant in MODEL_FREE:
        assert predict({variant: str(tmp_path / "x.jsonl")}, variant, str(tmp_path / "calib.json"), 2)["model"] is None
    out = predict({"sync": write_metrics(tmp_path / "a.jsonl")}, "sync", str(tmp_path / "missing.json"), 2)
    assert out["model"] is None and "not found" in out["model_note"]


def test_plots_draw_only_the_results_numbers(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.harness import comparison_plot as cp

    base = run_record(load_run(write_metrics(tmp_path / "a.jsonl")), skip=2, target=0.9)
    data = {"config": {"variants": ["sync", "pipe"], "target_accuracy": 0.9}, "cells": {},
            "runs": [{"cell": "c", "workload": "lenet", "variant": v, "status": "ok", **base,
                      "model": {"measured_s": 0.1, "predicted_s": p}} for v, p in (("pipe", 0.09), ("sync", 0.2))]
            + [{"cell": "c", "variant": "ddp", "status": "failed"}]}
    assert cp.cells(data) == ["c"] and [r["variant"] for r in cp.runs_of(data, "c")] == ["sync", "pipe"]
    fig, ax = plt.subplots()
    cp.plot_split(data, "c", ax)
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == sorted(round(1e3 * base[k], 6) for k in ("compute_s", "exposed_comm_s", "update_s")
                             for _ in range(2))
    fig2, ax2 = plt.subplots()
    cp.plot_model_scatter(data, ax2)
    offsets = sorted(tuple(o) for c in ax2.collections if hasattr(c, "get_offsets") for o in c.get_offsets()
                     if len(c.get_offsets()) == 1)
    assert (100.0, 90.0) in [tuple(round(v, 6) for v in o) for o in offsets]
    plt.close("all")
    cp.cell_figure(data, "c")
    plt.close("all")


def test_failure_hint_names_the_reason_not_the_traceback(tmp_path):
    from experiments.harness.comparison import failure_hint

    log = tmp_path / "run.log"
    log.write_text('[node 0] step 3/33\n[node 2]   File "/x/errors/__init__.py", line 3, error: no\n'
                   "[node 2] terminate called without an active exception\n[node 1] pipesgd-train: error: late\n")
    assert failure_hint(str(log)) == "[node 2] terminate called without an active exception"
    assert failure_hint(str(tmp_path / "missing.log")) == ""


def test_embedded_calibration_drops_samples_and_still_reads(tmp_path):
    from experiments.harness.comparison import embeddable_calibration
    from timing_model.calibration import read_calibration

    from timing_model.calibration import SCHEMA, Fit

    fit = Fit(overhead_s=0.0, latency_s=1e-4, bandwidth_Bps=1e8, reduce_Bps=1e9, n_samples=5,
              median_abs_rel_err=0.0, max_abs_rel_err=0.0).as_json()
    full = {"schema": SCHEMA, "fits": {"ring": fit, "backend": fit}, "codecs": {}, "host": {},
            "samples": [{"x": i} for i in range(500)], "residuals": [{"r": i} for i in range(500)]}
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(full))
    slim = embeddable_calibration(str(path))
    assert "samples" not in slim and slim["dropped"] == {"samples": 500, "residuals": 500}
    again = tmp_path / "slim.json"
    again.write_text(json.dumps(slim))
    cal = read_calibration(str(again))
    assert cal.fits["ring"].bandwidth_Bps == 1e8


def test_rounded_keeps_six_significant_digits_everywhere():
    from experiments.harness.comparison_store import rounded

    out = rounded({"a": 0.123456789, "b": [1234567.891, {"c": 1e-9 / 3}], "d": 3, "e": None, "f": "x"})
    assert out == {"a": 0.123457, "b": [1234570.0, {"c": 3.33333e-10}], "d": 3, "e": None, "f": "x"}


def test_model_ordering_counts_inversions_beyond_the_tie():
    from experiments.harness.model_ordering import cell_orderings, ordering_table

    def run(variant, measured, predicted, cell="c"):
        return {"cell": cell, "variant": variant, "status": "ok",
                "model": {"measured_s": measured, "predicted_s": predicted}}
    runs = [run("pipe", 0.10, 0.12), run("sync", 0.20, 0.11),  # 2x apart, the model says the other way
            run("ddp", 0.21, 0.30),  # 5 % from sync: a tie, not ordered; ordered against pipe and kept
            run("ps-sync", 0.5, None) | {"model": None}, run("x", 0.1, 0.1, cell="alone")]
    (cell,) = cell_orderings(runs)
    assert cell["runs"] == 3 and cell["pairs"] == 2
    assert [(f, s) for f, s, _, _ in cell["inversions"]] == [("pipe", "sync")]
    assert cell["inversions"][0][2] == pytest.approx(2.0) and cell["inversions"][0][3] == pytest.approx(0.11 / 0.12)
    text = ordering_table(runs)
    assert "| c | 3 | 2 | 1 | pipe < sync: 2.00x, model 0.92x |" in text and "1 of 2" in text


def test_orders_kept_between_two_sittings_judge_the_first_sittings_pairs_by_the_second():
    from experiments.harness.model_ordering import orders_kept_between

    def run(variant, measured, cell="c"):
        return {"cell": cell, "variant": variant, "status": "ok", "model": {"measured_s": measured, "predicted_s": 1.0}}
    first = [run("pipe", 0.10), run("sync", 0.20), run("ddp", 0.30), run("ps-sync", 0.31), run("x", 0.1, "alone")]
    # sync and ddp swap; ps-sync is 3 % from ddp in the first sitting (a tie) and not in the second at all
    second = [run("pipe", 0.11), run("sync", 0.25), run("ddp", 0.24), run("x", 0.1, "alone")]
    assert orders_kept_between(first, second) == (2, 3)  # pipe<sync and pipe<ddp kept, sync<ddp flipped
    assert orders_kept_between(second, first) == (2, 2)  # sync and ddp 4 % apart in the second: a tie there
    assert orders_kept_between(first, []) == (0, 0)

def test_model_curves_from_the_committed_result_keep_the_pipe_bounds():
    """Without host terms Pipe-SGD's speedup over sync lies in [1, 2] (max(W, T) against W + T); this machine's
    host terms (κ, κc >= 0) can only lower it."""
    from experiments.harness.model_curves import BANDWIDTHS_BPS, NODES, speedup_curves

    data = read_result(os.path.join(ROOT, "experiments", "results", "comparison", "runs.json"))
    curves = speedup_curves(data)
    assert curves, "no 1 Gbit/s cell with a calibration and a predicted sync run"
    for curve in curves.values():
        assert [b for b, _ in curve["bandwidth"]] == list(BANDWIDTHS_BPS) and [p for p, _ in curve["nodes"]] == list(NODES)
        for _, s in curve["bandwidth"] + curve["nodes"]:
            assert 1.0 - 1e-9 <= s["own"] <= 2.0 + 1e-9 and s["shared"] <= s["own"] + 1e-9


def test_loopback_quick_profile_runs_without_root(tmp_path):
    """The grid's quick profile: local ranks, no cluster, no model; the same records and tables."""
    result = tmp_path / "runs.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "comparison.py"), "--loopback",
                           "--nodes", "2", "--variants", "sync,pipe", "--steps", "8", "--out", str(tmp_path / "raw"),
                           "--result", str(result)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-2000:]
    data = read_result(str(result))
    assert [(r["cell"], r["variant"], r["status"]) for r in data["runs"]] == [
        ("lenet-loopback", "sync", "ok"), ("lenet-loopback", "pipe", "ok")]
    assert all(r["t_iter_s"] > 0 and r["model"] is None for r in data["runs"])
    assert "### lenet-loopback" in done.stdout and "not measured" in data["cells"]["lenet-loopback"]["tcp"]
