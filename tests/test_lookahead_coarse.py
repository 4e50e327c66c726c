"""The coarse stand-ins (``PipeSGD(lookahead_standin="coarse-q8")`` or ``"coarse-q4"``, ``pipesgd-train
--lookahead-standin coarse-q8``): every rank's gradients averaged with that codec before the exact exchange stand in
for the average during look-ahead. The
stand-in is the same on every rank and nearer the exact average than a rank's own gradient; the master weights stay
identical across ranks with every codec; a resumed run repeats the uninterrupted one; a rank that runs out of data
is named, not waited for; at world size 1 nothing changes (the own gradient is the average); bad values are
refused."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pipesgd import PipeSGD
from pipesgd.options import PipeSGDOptions
from pipesgd.train.flags import resolve
from pipesgd.train.metrics import pipe_staleness
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_lookahead import _loss, _run
from tests.test_lookahead_reach import _train, resumable
from tests.test_pipesgd import make_model, snapshot
from tests.test_uneven import TIMEOUT_S, _uneven


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def _standins(rank: int, world: int, standin: str = "coarse-q8"):
    """Per step that looks ahead: this rank's gradient, the exact average and the stand-in recorded for it; and
    the bytes the last step's record says were sent."""
    model = make_model(torch.float32)
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.01), model, width=2, warmup_steps=1,
                  lookahead_standin=standin, check_replicas_every=1)
    rows = []
    for t in range(6):
        _loss(model, t, rank).backward()
        own = _flat(p.grad for p in model.parameters())
        mean = own.clone()
        dist.all_reduce(mean)
        opt.step()
        opt.zero_grad()
        pending = opt._lookahead.state_dict() if opt._lookahead is not None else []  # resolves the stand-ins
        standin = [entry["grads"] for entry in pending if entry["step"] == t]
        if standin:
            rows.append((own, mean / world, _flat(standin[0])))
    stats = opt.last_stats
    opt.flush()
    opt.close()
    return rows, stats.bytes_sent, stats.t_standin_wait_s, "t_standin_wait" in stats.as_metrics()


@pytest.mark.parametrize("world, standin, bound", [(2, "coarse-q8", 0.02), (3, "coarse-q8", 0.02),
                                                   (3, "coarse-q4", 0.2)])
def test_the_stand_in_is_the_same_on_every_rank_and_near_the_average(world, standin, bound):
    per_rank = run_ranks(_standins, world, standin)
    rows = [rows for rows, *_ in per_rank]
    assert len(rows[0]) == 5  # every step after the warm-up
    for step_rows in zip(*rows):
        standins = [standin for _, _, standin in step_rows]
        assert all(torch.equal(s, standins[0]) for s in standins)  # identical: a checkpoint may keep any rank's
        for own, mean, standin in step_rows:
            error = (standin - mean).norm() / mean.norm()
            assert error < bound, error  # a scale per block: q8 well under a per cent, q4 a few per cent
            assert (standin - mean).norm() < (own - mean).norm()


def test_the_coarse_bytes_and_wait_are_in_the_step_record():
    coarse, local = run_ranks(_standins, 2), run_ranks(_standins, 2, "local")
    assert all(c[1] > plain[1] > 0 for c, plain in zip(coarse, local))
    assert all(c[2] is not None and c[2] >= 0 and c[3] for c in coarse)  # its forward's wait, in the metrics
    assert all(plain[2] is None and not plain[3] for plain in local)


def _replicas(rank: int, world: int, compression: str) -> list[torch.Tensor]:
    model = make_model()
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.01), model, width=3, warmup_steps=1,
                  compression=compression, error_feedback=compression in ("q8", "sign"), lookahead_standin="coarse-q4",
                  check_replicas_every=1)
    _train(model, opt, range(8), rank)
    opt.flush()
    opt.check_replicas()
    opt.close()
    return snapshot(model)


