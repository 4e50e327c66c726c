"""timing_model: exact arithmetic of REFERENCES §4.1, invariants, calibration and validation on synthetic data."""
from __future__ import annotations

import json
import statistics
import math
import os
import random
from dataclasses import replace

import pytest

from timing_model.core import collectives, equations, straggler
from timing_model.empirical import overlap, server
from timing_model.empirical.server import KERNEL_SEND_BUFFER_BYTES
from timing_model.calibration import Calibration, Fit, Sample, read_calibration, residual_table, write_calibration
from timing_model.fitting import fit_codec_costs, fit_collective
from timing_model.modes import MODES
from timing_model.params import (CODEC_RATIOS, ClusterParams, CodecParams, ComputeParams, ScheduleParams,
                                 ServerParams, build_codec)
from timing_model.predict import Scenario, predict, sweep
from timing_model.units import (parse_bandwidth, parse_bytes, parse_count, parse_size_range, parse_time)
from timing_model.validation import read_runs, summarise, validate_runs

MB = 1e6
GBE = 1.25e8  # bytes/s of 1 GbE line rate


def gbe(n: float) -> float:
    return GBE * n


# ---------------------------------------------------------------- exact arithmetic (REFERENCES §4.1)
@pytest.mark.parametrize("n_gbe, expected_s", [(1, 1.2), (10, 0.120), (25, 0.048), (100, 0.012)])
def test_ring_bandwidth_term_100MB_p4(n_gbe, expected_s):
    assert collectives.allreduce_ring(4, 100 * MB, 0.0, 1 / gbe(n_gbe)) == pytest.approx(expected_s, rel=1e-12)


@pytest.mark.parametrize("p, factor, expected_s", [(2, 1.0, 0.080), (4, 1.5, 0.120), (8, 1.75, 0.140),
                                                   (16, 1.875, 0.150)])
def test_ring_factor_by_p_on_10gbe(p, factor, expected_s):
    t = collectives.allreduce_ring(p, 100 * MB, 0.0, 1 / gbe(10))
    assert t == pytest.approx(expected_s, rel=1e-12)
    assert t / (100 * MB / gbe(10)) == pytest.approx(factor, rel=1e-12)


def test_full_model_sync_is_pure_formula_without_latency():
    s = Scenario(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=gbe(10))
    res = predict(s).result("sync")
    assert res.iteration_s == pytest.approx(0.120, rel=1e-12)
    assert res.exposed_comm_s == pytest.approx(0.120, rel=1e-12)
    assert res.codec_s == res.straggler_s == res.interference_s == 0.0


def test_single_parameter_server_2pM_over_B():
    assert equations.ps_transfer(4, 100 * MB, 0.0, gbe(10), gbe(10), 1, 2.0) == pytest.approx(0.640, rel=1e-12)
    s = Scenario(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=gbe(10))
    assert predict(s).result("ps-sync").iteration_s == pytest.approx(0.640, rel=1e-12)


def test_busbw_and_algbw():
    assert collectives.algbw(1e9, 0.010) == pytest.approx(100e9)
    assert collectives.busbw(8, 1e9, 0.010) == pytest.approx(175e9)
    assert collectives.busbw(8, 1e9, 0.010, "allgather") == pytest.approx(87.5e9)


def test_byteps_bound():
    assert collectives.byteps_bound(4, 0, 100 * MB, 1.25e9) == pytest.approx(0.120)
    assert collectives.byteps_bound(4, 4, 100 * MB, 1.25e9) == pytest.approx(0.080)


@pytest.mark.parametrize("n, simple, ll", [(2, 36.4, 12.0), (4, 92.4, 22.8), (8, 204.4, 44.4)])
def test_nccl_ring_latency(n, simple, ll):
    assert collectives.nccl_ring_latency_us(n, "Simple") == pytest.approx(simple)
    assert collectives.nccl_ring_latency_us(n, "LL") == pytest.approx(ll)


def test_hockney_half_size():
    assert collectives.hockney_half_size(50e-6, gbe(1)) == pytest.approx(6250)
    assert collectives.hockney_half_size(36e-6, 12e9) == pytest.approx(432e3)


def test_straggler_tables():
    assert [straggler.expected_max_normal_factor(p) for p in (2, 4, 8, 16)] == [0.564, 1.029, 1.424, 1.766]
    for p, table in ((2, 0.564), (4, 1.029), (8, 1.424), (16, 1.766)):  # the table agrees with the integral
        assert straggler._integrate_max_factor(p) == pytest.approx(table, abs=6e-4)
    assert straggler.expected_max_normal_factor(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-6)
    assert straggler.expected_max_normal(4, 0.1, 0.01) == pytest.approx(0.1 + 1.029 * 0.01)
    assert [round(straggler.harmonic(p), 3) for p in (2, 4, 8)] == [1.5, 2.083, 2.718]
    assert straggler.expected_max_exponential(2, 1.0) == pytest.approx(1.5)


def test_pipe_vs_sync_exactly_two_when_compute_equals_comm():
    assert equations.pipe_speedup_vs_sync(0.12, 0.12) == 2.0
    s = Scenario(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=gbe(10), compute_s=0.120)
    assert predict(s).speedup("pipe", "sync") == pytest.approx(2.0, rel=1e-12)
    assert predict(s.with_changes(slowdown=0.1)).speedup("pipe", "sync") < 2.0


