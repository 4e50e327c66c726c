"""PipeSGD's own logic at world size 1, without processes: its options, which step's gradient each step
applies and when it waits, and what its state holds (the handle-level layer of the tests)."""
from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch import nn

from pipesgd import PipeSGD
from pipesgd.comm.topology import RingTopology
from pipesgd.defaults import BUCKET_MB, WARMUP_STEPS
from pipesgd.options import PipeSGDOptions, WrapperConfig
from tests.wrap import split_options, wrap
from tests.fake_handles import RecordingWork
from tests.test_pipeline import expected_due
from tests.test_pipesgd import batch, make_model, reference_trajectory, snapshot
from tests.single_process import process_group  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("process_group")  # PipeSGD needs a process group: one rank


def backward(model: nn.Module, t: int) -> None:
    x, y = batch(t, 0)
    nn.functional.mse_loss(model(x), y).backward()


# ------------------------------------------------------------------------------------------- options
def test_options_defaults_come_from_their_owner_and_are_frozen():
    config = WrapperConfig()
    assert config.warmup_steps == WARMUP_STEPS and config.bucket_mb == BUCKET_MB
    assert config.bucket_bytes == int(BUCKET_MB * 2**20)
    assert config.options == PipeSGDOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.width = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.options.nonfinite = "skip"


def test_the_constructor_takes_at_most_ten_parameters_and_the_rest_are_options():
    taken = [name for name in inspect.signature(PipeSGD.__init__).parameters if name != "self"]
    assert len(taken) <= 10 and taken[-1] == "options"
    assert not set(taken) & {f.name for f in dataclasses.fields(PipeSGDOptions)}  # one place for each knob


def test_options_keep_a_private_copy_of_the_codec_options():
    given = {"stochastic": True, "seed": 3}
    options = PipeSGDOptions(compression_options=given)
    given["seed"] = 99
    assert options.compression_options == {"stochastic": True, "seed": 3}


def _config(kwargs: dict) -> WrapperConfig:
    own, options = split_options(kwargs)
    return WrapperConfig(**own, options=options)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"check_replicas_every": -1}, "check_replicas_every"),
        ({"compression": "q8", "compression_options": {"block_size": 0}}, "block_size"),
        ({"compression": "none", "compression_options": {"seed": 1}}, "bad options"),
        ({"compression": "none", "error_feedback": True}, "needs a lossy compression"),
        ({"staleness": "predict"}, "staleness must be one of"),
        ({"init_sync": 1}, "init_sync must be True or False"),
    ],
)
def test_options_refuse_what_the_wrapper_cannot_run(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _config(kwargs)


def test_options_resolve_the_allreduce_and_seed_the_codec_per_rank():
    lossless, lossy = WrapperConfig(), _config(dict(compression="q8", compression_options={"stochastic": True}))
    assert lossless.allreduce_for(lossless.build_compressor()) == "backend"
    assert lossy.allreduce_for(lossy.build_compressor()) == "alltoall"  # "auto": each contribution encoded once
    # gloo carrying CUDA tensors (payloads staged through host memory): "auto" takes the ring, which ran faster there
    assert lossy.allreduce_for(lossy.build_compressor(), staged=True) == "ring"
    assert lossless.allreduce_for(lossless.build_compressor(), staged=True) == "backend"
    for choice in ("ring", "alltoall"):
        forced = _config(dict(compression="q8", allreduce=choice))
        for staged in (False, True):
            assert forced.allreduce_for(forced.build_compressor(), staged) == choice
    assert lossy.build_compressor(rank=0).seed != lossy.build_compressor(rank=1).seed


def test_the_exchange_built_for_gradients_staged_through_the_host_runs_the_ring():
    topology = RingTopology(None)
    topology._stage_on_host = True  # what gloo sets: its collectives read host memory
    config = WrapperConfig(compression="q8")
    assert config.build_exchange(topology, 0, torch.device("cuda")).allreduce == "ring"
    assert config.build_exchange(topology, 0, torch.device("cpu")).allreduce == "alltoall"


# -------------------------------------------------------------------------------- the delayed apply
@pytest.mark.parametrize("width, warmup", [(1, 0), (2, 0), (2, 3), (3, 2)])
def test_each_step_applies_the_due_gradient_and_flush_the_rest(width, warmup):
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=width, warmup_steps=warmup)
    applied = []
    for t in range(8):
        backward(model, t)
        applied.append(opt.step().applied_step)
        opt.zero_grad()
        assert opt.last_stats.applied_step == applied[-1]
    assert applied == [expected_due(t, width, warmup) for t in range(8)]
    flushed = [s.applied_step for s in opt.flush()]
    assert [s for s in applied if s is not None] + flushed == list(range(8))
    assert opt.in_flight == 0 and opt.flush() == []


