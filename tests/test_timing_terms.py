"""timing_model terms added for issue 14: the allreduce anchored at the workload's size (calibration's probe),
the blocking buffer sync, and how a run's records feed them (fastest rank's buffer sync; ps-async's pace)."""
from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pytest

from timing_model.calibration import Calibration, Fit
from timing_model.core.costs import allreduce_cost
from timing_model.empirical.anchor import anchored
from timing_model.predict import Scenario, predict
from timing_model.validation import calibrated_scenario, read_runs

MB = 1e6
GBIT = 1.25e8


def scenario(**kw) -> Scenario:
    return Scenario.of(**{"nodes": 4, "grad_bytes": 1 * MB, "bandwidth_Bps": GBIT, "latency_s": 1e-4,
                       "compute_s": 0.02, "update_s": 0.001, **kw})


def comm(s: Scenario):
    cluster, _, codec, schedule, _ = s.records()
    return anchored(allreduce_cost(cluster, codec, schedule, per_hop=True), s.empirical.ring_anchor_s)


# ---------------------------------------------------------------- the anchor
def test_anchor_replaces_the_fit_at_this_size_and_names_the_difference():
    fit = comm(scenario(compression="q8", encode_Bps=1e9, decode_Bps=2e9))
    anchored = comm(scenario(compression="q8", encode_Bps=1e9, decode_Bps=2e9, ring_anchor_s=3 * fit.total_s))
    assert anchored.total_s == pytest.approx(3 * fit.total_s)
    assert anchored.anchor_s == pytest.approx(2 * fit.total_s)
    assert anchored.codec_s == pytest.approx(3 * fit.codec_s)  # every part scales by anchor / fit
    assert anchored.last_bucket_s == pytest.approx(3 * fit.last_bucket_s)
    assert comm(scenario()).anchor_s == 0.0  # no anchor: the fit alone


def test_anchor_leaves_error_feedback_on_top():
    """The probe times the codec's ring without error feedback; the run's feedback work is added to the anchor."""
    base = dict(compression="q8", encode_Bps=1e9, decode_Bps=2e9, error_feedback=True, feedback_Bps=5e8)
    with_ef = comm(scenario(**base))
    without = comm(scenario(**{**base, "error_feedback": False}))
    feedback = with_ef.total_s - without.total_s
    assert feedback > 0
    anchored = comm(scenario(**base, ring_anchor_s=0.05))
    assert anchored.total_s == pytest.approx(0.05 + feedback)
    assert anchored.anchor_s == pytest.approx(0.05 - without.total_s)


def test_anchor_moves_sync_and_pipe_but_not_the_parameter_server():
    plain, anchored = scenario(), scenario(ring_anchor_s=0.5)
    for mode in ("sync", "pipe"):
        assert predict(anchored, (mode,)).result(mode).iteration_s > predict(plain, (mode,)).result(mode).iteration_s
    for mode in ("ps-sync", "ps-async"):
        assert predict(anchored, (mode,)).result(mode).iteration_s == predict(plain, (mode,)).result(mode).iteration_s
    assert predict(anchored, ("sync",)).result("sync").anchor_s > 0
    with pytest.raises(ValueError, match="ring_anchor_s"):
        scenario(ring_anchor_s=-1.0).records()


def calibration(world: int = 4) -> Calibration:
    fit = Fit(overhead_s=0.0, latency_s=1e-4, bandwidth_Bps=GBIT, reduce_Bps=1e10, n_samples=5,
              median_abs_rel_err=0.0, max_abs_rel_err=0.0)
    rows = [{"compression": c, "n_bytes": 1e6, "ring_alone_s": t} for c, t in (("none", 0.02), ("q8", 0.03))]
    return Calibration(fits={"ring": fit, "backend": fit}, meta={"world_size": world},
                       host={"overlap": rows + [{"compression": "none", "n_bytes": 4e6, "ring_alone_s": 0.07}]})