@pytest.mark.parametrize("compression", ["none", "q8", "sign"])
def test_master_weights_stay_identical_across_ranks(compression):
    per_rank = run_ranks(_replicas, 3, compression)
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], per_rank[1]))
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], per_rank[2]))


def test_a_resumed_run_repeats_the_uninterrupted_one_and_differs_from_the_local_stand_in(tmp_path):
    path = str(tmp_path / "state")
    uninterrupted = run_ranks(resumable, 2, path, False, dict(lookahead_standin="coarse-q8"))
    resumed = run_ranks(resumable, 2, path, True, dict(lookahead_standin="coarse-q8"))
    for want, got in zip(uninterrupted, resumed):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    local = run_ranks(resumable, 2, str(tmp_path / "local"), False, {})
    assert not all(torch.equal(a, b) for a, b in zip(local[0], uninterrupted[0]))  # the option acts


@pytest.mark.parametrize("world, width, steps", [(2, 2, 7), (3, 3, 7), (3, 3, 10), (2, 2, 10)])
def test_the_rank_that_ran_out_is_named_not_waited_for(world, width, steps):
    """The finished rank joins the others' step with zeros in both all-reduces, the coarse one first; a rank that
    steps on afterwards gets the same error from its next forward pass, not a timeout."""
    last = world - 1
    for rank, (message, seconds) in enumerate(run_ranks(_uneven, world, width, "none", "coarse-q8", steps)):
        assert f"rank {last} ran out of data after 5 steps" in message, (rank, message)
        assert seconds < TIMEOUT_S / 2


def test_at_world_size_one_the_coarse_stand_in_is_the_own_gradient(process_group):
    want = _run(1, "adamw", warmup_steps=2)
    got = _run(3, "adamw", warmup_steps=2, lookahead_standin="coarse-q8")
    assert got[0] == want[0]
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


@pytest.mark.parametrize("bad, message", [(dict(lookahead_standin="mean"), "lookahead_standin must be one of"),
                                          (dict(lookahead_standin="coarse-q4", staleness="none"),
                                           "lookahead_standin applies to staleness='lookahead' only")])
def test_bad_values_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        PipeSGDOptions(**bad)


def test_the_trainer_names_the_stand_in_in_its_summary_and_its_config():
    cfg = resolve(["--lookahead-standin", "coarse-q8"])
    assert cfg.lookahead_standin == "coarse-q8" and cfg.to_dict()["lookahead_standin"] == "coarse-q8"
    assert pipe_staleness(cfg) == ", staleness lookahead (coarse-q8 stand-in)"
    assert pipe_staleness(resolve(["--lookahead-standin", "coarse-q4", "--lookahead-reach", "1.2"])) == \
        ", staleness lookahead (reach 1.2, coarse-q4 stand-in)"
    assert resolve([]).lookahead_standin == "local"


def _scaled(rank: int, world: int) -> list[torch.Tensor]:
    """fp16-style loss scaling with an overflow on one rank at step 4 (the scaler skips it and backs off), under the
    coarse stand-in: the stand-in of step 4 is non-finite on every rank."""
    model = make_model(torch.float32)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=2, warmup_steps=1,
                  grad_scaler=scaler, lookahead_standin="coarse-q8", check_replicas_every=1)
    skipped = 0
    for t in range(10):
        scaler.scale(_loss(model, t, rank) * (float("inf") if (t, rank) == (4, 1) else 1.0)).backward()
        skipped += bool(opt.step().skipped_nonfinite)
        opt.zero_grad()
    opt.flush()
    opt.close()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    return snapshot(model), skipped, scaler.get_scale()


def test_under_loss_scaling_overflowing_stand_ins_are_skipped_and_replicas_stay_identical():
    (first, skipped, scale), (second, _, _) = run_ranks(_scaled, 2)
    assert skipped == 1 and scale != 2.0**10  # step 4's overflow skipped; the scale backed off and regrew
    assert all(torch.equal(a, b) for a, b in zip(first, second))
