"""The many-workers simulation (``experiments/harness/staleness_sim.py``): with the true average standing in, look-ahead
is synchronous SGD bit for bit (so the diagnostic isolates the stand-in's noise); with a worker's own gradient it is
not; the charlm recipe is the accuracy study's; the two diagnostic stand-ins (``standin_variants``) do what their
docs say; the mean-point stand-in is each worker's batch gradient at the mean look-ahead point, and its runs say how
large the reaction it leaves out is (the overshooting one is experiments.harness.standin_variants.OvershootLookahead);
runs side by side are the runs one after another; a bad stand-in name or jobs count is one line and exit 2."""
from __future__ import annotations


import pytest
import torch

from experiments.harness.staleness_sim import (
    ReactionSize, SimSpec, gradients_at_mean_point, plan, run_all, simulate, summarise, summary_markdown)
from experiments.harness.standin_variants import FrozenMomentLookahead, ShrunkLookahead, coarse_average
from pipesgd.delay.lookahead import Lookahead
from tests.in_process import run_in_process

ONE_EPOCH = dict(task="digits", workers=2, epochs=1, warmup_steps=2)


@pytest.mark.slow
def test_the_true_average_as_stand_in_is_synchronous_sgd_and_a_workers_own_gradient_is_not():
    sync = simulate(SimSpec(width=1, **ONE_EPOCH))
    oracle = simulate(SimSpec(width=3, staleness="lookahead", standin="oracle", **ONE_EPOCH))
    local = simulate(SimSpec(width=3, staleness="lookahead", **ONE_EPOCH))
    assert oracle["final_loss"] == sync["final_loss"] and oracle["final_accuracy"] == sync["final_accuracy"]
    assert local["final_loss"] != sync["final_loss"]
    assert oracle["key"].endswith("oracle-stand-in seed=0") and "oracle" not in local["key"]
    # the control: the true average with a longer reach is no longer synchronous SGD (over one epoch the loss
    # barely leaves log 10, to the 5 digits kept)
    three = dict(ONE_EPOCH, epochs=3)
    reaching = simulate(SimSpec(width=2, staleness="lookahead", standin="oracle-overshoot", **three))
    assert reaching["final_loss"] != simulate(SimSpec(width=1, **three))["final_loss"]
    assert reaching["key"].endswith("oracle-overshoot-stand-in seed=0")


def test_the_charlm_plan_is_the_studys_recipe_and_its_table_reports_the_loss():
    specs = plan(["charlm"], [2], [0], width=3, standins=("local", "oracle"))
    assert [(s.width, s.staleness, s.standin) for s in specs] == [
        (1, "none", "local"), (3, "none", "local"), (3, "lookahead", "local"), (3, "lookahead", "oracle")]
    assert all(s.global_batch == 64 and s.lr == 1e-3 for s in specs)
    runs = [{**{k: getattr(s, k) for k in ("task", "workers", "width", "staleness", "standin", "global_batch",
                                           "seed")}, "final_accuracy": 0.5, "final_loss": 2.0 + i / 10}
            for i, s in enumerate(specs)]
    table = summary_markdown(summarise(runs))
    assert "true-average stand-in" in table and "2.3000 ± 0.0000 (+15.0 %)" in table
    assert "shrunk" not in table


def test_the_charlm_table_has_a_column_per_diagnostic_stand_in_that_ran():
    specs = plan(["charlm"], [2], [0], width=3, standins=("local", "shrunk", "frozen-v"))
    runs = [{**{k: getattr(s, k) for k in ("task", "workers", "width", "staleness", "standin", "global_batch",
                                           "seed")}, "final_accuracy": 0.5, "final_loss": 2.0 + i / 10}
            for i, s in enumerate(specs)]
    header, _, row = summary_markdown(summarise(runs)).splitlines()
    assert header.endswith("look-ahead, shrunk stand-in | look-ahead, frozen second moment |")
    assert "oracle" not in header and "true-average" not in header
    assert row.endswith("2.3000 ± 0.0000 (+15.0 %) | 2.4000 ± 0.0000 (+20.0 %) |")


def _adamw_after_one_step(seed: int = 0):
    torch.manual_seed(seed)
    param = torch.nn.Parameter(torch.randn(64))
    optimizer = torch.optim.AdamW([param], lr=0.1, betas=(0.9, 0.99), weight_decay=0.1)
    param.grad = torch.randn(64)
    optimizer.step()
    return param, optimizer


def test_frozen_v_is_adams_replay_when_the_stand_in_leaves_the_corrected_second_moment_unchanged():
    """A stand-in of sqrt(v_hat) per coordinate keeps Adam's bias-corrected second moment where it is, so holding it
    changes nothing; a stand-in three times that size moves Adam's and not the frozen one's."""
    looks = {}
    for size in (1.0, 3.0):
        for kind in (Lookahead, FrozenMomentLookahead):
            param, optimizer = _adamw_after_one_step()
            state = optimizer.state[param]
            stand_in = size * (state["exp_avg_sq"] / (1 - 0.99 ** int(state["step"]))).sqrt()
            ahead = kind(optimizer, [param], width=2)
            ahead.record(1, [stand_in])
            ahead.advance()
            looks[size, kind] = param.detach().clone()
            ahead.restore()
    assert torch.allclose(looks[1.0, Lookahead], looks[1.0, FrozenMomentLookahead], rtol=0, atol=1e-6)
    assert not torch.allclose(looks[3.0, Lookahead], looks[3.0, FrozenMomentLookahead], rtol=0, atol=1e-3)


def test_frozen_v_refuses_an_optimizer_that_is_not_adam():
    param = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="Adam"):
        FrozenMomentLookahead(torch.optim.SGD([param], lr=0.1, momentum=0.9), [param])
    with pytest.raises(ValueError, match="frozen-v"):
        SimSpec(task="digits", standin="frozen-v")