@pytest.mark.parametrize("mode, compression, size, nodes, expected", [
    ("sync", "none", 1e6, 4, 0.02), ("pipe", "q8", 1e6 + 4, 4, 0.03), ("ddp", "none", 4e6, 4, 0.07),
    ("pipe", "q8", 2e6, 4, 0.0),  # the probe did not run this size
    ("pipe", "bf16", 1e6, 4, 0.0),  # nor this codec
    ("sync", "none", 1e6, 2, 0.0),  # nor this world size
    ("ddp", "q8", 1e6, 4, 0.0),  # DDP with a comm hook runs another collective
    ("ps-sync", "none", 1e6, 4, 0.0),
])
def test_calibration_anchor_only_where_the_probe_measured_that_collective(mode, compression, size, nodes, expected):
    assert calibration().ring_anchor_s(mode, compression, size, nodes) == expected


def test_calibrated_scenario_takes_the_anchor_unless_given():
    s = scenario(grad_bytes=1e6, compression="q8")
    assert calibrated_scenario(s, calibration(), "pipe").empirical.ring_anchor_s == 0.03
    assert calibrated_scenario(s.with_changes(ring_anchor_s=0.5), calibration(), "pipe").empirical.ring_anchor_s == 0.5


# ---------------------------------------------------------------- the buffer sync
def test_buffer_sync_sits_in_pipes_window_and_beside_a_synchronous_ring():
    s = scenario(grad_bytes=1e3)  # a tiny gradient: pipe is compute-bound, the ring's bytes take 12 µs on the wire
    wire = comm(s).wire_s
    assert wire == pytest.approx(2 * 3 / 4 * 1e3 / GBIT)  # the ring's β·bytes, no latency
    for mode, width, added in (("pipe", 2, 0.005), ("pipe", 1, 0.005 - wire), ("sync", 1, 0.005 - wire)):
        before = predict(replace(s, width=width), (mode,)).result(mode)
        after = predict(s.with_changes(width=width, buffers_s=0.005), (mode,)).result(mode)
        assert after.iteration_s == pytest.approx(before.iteration_s + added), (mode, width)
        assert after.buffers_s == pytest.approx(added)
    # a slow link: the sync's messages wait behind the ring's 120 ms on the wire, inside the ring's time
    slow = scenario(bandwidth_Bps=12.5e6)
    assert comm(slow).wire_s == pytest.approx(0.12)
    plain, synced = (predict(slow.with_changes(buffers_s=b), ("sync",)).result("sync") for b in (0.0, 0.02))
    assert synced.iteration_s == plain.iteration_s and synced.buffers_s == 0.0
    assert predict(slow.with_changes(buffers_s=0.13), ("sync",)).result("sync").buffers_s == pytest.approx(0.01)
    ddp = predict(s.with_changes(buffers_s=0.005), ("ddp",)).result("ddp")
    assert ddp.buffers_s == 0.0  # DDP broadcasts in its forward: inside its compute


def test_the_wire_time_is_scaled_to_the_anchor_only_down():
    fit = comm(scenario(bandwidth_Bps=12.5e6))
    assert fit.wire_s == pytest.approx(0.12) and fit.total_s > fit.wire_s  # latency and overhead besides
    assert comm(scenario(bandwidth_Bps=12.5e6, ring_anchor_s=0.1)).wire_s == pytest.approx(0.1)
    assert comm(scenario(bandwidth_Bps=12.5e6, ring_anchor_s=0.2)).wire_s == pytest.approx(0.12)


# ---------------------------------------------------------------- the measured host work per step
def test_host_work_adds_beyond_the_hand_off_estimate_in_every_mode():
    s = scenario(grad_bytes=1e3, handoff_s=0.001)  # a tiny gradient: pipe is compute-bound
    for mode in ("sync", "pipe", "ddp", "ps-sync"):
        before = predict(s, (mode,)).result(mode)
        covered = predict(s.with_changes(host_s=0.0005), (mode,)).result(mode)  # less than pipe/sync's hand-off
        after = predict(s.with_changes(host_s=0.004), (mode,)).result(mode)
        extra = 0.004 - before.handoff_s
        assert after.iteration_s == pytest.approx(before.iteration_s + extra), mode
        assert after.host_s == pytest.approx(extra)
        if mode in ("sync", "pipe"):
            assert covered.iteration_s == pytest.approx(before.iteration_s) and covered.host_s == 0.0
    with pytest.raises(ValueError, match="host_s"):
        predict(s.with_changes(host_s=-1.0), ("sync",))