class RecordingChannel:
    """Stands in for the ring's channel: each job runs only when its handle is waited for."""

    size = 1

    def __init__(self) -> None:
        self.submitted, self.waited = 0, []

    def submit(self, fn, *args):
        name, self.submitted = self.submitted, self.submitted + 1
        return RecordingWork(name, lambda: fn(*args), self.waited)

    def close(self) -> None:
        pass


def test_step_waits_only_for_the_step_that_is_due():
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=3, warmup_steps=1)
    opt._parts.channel = channel = RecordingChannel()
    waited_after_step = []
    for t in range(5):
        backward(model, t)
        opt.step()
        opt.zero_grad()
        waited_after_step.append(list(channel.waited))
    assert waited_after_step == [[0], [0], [0], [0, 1], [0, 1, 2]]
    opt.flush()
    assert channel.waited == [0, 1, 2, 3, 4]


def test_lazy_rings_give_the_reference_trajectory():
    """Waiting late changes nothing: the weights follow the single-process reference bit for bit."""
    width, warmup, steps = 2, 2, 8
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4), model,
                  width=width, warmup_steps=warmup, staleness="none")  # the reference is the plain delayed update
    opt._parts.channel = RecordingChannel()
    sched = torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=4, gamma=0.5)
    got = []
    for t in range(steps):
        backward(model, t)
        opt.step()
        opt.zero_grad()
        sched.step()
        got.append(snapshot(model))
    opt.flush()
    got.append(snapshot(model))
    want = reference_trajectory(1, width, warmup, "sgd", steps)
    for a, b in zip(got, want):
        for g, w in zip(a, b):
            assert torch.equal(g, w)


# ------------------------------------------------------------------------------------------- state
def count_keys(tree, key: str) -> int:
    if isinstance(tree, dict):
        return sum((k == key) + count_keys(v, key) for k, v in tree.items())
    if isinstance(tree, (list, tuple)):
        return sum(count_keys(v, key) for v in tree)
    return 0


def test_state_saves_the_codec_random_state_once_and_restores_it():
    model = make_model()
    options = dict(width=2, warmup_steps=0, compression="q8", error_feedback=True,
                   compression_options={"stochastic": True})
    opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, **options)
    codec = opt._parts.exchange.compressor
    codec.compress(torch.randn(100))  # a generator exists once the codec has drawn
    backward(model, 0)
    opt.step()
    state = opt.state_dict()
    assert count_keys(state, "generators") == 1
    own = state["pipesgd"]
    assert own["ranks"][0]["residuals"] is not None and len(own["in_flight"]) == 1  # this rank's own, keyed
    draws = codec.compress(torch.randn(100, generator=torch.Generator().manual_seed(1)))[0]

    other = wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, **options)
    other.load_state_dict(state)
    again = other._parts.exchange.compressor.compress(torch.randn(100, generator=torch.Generator().manual_seed(1)))[0]
    assert torch.equal(draws, again)
    assert other.in_flight == 1 and [s.applied_step for s in other.flush()] == [0]
    opt.flush()


@pytest.mark.parametrize("key, value", [("width", 3), ("compression", "fp16"), ("world_size", 2)])
def test_load_refuses_another_width_codec_or_world_size(key, value):
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2)
    saved = opt.state_dict()
    state = {**saved, "pipesgd": {**saved["pipesgd"], key: value}}
    with pytest.raises(ValueError, match=key):
        opt.load_state_dict(state)


def test_load_with_steps_in_flight_raises():
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    state = opt.state_dict()
    backward(model, 0)
    opt.step()
    with pytest.raises(RuntimeError, match="call flush"):
        opt.load_state_dict(state)
    opt.flush()
