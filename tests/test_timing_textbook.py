"""The timing model with every empirical term off is the textbook: each mode's iteration time equals the α-β-γ
equations of REFERENCES §2, written out again here by hand, for a few parameter sets; the plain ``predict`` (no
calibration file) gives the same; and the composition of core and empirical terms adds nothing when the terms are
neutral, while each term, turned on alone, moves some mode."""
from __future__ import annotations

import json
import math
import random

import pytest

from timing_model.cli import main
from timing_model.core import equations
from timing_model.core.costs import allreduce_cost, ps_cost
from timing_model.core.straggler import expected_max_normal
from timing_model.empirical.terms import EMPIRICAL_FIELDS, NEUTRAL, EmpiricalTerms
from timing_model.modes import MODES, predict_mode
from timing_model.params import CODEC_RATIOS
from timing_model.predict import Scenario, predict

REL = 1e-12  # the same arithmetic in another order
E_MAX_NORMAL_4 = 1.029  # E[max of 4 standard normals] (REFERENCES §2, straggler)

# Parameter sets: workers, gradient bytes, bandwidth (bytes/s), latency, per-call overhead, reduction rate
# (bytes/s), compute mean and spread, update.
SETS = {
    "resnet50-10gbe": dict(nodes=4, grad_bytes=100e6, bandwidth_Bps=1.25e9, latency_s=0.0, overhead_s=0.0,
                           reduce_Bps=math.inf, compute_s=0.120, compute_std_s=0.0, update_s=0.005),
    "small-1gbe-latency": dict(nodes=8, grad_bytes=4e6, bandwidth_Bps=1.25e8, latency_s=50e-6, overhead_s=200e-6,
                               reduce_Bps=5e9, compute_s=0.020, compute_std_s=0.0, update_s=0.001),
    "straggler-100mbit": dict(nodes=4, grad_bytes=1.09e6, bandwidth_Bps=1.25e7, latency_s=1e-4, overhead_s=5e-4,
                              reduce_Bps=2e9, compute_s=0.150, compute_std_s=0.010, update_s=0.002),
    "two-nodes-comm-bound": dict(nodes=2, grad_bytes=244e6, bandwidth_Bps=1.25e8, latency_s=30e-6,
                                 overhead_s=0.0, reduce_Bps=math.inf, compute_s=0.300, compute_std_s=0.0,
                                 update_s=0.010),
}


def slowest_compute(s: dict) -> float:
    """T̂_c = E[max_i T_c,i] = μ + e_p·σ (only p = 4 carries a spread here)."""
    assert s["compute_std_s"] == 0.0 or s["nodes"] == 4
    return s["compute_s"] + E_MAX_NORMAL_4 * s["compute_std_s"]


def ring_allreduce(s: dict, M: float, r: float = 1.0) -> float:
    """T_AR = c0 + 2(p−1)α + 2(p−1)/p·M/(r·B) + (p−1)/p·M·γ (ring; r = 1 uncompressed)."""
    p, α, B, c0 = s["nodes"], s["latency_s"], s["bandwidth_Bps"], s["overhead_s"]
    γ = 0.0 if math.isinf(s["reduce_Bps"]) else 1.0 / s["reduce_Bps"]
    return c0 + 2 * (p - 1) * α + 2 * (p - 1) / p * M / (r * B) + (p - 1) / p * M * γ


def per_hop_codec(s: dict, enc_Bps: float, dec_Bps: float) -> float:
    """E·(M/p)/enc + D·(M/p)/dec with E = p, D = 2p − 1 (every hop re-encodes, the all-gather forwards payloads)."""
    p, M = s["nodes"], s["grad_bytes"]
    return p * (M / p) / enc_Bps + (2 * p - 1) * (M / p) / dec_Bps


def ps_push_pull(s: dict, workers: int, servers: int, colocated: bool) -> float:
    """T_PS = c0 + 2α + d·max(M/B_w, p'·M/(k·B_s)) + p'·M·γ_s/k with d = 2 (push, then pull), B_s = B_w = B,
    γ_s = 0, p' = p dedicated or p − 1 co-located (Paleo's OneToAll); c0 is one call's fixed cost, as in T_AR."""
    flows = workers - 1 if colocated else workers
    B, M = s["bandwidth_Bps"], s["grad_bytes"]
    return s["overhead_s"] + 2 * s["latency_s"] + 2 * max(M / B, flows * M / (servers * B))


def scenario(s: dict, **plain) -> Scenario:
    return Scenario(**{**s, "bucket_bytes": 0, **plain})  # one bucket: one collective call per iteration


@pytest.mark.parametrize("name", SETS)
def test_sync_is_compute_plus_update_plus_the_ring(name):
    s = SETS[name]
    expected = slowest_compute(s) + s["update_s"] + ring_allreduce(s, s["grad_bytes"])
    assert predict(scenario(s), ("sync",)).result("sync").iteration_s == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize("name", SETS)