def test_read_runs_takes_the_slowest_ranks_host_work(tmp_path):
    """Host work = t_iter less data, compute, wait, update and buffer sync, per step the slowest rank's."""
    step = lambda other: {"t_iter": 0.1 + other, "t_data": 0.01, "t_compute": 0.05, "t_wait": 0.03,  # noqa: E731
                          "t_update": 0.005, "t_buffers": 0.005}
    (run,) = read_runs(write_run(tmp_path, "h", "sync", {0: [step(0.002)] * 6, 1: [step(0.0005)] * 6}), skip=1)
    assert run.t_host == pytest.approx((0.002,) * 5)
    late = {r: [{"t_iter": 0.05, "t_compute": 0.05, "t_update": 0.001}] * 6 for r in range(2)}
    (floored,) = read_runs(write_run(tmp_path, "f", "sync", late), skip=1)
    assert floored.t_host == (0.0,) * 5  # timers that overlap a little never make it negative


def write_run(folder, name, mode, per_rank):
    """per_rank: rank -> list of step dicts (t_iter, t_compute, t_update, optional t_buffers)."""
    paths = []
    for rank, steps in per_rank.items():
        lines = [{"type": "config", "mode": mode, "world_size": len(per_rank), "grad_bytes": 1e6}] if rank == 0 else []
        lines += [{"type": "step", "step": s, "rank": rank, **fields} for s, fields in enumerate(steps)]
        path = folder / f"{name}.rank{rank}.jsonl"
        path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        paths.append(str(path))
    return paths


def test_read_runs_takes_the_fastest_ranks_buffer_sync(tmp_path):
    """The rank that arrives last at the sync waits least: its time is the sync's own cost."""
    step = lambda buffers: {"t_iter": 0.1, "t_compute": 0.05, "t_update": 0.001, "t_buffers": buffers}  # noqa: E731
    (run,) = read_runs(write_run(tmp_path, "bn", "pipe", {0: [step(0.030)] * 6, 1: [step(0.004)] * 6}), skip=1)
    assert run.t_buffers == pytest.approx((0.004,) * 5)
    no_bn = {r: [{"t_iter": 0.1, "t_compute": 0.05, "t_update": 0.001}] * 6 for r in range(2)}
    (plain,) = read_runs(write_run(tmp_path, "plain", "sync", no_bn), skip=1)
    assert plain.t_buffers == (0.0,) * 5


def test_ps_async_is_measured_at_the_slowest_workers_pace(tmp_path):
    """Async workers are not in lockstep: a worker beside a co-located server steps fast; the job's pace is the
    slowest worker's, not the mean of the two paces."""
    fast = [{"t_iter": 0.01, "t_compute": 0.005, "t_update": 0.001}] * 8
    slow = [{"t_iter": 0.09, "t_compute": 0.005, "t_update": 0.001}] * 8
    (run,) = read_runs(write_run(tmp_path, "async", "ps-async", {0: fast, 1: slow}), skip=2)
    assert statistics.median(run.t_iter) == pytest.approx(0.09)
    (lock,) = read_runs(write_run(tmp_path, "lock", "ps-sync", {0: fast, 1: slow}), skip=2)
    assert statistics.median(lock.t_iter) == pytest.approx(0.05)


