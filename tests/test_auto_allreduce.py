"""``compression="auto"`` measures the all-reduce too (pipesgd.auto.allreduce_trial): the provisional codec's warm-up
steps alternate the exchange and the ring, every rank keeps the same faster one, a resume and a re-check keep it."""
from __future__ import annotations

import pytest
import torch

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD, auto
from pipesgd.auto.allreduce_trial import MIN_STEPS, ORDER, AllreduceTrial
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_auto_codec import (PROBING, _guesses, _model, _no_measuring, _slow_link, _train, link_from_measure,
                                   probing)


def _verdicts(rank: int, world: int) -> list:
    out = []
    # locally rank 0 finds the ring faster and rank 1 the exchange; the slowest medians (0.020 / 0.030) decide
    for mine in ([{"alltoall": [0.030, 0.010], "ring": [0.015, 0.015]},
                  {"alltoall": [0.010, 0.010], "ring": [0.030, 0.020, 0.040]}],
                 [{"alltoall": [0.020, 0.020], "ring": [0.015, 0.015]}, {"alltoall": [0.012] * 2, "ring": [0.010] * 2}]):
        trial = AllreduceTrial()
        trial.times = mine[rank]
        out.append(trial.verdict(None, torch.device("cpu")))
    trial = AllreduceTrial()
    trial.times = {"alltoall": [0.01, 0.01], "ring": [0.001]}  # one step of the ring: too few to judge
    out.append(trial.verdict(None, torch.device("cpu")))
    return out


@pytest.mark.slow
def test_every_rank_reaches_the_same_verdict_from_the_slowest_ranks_medians():
    results = run_ranks(_verdicts, 2)
    assert results[0] == results[1]
    (first, medians), (second, medians2), none = results[0]
    assert first == "alltoall" and medians == pytest.approx({"alltoall_s": 0.020, "ring_s": 0.030})
    assert second == "ring" and medians2 == pytest.approx({"alltoall_s": 0.020, "ring_s": 0.015})
    assert none is None  # a verdict needs MIN_STEPS of each


def test_the_trial_alternates_from_the_rules_choice():
    trial = AllreduceTrial()
    assert trial.running == "alltoall"
    trial.record(0.1)
    assert trial.switch() == "ring"
    trial.record(0.2)
    assert trial.switch() == "alltoall" and trial.times == {"alltoall": [0.1], "ring": [0.2]}


TRIAL_WARMUP = 1 + 2 * MIN_STEPS  # step 0 probes; then MIN_STEPS steps of each all-reduce


def _ranks_ring_wins(rank: int, world: int, allreduce: str) -> dict:
    calls = []
    link_from_measure()
    auto.choices.measure, auto.choices.decide = _slow_link, _guesses(calls)  # a slow link: q4 + feedback from the probe on
    AllreduceTrial.verdict = lambda self, group, device: (  # the ring measured faster (deterministic here)
        ("ring", {"alltoall_s": 0.02, "ring_s": 0.01}) if all(self.times.values()) else None)  # any sample
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=TRIAL_WARMUP,
                  options=PipeSGDOptions(allreduce=allreduce))
    stats = _train(model, opt, range(TRIAL_WARMUP + 2), rank)
    state = opt.state_dict()
    again = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto",
                    warmup_steps=TRIAL_WARMUP, options=PipeSGDOptions(allreduce=allreduce))
    auto.choices.measure = _no_measuring
    again.load_state_dict(state)
    result = {"labels": [s.auto_choice for s in stats], "allreduce": opt.allreduce, "resumed": again.allreduce,
              "reason": opt.auto_choice["reason"]}
    for wrapper in (opt, again):
        wrapper.flush()
        wrapper.check_replicas()
        wrapper.close()
    return result


@pytest.mark.slow
def test_the_faster_all_reduce_runs_after_the_warmup_and_after_a_resume():
    results = run_ranks(_ranks_ring_wins, 2, "auto")
    assert results[0] == results[1]
    result = results[0]
    assert result["labels"][TRIAL_WARMUP - 1] == "width 2, q4 + error feedback, ring"
    assert result["allreduce"] == "ring" and result["resumed"] == "ring"
    assert "all-reduce: ring (warm-up medians: exchange 20.0 ms, ring 10.0 ms)" in result["reason"]


@pytest.mark.slow
def test_a_named_all_reduce_is_kept_and_not_measured():
    result = run_ranks(_ranks_ring_wins, 2, "alltoall")[0]
    assert result["labels"][0] == "warm-up: q4 + error feedback"  # no alternation
    assert result["labels"][TRIAL_WARMUP - 1] == "width 2, q4 + error feedback"
    assert result["allreduce"] == "alltoall" and result["resumed"] == "alltoall"


def test_one_rank_has_nothing_to_measure(process_group, monkeypatch):
    model, opt, _ = probing(monkeypatch)
    stats = _train(model, opt, range(PROBING))
    assert stats[PROBING - 1].auto_choice == "width 2, q4 + error feedback" and opt.allreduce == "alltoall"
    opt.flush()
    opt.close()


def _ranks_long_warmup(rank: int, world: int) -> dict:
    link_from_measure()
    auto.choices.measure, auto.choices.decide = _slow_link, _guesses([])
    model = _model()
    warmup = TRIAL_WARMUP
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=warmup)
    stats = _train(model, opt, range(warmup + 2), rank)
    result = {"labels": [s.auto_choice for s in stats], "allreduce": opt.allreduce,
              "reason": opt.auto_choice["reason"], "warmup": warmup}
    opt.flush()
    opt.check_replicas()
    opt.close()
    return result


@pytest.mark.slow
def test_with_enough_warmup_steps_the_measured_all_reduce_runs_on_every_rank():
    results = run_ranks(_ranks_long_warmup, 2)
    assert results[0] == results[1]  # the same verdict, from the agreed medians
    result = results[0]
    final = result["labels"][result["warmup"] - 1]
    assert final == f"width 2, q4 + error feedback, {result['allreduce']}" and result["allreduce"] in ORDER
    assert f"all-reduce: {result['allreduce']} (warm-up medians: exchange " in result["reason"]