def test_the_lookahead_replay_lengthens_the_pipelined_window_only():
    """The look-ahead replays the optimizer's rule each step at width 2 and up: 120 ms of compute, 30 ms of update
    and 30 ms of replay make a 180 ms window beside a 100 ms all-reduce; width 1, sync and DDP run no replay."""
    s = Scenario(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=gbe(10), compute_s=0.120, update_s=0.03)
    plain, replayed = predict(s), predict(s.with_changes(lookahead_s=0.03))
    assert replayed.result("pipe").iteration_s == pytest.approx(plain.result("pipe").iteration_s + 0.03, rel=1e-12)
    assert replayed.result("pipe").update_s == pytest.approx(0.06)
    for mode in ("sync", "ddp"):
        assert replayed.result(mode).iteration_s == plain.result(mode).iteration_s
    one = s.with_changes(width=1)
    assert predict(one.with_changes(lookahead_s=0.03)).result("pipe").iteration_s == predict(one).result(
        "pipe").iteration_s


def test_codec_ratios_and_passes():
    assert CODEC_RATIOS["q8"] == 4 * 4096 / 4100
    assert CODEC_RATIOS["q4"] == 8 * 4096 / 4104
    assert CODEC_RATIOS["sign"] == 32 * 4096 / 4128
    assert CODEC_RATIOS["bf16"] == CODEC_RATIOS["fp16"] == 2.0
    assert equations.codec_passes(4, per_hop=True) == (4, 7)  # E = p, D = 2p − 1 (REFERENCES §2)
    assert equations.codec_passes(4, per_hop=False) == (1, 1)
    assert equations.codec_passes(1, per_hop=True) == (0, 0)
    # per hop: (E + D)·(M/p)/rate = (3p − 1)/p·M/rate
    assert equations.codec_time(4, 100 * MB, 1e9, 1e9, True) == pytest.approx(2.75 * 0.1)
    # error feedback decodes and accumulates every encode's error: E·(M/p)/feedback_Bps more
    assert equations.codec_time(4, 100 * MB, 1e9, 1e9, True, 2e9) == pytest.approx(2.75 * 0.1 + 4 * 0.025 / 2)


# ---------------------------------------------------------------- invariants
def _random_scenario(rng: random.Random, **overrides) -> Scenario:
    fields = dict(nodes=rng.choice([1, 2, 3, 4, 8, 16]), grad_bytes=rng.uniform(1e4, 5e8),
                  bandwidth_Bps=rng.uniform(1e7, 5e10), latency_s=rng.uniform(0, 1e-4),
                  overhead_s=rng.uniform(0, 1e-3), compute_s=rng.uniform(0, 0.5),
                  compute_std_s=rng.uniform(0, 0.02), update_s=rng.uniform(0, 0.01),
                  overlap_fraction=rng.uniform(0, 1), collective=rng.choice(["ring", "rabenseifner", "tree"]))
    fields.update(overrides)
    return Scenario.of(**fields)


def test_one_worker_has_no_communication():
    s = Scenario(nodes=1, grad_bytes=100 * MB, bandwidth_Bps=gbe(1), latency_s=1e-4, overhead_s=1e-3,
                 compute_s=0.1, update_s=0.01, compute_std_s=0.01, ps_colocated=True)
    for res in predict(s).results:
        assert res.comm_total_s == 0.0, res.mode
        assert res.iteration_s == pytest.approx(0.11), res.mode
        assert res.regime == "no-communication"
    for fn in collectives.ALLREDUCE.values():
        assert fn(1, 1e8, 1e-4, 1e-9, 1e-10, 1e-3) == 0.0


def test_bandwidth_term_nondecreasing_in_p_and_below_2M_over_B():
    M, B = 100 * MB, gbe(10)
    terms = [collectives.allreduce_ring(p, M, 0.0, 1 / B) for p in range(1, 129)]
    assert all(b >= a for a, b in zip(terms, terms[1:]))
    assert all(t < 2 * M / B for t in terms)
    with_latency = [collectives.allreduce_ring(p, M, 5e-5, 1 / B, 1e-10, 1e-4) for p in range(1, 129)]
    assert all(b >= a for a, b in zip(with_latency, with_latency[1:]))


def test_pipe_at_most_twice_sync_and_never_slower():
    rng = random.Random(5)
    for _ in range(300):
        pred = predict(_random_scenario(rng))
        speedup = pred.speedup("pipe", "sync")
        assert 1.0 - 1e-12 <= speedup <= 2.0 + 1e-12


def test_breakdown_terms_add_up():
    rng = random.Random(7)
    for _ in range(200):
        s = _random_scenario(rng, compression=rng.choice(list(CODEC_RATIOS)), encode_Bps=rng.uniform(1e8, 1e10),
                             decode_Bps=rng.uniform(1e8, 1e10), slowdown=rng.uniform(0, 0.5),
                             comm_slowdown=rng.choice([0.0, rng.uniform(0, 0.5)]),
                             copy_Bps=rng.choice([math.inf, rng.uniform(1e9, 1e10)]),
                             handoff_s=rng.choice([0.0, rng.uniform(0, 1e-3)]),
                             buffers_s=rng.choice([0.0, rng.uniform(0, 5e-3)]),
                             host_s=rng.choice([0.0, rng.uniform(0, 5e-3)]),
                             lookahead_s=rng.choice([0.0, rng.uniform(0, 5e-3)]))
        for r in predict(s).results:
            parts = (r.compute_s + r.straggler_s + r.interference_s + r.update_s + r.handoff_s + r.buffers_s
                     + r.host_s + r.exposed_comm_s + r.codec_s)
            assert parts == pytest.approx(r.iteration_s, rel=1e-9, abs=1e-15), r
            assert min(r.exposed_comm_s, r.codec_s, r.interference_s, r.hidden_comm_s) >= 0


