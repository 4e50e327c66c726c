"""End-to-end runs of pipesgd-train with 2 processes on CPU (gloo): every mode learns digits, sync matches
DDP step by step, resume continues the identical trajectory, Muon trains the GPT under look-ahead, and a dead or
hung rank fails the others with one clear line within the timeout.

Workers are started the way torchrun starts them (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT env), which
saves torchrun's agent start-up on this 2-core box; one test goes through torchrun itself.
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from pipesgd import auto

pytestmark = pytest.mark.slow

WORLD = 2
# 5 epochs of batch 32 per worker on digits = 110 steps at 2 workers; every mode reaches ~96 %.
TRAIN_ARGS = ["--epochs", "5", "--eval-every", "0", "--timeout", "60"]
STEPS = 110
MIN_ACCURACY = 0.90
RUN_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def launch(args: list[str], world: int = WORLD, env: dict | None = None, timeout_s: float = RUN_TIMEOUT_S,
           stop_when_rank0_exits: bool = False):
    """Start ``world`` ranks of ``python -m pipesgd.train args``; return [(returncode, stdout, stderr)] by rank.

    ``stop_when_rank0_exits`` kills the others once rank 0 is done (a frozen rank never exits by itself);
    their return code is then None.
    """
    port = _free_port()
    procs, logs = [], []
    deadline = time.monotonic() + timeout_s
    for rank in range(world):
        rank_env = _clean_env(env)
        rank_env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        logs.append((out, err))
        procs.append(subprocess.Popen([sys.executable, "-m", "pipesgd.train", *args], env=rank_env,
                                      stdout=out, stderr=err, text=True))
    try:
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p in procs) or (stop_when_rank0_exits and procs[0].poll() is not None):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"ranks did not finish within {timeout_s} s")
    finally:
        codes = [p.poll() for p in procs]
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for code, (out, err) in zip(codes, logs):
        out.seek(0)
        err.seek(0)
        results.append((code, out.read(), err.read()))
        out.close()
        err.close()
    return results


def records(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def step_losses(path: str) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(path) if r["type"] == "step"}


def final_accuracy(path: str) -> float:
    return [r for r in records(path) if r["type"] == "eval"][-1]["accuracy"]


MODES = {
    "sync": ["--mode", "sync"],
    "pipe": ["--mode", "pipe"],
    "ddp": ["--mode", "ddp"],
    "ps-sync": ["--mode", "ps-sync"],
    "ps-async": ["--mode", "ps-async", "--push-every", "2"],
    "localsgd": ["--mode", "localsgd", "--sync-every", "4"],
    # DiLoCo's inner optimizer is AdamW, as in the paper (inner momentum SGD under the outer Nesterov step learns
    # digits more slowly in this budget); period 7 puts the resume test's step-20 checkpoint (2 periods and 6 steps)
    # where a pseudo-gradient is in flight
    "diloco": ["--mode", "diloco", "--sync-every", "7", "--sync-delay", "1", "--optimizer", "adamw", "--lr", "0.003"],
}


@pytest.fixture(scope="module")
def mode_runs(tmp_path_factory):
    """One training run per mode (metrics paths by mode), shared by the tests below."""
    out = tmp_path_factory.mktemp("runs")
    cache = {}

    def get(mode: str) -> str:
        if mode not in cache:
            if mode.startswith("ps-"):
                pytest.importorskip("pipesgd.baselines.parameter_server",
                                    reason="the parameter-server baseline is not importable yet")
            (out / mode).mkdir()  # a folder per run: what a run writes, and nothing else, is there
            metrics = str(out / mode / f"{mode}.jsonl")
            if mode == "pipe":  # the README's launcher, once
                proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
                                       "--master-port", str(_free_port()), "-m", "pipesgd.train", *MODES[mode],
                                       *TRAIN_ARGS, "--metrics", metrics],
                                      env=_clean_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
                assert proc.returncode == 0, proc.stderr
                assert "test accuracy" in proc.stdout and "iterations/s" in proc.stdout
                (out / f"{mode}.stdout").write_text(proc.stdout)  # what the user reads, beside the run's folder
            else:
                for rc, _, err in launch([*MODES[mode], *TRAIN_ARGS, "--metrics", metrics]):
                    assert rc == 0, err
            cache[mode] = metrics
        return cache[mode]

    return get


@pytest.mark.parametrize("mode", list(MODES))
def test_mode_learns_digits(mode, mode_runs):
    metrics = mode_runs(mode)
    rank0 = metrics.replace(".jsonl", ".rank0.jsonl")
    config = records(rank0)[0]
    assert config["type"] == "config" and config["world_size"] == WORLD and config["mode"] == mode
    assert config["params"] > 0 and config["grad_bytes"] == 4 * config["params"]
    # what averaged the buckets ("auto" without a codec: the backend's all_reduce); the other modes have none
    assert config["allreduce"] == ("backend" if mode in ("sync", "pipe") else None)
    assert final_accuracy(rank0) >= MIN_ACCURACY
    summary = records(rank0)[-1]
    assert summary["type"] == "summary" and summary["iters_per_s"] > 0
    # every rank wrote its own step records with the contract fields
    for rank in range(WORLD):
        steps = [r for r in records(metrics.replace(".jsonl", f".rank{rank}.jsonl")) if r["type"] == "step"]
        assert len(steps) == STEPS and {r["rank"] for r in steps} == {rank}
        assert all(r["t_iter"] >= r["t_compute"] >= 0 and r["bytes_sent"] >= 0 for r in steps)
        assert all(r["t_cpu"] >= 0 for r in steps) and sum(r["t_cpu"] for r in steps) > 0  # computing costs CPU
    assert os.path.exists(metrics.replace(".jsonl", ".config.json"))


def test_the_pipe_run_ends_with_one_final_result_and_what_pipe_sgd_did(mode_runs):
    metrics = mode_runs("pipe")
    stdout = open(os.path.join(os.path.dirname(os.path.dirname(metrics)), "pipe.stdout")).read()
    summary = records(metrics.replace(".jsonl", ".rank0.jsonl"))[-1]
    finals = [line for line in stdout.splitlines() if line.startswith("done:")]
    assert len(finals) == 1 and stdout.count("test accuracy") == 1, stdout  # --eval-every 0: the final result alone
    assert f"test accuracy {100 * summary['accuracy']:.1f} % (loss {summary['test_loss']:.4f})" in finals[0]
    # the words come from the summary's own figures: the exchange per step and the part the step waited for
    hidden_ms = 1000 * max(summary["t_comm_busy"] - summary["t_wait"], 0.0)
    overlap = [line for line in stdout.splitlines() if line.startswith("Pipe-SGD: ")]
    assert len(overlap) == 1 and f"of its {1000 * summary['t_comm_busy']:.2f} ms per step" in overlap[0], stdout
    assert f"{hidden_ms:.2f} ms of its" in overlap[0]
    assert summary["local_ranks"] == WORLD and summary["cpu_cores"] >= 1


def test_no_trace_file_without_the_flag(mode_runs):
    """The pipe run above, launched without --trace, wrote its metrics and config and no trace file."""
    folder = os.path.dirname(mode_runs("pipe"))
    assert sorted(os.listdir(folder)) == ["pipe.config.json", "pipe.rank0.jsonl", "pipe.rank1.jsonl"]


def test_sync_matches_ddp_step_by_step(mode_runs):
    # Both average the same two fp32 gradients each step and apply them with the same SGD; on 2 ranks
    # they agree bitwise in practice. DDP divides before its allreduce and the ring after, which may
    # differ by an ulp per element; over 100 steps that stays far below rtol 1e-4.
    sync = step_losses(mode_runs("sync").replace(".jsonl", ".rank0.jsonl"))
    ddp = step_losses(mode_runs("ddp").replace(".jsonl", ".rank0.jsonl"))
    for step in range(100):
        assert ddp[step] == pytest.approx(sync[step], rel=1e-4), step


def _assert_lost_peer_line(stderr: str, timeout_s: int) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("pipesgd-train: error: rank 0: lost connection to peer rank 1"), stderr
    assert f"timeout {timeout_s} s" in lines[0], stderr


@pytest.mark.parametrize("mode", ["sync", "pipe", "diloco"])
def test_rank_dies_then_resume_continues_identical_trajectory(mode, mode_runs, tmp_path):
    """Rank 1 exits abruptly at step 25; --resume from the step-20 checkpoint then reproduces the
    uninterrupted run's losses exactly. sync and diloco: started by hand, rank 0 must fail with the clear line, then
    a second launch resumes. pipe: ``torchrun --max-restarts 1 ... --resume`` recovers by itself (the
    first attempt starts fresh because no checkpoint exists yet)."""
    reference = mode_runs(mode)
    ckpt, metrics = str(tmp_path / "ckpt"), str(tmp_path / "resumed.jsonl")
    args = [*MODES[mode], *TRAIN_ARGS, "--timeout", "8", "--checkpoint", ckpt, "--checkpoint-every", "10",
            "--metrics", metrics, "--resume"]
    die = {"PIPESGD_TEST_DIE_AT_STEP": "1:25"}
    if mode == "pipe":
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
                               "--max-restarts", "1", "--master-port", str(_free_port()), "-m", "pipesgd.train",
                               *args], env=_clean_env(die), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
        stdout = proc.stdout
    else:
        (rc0, _, err0), (rc1, _, _) = launch(args, env=die, timeout_s=120)
        assert (rc0, rc1) == (1, 17), err0
        _assert_lost_peer_line(err0, 8)
        results = launch(args)
        for rc, _, err in results:
            assert rc == 0, err
        stdout = results[0][1]
    assert "resumed from" in stdout and "at step 20" in stdout, stdout
    for rank in range(WORLD):
        want = step_losses(reference.replace(".jsonl", f".rank{rank}.jsonl"))
        got = step_losses(metrics.replace(".jsonl", f".rank{rank}.jsonl"))  # resumed records come last
        assert got == want  # identical floats at every step, before and after the resume
    assert final_accuracy(metrics.replace(".jsonl", ".rank0.jsonl")) == final_accuracy(
        reference.replace(".jsonl", ".rank0.jsonl"))


def test_the_language_model_task_runs_alone(tmp_path):
    """gpt on pysrc with AdamW and a cosine schedule, launched as a user would at world size 1: the corpus is named
    on the startup line and in the config record, and the held-out loss is per token, below ln(97) = 4.57."""
    metrics = str(tmp_path / "lm.jsonl")
    ((rc, out, err),) = launch(["--dataset", "pysrc", "--model", "gpt", "--optimizer", "adamw", "--lr", "1e-3",
                                "--lr-schedule", "cosine", "--lr-warmup-steps", "2", "--steps", "6",
                                "--batch-size", "8", "--metrics", metrics], world=1)
    assert rc == 0, err
    config = records(metrics)[0]
    assert config["lr_schedule"] == "cosine" and config["num_classes"] == 97 and config["input_shape"] == [64]
    assert f"files {config['dataset_source']['files']}, chars 1000000, sha256 " in out
    final = [r for r in records(metrics) if r["type"] == "eval"][-1]
    assert 0.15 < final["accuracy"] < 0.6 and final["loss"] < 4.0  # the space alone is ~17 % of the characters


def test_muon_trains_the_language_model_at_width_two_with_lookahead(tmp_path):
    """--optimizer muon (torch's Muon on the GPT's block matrices, AdamW on the rest) on 2 ranks at the default
    width 2 with look-ahead, the replicas compared after every step: every loss finite and the held-out loss per
    token below ln(97) = 4.57."""
    metrics = str(tmp_path / "muon.jsonl")
    results = launch(["--dataset", "pysrc", "--model", "gpt", "--optimizer", "muon", "--lr", "1e-3",
                      "--weight-decay", "0.1", "--steps", "8", "--batch-size", "8", "--eval-every", "0",
                      "--check-replicas", "1", "--timeout", "60", "--metrics", metrics])
    for rc, _, err in results:
        assert rc == 0, err
    assert "mode pipe (width 2, staleness lookahead)" in results[0][1]
    for rank in range(WORLD):
        losses = step_losses(metrics.replace(".jsonl", f".rank{rank}.jsonl"))
        assert sorted(losses) == list(range(8)) and all(math.isfinite(v) for v in losses.values())
    final = [r for r in records(metrics.replace(".jsonl", ".rank0.jsonl")) if r["type"] == "eval"][-1]
    assert final["loss"] < 4.0


def test_hung_rank_fails_the_others_within_timeout():
    """Rank 1 freezes (SIGSTOP) at step 20: rank 0 stops within the timeout plus a short grace, naming it."""
    timeout_s = 6
    results = launch(["--mode", "pipe", "--steps", "100", "--timeout", str(timeout_s)],
                     env={"PIPESGD_TEST_HANG_AT_STEP": "1:20"}, timeout_s=90, stop_when_rank0_exits=True)
    rc0, _, err0 = results[0]
    assert rc0 == 1 and results[1][0] is None  # rank 1 was still frozen
    _assert_lost_peer_line(err0, timeout_s)


def test_four_processes_with_a_compressed_ring(tmp_path):
    """The main job's shape at 4 processes (p > 2: real ring neighbours), q8 on every hop with feedback."""
    metrics = str(tmp_path / "q8.jsonl")
    # 8 epochs (88 steps at 4 workers): with fewer this world ends too close to MIN_ACCURACY
    results = launch(["--compression", "q8", "--error-feedback", *TRAIN_ARGS, "--epochs", "8", "--metrics", metrics],
                     world=4, timeout_s=300)
    for rc, _, err in results:
        assert rc == 0, err
    assert "test accuracy" in results[0][1]
    assert final_accuracy(metrics.replace(".jsonl", ".rank0.jsonl")) >= MIN_ACCURACY
    steps = [r for r in records(metrics.replace(".jsonl", ".rank3.jsonl")) if r["type"] == "step"]
    assert max(r["compression_ratio"] for r in steps) > 3.5  # q8 really ran: ~4x fewer bytes


