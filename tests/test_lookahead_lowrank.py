"""The low-rank stand-in (``PipeSGD(lookahead_standin="coarse-lowrank")``, ``pipesgd.delay.lowrank``): each rank's own
gradient with every rank's average in a shared rank-4 subspace of each weight matrix. The stand-ins average to the
exact average and each is nearer it than the own gradient; a matrix of rank at most 4 and every vector stand in
exactly; the subspace follows the average; the master weights stay identical; a rank that runs out of data is named;
at world size 1 nothing changes. It is the default ("auto") under Adam and AdamW, the own gradient under others. (A resumed run repeats the uninterrupted one, its subspace saved:
``tests/test_lookahead_coarse.py``.)"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pipesgd import PipeSGD
from pipesgd.comm.topology import RingTopology
from pipesgd.defaults import resolve_lookahead_standin
from pipesgd.delay.lowrank import LowRankFill
from pipesgd.train.flags import resolve
from pipesgd.train.metrics import pipe_staleness
from tests.wrap import wrap
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_lookahead import _run
from tests.test_lookahead_coarse import _replicas, _standins
from tests.test_lookahead_coarse import _train
from tests.test_pipesgd import make_model, snapshot
from tests.test_uneven import TIMEOUT_S, _uneven

STANDIN = "coarse-lowrank"


def _fill(rank: int, world: int) -> dict:
    """Two steps of the fill on rank-dependent gradients: a 12 x 10 matrix (rank 10 > 4), a 3 x 7 one (rank 3), a
    vector; each step's own gradients, stand-ins and the exact average."""
    params = [torch.zeros(12, 10), torch.zeros(3, 7), torch.zeros(5)]
    fill = LowRankFill(params, RingTopology(dist.group.WORLD))
    steps = []
    for step in range(2):
        g = torch.Generator().manual_seed(100 * step + rank)
        shared = torch.Generator().manual_seed(100 * step + 99)
        own = [torch.randn(p.shape, generator=shared) + 0.5 * torch.randn(p.shape, generator=g) for p in params]
        mean = [o.clone() for o in own]
        for m in mean:
            dist.all_reduce(m)
            m.div_(world)
        slots = [o.clone() for o in own]
        fill(slots)
        fill.advance()
        steps.append((own, slots, mean))
    return {"steps": steps, "basis": fill.state_dict()}


@pytest.mark.slow
def test_the_stand_ins_average_to_the_average_and_small_parts_are_exact():
    per_rank = run_ranks(_fill, 3)
    for step in range(2):
        owns, standins, means = zip(*(r["steps"][step] for r in per_rank))
        for index in range(3):
            mean = means[0][index]
            together = torch.stack([s[index] for s in standins]).mean(0)
            assert torch.allclose(together, mean, atol=1e-5), index  # the subspace is shared
            for own, standin in zip(owns, standins):
                if index == 0:  # rank 10: the own gradient outside the subspace, so nearer the mean, not at it
                    assert 0 < (standin[0] - mean).norm() < (own[0] - mean).norm()
                else:  # a matrix of rank 3 lies in its subspace whole; a vector is averaged exactly
                    assert torch.allclose(standin[index], mean, atol=1e-5), index
    bases = [r["basis"]["basis"] for r in per_rank]
    assert all(torch.equal(a, b) for w in bases[1:] for a, b in zip(w, bases[0]))  # one subspace on every rank


def _follow(rank: int, world: int) -> dict:
    """Two steps of the fill on a 12 x 10 gradient: a rank-2 part every rank shares, plus a little of its own."""
    low = torch.randn(12, 2, generator=torch.Generator().manual_seed(7)) @ torch.randn(2, 10)
    fill, outside = LowRankFill([torch.zeros(12, 10)], RingTopology(dist.group.WORLD)), []
    for step in range(2):
        u = fill.state_dict()["basis"][0]
        outside.append(((low - u @ (u.T @ low)).norm() / low.norm()).item())
        fill([low + 0.1 * torch.randn(12, 10, generator=torch.Generator().manual_seed(10 * step + rank))])
        fill.advance()
    return {"outside": outside, "basis": fill.state_dict()["basis"][0]}


def test_the_subspace_follows_the_average():
    """The first subspace is random; after one step it holds the average's dominant part (one power iteration on the
    average), the same on every rank."""
    per_rank = run_ranks(_follow, 2)
    for result in per_rank:
        first, second = result["outside"]
        assert first > 0.3 and second < 0.05, result
    assert torch.equal(per_rank[0]["basis"], per_rank[1]["basis"])