def test_pipe_width_two_is_the_longer_of_compute_and_the_ring(name):
    s = SETS[name]
    expected = max(slowest_compute(s) + s["update_s"], ring_allreduce(s, s["grad_bytes"]))
    assert predict(scenario(s), ("pipe",)).result("pipe").iteration_s == pytest.approx(expected, rel=REL)
    width_one = slowest_compute(s) + s["update_s"] + ring_allreduce(s, s["grad_bytes"])
    assert predict(scenario(s, width=1), ("pipe",)).result("pipe").iteration_s == pytest.approx(width_one, rel=REL)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("codec, enc_Bps, dec_Bps", [("q8", 2e9, 3e9), ("fp16", 8e9, 8e9), ("sign", 1e9, 4e9)])
@pytest.mark.parametrize("allreduce", ["ring", "alltoall", "auto"])
def test_pipe_width_two_with_a_codec_on_every_hop(name, codec, enc_Bps, dec_Bps, allreduce):
    s = SETS[name]
    r = CODEC_RATIOS[codec]  # an input, like the bandwidth: raw fp32 bytes over payload bytes
    # the exchange (what "auto" runs for a lossy codec): the ring's steps, bytes and codec passes, one call more
    calls = 1 if allreduce == "ring" else 2
    ring = ring_allreduce(s, s["grad_bytes"], r) + (calls - 1) * s["overhead_s"] + per_hop_codec(s, enc_Bps, dec_Bps)
    expected = max(slowest_compute(s) + s["update_s"], ring)
    plain = scenario(s, compression=codec, encode_Bps=enc_Bps, decode_Bps=dec_Bps, allreduce=allreduce)
    assert predict(plain, ("pipe",)).result("pipe").iteration_s == pytest.approx(expected, rel=REL)
    sync = slowest_compute(s) + s["update_s"] + ring
    assert predict(plain, ("sync",)).result("sync").iteration_s == pytest.approx(sync, rel=REL)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("n_buckets, φ", [(1, 0.5), (4, 0.5), (10, 0.3), (10, 0.0)])
def test_ddp_overlaps_the_buckets_with_the_end_of_backward(name, n_buckets, φ):
    s = SETS[name]
    T_c, M = slowest_compute(s), s["grad_bytes"]
    last = ring_allreduce(s, M / n_buckets)  # each bucket is one collective call of M/n bytes
    T_AR = n_buckets * last
    expected = max(T_c, (1 - φ) * T_c + T_AR, T_c + last) + s["update_s"]
    plain = scenario(s, bucket_bytes=M / n_buckets, overlap_fraction=φ)
    assert predict(plain, ("ddp",)).result("ddp").iteration_s == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("servers, colocated", [(1, False), (2, False), (1, True)])
def test_parameter_server_sync_and_async(name, servers, colocated):
    s = SETS[name]
    p, M, B = s["nodes"], s["grad_bytes"], s["bandwidth_Bps"]
    plain = scenario(s, servers=servers, ps_colocated=colocated)
    sync = slowest_compute(s) + s["update_s"] + ps_push_pull(s, p, servers, colocated)
    assert predict(plain, ("ps-sync",)).result("ps-sync").iteration_s == pytest.approx(sync, rel=REL)
    # updates/s ≈ min(p/(T_c + T_u + T_PS,worker), k·B_s/(2M)): p updates take the longer of one worker's own cycle
    # (its push + pull alone) and the servers' links carrying every remote worker's M each way
    remote = p - 1 if colocated else p
    cycle = s["compute_s"] + s["update_s"] + ps_push_pull(s, 1, servers, False)
    expected = max(cycle, remote * 2 * M / (servers * B))
    assert predict(plain, ("ps-async",)).result("ps-async").iteration_s == pytest.approx(expected, rel=REL)


def test_predict_without_a_calibration_file_is_the_textbook(capsys):
    s = SETS["straggler-100mbit"]
    argv = ["predict", "--nodes", "4", "--bytes", "1.09MB", "--bandwidth", "100Mbit/s", "--latency", "100us",
            "--overhead", "500us", "--reduce-rate", "2GB/s", "--compute", "150ms", "--compute-std", "10ms",
            "--update", "2ms", "--bucket", "0", "--format", "json"]
    assert main(argv) == 0
    rows = {r["mode"]: r["iteration_s"] for r in json.loads(capsys.readouterr().out)}
    T_cu, T_AR = slowest_compute(s) + s["update_s"], ring_allreduce(s, s["grad_bytes"])
    assert rows["sync"] == pytest.approx(T_cu + T_AR, rel=REL)
    assert rows["pipe"] == pytest.approx(max(T_cu, T_AR), rel=REL)
    assert rows["ddp"] == pytest.approx(T_cu + T_AR, rel=REL)  # one bucket: nothing to overlap
    assert rows["ps-sync"] == pytest.approx(T_cu + ps_push_pull(s, 4, 1, False), rel=REL)


