"""The parameter server's service time in the timing model: the queue formula, its inversion, the two-phase pace of
an asynchronous job whose co-located worker finishes first, the probe that measures it and how a ps-async run is
measured (the slowest worker's mean)."""
from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from pipesgd.measure.server import phase_means
from tests.distributed import run_ranks
from tests.test_timing_terms import calibration, write_run
from timing_model.empirical import server
from timing_model.fitting import host_record
from timing_model.empirical.host_terms import host_terms, ps_service_terms, service_from_timings
from timing_model.predict import Scenario, predict
from timing_model.validation import read_runs, scenario_for


def test_closed_queue_response_at_its_limits_and_by_hand():
    assert server.closed_queue_response(1, 0.7, 0.002) == pytest.approx(0.002)  # nobody to queue behind
    assert server.closed_queue_response(3, 0.0, 0.002) == pytest.approx(0.006)  # saturated: one request per s
    # n = 2, Z = s = 1: R1 = 1, Q1 = 1/(1 + 1) = 0.5; R2 = 1·1.5, so 1.5
    assert server.closed_queue_response(2, 1.0, 1.0) == pytest.approx(1.5)
    assert server.closed_queue_response(3, 0.01, 0.0) == 0.0
    rising = [server.closed_queue_response(3, 0.005, s) for s in (0.001, 0.002, 0.004)]
    assert rising == sorted(rising) and rising[0] > 0.001


def test_the_colocated_worker_ahead_splits_the_job_into_two_phases():
    # it finishes after S·2 s; the remote workers have done S/2 steps at 4 s, the other S/2 take 3 s each
    assert server.colocated_pace(2.0, 4.0, 3.0) == pytest.approx(3.5)
    assert server.colocated_pace(5.0, 4.0, 3.0) == 4.0  # not ahead: the remote pace alone
    assert server.colocated_pace(0.0, 4.0, 3.0) == pytest.approx(3.0)


def test_service_time_inverts_the_queue():
    for workers, think, service in ((3, 0.005, 0.003), (1, 0.02, 0.001), (7, 0.0, 0.004)):
        response = server.closed_queue_response(workers, think, service)
        assert service_from_timings(workers, think, response) == pytest.approx(service, rel=1e-6)
    with pytest.raises(ValueError):
        service_from_timings(0, 0.01, 0.01)


def probe(busy_steps=12, idle_steps=30):
    return {"load": "lenet", "workers": 3, "steps": 20, "rank0_step_s": 0.003,
            "busy": {"steps": busy_steps, "think_s": 0.004, "response_s": 0.010 if busy_steps else None},
            "idle": {"steps": idle_steps, "think_s": 0.004, "response_s": 0.005 if idle_steps else None}}


def test_each_phase_gives_its_own_service_and_a_missing_phase_takes_the_other():
    terms = ps_service_terms(probe())
    assert terms["ps_service_s"] == pytest.approx(service_from_timings(3, 0.004, 0.010))
    assert terms["ps_service_idle_s"] == pytest.approx(service_from_timings(3, 0.004, 0.005))
    assert terms["ps_service_s"] > terms["ps_service_idle_s"]
    only_idle = ps_service_terms(probe(busy_steps=0))
    assert only_idle["ps_service_s"] == only_idle["ps_service_idle_s"] == terms["ps_service_idle_s"]
    with pytest.raises(ValueError, match="no remote step"):
        ps_service_terms(probe(busy_steps=0, idle_steps=0))
    host = host_record({"ps_service": probe()})
    assert host["ps_service"] == probe() and host_terms(host)["ps_service_s"] == terms["ps_service_s"]


def test_each_phase_is_summarised_by_its_mean_the_statistic_the_queue_is_solved_in():
    """Mean-value analysis needs means: a slow tail (a step descheduled on shared cores) moves the mean, not the
    median, and the job's pace is a mean step."""
    rows = [(1.0, 0.010, 0.006)] * 3 + [(1.0, 0.030, 0.020)] + [(3.0, 0.008, 0.004)] * 2  # (end, step, wait)
    phases = phase_means(rows, boundary=2.0)
    assert phases["busy"] == {"steps": 4, "think_s": pytest.approx(0.0055), "response_s": pytest.approx(0.0095)}
    assert phases["idle"] == {"steps": 2, "think_s": pytest.approx(0.004), "response_s": pytest.approx(0.004)}
    assert phase_means(rows, boundary=5.0)["idle"] == {"steps": 0, "think_s": None, "response_s": None}


