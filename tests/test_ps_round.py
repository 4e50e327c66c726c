"""The ps-sync round in the timing model: the probe that times it as the trainer runs it, its way from the raw
record to the scenario (only at the gradient and ranks it was timed with), and ps-sync's step with it."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tests.test_ps_service import TINY_MLP, record_of_every_rank
from tests.test_timing_terms import calibration
from timing_model.fitting import host_record
from timing_model.empirical.host_terms import host_terms
from timing_model.empirical.terms import EmpiricalTerms
from timing_model.predict import Scenario, predict
from timing_model.validation import calibrated_scenario

ROUND = {"load": "lenet forward+backward, batch 32", "nodes": 4, "grad_bytes": 79016.0, "steps": 300,
         "period_s": 0.0330, "compute_max_s": 0.0025, "update_s": 0.0002, "excess_s": 0.0303}


def test_the_round_flows_from_the_raw_record_to_the_scenario_at_its_own_size_only():
    host = host_record({"ps_round": ROUND})
    assert host["ps_round"] == ROUND
    assert host_terms(host)["ps_round_s"] == 0.0303
    assert host_terms(host, nodes=4, grad_bytes=79016.0)["ps_round_s"] == 0.0303
    assert host_terms(host, nodes=8, grad_bytes=79016.0)["ps_round_s"] == 0.0  # other ranks: not this round
    assert host_terms(host, nodes=4, grad_bytes=1.09e6)["ps_round_s"] == 0.0  # another model's gradient
    assert host_terms({})["ps_round_s"] == 0.0  # not probed
    cal = calibration()
    cal.host = {**cal.host, **host}
    scenario = Scenario(nodes=4, grad_bytes=79016.0, bandwidth_Bps=12.5e6, ps_colocated=True)
    assert calibrated_scenario(scenario, cal, "ps-sync").empirical.ps_round_s == 0.0303
    assert calibrated_scenario(replace(scenario, nodes=2), cal, "ps-sync").empirical.ps_round_s == 0.0
    given = scenario.with_changes(ps_round_s=0.02)
    assert calibrated_scenario(given, cal, "ps-sync").empirical.ps_round_s == 0.02  # given wins


def test_ps_sync_takes_the_probed_round_in_place_of_the_link_and_the_service():
    """LeNet's 79 KB at 100 Mbit/s, 4 nodes: the link's push + pull is 3·79 KB/B each way (38 ms); the probed
    round, 30 ms, is what the step pays, and server_s is the difference, signed."""
    base = Scenario.of(nodes=4, grad_bytes=79016.0, bandwidth_Bps=12.5e6, compute_s=0.002, update_s=0.0003,
                       host_s=0.0004, ps_colocated=True, ps_service_s=0.007, ps_service_idle_s=0.0067)
    link = predict(base).result("ps-sync")
    probed = predict(base.with_changes(ps_round_s=0.030)).result("ps-sync")
    assert probed.iteration_s == pytest.approx(0.002 + 0.0003 + 0.0004 + 0.030)
    assert probed.server_s == pytest.approx(0.030 - probed.comm_total_s) and probed.server_s < 0
    assert probed.exposed_comm_s == pytest.approx(link.comm_total_s)
    terms = ("compute_s", "straggler_s", "interference_s", "update_s", "handoff_s", "buffers_s", "host_s",
             "lockstep_s", "server_s", "exposed_comm_s", "codec_s")
    assert sum(getattr(probed, t) for t in terms) == pytest.approx(probed.iteration_s)
    dedicated = base.with_changes(ps_colocated=False, ps_round_s=0.030)
    assert predict(dedicated).result("ps-sync") == predict(dedicated.with_changes(ps_round_s=0.0)).result("ps-sync")
    assert predict(base.with_changes(ps_round_s=0.030)).result("sync") == predict(base).result("sync")


def test_the_server_refuses_a_round_that_is_no_time():
    for bad in (-0.001, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="round_s"):
            EmpiricalTerms(ps_round_s=bad)


def _probe_on_ranks(rank, world_size):
    from pipesgd.measure.ps_round import measure_ps_round

    return measure_ps_round(TINY_MLP, budget_s=0.5)["ps_round"]


@pytest.mark.slow
def test_the_probe_times_the_trainers_synchronous_rounds():
    record = record_of_every_rank(_probe_on_ranks)
    assert record["nodes"] == 3 and record["steps"] >= 5 and "mlp forward+backward, batch 8" in record["load"]
    assert record["grad_bytes"] == 4.0 * (16 * 8 + 8 + 8 * 8 + 8 + 8 * 4 + 4)  # the mlp's three layers, fp32
    assert record["period_s"] >= record["compute_max_s"] > 0 and record["update_s"] > 0
    assert record["excess_s"] > 0  # the round: two messages per remote worker at least
    assert host_terms(host_record({"ps_round": record}), nodes=3)["ps_round_s"] == record["excess_s"]
