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


def _replicas(rank: int, world: int, compression: str, standin: str) -> list[torch.Tensor]:
    model = make_model()
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.01), model, width=3, warmup_steps=1,
                  compression=compression, error_feedback=compression in ("q8", "sign"), lookahead_standin=standin,
                  check_replicas_every=1)
    _train(model, opt, range(8), rank)
    opt.flush()
    opt.check_replicas()
    opt.close()
    return snapshot(model)


@pytest.mark.parametrize("compression, standin", [("none", "coarse-q4"), ("q8", "coarse-q4"), ("sign", "coarse-q4"),
                                                   ("q8", "local-then-q8")])
def test_master_weights_stay_identical_across_ranks(compression, standin):
    per_rank = run_ranks(_replicas, 3, compression, standin)
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], per_rank[1]))
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], per_rank[2]))


@pytest.mark.parametrize("standin", ["coarse-q8", "local-then-q8", "coarse-lowrank"])  # lowrank: its warm start saved
def test_a_resumed_run_repeats_the_uninterrupted_one_and_differs_from_the_local_stand_in(tmp_path, standin):
    path = str(tmp_path / "state")
    uninterrupted = run_ranks(resumable, 2, path, False, dict(lookahead_standin=standin))
    resumed = run_ranks(resumable, 2, path, True, dict(lookahead_standin=standin))
    for want, got in zip(uninterrupted, resumed):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    local = run_ranks(resumable, 2, str(tmp_path / "local"), False, dict(lookahead_standin="local"))
    assert not all(torch.equal(a, b) for a, b in zip(local[0], uninterrupted[0]))  # the option acts


@pytest.mark.parametrize("world, width, steps, standin", [(2, 2, 7, "coarse-q8"), (3, 3, 7, "coarse-q8"),
                                                          (3, 3, 10, "coarse-q8"), (2, 2, 10, "coarse-q8"),
                                                          (3, 3, 10, "local-then-q8")])
def test_the_rank_that_ran_out_is_named_not_waited_for(world, width, steps, standin):
    """The finished rank joins the others' step with zeros in both all-reduces, the coarse one first; a rank that
    steps on afterwards gets the same error from its next forward pass, not a timeout."""
    last = world - 1
    for rank, (message, seconds) in enumerate(run_ranks(_uneven, world, width, "none", standin, steps)):
        assert f"rank {last} ran out of data after 5 steps" in message, (rank, message)
        assert seconds < TIMEOUT_S / 2


@pytest.mark.parametrize("standin", ["coarse-q8", "local-then-q8"])
def test_at_world_size_one_the_coarse_stand_in_is_the_own_gradient(process_group, standin):
    want = _run(1, "adamw", warmup_steps=2)
    got = _run(3, "adamw", warmup_steps=2, lookahead_standin=standin)
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
    assert resolve([]).lookahead_standin == "auto"


def _scaled(rank: int, world: int, standin: str = "coarse-q8") -> list[torch.Tensor]:
    """fp16-style loss scaling with an overflow on one rank at step 4 (the scaler skips it and backs off), under a
    coarse stand-in: the stand-in of step 4 is non-finite on every rank (the low-rank one keeps its subspace)."""
    model = make_model(torch.float32)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=2, warmup_steps=1,
                  grad_scaler=scaler, lookahead_standin=standin, check_replicas_every=1)
    skipped = 0
    for t in range(10):
        scaler.scale(_loss(model, t, rank) * (float("inf") if (t, rank) == (4, 1) else 1.0)).backward()
        skipped += bool(opt.step().skipped_nonfinite)
        opt.zero_grad()
    opt.flush()
    kept = (opt.state_dict()["pipesgd"]["standin"] or {}).get("basis", [])  # the low-rank stand-in's subspace
    opt.close()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isfinite(u).all() for u in kept)  # later stand-ins finite: the overflow left it alone
    return snapshot(model), skipped, scaler.get_scale()


@pytest.mark.parametrize("standin", ["coarse-q8", "coarse-lowrank"])
def test_under_loss_scaling_overflowing_stand_ins_are_skipped_and_replicas_stay_identical(standin):
    (first, skipped, scale), (second, _, _) = run_ranks(_scaled, 2, standin)
    assert skipped == 1 and scale != 2.0**10  # step 4's overflow skipped; the scale backed off and regrew
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def _late(rank: int, world: int, width: int, standin: str):
    """Per step after the pipeline fills: the stand-ins pending after step(), newest last, as (step, gradients);
    and the final weights."""
    model = make_model(torch.float32)
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.01), model, width=width, warmup_steps=1,
                  lookahead_standin=standin, check_replicas_every=1)
    seen = []
    for t in range(7):
        _loss(model, t, rank).backward()
        own = _flat(p.grad for p in model.parameters())
        opt.step()
        opt.zero_grad()
        pending = opt._lookahead.state_dict() if opt._lookahead is not None else []
        seen.append((own, [(entry["step"], _flat(entry["grads"])) for entry in pending]))
    opt.flush()
    opt.close()
    return seen, snapshot(model)


def test_local_then_q8_keeps_the_own_gradient_for_the_newest_step_and_the_average_for_the_older():
    first, second = run_ranks(_late, 2, 3, "local-then-q8")
    steps_with_two = 0
    for (own0, pending0), (own1, pending1) in zip(first[0], second[0]):
        if not pending0:
            continue
        newest0, newest1 = pending0[-1][1], pending1[-1][1]
        assert torch.equal(newest0, own0) and torch.equal(newest1, own1)  # the newest: each rank's own
        for (_, older0), (_, older1) in zip(pending0[:-1], pending1[:-1]):
            assert torch.equal(older0, older1)  # the older: everyone's average, the same on both ranks
            steps_with_two += 1
    assert steps_with_two >= 3
    local = run_ranks(_late, 2, 3, "local")
    assert not all(torch.equal(a, b) for a, b in zip(first[1], local[0][1]))  # it acts at width 3


def test_local_then_q8_at_width_two_is_the_local_stand_in():
    late, local = run_ranks(_late, 2, 2, "local-then-q8"), run_ranks(_late, 2, 2, "local")
    for (_, weights), (_, want) in zip(late, local):
        assert all(torch.equal(a, b) for a, b in zip(weights, want))