def test_the_colocated_workers_own_step_sets_how_long_the_slow_phase_lasts():
    base = Scenario.of(nodes=4, grad_bytes=80e3, bandwidth_Bps=125e6, compute_s=0.004, update_s=0.0005,
                       host_s=0.0005, ps_colocated=True, ps_service_s=0.004, ps_service_idle_s=0.002)
    think = 0.005
    busy = think + server.closed_queue_response(3, think, 0.004)
    idle = think + server.closed_queue_response(3, think, 0.002)
    own = predict(base.with_changes(ps_colocated_step_s=0.008)).result("ps-async")
    assert own.iteration_s == pytest.approx(server.colocated_pace(0.008, busy, idle))
    assert own.iteration_s > predict(base).result("ps-async").iteration_s  # it trains longer beside the server
    with pytest.raises(ValueError, match="colocated_step_s"):
        predict(base.with_changes(ps_colocated_step_s=-1.0))


def test_a_colocated_ps_async_run_is_predicted_from_rank_0s_steps_and_mean_think(tmp_path):
    step = lambda t, c: {"t_iter": t, "t_compute": c, "t_update": 0.0, "t_wait": t - c}  # noqa: E731
    rank0 = [step(0.006, 0.005)] * 8
    remote = [step(0.012, 0.003)] * 6 + [step(0.024, 0.009)] * 2  # a slow tail: mean 4.5 ms, median 3 ms
    paths = write_run(tmp_path, "job", "ps-async", {0: rank0, 1: remote, 2: remote})
    (run,) = read_runs(paths, skip=0)
    assert run.t_rank0 == pytest.approx((0.006,) * 8)
    colocated = scenario_for(replace(run, config={**run.config, "servers": 0}), calibration())
    assert colocated.ps_colocated and colocated.empirical.ps_colocated_step_s == pytest.approx(0.006)
    assert colocated.compute_s == pytest.approx(0.0045)  # the mean, as the pace it predicts
    dedicated = scenario_for(replace(run, config={**run.config, "servers": 1}), calibration())
    assert dedicated.empirical.ps_colocated_step_s == 0.0
    (sync,) = read_runs(write_run(tmp_path, "s", "sync", {0: rank0, 1: remote}), skip=0)
    assert sync.t_rank0 == () and scenario_for(sync, calibration()).compute_s == pytest.approx(0.005)  # the median


def test_ps_async_with_a_service_time_queues_at_the_server_in_two_phases():
    base = Scenario.of(nodes=4, grad_bytes=80e3, bandwidth_Bps=125e6, compute_s=0.004, update_s=0.0005,
                       host_s=0.0005, ps_colocated=True)
    plain = predict(base).result("ps-async")
    assert plain.server_s == 0.0  # not calibrated: the link alone, as before
    served = predict(base.with_changes(ps_service_s=0.004, ps_service_idle_s=0.002)).result("ps-async")
    think = 0.005
    busy = think + server.closed_queue_response(3, think, 0.004)
    idle = think + server.closed_queue_response(3, think, 0.002)
    assert served.iteration_s == pytest.approx(server.colocated_pace(think, busy, idle))
    assert served.iteration_s > plain.iteration_s
    terms = ("compute_s", "straggler_s", "interference_s", "update_s", "handoff_s", "buffers_s", "host_s",
             "lockstep_s", "server_s", "exposed_comm_s", "codec_s")
    assert sum(getattr(served, t) for t in terms) == pytest.approx(served.iteration_s)
    assert served.server_s == pytest.approx(served.iteration_s - think - served.exposed_comm_s) and served.server_s > 0
    same = predict(base.with_changes(ps_service_s=0.004)).result("ps-async")  # no idle figure: the busy one throughout
    assert same.iteration_s == pytest.approx(busy)
    dedicated = predict(base.with_changes(ps_colocated=False, ps_service_s=0.004)).result("ps-async")
    assert dedicated.server_s == 0.0  # the probe measures a co-located server only
    assert predict(base.with_changes(ps_service_s=0.004)).result("sync") == predict(base).result("sync")