def test_compression_helps_only_when_saved_transfer_exceeds_codec_time():
    rng = random.Random(11)
    seen = set()
    for _ in range(300):
        p, M, B = rng.choice([2, 4, 8]), rng.uniform(1e6, 4e8), rng.uniform(1e8, 1e10)
        name = rng.choice(["fp16", "q8", "q4", "sign"])
        enc, dec = rng.uniform(5e7, 2e10), rng.uniform(5e7, 2e10)
        base = Scenario(nodes=p, grad_bytes=M, bandwidth_Bps=B, compute_s=0.05)
        plain = predict(base, ("sync",)).result("sync").iteration_s
        packed = predict(replace(base, compression=name, encode_Bps=enc, decode_Bps=dec), ("sync",))
        saved = equations.saved_transfer(p, M, B, CODEC_RATIOS[name])
        cost = equations.codec_time(p, M, enc, dec, True)
        helps = packed.result("sync").iteration_s < plain
        assert helps == (saved > cost)
        seen.add(helps)
    assert seen == {True, False}


def test_regime_label():
    s = Scenario(nodes=4, grad_bytes=4000, bandwidth_Bps=gbe(1), latency_s=50e-6)
    assert predict(s).result("sync").regime == "latency-bound"  # M/p = 1 KB < n½ = 6.25 KB
    assert predict(replace(s, grad_bytes=100 * MB)).result("sync").regime == "bandwidth-bound"
    assert predict(replace(s, latency_s=0.0)).result("sync").regime == "bandwidth-bound"


def test_ddp_limits_and_width_one_pipe():
    s = Scenario(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=gbe(10), compute_s=0.1, update_s=0.005)
    sync = predict(s).result("sync").iteration_s
    assert predict(replace(s, overlap_fraction=0.0)).result("ddp").iteration_s == pytest.approx(sync)
    assert predict(replace(s, width=1)).result("pipe").iteration_s == pytest.approx(sync)
    ddp = predict(s).result("ddp").iteration_s
    assert predict(s).result("pipe").iteration_s <= ddp <= sync


def test_straggler_only_in_synchronous_modes():
    s = Scenario(nodes=4, grad_bytes=1 * MB, bandwidth_Bps=gbe(10), compute_s=0.1, compute_std_s=0.01)
    pred = predict(s)
    assert pred.result("sync").straggler_s == pytest.approx(1.029 * 0.01)
    assert pred.result("ps-async").straggler_s == 0.0
    assert pred.result("ps-async").staleness == 3 and pred.result("pipe").staleness == 1


def test_ps_async_is_bounded_by_the_full_duplex_server_link():
    s = Scenario.of(nodes=8, grad_bytes=2 * MB, bandwidth_Bps=gbe(1), compute_s=0.01,
                    send_buffer_bytes=KERNEL_SEND_BUFFER_BYTES)
    res = predict(s).result("ps-async")
    # between two of a worker's updates the server's link carries the 8 workers' updates, M each direction
    assert res.iteration_s == pytest.approx(8 * 2 * MB / gbe(1))
    # a co-located server: 7 remote workers; two server shards halve the link's share
    assert predict(replace(s, ps_colocated=True)).result("ps-async").iteration_s == pytest.approx(7 * 2 * MB / gbe(1))
    assert predict(replace(s, servers=2)).result("ps-async").iteration_s == pytest.approx(4 * 2 * MB / gbe(1))


def test_ps_async_replies_beyond_the_socket_buffer_take_the_link_in_turn():
    """The server waits for each reply's send: what exceeds the kernel's socket buffers (4 MiB) is serial."""
    s = Scenario.of(nodes=8, grad_bytes=100 * MB, bandwidth_Bps=gbe(10), compute_s=0.01,
                    send_buffer_bytes=KERNEL_SEND_BUFFER_BYTES)
    assert predict(s).result("ps-async").iteration_s == pytest.approx(8 * (200 * MB - 4 * 2**20) / gbe(10))
    # bf16 halves the reply's wire bytes: the buffer holds twice the fp32-equivalent bytes
    bf16 = predict(replace(s, compression="bf16")).result("ps-async").iteration_s
    assert bf16 == pytest.approx(8 * (200 * MB - 8 * 2**20) / (2 * gbe(10)))
    link = {buffer: server.buffered_server_link(3, 1e6, 1, 1e6, buffer) for buffer in (4e6, 0.0)}
    assert equations.ps_async_iteration(0.0, 0.0, 0.0, link[4e6]) == pytest.approx(3.0)
    assert equations.ps_async_iteration(0.0, 0.0, 0.0, link[0.0]) == pytest.approx(6.0)