# ---------------------------------------------------------------- the lockstep term
def test_lockstep_is_the_synchronous_step_beyond_its_parts_and_signed():
    from timing_model.empirical.host_terms import host_terms, lockstep_from_timings
    from timing_model.fitting import host_record

    assert lockstep_from_timings(0.013, 0.009) == pytest.approx(0.004)
    assert lockstep_from_timings(0.008, 0.009) == pytest.approx(-0.001)  # quicker than its parts: a refilled bucket
    # a calibration written when the term was floored: the record's paired excess gives the signed term again
    floored = {"lockstep_s": 0.0, "lockstep": {"excess_s": 0.0084, "ring_alone_s": 0.0102}}
    assert host_terms(floored)["lockstep_s"] == pytest.approx(-0.0018)
    assert host_terms({"lockstep_s": 0.002})["lockstep_s"] == 0.002  # no record: the stored term
    # beyond the anchor the prediction adds, when there is one (the probe's own all-reduce alone is another timing)
    assert host_terms(floored, ring_alone_s=0.0051)["lockstep_s"] == pytest.approx(0.0033)
    with pytest.raises(ValueError, match="lockstep"):
        lockstep_from_timings(0.013, -0.009)
    raw = {"lockstep": {"load": "lenet", "steps": 30, "period_s": 0.0185, "compute_max_s": 0.0065,
                        "excess_s": 0.0117, "ring_alone_s": 0.0077}}
    host = host_record(raw)
    assert host["lockstep_s"] == pytest.approx(0.0040) and host["lockstep"] == raw["lockstep"]  # the paired excess
    older = {"lockstep": {k: v for k, v in raw["lockstep"].items() if k != "excess_s"}}
    assert host_record(older)["lockstep_s"] == pytest.approx(0.0043)  # before it: the difference of the medians
    assert "lockstep_s" not in host_record({})  # no model, no probe


def test_lockstep_adds_to_every_step_that_ends_in_a_blocking_allreduce():
    s = scenario(grad_bytes=1e3)  # a tiny gradient: pipe is compute-bound
    for mode, width, adds in (("sync", 1, True), ("ddp", 1, True), ("pipe", 1, True), ("pipe", 2, False),
                              ("ps-sync", 1, False), ("ps-async", 1, False)):
        before = predict(replace(s, width=width), (mode,)).result(mode)
        after = predict(s.with_changes(width=width, lockstep_s=0.003), (mode,)).result(mode)
        assert after.iteration_s == pytest.approx(before.iteration_s + (0.003 if adds else 0.0)), (mode, width)
        assert after.lockstep_s == (0.003 if adds else 0.0)
        terms = ("compute_s", "straggler_s", "interference_s", "update_s", "handoff_s", "buffers_s", "host_s",
                 "lockstep_s", "exposed_comm_s", "codec_s")
        if mode != "ps-async":  # its iteration is the server's pace, not a sum of one worker's terms
            assert sum(getattr(after, t) for t in terms) == pytest.approx(after.iteration_s), (mode, width)


def test_a_negative_lockstep_hides_at_most_the_compute():
    s = scenario(grad_bytes=1e3)
    for mode in ("sync", "ddp"):
        before = predict(s, (mode,)).result(mode)
        quicker = predict(s.with_changes(lockstep_s=-0.004), (mode,)).result(mode)
        assert quicker.iteration_s == pytest.approx(before.iteration_s - 0.004) and quicker.lockstep_s == -0.004
        floor = predict(s.with_changes(lockstep_s=-1.0), (mode,)).result(mode)
        assert floor.lockstep_s == pytest.approx(-0.02)  # −compute: nothing hides more than the bucket refilled
    with pytest.raises(ValueError, match="lockstep_s"):
        predict(s.with_changes(lockstep_s=float("nan")), ("sync",))


def test_calibrated_scenario_takes_the_lockstep_beyond_the_anchor():
    cal = calibration()
    cal.host = {**cal.host, "lockstep_s": 0.0, "lockstep": {"excess_s": 0.025, "ring_alone_s": 0.03}}
    s = scenario()  # 1 MB on 4 nodes: the anchor is 20 ms
    assert calibrated_scenario(s, cal, "sync").empirical.lockstep_s == pytest.approx(0.005)
    assert calibrated_scenario(replace(s, grad_bytes=3e6), cal, "sync").empirical.lockstep_s == pytest.approx(-0.005)


def test_calibrated_scenario_takes_the_lockstep_term_unless_given():
    cal = calibration()
    cal.host = {"lockstep_s": 0.004}
    s = scenario()
    assert calibrated_scenario(s, cal, "sync").empirical.lockstep_s == 0.004
    assert calibrated_scenario(s.with_changes(lockstep_s=0.001), cal, "sync").empirical.lockstep_s == 0.001


