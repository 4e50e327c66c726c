"""The GPU path's logic, tested on CPU (issue 13, part 1): the batched send/recv exchange NCCL needs gives
the bits of gloo's posted one, a non-finite residual is reset in order with the background rings, private
groups are destroyed on close, host staging reuses its buffers, codecs keep their bits without host syncs."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD
from pipesgd.comm.channel import open_private_channel
from pipesgd.compression import ErrorFeedback, build
from pipesgd.compression.sign import _bit_weights
from pipesgd.comm.exchange import GradientExchange
from pipesgd.comm.ring import RingTopology, ring_allreduce_
from pipesgd.comm.topology import HostStaging
from tests.distributed import run_ranks
from tests.fake_topology import LoopbackTopology

CODECS = ("none", "fp16", "bf16", "q8", "q4", "sign")
SIZES = (0, 3, 1_000, 600_001)  # the last one travels in several pieces per hop


def _posted_and_batched(rank: int, world: int):
    """Every codec's ring through both exchange primitives; returns (codec, size, same bits, batched used)."""
    posted, batched = RingTopology(dist.group.WORLD), RingTopology(dist.group.WORLD, batched=True)
    rows = []
    for name in CODECS:
        for numel in SIZES:
            g = torch.Generator().manual_seed(100 * rank + numel)
            x = torch.randn(numel, generator=g) * (rank + 1)
            a, b = x.clone(), x.clone()
            ring_allreduce_(a, build(name), posted, "mean")
            ring_allreduce_(b, build(name), batched, "mean")
            rows.append((name, numel, torch.equal(a, b)))
    return rows, posted.batched, batched.batched


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_the_batched_exchange_gives_the_bits_of_the_posted_one(world):
    for rows, posted_batched, batched_batched in run_ranks(_posted_and_batched, world):
        assert not posted_batched and batched_batched  # gloo picks the posted one unless told
        assert [row for row in rows if not row[2]] == []


# ------------------------------------------------------------------ error feedback after a non-finite step
RESET_DELAY_S = 0.005


def _skips_with_a_slow_reset(rank: int, world: int):
    """q8 + error feedback, a NaN on rank 1 at step 2, nonfinite="skip", and every residual reset delayed by
    5 ms: a reset that is not ordered with the background ring lets ring 3 fold in the NaN residual."""
    original = ErrorFeedback.reset

    def slow_reset(self, nonfinite_only: bool = False) -> None:
        time.sleep(RESET_DELAY_S)
        original(self, nonfinite_only)

    ErrorFeedback.reset = slow_reset
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0, compression="q8",
                  error_feedback=True, options=PipeSGDOptions(nonfinite="skip"))
    skipped = []
    for t in range(7):
        g = torch.Generator().manual_seed(10 * t + rank)
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        if t == 2 and rank == 1:
            x[0, 0] = float("nan")
        nn.functional.mse_loss(model(x), y).backward()
        skipped.append(opt.step().skipped_nonfinite)
        opt.zero_grad()
    skipped += [s.skipped_nonfinite for s in opt.flush()]
    opt.close()
    return skipped, all(bool(torch.isfinite(p).all()) for p in model.parameters())


@pytest.mark.slow
def test_a_nonfinite_step_skips_only_itself_even_when_the_reset_is_slow():
    for skipped, finite in run_ranks(_skips_with_a_slow_reset, 2):
        # step() at t applies step t-1: only step 2's gradient (applied at t = 3) is skipped.
        assert skipped == [False, False, False, True, False, False, False, False] and finite


def test_the_exchange_zeroes_a_nonfinite_residual_before_the_next_ring():
    feedback = ErrorFeedback(build("q8", block_size=4))
    exchange = GradientExchange(LoopbackTopology(), feedback.compressor, "ring", feedback)
    bucket = torch.linspace(-1, 1, 10)
    poisoned = bucket.clone()
    poisoned[3] = float("nan")
    first = exchange([poisoned])
    assert not first.finite and first.residual_norm != first.residual_norm  # NaN reported ...
    assert torch.equal(feedback.residual(0, bucket), torch.zeros(10))  # ... and reset before the next ring
    second = exchange([bucket.clone()])
    assert second.finite and 0 < second.residual_norm < 1  # q8 dropped a little, kept for the ring after


# ------------------------------------------------------------------ private groups, staging, codecs
def _closing_destroys_the_private_group(rank: int, world: int):
    channel = open_private_channel(None, torch.device("cpu"))
    group = channel.topology.group
    before = group in dist.distributed_c10d._world.pg_map
    # a peer may still be connecting to the new gloo group; destroying it at once closed that connection
    # ("Connection closed by peer") in about 3 % of runs on a loaded 2-core box
    dist.barrier()
    channel.close()
    channel.close()  # idempotent
    return before, group in dist.distributed_c10d._world.pg_map


@pytest.mark.slow
def test_closing_a_private_channel_destroys_its_group():
    for before, after in run_ranks(_closing_destroys_the_private_group, 2):
        assert before and not after