def test_ps_async_is_the_workers_own_cycle_when_the_link_keeps_up():
    s = Scenario(nodes=2, grad_bytes=1 * MB, bandwidth_Bps=gbe(10), compute_s=0.2, update_s=0.01)
    res = predict(s).result("ps-async")
    assert res.iteration_s == pytest.approx(0.21 + res.comm_total_s) and res.comm_total_s > 0
    assert res.iteration_s > 2 * MB / gbe(10)  # the link limit is below the worker's own cycle here


def test_sweep_covers_the_grid():
    base = Scenario(nodes=2, grad_bytes=100 * MB, bandwidth_Bps=gbe(1), compute_s=0.1)
    preds = sweep(base, {"nodes": [2, 4, 8], "bandwidth_Bps": [gbe(1), gbe(10)]})
    assert len(preds) == 6 and all(p.winner() in MODES for p in preds)
    with pytest.raises(ValueError):
        sweep(base, {"colour": [1]})


@pytest.mark.parametrize("make", [
    lambda: ClusterParams(0, 1e6, 1e9),
    lambda: ClusterParams(2, 1e6, 0.0),
    lambda: ClusterParams(2, 1e6, -1e9),
    lambda: ClusterParams(2, -1.0, 1e9),
    lambda: ClusterParams(2, 1e6, 1e9, latency_s=-1e-6),
    lambda: ClusterParams(2, 1e6, 1e9, collective="butterfly"),
    lambda: ComputeParams(-0.1),
    lambda: ComputeParams(0.1, compute_std_s=math.nan),
    lambda: CodecParams("x", ratio=0.5),
    lambda: ServerParams(servers=0),
    lambda: ScheduleParams(width=0),
    lambda: ScheduleParams(overlap_fraction=1.5),
    lambda: build_codec("zip"),
])
def test_parameter_records_reject_nonsense(make):
    with pytest.raises(ValueError):
        make()


# ---------------------------------------------------------------- units
@pytest.mark.parametrize("text, value", [
    ("1gbit", 1.25e8), ("10gbit", 1.25e9), ("10Gb/s", 1.25e9), ("10GbE", 1.25e9),
    ("1.25GB/s", 1.25e9), ("100Mbit/s", 1.25e7), ("500MiB/s", 500 * 2**20),
])
def test_parse_bandwidth(text, value):
    """Bytes per second (the rule itself: tests/test_bandwidth.py)."""
    assert parse_bandwidth(text) == pytest.approx(value)


def test_parse_other_units():
    assert parse_time("50us") == pytest.approx(50e-6)
    assert parse_time("2ms") == pytest.approx(2e-3)
    assert parse_time("0.12") == pytest.approx(0.12)
    assert parse_count("25M") == 25_000_000 and parse_count("61M") == 61_000_000
    assert parse_bytes("100MB") == 1e8 and parse_bytes("4KiB") == 4096 and parse_bytes("1GiB") == 2**30
    assert parse_size_range("4KB:64MB") == [2**k for k in range(12, 27)]
    assert parse_size_range("1GB:1TB") == [2**k for k in range(30, 41)]  # decimal prefixes drift up to 10 %


@pytest.mark.parametrize("fn, text", [
    (parse_bandwidth, "-1gbit"), (parse_bandwidth, "0gbit"), (parse_bandwidth, "10gbot"), (parse_bandwidth, "fast"),
    (parse_bandwidth, "10G"), (parse_time, "5 parsecs"), (parse_time, "-1ms"), (parse_bytes, "12 apples"),
    (parse_count, "61X"), (parse_bandwidth, "inf"), (parse_size_range, "64MB:4KB"), (parse_size_range, "10:14"),
    (parse_size_range, "4KB:5KB"),
])
def test_parse_rejects_nonsense(fn, text):
    with pytest.raises(ValueError, match=r"\S"):
        fn(text)


# ---------------------------------------------------------------- calibration
def _synthetic_samples(c0, alpha, bandwidth, reduce_rate, noise, seed=0, nodes=(2, 4, 8)):
    rng = random.Random(seed)
    out = []
    for p in nodes:
        for k in range(12, 27):
            M = float(2**k)
            t = collectives.allreduce_ring(p, M, alpha, 1 / bandwidth, 1 / reduce_rate, c0)
            out.append(Sample("allreduce", "ring", "none", p, M, t * (1 + rng.uniform(-noise, noise))))
    for k in range(12, 27):
        t = 2**k / reduce_rate + 3e-6
        out.append(Sample("reduce", "local", "none", 1, float(2**k), t * (1 + rng.uniform(-noise, noise))))
    return out


def test_calibration_recovers_known_terms_from_noisy_timings():
    c0, alpha, bandwidth, reduce_rate = 150e-6, 40e-6, 1.1e9, 4e9
    fit = fit_collective(_synthetic_samples(c0, alpha, bandwidth, reduce_rate, noise=0.01))
    assert fit.latency_s == pytest.approx(alpha, rel=0.05)
    assert fit.overhead_s == pytest.approx(c0, rel=0.05)
    assert fit.bandwidth_Bps == pytest.approx(bandwidth, rel=0.03)
    assert fit.reduce_Bps == pytest.approx(reduce_rate, rel=0.05)
    assert fit.median_abs_rel_err < 0.01 and fit.max_abs_rel_err < 0.03