# ---------------------------------------------------------------- DDP with one bucket
def test_ddp_overlaps_nothing_when_the_gradient_fits_one_bucket():
    """DDP all-reduces a one-bucket gradient after backward (a comm hook's timestamps: ResNet-20's 1.09 MB); only
    a gradient of several buckets overlaps backward, and pays κ there."""
    one = scenario(grad_bytes=20 * MB, compute_s=0.1, slowdown=0.5, overlap_fraction=0.5, bucket_bytes=25 * 2**20)
    ddp, sync = predict(one, ("ddp", "sync")).result("ddp"), predict(one, ("sync",)).result("sync")
    assert ddp.interference_s == 0.0
    assert ddp.iteration_s == pytest.approx(sync.iteration_s - sync.handoff_s + ddp.handoff_s)
    two = replace(one, bucket_bytes=10 * MB)  # two buckets: the first all-reduces during backward
    assert predict(two, ("ddp",)).result("ddp").interference_s > 0


# ---------------------------------------------------------------- the DDP probe's term
def test_ddp_takes_what_the_probe_step_took_beyond_the_model_for_its_own_compute():
    """One bucket: the model's DDP step is compute + all-reduce + update + host + the term; with the probe, the
    term is its step less the model's step for the probe's compute, so a run of the probe's compute is predicted
    at exactly the probe's step (plus the run's update), and the lockstep term no longer counts for ddp."""
    s = scenario(grad_bytes=4 * MB, ring_anchor_s=0.010, lockstep_s=0.002, copy_Bps=1e9)
    without = predict(s, ("ddp", "sync"))
    probed = s.with_changes(ddp_step_s=0.045, ddp_compute_s=0.025)
    ddp, sync = predict(probed, ("ddp",)).result("ddp"), predict(probed, ("sync",)).result("sync")
    hand = 2 * 4 * MB / 1e9  # DDP's bucket copies, in its step and in the probe's
    assert ddp.lockstep_s == pytest.approx(0.045 - (0.025 + 0.010 + hand))
    assert ddp.iteration_s == pytest.approx(0.045 - 0.025 + s.compute_s + s.update_s)
    assert without.result("ddp").lockstep_s == 0.002  # not probed: the lockstep term, as before
    assert sync.iteration_s == without.result("sync").iteration_s  # sync keeps the lockstep term
    quick = predict(probed.with_changes(ddp_step_s=0.001), ("ddp",)).result("ddp")
    assert quick.lockstep_s == pytest.approx(-s.compute_s)  # at least −compute


def test_ddp_term_with_several_buckets_is_the_residual_of_the_overlapped_step():
    s = scenario(grad_bytes=20 * MB, compute_s=0.1, slowdown=0.2, comm_slowdown=0.1, overlap_fraction=0.5,
                 bucket_bytes=10 * MB, ddp_step_s=0.3, ddp_compute_s=0.1)
    ddp = predict(s, ("ddp",)).result("ddp")
    assert ddp.iteration_s == pytest.approx(0.3 + s.update_s)  # the run's compute is the probe's
    assert ddp.interference_s > 0  # the overlap stays the model's


def test_the_ddp_probe_needs_its_step_and_its_compute():
    with pytest.raises(ValueError, match="both its step and its compute"):
        predict(scenario(ddp_step_s=0.04), ("ddp",))
    with pytest.raises(ValueError, match="ddp_compute_s"):
        predict(scenario(ddp_step_s=0.04, ddp_compute_s=-0.01), ("ddp",))


def test_the_ddp_probe_flows_from_the_raw_record_to_the_scenario():
    from timing_model.fitting import host_record
    from timing_model.empirical.host_terms import host_terms
    raw = {"ddp_step": {"load": "lenet forward+backward, batch 32", "steps": 900, "period_s": 0.013,
                        "compute_s": 0.002}}
    host = host_record(raw)
    assert host["ddp_step"] == raw["ddp_step"]
    terms = host_terms(host)
    assert (terms["ddp_step_s"], terms["ddp_compute_s"]) == (0.013, 0.002)
    assert (host_terms({})["ddp_step_s"], host_terms({})["ddp_compute_s"]) == (0.0, 0.0)  # not probed
    cal = calibration()
    cal.host = {**cal.host, **host}
    calibrated = calibrated_scenario(scenario(), cal, "ddp")
    assert (calibrated.empirical.ddp_step_s, calibrated.empirical.ddp_compute_s) == (0.013, 0.002)