def _random_scenario(rng: random.Random) -> Scenario:
    return Scenario(nodes=rng.choice([1, 2, 3, 4, 8]), grad_bytes=rng.uniform(1e4, 3e8),
                    bandwidth_Bps=rng.uniform(1e7, 5e10), latency_s=rng.uniform(0, 1e-4),
                    overhead_s=rng.uniform(0, 1e-3), reduce_Bps=rng.choice([math.inf, rng.uniform(1e9, 1e10)]),
                    compute_s=rng.uniform(0, 0.3), compute_std_s=rng.choice([0.0, rng.uniform(0, 0.01)]),
                    update_s=rng.uniform(0, 0.01), compression=rng.choice(list(CODEC_RATIOS)),
                    encode_Bps=rng.uniform(1e8, 1e10), decode_Bps=rng.uniform(1e8, 1e10),
                    width=rng.choice([1, 2, 3]), overlap_fraction=rng.uniform(0, 1),
                    bucket_bytes=rng.choice([0.0, 25 * 2**20, rng.uniform(1e6, 5e7)]), servers=rng.choice([1, 2]),
                    ps_colocated=rng.random() < 0.5, collective=rng.choice(["ring", "rabenseifner", "tree"]))


def test_neutral_terms_compose_to_the_core_equations_exactly():
    """Bit for bit: each mode with ``NEUTRAL`` terms is its ``core.equations`` equation of the core's costs."""
    rng = random.Random(37)
    for _ in range(300):
        s = _random_scenario(rng)
        assert s.empirical == NEUTRAL and s.empirical.is_neutral()
        cluster, compute, codec, schedule, server = s.records()
        slow = expected_max_normal(s.nodes, s.compute_s, s.compute_std_s)
        ring = allreduce_cost(cluster, codec, schedule, per_hop=True)
        once = allreduce_cost(cluster, codec, schedule, per_hop=False)
        cycle = ps_cost(cluster, codec, schedule, server, asynchronous=True).total_s
        flows = s.nodes - 1 if s.ps_colocated else s.nodes
        link = equations.ps_server_link(flows, s.grad_bytes if cycle > 0 else 0.0, s.servers,
                                        s.bandwidth_Bps * codec.ratio)
        φ = s.overlap_fraction if once.buckets > 1 else 0.0
        core = {
            "sync": equations.sync_iteration(slow + s.update_s, ring.total_s),
            "pipe": equations.pipe_iteration(slow + s.update_s, ring.total_s, s.width),
            "ddp": equations.ddp_iteration(slow, s.update_s, once.total_s, once.last_bucket_s, φ),
            "ps-sync": equations.sync_iteration(slow + s.update_s, ps_cost(cluster, codec, schedule, server).total_s),
            "ps-async": equations.ps_async_iteration(s.compute_s, s.update_s, cycle, link),
        }
        for mode in MODES:
            assert predict_mode(mode, cluster, compute, codec, schedule, server, NEUTRAL).iteration_s == core[mode], (
                mode, s)


# one non-neutral value per empirical term, and a scenario where it acts (co-located server, several buckets)
TURNED_ON = {"ring_anchor_s": 0.5, "codec_call_s": 0.05, "slowdown": 0.3, "comm_slowdown": 0.5, "window_loss": 0.5,
             "copy_Bps": 1e8, "handoff_s": 0.01, "buffers_s": 0.2, "host_s": 0.05, "lockstep_s": 0.01,
             "ddp_step_s": 1.0, "ddp_compute_s": 0.1, "ps_service_s": 0.5, "ps_service_idle_s": 0.2,
             "ps_colocated_step_s": 0.001, "ps_round_s": 2.0, "send_buffer_bytes": 4 * 2**20}


def _iterations(scenario: Scenario) -> list[float]:
    return [r.iteration_s for r in predict(scenario).results]


def test_every_empirical_term_turned_on_alone_moves_some_mode():
    """On a communication-bound or a compute-bound cluster (co-located server, several buckets)."""
    assert set(TURNED_ON) == set(EMPIRICAL_FIELDS)
    service = {"ps_service_s": TURNED_ON["ps_service_s"]}
    # terms that refine the service time, compared with it (the co-located worker's step sets how long the server
    # is slow: it matters when the server is faster once that worker finished)
    refines = {"ps_service_idle_s": service, "ps_colocated_step_s": {**service, "ps_service_idle_s": 0.2}}
    for name, value in TURNED_ON.items():
        on = {name: value}
        if name in ("ddp_step_s", "ddp_compute_s"):  # the DDP probe gives both or neither
            on = {"ddp_step_s": TURNED_ON["ddp_step_s"], "ddp_compute_s": TURNED_ON["ddp_compute_s"]}
        before = refines.get(name, {})
        plain = {"compression": "q8"} if name == "codec_call_s" else {}  # a compressed all-reduce's own cost
        moved = False
        for bandwidth_Bps in (1.25e8, 1.25e9):
            base = Scenario.of(nodes=4, grad_bytes=20e6, bandwidth_Bps=bandwidth_Bps, compute_s=0.1, update_s=0.01,
                               bucket_bytes=5e6, ps_colocated=True, **before, **plain)
            changed = base.with_changes(empirical=EmpiricalTerms(**{**before, **on}))
            moved |= _iterations(changed) != pytest.approx(_iterations(base), rel=1e-9)
        assert moved, name