def test_a_term_that_would_fit_negative_is_fixed_at_zero_and_the_rest_refitted():
    """Non-negative least squares: timings below the α-β line by a constant (c0 < 0) leave overhead at exactly 0
    and a note, and the rest is the least-squares fit without it (α and β stay close to the truth)."""
    fit = fit_collective(_synthetic_samples(-5e-6, 40e-6, 1.1e9, 4e9, noise=0.0))
    assert fit.overhead_s == 0.0 and "overhead fitted below zero: fixed at 0" in fit.notes
    assert fit.latency_s > 0 and fit.bandwidth_Bps == pytest.approx(1.1e9, rel=0.05)


def test_calibration_exact_without_noise_and_notes_at_one_cluster_size():
    fit = fit_collective(_synthetic_samples(0.0, 30e-6, 2e9, 1e10, noise=0.0))
    assert fit.latency_s == pytest.approx(30e-6, rel=1e-6) and fit.bandwidth_Bps == pytest.approx(2e9, rel=1e-6)
    single = fit_collective([s for s in _synthetic_samples(1e-4, 30e-6, 2e9, 1e10, 0.0, nodes=(4,))
                             if s.kind == "allreduce"])
    assert single.overhead_s == 0.0 and len(single.notes) == 3
    assert any("one cluster size" in n for n in single.notes) and any("burst" in n for n in single.notes)
    assert single.latency_s == pytest.approx(30e-6 + 1e-4 / 6, rel=1e-3)  # α absorbs c0/(2(p−1))
    with pytest.raises(ValueError):
        fit_collective([])


def test_codec_ring_factor_recovers_the_in_ring_codec_cost_per_cluster_size_and_round_trips(tmp_path):
    # compressed rings whose codec costs f x its isolated time on top of the wire: q8 2.5x at p = 2 and 4x at
    # p = 4 (ranks sharing cores), bf16 0.4x (hidden behind the wire)
    fit = Fit(0.0, 20e-6, 1e8, math.inf, 0, 0.0, 0.0)
    codecs = {"q8": (1e9, 3e9), "bf16": (4e9, 6e9), "q4": (1e9, 1e9)}
    truth, rng, samples = {"q8": {2: 2.5, 4: 4.0}, "bf16": {2: 0.4, 4: 0.4}}, random.Random(3), []
    for name, by_nodes in truth.items():
        for p, factor in by_nodes.items():
            for k in range(20, 26):
                n = float(2**k)
                wire = Fit(0.0, 20e-6, 1e8 * CODEC_RATIOS[name], math.inf, 0, 0.0, 0.0).predict(p, n)
                codec = equations.codec_time(p, n, *codecs[name], True)
                samples.append(Sample("allreduce", "ring", name, p, n,
                                      (wire + factor * codec) * (1 + rng.uniform(-0.01, 0.01))))
    factors, _ = fit_codec_costs(samples, fit, codecs, CODEC_RATIOS)
    assert set(factors) == {"q8", "bf16"}  # q4 has no ring samples: no factor, the model keeps 1
    for name, by_nodes in truth.items():
        for p, factor in by_nodes.items():
            assert factors[name][p] == pytest.approx(factor, rel=0.1)
    rows = residual_table(samples, fit, codecs=codecs, ratios=CODEC_RATIOS, factors=factors)
    assert max(abs(r["rel_err"]) for r in rows) < 0.03
    unscaled = residual_table(samples, fit, codecs=codecs, ratios=CODEC_RATIOS)
    assert max(abs(r["rel_err"]) for r in unscaled) > 0.2  # the isolated speeds alone do not explain them
    cal = Calibration({"ring": fit}, codecs, None, samples, rows, {}, {}, factors, {"q8": 2e9})
    assert cal.feedback_speed("q8", 4) == pytest.approx(2e9 / factors["q8"][4])
    assert cal.feedback_speed("bf16", 4) == math.inf  # not measured: free
    q8_at_4 = (1e9 / factors["q8"][4], 3e9 / factors["q8"][4])
    assert cal.codec_speeds("q8", 4) == pytest.approx(q8_at_4)
    assert cal.codec_speeds("q8", 8) == cal.codec_speeds("q8", 4)  # nearest calibrated cluster size
    assert cal.codec_speeds("q8", 3) == cal.codec_speeds("q8", 4)  # ties go to the larger size
    assert cal.codec_speeds("q4", 4) == (1e9, 1e9) and cal.codec_speeds("fp16", 4) == (math.inf, math.inf)
    write_calibration(str(tmp_path / "c.json"), cal)
    back = read_calibration(str(tmp_path / "c.json"))
    assert back.codec_ring_factors == factors and back.codec_speeds("q8", 4) == cal.codec_speeds("q8", 4)
    assert back.codec_feedback == {"q8": 2e9}
    data = json.loads((tmp_path / "c.json").read_text())
    data["codecs"]["q8"]["ring_factor_by_nodes"]["2"] = -1
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="ring_factor_by_nodes"):
        read_calibration(str(tmp_path / "c.json"))


def test_calibration_file_round_trip(tmp_path):
    samples = _synthetic_samples(1e-4, 30e-6, 2e9, 1e10, noise=0.01)
    cal = Calibration({"ring": fit_collective(samples)}, {"q8": (2e9, 3e9)}, None, samples, [],
                      {"backend": "gloo", "world_size": 8})
    path = tmp_path / "calib.json"
    write_calibration(str(path), cal)
    assert [p.name for p in tmp_path.iterdir()] == ["calib.json"]  # no temporary file left behind
    back = read_calibration(str(path))
    assert back.fits["ring"] == cal.fits["ring"] and back.codecs == cal.codecs
    assert back.fit_for("ddp") == cal.fits["ring"] and back.meta["world_size"] == 8
    json.loads(path.read_text())  # strict JSON
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_calibration(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="not found"):
        read_calibration(str(tmp_path / "missing.json"))