def test_ps_sync_with_a_colocated_server_pays_its_service_per_remote_worker():
    """A synchronous round serves every remote worker in turn: p' = p − 1 requests at the idle service time less
    the update (the round applies once, and the step already counts that update), unless the link takes longer."""
    base = Scenario.of(nodes=4, grad_bytes=80e3, bandwidth_Bps=1e9, compute_s=0.002, update_s=0.0003,
                       host_s=0.0004, ps_colocated=True)
    plain = predict(base).result("ps-sync")
    assert plain.server_s == 0.0  # not calibrated: the link alone
    served = predict(base.with_changes(ps_service_s=0.004, ps_service_idle_s=0.0019)).result("ps-sync")
    assert served.iteration_s == pytest.approx(0.002 + 0.0003 + 0.0004 + 3 * (0.0019 - 0.0003))
    assert served.server_s == pytest.approx(served.iteration_s - plain.iteration_s) and served.server_s > 0
    terms = ("compute_s", "straggler_s", "interference_s", "update_s", "handoff_s", "buffers_s", "host_s",
             "lockstep_s", "server_s", "exposed_comm_s", "codec_s")
    assert sum(getattr(served, t) for t in terms) == pytest.approx(served.iteration_s)
    slow_link = base.with_changes(bandwidth_Bps=12.5e6, ps_service_s=0.004, ps_service_idle_s=0.0019)
    assert predict(slow_link).result("ps-sync").server_s == 0.0  # 6 × 80 kB at 100 Mbit/s outlast the service
    dedicated = predict(base.with_changes(ps_colocated=False, ps_service_idle_s=0.0019)).result("ps-sync")
    assert dedicated.server_s == 0.0  # the probe measures a co-located server only


def test_a_ps_async_run_is_measured_by_its_slowest_workers_mean(tmp_path):
    """Rank 0 (beside the server) steps fast; the remote workers step slowly while it trains, faster after. The
    job's pace is the slowest worker's mean, not its median (one phase) nor the per-step maximum (jitter)."""
    step = lambda t, c=0.002: {"t_iter": t, "t_compute": c, "t_update": 0.0}  # noqa: E731
    rank0 = [step(0.003, 0.0025)] * 12
    remote_a = [step(0.010)] * 4 + [step(0.005)] * 8
    remote_b = [step(0.011)] * 4 + [step(0.006), step(0.004)] * 4
    (run,) = read_runs(write_run(tmp_path, "job", "ps-async", {0: rank0, 1: remote_a, 2: remote_b}), skip=2)
    assert run.t_iter == pytest.approx(tuple(t["t_iter"] for t in remote_b[2:]))  # rank 2 took longest in all
    assert run.measured_s == pytest.approx(statistics.fmean(t["t_iter"] for t in remote_b[2:]))
    assert run.measured_s != pytest.approx(statistics.median(run.t_iter))
    assert run.t_compute == pytest.approx((0.002,) * 10)  # its own compute, not rank 0's


TINY_MLP = {"model": "mlp", "input_shape": (16,), "num_classes": 4, "batch_size": 8, "hidden": 8}  # probes' load


def _probe_on_ranks(rank, world_size):
    from pipesgd.measure.server import measure_ps_service

    return measure_ps_service(TINY_MLP, budget_s=0.5)["ps_service"]


def record_of_every_rank(probe_on_ranks, ranks: int = 3) -> dict:
    """A probe's record, run on ``ranks`` gloo processes; every rank must return the same (gathered) record."""
    results = run_ranks(probe_on_ranks, ranks, timeout_s=120)
    assert all(r == results[0] for r in results)
    return results[0]


@pytest.mark.slow
def test_the_probe_runs_a_colocated_async_job_and_splits_its_phases():
    record = record_of_every_rank(_probe_on_ranks)
    assert record["workers"] == 2 and record["steps"] >= 5 and record["statistic"] == "mean"
    assert record["busy"]["steps"] + record["idle"]["steps"] == 2 * record["steps"]
    for phase in ("busy", "idle"):
        if record[phase]["steps"]:
            assert record[phase]["response_s"] > 0 and record[phase]["think_s"] > 0
    terms = ps_service_terms(record)
    assert terms["ps_service_s"] > 0 and terms["ps_service_idle_s"] > 0
