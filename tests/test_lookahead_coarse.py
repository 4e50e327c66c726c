"""The shared stand-in (``lookahead_standin="coarse-lowrank"``, "auto"'s under Adam and AdamW) in the wrapper: its
all-reduce's bytes and its forward's wait are in the step record; the master weights stay identical across ranks
with every codec; a resumed run repeats the uninterrupted one; a rank that runs out of data is named, not waited
for; at world size 1 nothing changes (the own gradient is the average); fp16 overflows are skipped; bad values are
refused. The stand-in's own arithmetic is tests/test_lookahead_lowrank.py's."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pipesgd import PipeSGD, PipeSGDOptions
from pipesgd.options import WrapperConfig
from pipesgd.train.flags import resolve
from pipesgd.train.metrics import pipe_staleness
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_lookahead import _loss, _run
from tests.test_pipesgd import make_model, snapshot
from tests.test_uneven import TIMEOUT_S, _uneven
from tests.wrap import wrap

SHARED = "coarse-lowrank"


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def _standins(rank: int, world: int, standin: str = SHARED):
    """Per step that looks ahead: this rank's gradient, the exact average and the stand-in recorded for it; and
    the bytes the last step's record says were sent."""
    model = make_model(torch.float32)
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.01), model, width=2, warmup_steps=1,
                  options=PipeSGDOptions(lookahead_standin=standin, check_replicas_every=1))
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


@pytest.mark.slow
def test_the_shared_stand_ins_bytes_and_wait_are_in_the_step_record():
    coarse, local = run_ranks(_standins, 2), run_ranks(_standins, 2, "local")
    assert all(c[1] > plain[1] > 0 for c, plain in zip(coarse, local))
    assert all(c[2] is not None and c[2] >= 0 and c[3] for c in coarse)  # its forward's wait, in the metrics
    assert all(plain[2] is None and not plain[3] for plain in local)


def _replicas(rank: int, world: int, compression: str, standin: str) -> list[torch.Tensor]:
    model = make_model()
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=0.01), model, width=3, warmup_steps=1,
                  compression=compression, error_feedback=compression in ("q8", "sign"),
                  options=PipeSGDOptions(lookahead_standin=standin, check_replicas_every=1))
    _train(model, opt, range(8), rank)
    opt.flush()
    opt.check_replicas()
    opt.close()
    return snapshot(model)


@pytest.mark.parametrize("compression", ["none", "q8", "sign"])
@pytest.mark.slow
def test_master_weights_stay_identical_across_ranks(compression):
    per_rank = run_ranks(_replicas, 3, compression, SHARED)
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], per_rank[1]))
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], per_rank[2]))


@pytest.mark.slow
def test_a_resumed_run_repeats_the_uninterrupted_one_and_differs_from_the_local_stand_in(tmp_path):
    standin = SHARED  # its subspace is saved
    path = str(tmp_path / "state")
    uninterrupted = run_ranks(resumable, 2, path, False, dict(lookahead_standin=standin))
    resumed = run_ranks(resumable, 2, path, True, dict(lookahead_standin=standin))
    for want, got in zip(uninterrupted, resumed):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    local = run_ranks(resumable, 2, str(tmp_path / "local"), False, dict(lookahead_standin="local"))
    assert not all(torch.equal(a, b) for a, b in zip(local[0], uninterrupted[0]))  # the option acts


@pytest.mark.parametrize("world, width, steps", [(2, 2, 7), (3, 3, 10)])
@pytest.mark.slow
def test_the_rank_that_ran_out_is_named_not_waited_for(world, width, steps):
    """The finished rank joins the others' step with zeros in both all-reduces, the stand-in's first; a rank that
    steps on afterwards gets the same error from its next forward pass, not a timeout."""
    last = world - 1
    for rank, (message, seconds) in enumerate(run_ranks(_uneven, world, width, "none", SHARED, steps)):
        assert f"rank {last} ran out of data after 5 steps" in message, (rank, message)
        assert seconds < TIMEOUT_S / 2


def test_at_world_size_one_the_shared_stand_in_is_the_own_gradient(process_group):
    want = _run(1, "adamw", warmup_steps=2)
    got = _run(3, "adamw", warmup_steps=2, lookahead_standin=SHARED)
    assert got[0] == want[0]
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="lookahead_standin must be one of"):
        PipeSGDOptions(lookahead_standin="coarse-q8")  # the codec averages lost their measurement: gone
    with pytest.raises(ValueError, match="lookahead_standin applies to staleness='lookahead' only"):
        WrapperConfig(staleness="none", options=PipeSGDOptions(lookahead_standin=SHARED))


def test_the_trainer_names_the_stand_in_in_its_summary_and_its_config():
    cfg = resolve(["--lookahead-standin", SHARED])
    assert cfg.lookahead_standin == SHARED and cfg.to_dict()["lookahead_standin"] == SHARED
    assert pipe_staleness(cfg) == f", staleness lookahead ({SHARED} stand-in)"
    assert resolve([]).lookahead_standin == "auto"


def _scaled(rank: int, world: int, standin: str = SHARED) -> list[torch.Tensor]:
    """fp16-style loss scaling with an overflow on one rank at step 4 (the scaler skips it and backs off), under a
    shared stand-in: the stand-in of step 4 is non-finite on every rank (it keeps its subspace)."""
    model = make_model(torch.float32)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=2, warmup_steps=1,
                  options=PipeSGDOptions(grad_scaler=scaler, lookahead_standin=standin, check_replicas_every=1))
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


@pytest.mark.slow
def test_under_loss_scaling_overflowing_stand_ins_are_skipped_and_replicas_stay_identical():
    (first, skipped, scale), (second, _, _) = run_ranks(_scaled, 2, SHARED)
    assert skipped == 1 and scale != 2.0**10  # step 4's overflow skipped; the scale backed off and regrew
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def _train(model: torch.nn.Module, opt: PipeSGD, steps: range, rank: int) -> None:
    for t in steps:
        _loss(model, t, rank).backward()
        opt.step()
        opt.zero_grad()


RESUME_AT = 5


def resumable(rank: int, world: int, path: str, resume: bool, options: dict) -> list[torch.Tensor]:
    """AdamW at width 3 with q8 + error feedback and ``options`` (PipeSGD's); saved per rank at RESUME_AT, or resumed
    from there. The final weights."""
    model = make_model()
    opt = wrap(torch.optim.AdamW(model.parameters(), lr=0.01), model, width=3, warmup_steps=1, compression="q8",
               error_feedback=True, **options)
    if resume:
        state = torch.load(f"{path}.{rank}", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    else:
        _train(model, opt, range(RESUME_AT), rank)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"{path}.{rank}")
    _train(model, opt, range(RESUME_AT, 10), rank)
    opt.flush()
    opt.close()
    return snapshot(model)