# ---------------------------------------------------------------- validation
FIT = Fit(overhead_s=2e-4, latency_s=3e-5, bandwidth_Bps=1.2e8, reduce_Bps=math.inf, n_samples=0,
          median_abs_rel_err=0.0, max_abs_rel_err=0.0)


def write_run(folder, name, mode, world, grad_bytes, compute_s, update_s, scale=1.0, steps=12, width=2):
    """Metrics files of a synthetic run whose iteration time is the model's prediction × scale."""
    s = Scenario(nodes=world, grad_bytes=grad_bytes, bandwidth_Bps=FIT.bandwidth_Bps, latency_s=FIT.latency_s,
                 overhead_s=FIT.overhead_s, compute_s=compute_s, update_s=update_s, width=width)
    t_iter = predict(s, (mode,)).result(mode).iteration_s * scale
    paths = []
    for rank in range(world):
        path = os.path.join(folder, f"{name}.rank{rank}.jsonl")
        with open(path, "w") as out:
            if rank == 0:
                out.write(json.dumps({"type": "config", "mode": mode, "world_size": world, "width": width,
                                      "compression": "none", "grad_bytes": grad_bytes}) + "\n")
            for step in range(steps):
                jitter = 1 + 0.002 * ((step + rank) % 3 - 1)
                # what is neither compute nor update is the wait for communication, as the trainer records it
                wait = max(0.0, t_iter * jitter - compute_s - update_s)
                out.write(json.dumps({"type": "step", "step": step, "rank": rank, "mode": mode,
                                      "t_iter": t_iter * jitter, "t_compute": compute_s, "t_wait": wait,
                                      "t_update": update_s, "bytes_sent": 0}) + "\n")
        paths.append(path)
    return paths


def test_validate_synthetic_runs(tmp_path):
    paths = write_run(tmp_path, "pipe4", "pipe", 4, 8e6, 0.05, 0.004)
    paths += write_run(tmp_path, "sync2", "sync", 2, 8e6, 0.05, 0.004, scale=1.10)
    cal = Calibration({"ring": FIT, "backend": FIT})
    checks = validate_runs(read_runs(paths, skip=3), cal)
    by_mode = {c.mode: c for c in checks}
    assert by_mode["pipe"].error == pytest.approx(0.0, abs=0.005) and by_mode["pipe"].steps == 9
    assert by_mode["sync"].error == pytest.approx(1 / 1.10 - 1, abs=0.005)
    summary = summarise(checks)
    assert summary["runs"] == 2 and summary["max_abs_error"] == pytest.approx(abs(1 / 1.10 - 1), abs=0.005)


