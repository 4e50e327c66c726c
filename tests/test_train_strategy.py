"""Which wrapper each mode builds, at world size 1 in this process: every one satisfies the wrapper seam."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pipesgd import PipeSGD
from pipesgd.baselines import DDPOptimizer, DiLoCo, LocalSGD, ParameterServer
from pipesgd.train.config import TrainConfig
from pipesgd.train.modes import MODES, num_workers_for
from pipesgd.train.strategy import build_strategy
from pipesgd.wrapper import OptimizerWrapper
from tests.single_process import RecordingWrapper, process_group  # noqa: F401 - a fixture

EXPECTED = {"pipe": PipeSGD, "sync": PipeSGD, "ddp": DDPOptimizer, "ps-sync": ParameterServer,
            "ps-async": ParameterServer, "localsgd": LocalSGD, "diloco": DiLoCo}


def test_every_mode_has_a_wrapper():
    assert set(MODES) == set(EXPECTED)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_mode_builds_its_wrapper_behind_the_seam(mode, process_group):  # noqa: F811
    model = nn.Linear(4, 2)
    strategy = build_strategy(TrainConfig(mode=mode, optimizer="adam"), model, torch.device("cpu"))
    try:
        assert type(strategy.opt) is EXPECTED[mode] and isinstance(strategy.opt, OptimizerWrapper)
        assert isinstance(strategy.opt.param_groups, list) and "betas" in strategy.opt.param_groups[0]  # adam
        assert (strategy.worker_rank, strategy.num_workers, strategy.is_server_only) == (0, 1, False)
        assert strategy.is_leader and strategy.serve is None
        forward_ddp = isinstance(strategy.forward_model, DistributedDataParallel)
        assert forward_ddp == (mode in ("ddp", "localsgd")) and (forward_ddp or strategy.forward_model is model)
        if mode == "pipe":
            assert strategy.opt.width == 2
        if mode == "sync":
            assert strategy.opt.width == 1  # sync is width 1 whatever --width says
        nn.functional.mse_loss(strategy.forward_model(torch.ones(3, 4)), torch.zeros(3, 2)).backward()
        stats = strategy.opt.step()
        strategy.opt.zero_grad()
        assert stats.step == 0 and isinstance(strategy.opt.flush(), list)
    finally:
        strategy.opt.close()


def test_a_class_without_flush_is_not_a_wrapper():
    class NoFlush(RecordingWrapper):
        flush = None

    assert not isinstance(NoFlush(), OptimizerWrapper)


def test_workers_leave_out_dedicated_servers():
    assert num_workers_for("ps-sync", 1, 4) == 3
    assert num_workers_for("ps-async", 0, 4) == 4
    assert num_workers_for("pipe", 0, 4) == 4


@pytest.mark.parametrize("allreduce, compression, runs", [("ring", "q8", "ring"), ("alltoall", "q8", "alltoall"),
                                                         ("auto", "q8", "alltoall"), ("auto", "none", "backend")])
def test_allreduce_reaches_the_wrapper(allreduce, compression, runs, process_group):  # noqa: F811
    config = TrainConfig(mode="pipe", allreduce=allreduce, compression=compression,
                         error_feedback=compression != "none")
    strategy = build_strategy(config, nn.Linear(4, 2), torch.device("cpu"))
    try:
        assert strategy.opt.allreduce == runs
    finally:
        strategy.opt.close()