def _closing_pipesgd_destroys_its_groups(rank: int, world: int, check_uneven: bool):
    groups = set(dist.distributed_c10d._world.pg_map)
    model = nn.Linear(3, 2)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model,
                  options=PipeSGDOptions(check_uneven=check_uneven))
    opened = len(set(dist.distributed_c10d._world.pg_map) - groups)
    dist.barrier()  # every rank connected to the new groups before any destroys them (as above)
    opt.close()
    return opened, set(dist.distributed_c10d._world.pg_map) == groups


@pytest.mark.parametrize("check_uneven, opened", [(True, 2), (False, 1)])
@pytest.mark.slow
def test_closing_pipesgd_destroys_the_ring_and_agreement_groups(check_uneven, opened):
    """The ring's private group, and with ``check_uneven`` the agreement's own group, are gone after ``close()``."""
    assert run_ranks(_closing_pipesgd_destroys_its_groups, 2, check_uneven) == [(opened, True)] * 2


def test_host_staging_reuses_a_slot_and_grows_it_on_demand():
    staging = HostStaging(pinned=False)
    a = staging.slot("recv", 0, 100, torch.uint8)
    assert staging.slot("recv", 0, 60, torch.uint8).data_ptr() == a.data_ptr()
    assert staging.slot("send", 0, 60, torch.uint8).data_ptr() != a.data_ptr()  # directions apart
    assert staging.slot("recv", 1, 60, torch.uint8).data_ptr() != a.data_ptr()  # pieces apart
    bigger = staging.slot("recv", 0, 200, torch.uint8)
    assert bigger.numel() == 200 and staging.slot("recv", 0, 150, torch.uint8).data_ptr() == bigger.data_ptr()


def test_the_sign_bit_weights_are_built_once_per_device():
    weights = _bit_weights(torch.device("cpu"))
    assert weights is _bit_weights(torch.device("cpu"))
    assert weights.tolist() == [1, 2, 4, 8, 16, 32, 64, 128]


@pytest.mark.parametrize("bits", ["q8", "q4"])
def test_quantizer_keeps_nan_scales_and_zero_codes_for_bad_blocks_on_every_path(bits, monkeypatch):
    """The masked path (taken on CUDA, where asking ``bad.any()`` would sync) gives the bytes of the CPU one."""
    import pipesgd.compression.quantize as quantize

    x, clean = torch.randn(1000), torch.randn(1000)
    x[5], x[300] = float("inf"), float("nan")
    codec = build(bits, block_size=64)
    expected, expected_clean = codec.compress(x)[0], codec.compress(clean)[0]
    monkeypatch.setattr(quantize, "_ask_before_masking", lambda tensor: False)
    masked, ctx = codec.compress(x)
    assert torch.equal(masked, expected) and torch.equal(codec.compress(clean)[0], expected_clean)
    decoded = codec.decompress(masked, ctx)
    assert torch.isnan(decoded[:64]).all() and torch.isnan(decoded[256:320]).all()
    assert torch.isfinite(decoded[64:256]).all()


# ------------------------------------------------------------------ the trainer: GPU count, compute timing
def test_more_ranks_than_gpus_with_nccl_is_one_line_and_exit_2(monkeypatch, capsys):
    from pipesgd.train.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert main(["--device", "cuda"]) == 2  # the backend defaults to nccl on cuda
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesgd-train: error: 4 ranks on this node but 1 GPU(s)"), err
    assert "--backend gloo" in err


def test_the_gpu_check_passes_one_rank_per_gpu_and_anything_on_gloo_or_cpu():
    from pipesgd.train.cli import check_gpus
    from pipesgd.train.config import ConfigError, TrainConfig

    nccl = TrainConfig(device="cuda")
    check_gpus(nccl, 2, 2)
    check_gpus(TrainConfig(device="cuda", backend="gloo"), 4, 1)
    check_gpus(TrainConfig(), 4, 0)
    with pytest.raises(ConfigError, match="3 ranks on this node but 2 GPU"):
        check_gpus(nccl, 3, 2)


def test_ranks_share_gpus_round_robin_on_gloo_and_nccl_refuses_sharing(monkeypatch):
    # The calibration used LOCAL_RANK as the GPU index: 4 ranks on one H100 died with "invalid device ordinal".
    from pipesgd.launch import rank_gpu

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [rank_gpu(r, "gloo", 4).index for r in range(4)] == [0, 1, 0, 1]
    assert rank_gpu(1, "nccl", 2) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="4 ranks on this node but 2 GPU.*--backend gloo"):
        rank_gpu(0, "nccl", 4)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="no GPU is visible"):
        rank_gpu(0, "gloo", 1)


def test_the_compute_timer_reads_the_wall_clock_on_cpu(monkeypatch):
    from pipesgd.train import step_timer

    ticks = iter([10.0, 12.5])
    monkeypatch.setattr(step_timer.time, "perf_counter", lambda: next(ticks))
    timer = step_timer.ComputeTimer("cpu")
    timer.start()
    assert timer.stop() == 2.5
    step_timer.wait_for_compute("cpu")  # nothing queued on a CPU: returns at once