def test_measured_is_the_period_not_the_slowest_rank_per_step(tmp_path):
    """Lockstep ranks whose wait moves between them: measured = the median step's mean over ranks (0.1 s, the
    period), while the model's compute input stays each step's slowest rank."""
    for rank in range(2):
        lines = [{"type": "config", "mode": "sync", "world_size": 2, "grad_bytes": 8e6}] if rank == 0 else []
        lines += [{"type": "step", "step": s, "rank": rank, "t_iter": 0.12 if (s + rank) % 2 else 0.08,
                   "t_compute": 0.03 + 0.01 * rank, "t_update": 0.001} for s in range(10)]
        (tmp_path / f"lock.rank{rank}.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (run,) = read_runs([str(tmp_path / f"lock.rank{r}.jsonl") for r in range(2)], skip=3)
    assert statistics.median(run.t_iter) == pytest.approx(0.1)
    assert run.t_compute == pytest.approx((0.04,) * 7)


def test_validate_rejects_bad_metrics(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "step", "step": 5\n')
    with pytest.raises(ValueError, match="malformed JSON"):
        read_runs([str(bad)])
    with pytest.raises(ValueError, match="not found"):
        read_runs([str(tmp_path / "nope.jsonl")])
    nosize = tmp_path / "nosize.jsonl"
    nosize.write_text(json.dumps({"type": "step", "step": 5, "rank": 0, "mode": "ddp", "t_iter": 0.1,
                                  "t_compute": 0.1, "t_update": 0.0}) + "\n")
    with pytest.raises(ValueError, match="gradient size"):
        read_runs([str(nosize)])


# ---------------------------------------------------------------- interference (κ, κc) and hand-off terms
def test_new_terms_at_defaults_reproduce_the_old_numbers_exactly():
    """κc = 0, copy rate ∞, hand-off 0: the old equations, bit for bit."""
    s = Scenario.of(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=gbe(10), compute_s=0.05, update_s=0.01, slowdown=0.1,
                    overlap_fraction=0.5, bucket_bytes=0)
    explicit = s.with_changes(comm_slowdown=0.0, copy_Bps=math.inf, handoff_s=0.0)
    T_cu, T_AR = 0.05 + 0.01, collectives.allreduce_ring(4, 100 * MB, 0.0, 1 / gbe(10))
    for scenario in (s, explicit):
        pred = predict(scenario)
        assert pred.result("sync").iteration_s == T_cu + T_AR
        assert pred.result("pipe").iteration_s == max(T_cu * 1.1, T_AR)
        assert pred.result("ddp").iteration_s == max(0.05 * (1 + 0.1 * 0.5), 0.5 * 0.05 + T_AR, 0.05 + T_AR) + 0.01
        assert all(r.handoff_s == 0.0 for r in pred.results)
    assert overlap.pipe_iteration_with(0.3, 0.2, 0.1, 2) == max(0.3 * 1.1, 0.2)
    assert overlap.overlapped_comm(0.2, 5.0, 0.0) == 0.2


def test_comm_slowdown_pipe_slows_the_ring_while_the_compute_side_runs():
    T_AR = collectives.allreduce_ring(4, 100 * MB, 0.0, 1 / gbe(10))  # 0.12 s
    s = Scenario.of(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=gbe(10), compute_s=0.2, comm_slowdown=0.1)
    # compute-bound: the ring runs beside compute all along and still finishes first: max(T_cu, 1.1·T_AR)
    assert predict(s).result("pipe").iteration_s == pytest.approx(max(0.2, 1.1 * T_AR), rel=1e-12)
    at_edge = replace(s, compute_s=1.1 * T_AR)
    assert predict(at_edge).result("pipe").iteration_s == pytest.approx(1.1 * T_AR, rel=1e-12)
    # ring-bound: slowed by κc during the 50 ms of compute only, at full rate afterwards
    short = replace(s, compute_s=0.05)
    assert predict(short).result("pipe").iteration_s == pytest.approx(T_AR + 0.1 * 0.05 / 1.1, rel=1e-12)
    assert overlap.pipe_iteration_with(0.05, T_AR, 0.0, 2, 0.1) == overlap.overlapped_comm(T_AR, 0.05, 0.1)
    assert overlap.overlapped_comm(0.12, math.inf, 0.1) == pytest.approx(0.132, rel=1e-12)
    # sync never overlaps: κc does not touch it
    assert predict(s).result("sync").iteration_s == pytest.approx(0.2 + T_AR, rel=1e-12)


def test_comm_slowdown_ddp_only_on_the_overlapped_part():
    s = Scenario.of(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=gbe(10), compute_s=0.1, bucket_bytes=10 * MB,
                    overlap_fraction=0.5, comm_slowdown=0.2)  # 10 buckets: the last one (12 ms) is not the limit
    T_AR = 0.12
    # ring outlasts the overlap window φ·T̂_c = 0.05: slowed by κc inside it only
    assert predict(s).result("ddp").iteration_s == pytest.approx(0.05 + T_AR + 0.2 * 0.05 / 1.2, rel=1e-12)
    sync = predict(s).result("sync").iteration_s
    assert predict(replace(s, overlap_fraction=0.0)).result("ddp").iteration_s == pytest.approx(sync, rel=1e-12)


def test_handoff_term_two_copies_plus_fixed_cost():
    M, copy, hand = 5 * MB, 2e9, 1e-3
    H = 2 * M / copy + hand  # 6 ms
    assert overlap.handoff_time(M, copy, hand) == pytest.approx(H, rel=1e-12)
    assert overlap.handoff_time(M, math.inf, 0.0) == 0.0
    s = Scenario.of(nodes=2, grad_bytes=M, bandwidth_Bps=gbe(1), compute_s=0.02, update_s=0.002, copy_Bps=copy,
                    handoff_s=hand, bucket_bytes=0)
    T_AR = M / gbe(1)  # p = 2: factor 1.0 → 40 ms
    pred = predict(s)
    assert pred.result("sync").iteration_s == pytest.approx(0.022 + H + T_AR, rel=1e-12)
    assert pred.result("sync").handoff_s == pytest.approx(H, rel=1e-12)
    # pipe: H is on the compute side (step() on the main thread); here the ring is longer
    assert pred.result("pipe").iteration_s == pytest.approx(T_AR, rel=1e-12)
    heavy = replace(s, compute_s=0.05)
    assert predict(heavy).result("pipe").iteration_s == pytest.approx(0.052 + H, rel=1e-12)
    # ddp pays the bucket copies, not the thread hand-off
    assert pred.result("ddp").handoff_s == pytest.approx(2 * M / copy, rel=1e-12)


def test_calibration_recovers_known_slowdowns_and_copy_rate():
    from timing_model.empirical.host_terms import copy_rate_from_timings, host_terms, slowdown_from_timings

    rng = random.Random(3)
    alone = [rng.uniform(0.01, 0.5) for _ in range(9)]
    together = [t * 1.15 * (1 + rng.uniform(-0.01, 0.01)) for t in alone]
    assert slowdown_from_timings(alone, together) == pytest.approx(0.15, abs=0.012)
    assert slowdown_from_timings([0.1, 0.2, 0.4], [0.11, 0.22, 0.44]) == pytest.approx(0.1, rel=1e-9)
    assert slowdown_from_timings([0.1], [0.09]) == 0.0  # faster together is noise: floored at 0
    sizes = [2.0**k for k in range(20, 25)]
    assert copy_rate_from_timings(sizes, [n / 4e9 for n in sizes]) == pytest.approx(4e9)
    with pytest.raises(ValueError):
        slowdown_from_timings([0.1], [])
    assert host_terms({}) == {"slowdown": 0.0, "comm_slowdown": 0.0, "window_loss": None, "lockstep_s": 0.0,
                              "ddp_step_s": 0.0, "ddp_compute_s": 0.0, "copy_Bps": math.inf,
                              "handoff_s": 0.0, "ps_service_s": 0.0, "ps_service_idle_s": 0.0, "ps_round_s": 0.0}


def test_fit_min_bytes_drops_burst_sized_samples():
    samples = _synthetic_samples(1e-4, 30e-6, 2e9, 1e10, 0.0)
    burst = [Sample("allreduce", "ring", "none", 2, 4096.0, 1e-6)]  # sent at line rate through the tbf burst
    fit = fit_collective(samples + burst, min_bytes=2**20)
    assert fit.bandwidth_Bps == pytest.approx(2e9, rel=1e-6) and fit.overhead_s == pytest.approx(1e-4, rel=1e-6)
    assert not any("burst" in n for n in fit.notes)
    assert fit.n_samples == sum(s.kind == "allreduce" and s.n_bytes >= 2**20 for s in samples)


def test_calibration_host_round_trip_and_validate_uses_it(tmp_path):
    host = {"compute_slowdown": 0.3, "comm_slowdown": 0.1, "copy_Bps": 2e9, "handoff_s": 5e-4}
    cal = Calibration({"ring": FIT, "backend": FIT}, host=host)
    path = tmp_path / "calib.json"
    write_calibration(str(path), cal)
    back = read_calibration(str(path))
    assert back.host == host
    (run,) = read_runs(write_run(tmp_path, "pipe2", "pipe", 2, 8e6, 0.05, 0.004), skip=3)
    from timing_model.validation import scenario_for

    sc = scenario_for(run, back)
    assert (sc.empirical.comm_slowdown, sc.empirical.copy_Bps, sc.empirical.handoff_s) == (0.1, 2e9, 5e-4)
    assert sc.empirical.slowdown == 0.0  # pipe's measured compute already ran next to the ring
    (sync,) = read_runs(write_run(tmp_path, "sync2", "sync", 2, 8e6, 0.05, 0.004), skip=3)
    assert scenario_for(sync, back).empirical.slowdown == 0.3
    (check,) = validate_runs([sync], back)
    T_AR = FIT.predict(2, 8e6)
    assert check.predicted_s == pytest.approx(0.054 + 2 * 8e6 / 2e9 + 5e-4 + T_AR, rel=1e-9)


def test_ddp_run_takes_the_compute_of_the_sync_run_of_its_folder(tmp_path):
    cal = Calibration({"ring": FIT, "backend": FIT})
    paths = write_run(tmp_path, "sync", "sync", 2, 8e6, 0.05, 0.004)
    ddp_paths = write_run(tmp_path, "ddp", "ddp", 2, 8e6, 0.05, 0.004)
    for path in ddp_paths:  # DDP's t_compute holds its in-backward allreduce: +30 ms
        lines = [json.loads(line) for line in open(path)]
        for rec in lines:
            if rec["type"] == "step":
                rec["t_compute"] += 0.030
        with open(path, "w") as out:
            out.write("".join(json.dumps(rec) + "\n" for rec in lines))
    runs = read_runs(paths + ddp_paths, skip=3)
    checks = {c.mode: c for c in validate_runs(runs, cal)}
    assert checks["ddp"].compute_from.endswith("sync.jsonl") and checks["ddp"].compute_s == pytest.approx(0.05)
    assert checks["ddp"].error == pytest.approx(0.0, abs=0.005)
    assert checks["sync"].compute_from == "own"
    plain = {c.mode: c for c in validate_runs(runs, cal, pair_ddp=False)}
    assert plain["ddp"].compute_from == "own" and plain["ddp"].error > 0.2
    forced = {c.mode: c for c in validate_runs(runs, cal, compute_override={runs[1].name: 0.01})}
    assert forced["ddp"].compute_s == 0.01 and forced["ddp"].compute_from == "override"


def test_error_feedback_adds_its_calibrated_cost_only_when_the_run_uses_it():
    base = Scenario(nodes=4, grad_bytes=100 * MB, bandwidth_Bps=gbe(10), compute_s=0.01, compression="q8",
                    encode_Bps=1e9, decode_Bps=1e9, feedback_Bps=2e9)
    plain = predict(base, ("sync",)).result("sync")
    kept = predict(replace(base, error_feedback=True), ("sync",)).result("sync")
    assert plain.codec_s == pytest.approx(equations.codec_time(4, 100 * MB, 1e9, 1e9, True))
    assert kept.codec_s - plain.codec_s == pytest.approx(4 * 25 * MB / 2e9)  # E = p encodes of M/p, each decoded
    assert kept.iteration_s - plain.iteration_s == pytest.approx(4 * 25 * MB / 2e9)


def test_validate_takes_error_feedback_from_the_run_config():
    from timing_model.validation import RunRecord, scenario_for

    cal = Calibration({"ring": FIT}, {"q8": (1e9, 2e9)}, codec_feedback={"q8": 3e9})
    config = {"mode": "pipe", "compression": "q8", "width": 2}
    run = RunRecord("r", {**config, "error_feedback": True}, "pipe", 4, 8e6, (0.1,), (0.05,), (0.004,))
    assert scenario_for(run, cal).error_feedback and scenario_for(run, cal).feedback_Bps == 3e9
    assert not scenario_for(replace(run, config=config), cal).error_feedback