def test_a_saved_subspace_of_another_model_is_refused():
    fill = LowRankFill([torch.zeros(6, 5)], topology=None)
    with pytest.raises(ValueError, match="does not match this model's matrices"):
        fill.load_state_dict({"basis": [torch.zeros(3, 2)]})


@pytest.mark.slow
def test_through_the_wrapper_each_stand_in_is_nearer_the_average_and_they_average_to_it():
    per_rank = run_ranks(_standins, 3, STANDIN)
    rows = [rows for rows, *_ in per_rank]
    assert len(rows[0]) == 5  # every step after the warm-up
    for step_rows in zip(*rows):
        mean = step_rows[0][1]
        together = torch.stack([standin for _, _, standin in step_rows]).mean(0)
        assert torch.allclose(together, mean, atol=1e-6)
        for own, _, standin in step_rows:
            assert (standin - mean).norm() < (own - mean).norm()
    assert all(wait is not None and wait >= 0 for _, _, wait, _ in per_rank)  # its wait is in the step record


@pytest.mark.parametrize("compression", ["none", "q8"])
@pytest.mark.slow
def test_master_weights_stay_identical_across_ranks(compression):
    per_rank = run_ranks(_replicas, 3, compression, STANDIN)
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], per_rank[1]))
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], per_rank[2]))


@pytest.mark.slow
def test_the_rank_that_ran_out_is_named_not_waited_for():
    for rank, (message, seconds) in enumerate(run_ranks(_uneven, 3, 3, "none", STANDIN, 7)):
        assert "rank 2 ran out of data after 5 steps" in message, (rank, message)
        assert seconds < TIMEOUT_S / 2


def test_at_world_size_one_the_low_rank_stand_in_is_the_own_gradient(process_group):  # noqa: F811
    want = _run(1, "adamw", warmup_steps=2)
    got = _run(3, "adamw", warmup_steps=2, lookahead_standin=STANDIN)
    assert got[0] == want[0]
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def test_the_trainer_takes_it():
    cfg = resolve(["--lookahead-standin", STANDIN])
    assert pipe_staleness(cfg) == f", staleness lookahead ({STANDIN} stand-in)"


def test_a_model_of_vectors_only_stands_in_with_their_average(process_group):  # noqa: F811
    fill = LowRankFill([nn.Parameter(torch.zeros(4))], RingTopology(dist.group.WORLD))
    slots = [torch.arange(4.0)]
    report = fill(slots)
    assert torch.equal(slots[0], torch.arange(4.0)) and report.bytes_sent == 0  # world size 1: nothing sent


class _MyAdamW(torch.optim.AdamW):
    pass


@pytest.mark.parametrize("optimizer, want", [(torch.optim.AdamW, STANDIN), (torch.optim.Adam, STANDIN),
                                             (_MyAdamW, STANDIN), (torch.optim.SGD, "local"),
                                             (torch.optim.RMSprop, "local")])
def test_auto_is_the_low_rank_stand_in_under_adam_and_adamw_and_the_own_gradient_otherwise(optimizer, want):
    assert resolve_lookahead_standin("auto", optimizer.__mro__) == want
    assert resolve_lookahead_standin("local", optimizer.__mro__) == "local"  # a choice is kept
    name = optimizer.__name__.lower()
    if name in ("sgd", "adam", "adamw"):  # the trainer's summary line names what "auto" chose
        cfg = resolve(["--mode", "pipe", "--width", "2", "--optimizer", name])
        assert cfg.lookahead_standin == "auto"
        assert pipe_staleness(cfg) == ", staleness lookahead" + (f" ({want} stand-in)" if want != "local" else "")


def _weights(rank: int, world: int, optimizer: type, options: dict) -> list[torch.Tensor]:
    model = make_model()
    opt = wrap(optimizer(model.parameters(), lr=0.01), model, width=2, warmup_steps=1, **options)
    _train(model, opt, range(6), rank)
    opt.flush()
    opt.close()
    return snapshot(model)


@pytest.mark.parametrize("optimizer, same, other", [(torch.optim.AdamW, STANDIN, "local"),
                                                     (torch.optim.SGD, "local", STANDIN)])
@pytest.mark.slow
def test_the_default_stand_in_is_the_one_auto_names(optimizer, same, other):
    default = run_ranks(_weights, 2, optimizer, {})[0]
    assert all(torch.equal(a, b) for a, b in zip(default, run_ranks(_weights, 2, optimizer,
                                                                    dict(lookahead_standin=same))[0]))
    assert not all(torch.equal(a, b) for a, b in zip(default, run_ranks(_weights, 2, optimizer,
                                                                        dict(lookahead_standin=other))[0]))