def test_the_shrunk_stand_in_learns_how_much_of_a_workers_gradient_the_average_keeps():
    """Two workers whose gradients are a shared part plus independent noise: the average keeps half of a worker's
    noise, so rho tends to 1/2; a lone worker's gradient is the average, so rho is 1 and its stand-in its own."""
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.zeros(256))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    pair, alone = ShrunkLookahead(optimizer, [param]), ShrunkLookahead(optimizer, [param])
    shared = torch.randn(256)
    for step in range(200):
        own, other = shared + torch.randn(256), shared + torch.randn(256)
        average = (own + other) / 2
        pair.record(step, [own])
        alone.record(step, [average])
        pair.discard(step)
        alone.discard(step)
        pair.observe(step, [average])
        alone.observe(step, [average])
    assert 0.4 < pair.rho < 0.6 and alone.rho == 1.0
    alone.record(200, [shared])
    assert torch.allclose(alone._pending[200].grads[0], shared, rtol=0, atol=1e-6)


def test_the_mean_point_stand_in_is_each_batch_gradient_at_the_mean_look_ahead_point():
    """Two workers at points a and b: each stand-in is its own batch's gradient at (a + b) / 2, as a fresh model
    there computes it, and the model's parameters are left where they were; in a run it differs from the
    worker's own gradient."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    points = [[p.detach() + torch.randn_like(p) for p in params] for _ in range(2)]
    batches = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(2)]
    got = gradients_at_mean_point(model, params, points, batches)
    reference = torch.nn.Linear(4, 3)
    with torch.no_grad():
        for r, a, b in zip(reference.parameters(), *points):
            r.copy_((a + b) / 2)
    for grads, (x, y) in zip(got, batches):
        reference.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        assert all(torch.allclose(g, r.grad, rtol=0, atol=1e-6) for g, r in zip(grads, reference.parameters()))
    assert all(torch.equal(p, q) for p, q in zip(params, before))
    two_epochs = {**ONE_EPOCH, "epochs": 2}  # LeNet barely moves in one: both losses round to 2.30019
    local = simulate(SimSpec(width=3, staleness="lookahead", **two_epochs))
    meanpoint = simulate(SimSpec(width=3, staleness="lookahead", standin="meanpoint", **two_epochs))
    assert meanpoint["final_loss"] != local["final_loss"] and "meanpoint-stand-in" in meanpoint["key"]
    assert 0 < meanpoint["reaction_ratio"] and "reaction_ratio" not in local


def test_the_reaction_size_is_the_reaction_beside_the_deviation_from_the_average():
    size = ReactionSize()
    average = [torch.zeros(2)]
    size.add([[torch.tensor([3.0, 4.0])]], [[torch.tensor([3.0, 4.0 - 2.5])]], average)  # |dev| 5, |reaction| 2.5
    size.add([[torch.tensor([0.0, 0.0])]], [[torch.tensor([0.0, 0.0])]], average)  # nothing on a zero step
    assert size.steps == 2 and size.ratio == pytest.approx(0.5)
    assert ReactionSize().ratio == 0.0
    specs = plan(["charlm"], [2], [0, 1], width=3, standins=("local", "meanpoint"))
    runs = [{**{k: getattr(s, k) for k in ("task", "workers", "width", "staleness", "standin", "global_batch",
                                           "seed")}, "final_accuracy": 0.5, "final_loss": 2.0,
             **({"reaction_ratio": 0.5 + s.seed / 10} if s.standin == "meanpoint" else {})} for s in specs]
    assert summary_markdown(summarise(runs)).endswith("mean-point runs): charlm W=2 width 3: 0.55")


@pytest.mark.slow
def test_runs_side_by_side_in_processes_are_the_runs_made_one_after_another():
    specs = [SimSpec(width=1, **ONE_EPOCH), SimSpec(width=2, staleness="lookahead", **ONE_EPOCH)]
    alone = list(run_all(specs, jobs=1))
    side_by_side = sorted(run_all(specs, jobs=2), key=lambda run: run["width"])
    assert side_by_side == alone and len({run["key"] for run in alone}) == 2


@pytest.mark.parametrize("jobs", ["0", "-1", "two", "1.5"])
def test_a_bad_jobs_count_is_one_line_and_exit_2(jobs):
    result = run_in_process("experiments/staleness_sim.py", "--jobs", jobs)
    assert result.returncode == 2 and "--jobs" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_unknown_stand_in_is_one_line_and_exit_2():
    result = run_in_process("experiments/staleness_sim.py", "--standins", "psychic")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "psychic" in result.stderr and "oracle" in result.stderr


def test_the_coarse_stand_in_is_everyones_average_after_a_codec_round_trip():
    torch.manual_seed(0)
    grads = [[torch.randn(4, 8), torch.randn(16)] for _ in range(3)]  # 3 workers, 2 parameters
    exact = [torch.stack(per_param).mean(0) for per_param in zip(*grads)]
    assert all(torch.equal(a, b) for a, b in zip(coarse_average(grads, "none"), exact))  # a lossless codec
    coarse = coarse_average(grads)  # q4: close, not equal
    assert all(a.shape == b.shape and not torch.equal(a, b) and (a - b).abs().max() < 0.5
               for a, b in zip(coarse, exact))
    again = coarse_average(grads, requantize=True)  # the exchange's: the mean encoded once more
    assert all(not torch.equal(a, b) and (a - b).abs().max() < 0.5 for a, b in zip(again, coarse))


@pytest.mark.parametrize("bad", [dict(standin="psychic"), dict(task="imagenet")])
def test_a_bad_spec_is_refused(bad):
    with pytest.raises(ValueError):
        SimSpec(**bad)