def test_width_and_compression_auto_print_their_choice_and_record_it(tmp_path):
    """--width auto --compression auto (issue 39): the warm-up's last step chooses on every rank alike; rank 0
    prints the one line, the step that chose and the summary record keep it, and the run trains. A width above 1
    may be held against the warm-up 3 to 6 steps on and go back to width 1 with the warm-up's codec, none or the
    provisional one (it depends on the host's timing): then one more line and record, and the summary keeps that
    last choice."""
    metrics = str(tmp_path / "auto.jsonl")
    results = launch(["--width", "auto", "--compression", "auto", "--epochs", "2", "--eval-every", "0",
                      "--timeout", "60", "--metrics", metrics])
    for rc, _, err in results:
        assert rc == 0, err
    rank0 = records(metrics.replace(".jsonl", ".rank0.jsonl"))
    summary = [r for r in rank0 if r["type"] == "summary"][-1]
    choice = summary["auto_choice"]
    held = choice["reason"].startswith("held against the warm-up")
    assert results[0][1].count("PipeSGD auto chose width ") == 1 + held and "chose" not in results[1][1]
    assert choice["width"] in (1, 2, 3) and choice["compression"] in ("none", "bf16", "q8", "q4") and choice["reason"]
    assert f"mode pipe (width auto: {choice['width']}" in results[0][1]
    chose = [(r["step"], r["auto_choice"]) for r in rank0 if r["type"] == "step" and r.get("auto_choice")]
    # A provisional codec for the rest of the warm-up may come first, at step 0 (it depends on the host's timing);
    # then its steps alternate the exchange and the ring (pipesgd.auto.allreduce_trial), one record per switch.
    warmup = [(step, label) for step, label in chose if label.startswith("warm-up: ")]
    provisional = {label.removeprefix("warm-up: ").rsplit(", ", 1)[0] for _, label in warmup}
    assert len(provisional) <= 1 and all(step < choice["step"] for step, _ in warmup)
    if warmup:
        assert warmup[0][0] == 0
        assert [label.rsplit(", ", 1)[1] for _, label in warmup] == ["alltoall", "ring"] * (len(warmup) // 2) + (
            ["alltoall"] if len(warmup) % 2 else [])
    codec = choice["compression"] + (" + error feedback" if choice["error_feedback"] else "")
    trial = choice["compression"] != "none" and provisional == {codec} and len(warmup) > 1  # its verdict counts
    label = f"width {choice['width']}, {codec}" + (f", {choice['allreduce']}" if trial else "")
    after = [entry for entry in chose if entry not in warmup]
    if held:  # the warm-up's choice, a width above 1, then width 1 with its codec 3 to 6 steps on (pipesgd.auto.hold)
        (first_step, first), hold = after
        back = next(iter(provisional), "none")  # what the warm-up's synchronous steps ran
        assert hold[0] == choice["step"] and hold[1] in (f"width 1, {back}", f"width 1, {back}, {choice['allreduce']}")
        assert codec == back and first_step + auto.EARLY_HOLD_STEPS <= choice["step"] <= first_step + auto.CONFIRM_STEPS
        assert first.startswith("width ") and not first.startswith("width 1,")
        assert choice["allreduce"] == "backend" if back == "none" else choice["allreduce"] in ("alltoall", "ring")
        return
    assert after == [(choice["step"], label)]
    if choice["compression"] == "none":
        assert choice["allreduce"] == "backend"
    elif trial:
        assert choice["allreduce"] in ("alltoall", "ring") and "all-reduce: " + choice["allreduce"] in choice["reason"]
    else:
        assert choice["allreduce"] == "alltoall"  # the rule where payloads are not staged


def test_a_shared_stand_in_is_named_and_its_wait_counted_as_communication(tmp_path):
    """--lookahead-standin coarse-lowrank: the summary line names it, every step after the pipeline fills
    records the forward pass's wait for it, and that wait is in t_wait, not t_compute."""
    metrics = str(tmp_path / "coarse.jsonl")
    results = launch(["--lookahead-standin", "coarse-lowrank", "--epochs", "1", "--eval-every", "0", "--timeout", "60",
                      "--metrics", metrics])
    for rc, _, err in results:
        assert rc == 0, err
    assert "staleness lookahead (coarse-lowrank stand-in)" in results[0][1]
    steps = [r for r in records(metrics.replace(".jsonl", ".rank1.jsonl")) if r["type"] == "step"]
    waits = [r for r in steps if "t_standin_wait" in r]
    assert len(waits) >= len(steps) - 12  # all but the warm-up's and the first after it
    assert all(0 <= r["t_standin_wait"] <= r["t_wait"] + 1e-9 for r in waits)
