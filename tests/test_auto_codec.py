"""``PipeSGD(compression="auto")`` (``pipesgd.auto``): the decision against fake measurements, the link terms that
reproduce what was measured, every rank reaching the same choice from different measurements, a resume that keeps
the choice without measuring again, a named codec never measured or changed, and the options it refuses."""
from __future__ import annotations

import itertools
import time

import pytest
import torch
from torch import nn

from pipesgd import PipeSGD, auto
from pipesgd.auto import probes
from pipesgd.auto.allreduce_trial import ORDER
from pipesgd.options import PipeSGDOptions, WrapperConfig
from tests.wrap import split_options
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture

WARMUP = 3


def _measured(comm_s: float, small_allreduce_s: float, compute_s: float = 0.1) -> dict:
    speeds = {f"{c}_{d}_Bps": 1e11 for c in auto.CANDIDATES for d in ("encode", "decode")}
    return {"comm_s": comm_s, "small_allreduce_s": small_allreduce_s, "compute_s": compute_s, **speeds}


# A 4 MB gradient on 4 ranks: at 100 Mbit/s the ring moves 1.5 x 4 MB in 0.48 s; at 10 Gbit/s in 4.8 ms.
SLOW = _measured(0.48 + 6 * 1e-4, 0.48 / 64 + 6 * 1e-4)
FAST = _measured(0.0048 + 6 * 1e-5, 0.0048 / 64 + 6 * 1e-5)


@pytest.mark.parametrize("measured, width, want", [
    (SLOW, 2, ("q4", True)),    # 480 ms uncompressed behind a 100 ms step: only q4's 60 ms hides
    (FAST, 2, ("none", False)),  # 4.8 ms hides uncompressed
    (FAST, 1, ("none", False)),  # under 5 % of the step: no codec needed even synchronously
    (SLOW, 1, ("q4", True)),    # nothing hides at width 1: the fastest
])
def test_the_decision_from_measurements(measured, width, want):
    choice = auto.decide(measured, nodes=4, grad_bytes=4e6, knobs=auto.Knobs(width, None, None))
    assert (choice["compression"], choice["error_feedback"]) == want
    assert "measured: compute 100 ms per step" in choice["reason"] and choice["measured"] == measured


class _MyAdamW(torch.optim.AdamW):
    pass


@pytest.mark.parametrize("optimizer, adam", [
    (torch.optim.SGD, False), (torch.optim.Adam, True), (torch.optim.AdamW, True), (_MyAdamW, True)])
def test_under_adam_and_adamw_the_codec_goes_without_error_feedback_and_not_below_q8(optimizer, adam):
    knobs = auto.Knobs.of(2, "auto", False, optimizer.__mro__)
    assert (knobs.compression, knobs.width) == (None, 2)
    assert knobs.error_feedback is (False if adam else None)
    assert knobs.codecs_to_time() == (("bf16", "q8") if adam else ("bf16", "q8", "q4"))
    # the slow link: q4 + feedback under SGD (only it hides); under Adam nothing allowed hides, so the fastest, q8
    choice = auto.decide(SLOW, nodes=4, grad_bytes=4e6, knobs=knobs)
    assert (choice["compression"], choice["error_feedback"]) == (("q8", False) if adam else ("q4", True))
    assert ("no error feedback and nothing below q8 under Adam/AdamW" in choice["reason"]) is adam
    # a codec the user names keeps the feedback the user gave it, whatever the optimizer
    assert auto.Knobs.of("auto", "q8", True, optimizer.__mro__) == auto.Knobs(None, "q8", True)
    # the warm-up's provisional codec: the most compressed the choice may take
    assert knobs.fastest_codec() == (("q8", False) if adam else ("q4", True))


def test_the_link_terms_reproduce_both_measured_all_reduces():
    terms = auto.link_terms(SLOW, nodes=4, grad_bytes=4e6)
    for size, seconds in ((4e6, SLOW["comm_s"]), (4e6 / 64, SLOW["small_allreduce_s"])):
        model = 6 * terms["latency_s"] + 1.5 * size / terms["bandwidth_Bps"]  # the ring: 2(p-1) hops of M/p
        assert model == pytest.approx(seconds, rel=1e-9)
    assert terms["bandwidth_Bps"] == pytest.approx(100e6 / 8, rel=1e-6)
    assert auto.link_terms(SLOW, nodes=1, grad_bytes=4e6)["bandwidth_Bps"] == float("inf")


def test_the_step_clock_times_the_callers_work_between_steps_and_the_iteration():
    ticks = iter([0.0, 0.010, 0.110, 0.115, 0.315, 0.320])  # begins at 0, 0.11, 0.315; ends at 0.01, 0.115, 0.32
    clock = auto.StepClock(lambda: next(ticks))
    for wait in (0.001, 0.002, 0.003):
        clock.begin()
        clock.end(wait_s=wait)
    assert clock.gaps == pytest.approx([0.100, 0.200]) and clock.compute_s == pytest.approx(0.150)
    window = clock.window()
    assert window["period_s"] == pytest.approx(0.1575) and window["wait_s"] == 0.002
    # step()'s own work, what it did not block on communication: 10 - 1, 5 - 2, 5 - 3 ms
    assert clock.own == pytest.approx([0.009, 0.003, 0.002]) and window["update_s"] == pytest.approx(0.003)
    # from one step()'s end to the next's: the gap before a step, then the step (the first had no gap)
    assert clock.iterations == pytest.approx([0.105, 0.205]) and clock.fastest_s == pytest.approx(0.105)


def test_the_fastest_iteration_leaves_out_what_the_clock_skipped():
    """A probe after step 0 (``skip``) is neither compute nor an iteration: the warm-up's fastest iteration, which
    the hold's early look compares with (``pipesgd.auto.hold``), is step 1's own gap and step."""
    ticks = iter([0.0, 0.010, 0.500, 0.520, 0.530, 0.600, 0.610])  # step 0 to 0.01, a probe to 0.5, step 1, step 2
    clock = auto.StepClock(lambda: next(ticks))
    clock.begin()
    clock.end()
    clock.skip()
    clock.begin()
    clock.end()
    clock.begin()
    clock.end()
    assert clock.iterations == pytest.approx([0.030, 0.080])
    assert clock.synchronous()["fastest_s"] == pytest.approx(0.030)
    assert auto.StepClock().synchronous()["fastest_s"] == 0.0  # nothing timed: the median's, itself 0


def test_the_first_steps_compute_runs_from_its_first_forward_pass():
    ticks = iter([0.0, 0.100, 0.110, 0.300])  # the first forward at 0; step 0 from 0.1 to 0.11; step 1 at 0.3
    clock = auto.StepClock(lambda: next(ticks))
    clock.forward()
    clock.forward()  # a second micro-batch: ignored
    clock.begin()
    clock.end()
    clock.begin()  # step 1
    assert clock.gaps == pytest.approx([0.100, 0.190])


@pytest.mark.parametrize("options, needle", [
    (dict(compression="auto", error_feedback=True), "chooses error feedback"),
    (dict(compression="auto", warmup_steps=1), "warmup_steps must be >= 2"),
    (dict(width="wide"), "width must be an integer >= 1 or 'auto'"),
    (dict(width="auto", warmup_steps=1), "width='auto' measures during the synchronous warm-up"),
    (dict(auto_recheck_every=10), "auto_recheck_every needs width='auto' or compression='auto'"),
    (dict(width="auto", auto_recheck_every=-1), "auto_recheck_every must be an integer >= 0"),
])
def test_what_auto_refuses(options, needle):
    with pytest.raises(ValueError, match=needle):
        own, rest = split_options(options)
        WrapperConfig(**own, options=rest)


def link_from_measure() -> None:
    """For a test (in a rank's own process) whose link is ``measure``'s fake and that follows the early look: no look
    (on loopback the initial broadcast of a 360-byte model is latency and jitter, 0.2-3.6 ms, which the look could
    read as a slow link now and then) and no shortcut past the measuring (``never_hides``)."""
    auto.choices.transfer_floor_s = lambda *_: 0.0
    auto.choices.uncompressed_hides = never_hides


def never_hides(*_args) -> None:
    """``uncompressed_hides`` for a test whose link is ``measure``'s fake: on loopback the warm-up's own uncompressed
    exchange hides by itself, which would spare the measuring (and the fake) altogether."""
    return None


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


def _train(model: nn.Module, opt: PipeSGD, steps: range, rank: int = 0) -> list:
    """Each step's ``StepStats``."""
    stats = []
    for t in steps:
        g = torch.Generator().manual_seed(100 * t + rank)
        model(torch.randn(4, 8, generator=g)).square().mean().backward()
        stats.append(opt.step())
        opt.zero_grad()
    return stats


def _ranks_choose(rank: int, world: int, optimizer=torch.optim.SGD) -> dict:
    # Each rank measures something else (rank 1 a fast link): the agreement takes the slowest.
    measured = FAST if rank else SLOW
    link_from_measure()
    auto.choices.measure = lambda numel, device, dtype, group, *_: {k: v for k, v in measured.items() if k != "compute_s"}
    auto.StepClock.comm_s = property(lambda self: 0.2)  # the provisional codec's exchanges on that slow link
    model = _model()
    opt = PipeSGD(optimizer(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=WARMUP)
    _train(model, opt, range(WARMUP + 4), rank)
    opt.flush()
    opt.check_replicas()
    choice = dict(opt.auto_choice)
    opt.close()
    return {"choice": choice, "compression": opt.compression, "error_feedback": opt.config.error_feedback}


def test_every_rank_reaches_the_same_choice_and_replicas_stay_identical():
    results = run_ranks(_ranks_choose, 2)
    assert results[0] == results[1]
    assert results[0]["compression"] in ("q8", "q4") and results[0]["error_feedback"]  # the slow link's numbers


def test_the_wrapper_hands_its_optimizer_to_the_choice():
    results = run_ranks(_ranks_choose, 2, torch.optim.AdamW)
    assert results[0] == results[1]
    assert results[0]["compression"] == "q8" and not results[0]["error_feedback"]
    assert "no error feedback and nothing below q8 under Adam/AdamW" in results[0]["choice"]["reason"]


def _no_measuring(*_args, **_kwargs):
    raise AssertionError("measured again")


def test_a_resumed_run_keeps_the_choice_without_measuring(process_group, monkeypatch):
    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)
    monkeypatch.setattr(auto.choices, "measure", lambda numel, device, dtype, group, *_: dict(SLOW))
    monkeypatch.setattr(auto.choices, "decide", lambda measured, nodes, grad_bytes, knobs, *_, **__: {"width": 2,
        "compression": "q8", "error_feedback": True, "reason": "a test", "measured": measured})
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=WARMUP)
    _train(model, opt, range(WARMUP + 2))
    state = opt.state_dict()
    assert state["pipesgd"]["auto"]["compression"] == "q8" and state["pipesgd"]["compression"] == "q8"
    monkeypatch.setattr(auto.choices, "measure", _no_measuring)
    again = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=WARMUP)
    again.load_state_dict(state)
    assert again.compression == "q8" and again.config.error_feedback and again.auto_choice["reason"] == "a test"
    _train(model, again, range(WARMUP + 2, WARMUP + 5))
    for wrapper in (opt, again):
        wrapper.flush()
        wrapper.close()


def test_a_state_saved_during_the_warmup_chooses_at_its_end(process_group, monkeypatch):
    # a fast link: no provisional codec (that case: test_a_state_saved_with_a_provisional_codec_resumes_with_it)
    monkeypatch.setattr(auto.choices, "measure", lambda numel, device, dtype, group, *_: dict(FAST))
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=WARMUP)
    _train(model, opt, range(1))
    state = opt.state_dict()
    assert (state["pipesgd"]["auto"]["provisional"] and state["pipesgd"]["auto"]["compression"] == "none"
            and state["pipesgd"]["compression"] == "auto")
    again = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=WARMUP)
    again.load_state_dict(state)
    _train(model, again, range(1, WARMUP))
    assert again.auto_choice is not None and again.compression == again.auto_choice["compression"]
    for wrapper in (opt, again):
        wrapper.flush()
        wrapper.close()


def test_a_named_codec_is_never_measured_or_changed(process_group, monkeypatch):
    monkeypatch.setattr(auto.choices, "measure", _no_measuring)
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="bf16", warmup_steps=WARMUP)
    _train(model, opt, range(WARMUP + 2))
    assert opt.compression == "bf16" and opt.auto_choice is None and "auto" not in opt.state_dict()
    opt.flush()
    opt.close()


PROBING = 1 + auto.PROVISIONAL_STEPS + 1  # warm-up steps: the probe, the provisional codec's, one more


def _slow_link(numel, device, dtype, group, *_):
    """``measure`` on a slow link, leaving compute and the exchange to the real clock."""
    return {k: v for k, v in SLOW.items() if k not in ("compute_s", "comm_s")}


def _guesses(calls: list):
    """``decide`` that records which codecs' exchanges it was given (``_exchange_s``) and picks q4 + feedback at
    width 2."""
    def decide(measured, nodes, grad_bytes, knobs, measured_with=("none", False), **_):
        calls.append((measured_with, sorted(name for name in measured if name.endswith("_exchange_s"))))
        return {"width": 2, "compression": "q4", "error_feedback": True, "reason": "a test", "measured": measured}
    return decide


def _ranks_probe(rank: int, world: int) -> dict:
    calls = []
    link_from_measure()
    auto.choices.measure, auto.choices.decide = _slow_link, _guesses(calls)
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=PROBING)
    stats = _train(model, opt, range(PROBING - 1), rank)
    saved = opt.state_dict()["pipesgd"]
    named = (opt.compression, saved["compression"], saved["auto"]["provisional"])
    stats += _train(model, opt, range(PROBING - 1, PROBING + 2), rank)
    opt.flush()
    opt.check_replicas()
    opt.close()
    applied = [s for s in stats if s.applied_step is not None]
    return {"labels": [s.auto_choice for s in stats], "ratios": [s.compression_ratio for s in applied],
            "calls": calls, "named": named, "compression": opt.compression, "allreduce": opt.allreduce}


def test_a_slow_link_runs_the_rest_of_the_warmup_with_a_provisional_codec():
    results = run_ranks(_ranks_probe, 2)
    assert results[1].pop("calls") == []  # rank 0 decides for both (probes.on_rank0) ...
    assert results[0]["calls"] and {**results[0], "calls": []} == {**results[1], "calls": []}  # ... the same choice
    result, probe = results[0], 0  # step 0: the model's forward pre-hook timed its compute
    # too few provisional steps to judge the all-reduce (allreduce_trial.MIN_STEPS): the rule's runs throughout, no
    # trial (alternating would pay the ring's first call for no verdict)
    assert result["labels"][probe:PROBING - 1] == ["warm-up: q4 + error feedback"] + [None] * (PROBING - 2)
    assert result["labels"][PROBING - 1] == "width 2, q4 + error feedback" and result["allreduce"] == "alltoall"
    assert sum(label is not None for label in result["labels"]) == 2  # a record where the configuration changed
    first, then = result["ratios"][0], result["ratios"][1:]  # of the steps that applied a gradient
    assert first == 1.0 and all(ratio > 6 for ratio in then)  # uncompressed until the probe, q4 after it
    # the probe decides from the uncompressed exchange; the warm-up's end from q4's exchanges (the link as they found
    # it), with the uncompressed one as none's measured time
    assert result["calls"] == [(("none", False), []), (("q4", True), ["none_exchange_s"])]
    assert result["named"] == ("auto", "auto", True) and result["compression"] == "q4"


@pytest.mark.parametrize("broadcast_s, latency_s, nodes, want_ms", [
    (0.213, 0.00126, 4, 105.9),  # ResNet-20 at 100 Mbit/s on the emulated cluster: the ring's bytes take ~130 ms
    (0.0203, 0.000712, 4, 9.8),  # at 1 Gbit/s (~13 ms)
    (0.0012, 0.0005, 4, 0.0),  # mostly latency: a small model's broadcast says nothing of the bandwidth
    (0.213, 0.00126, 1, 0.0),  # one rank sends nothing
])
def test_the_early_look_finds_the_least_time_of_the_gradients_bytes_from_the_initial_broadcast(
        broadcast_s, latency_s, nodes, want_ms):
    floor = auto.transfer_floor_s(broadcast_s, latency_s, 1_000_000, 1_000_000, nodes)
    assert floor * 1e3 == pytest.approx(want_ms, abs=0.05)
    assert auto.transfer_floor_s(broadcast_s, latency_s, 2_000_000, 1_000_000, nodes) == pytest.approx(floor / 2)


def test_the_early_look_calls_a_link_slow_only_when_the_bytes_reach_half_the_first_steps_compute():
    assert auto.clearly_slow(0.106, 0.045) and auto.clearly_slow(0.106, 0.110)  # 100 Mbit/s, step 0 of 45-110 ms
    assert not auto.clearly_slow(0.0098, 0.0367)  # 1 Gbit/s: a floor of 10 ms against 37 ms of compute
    assert not auto.clearly_slow(0.0, 0.0) and not auto.clearly_slow(0.1, 0.0)  # nothing measured: no verdict


def _ranks_early_look(rank: int, world: int, init_sync: bool, warmup: int = PROBING) -> dict:
    calls = []
    auto.choices.transfer_floor_s = lambda *_: 1.0  # the initial broadcast of a clearly slow link
    auto.choices.measure, auto.choices.decide, auto.choices.uncompressed_hides = _slow_link, _guesses(calls), never_hides
    model = _model()  # the same on every rank (a seed), so init_sync=False starts from equal replicas too
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=warmup,
                  options=PipeSGDOptions(init_sync=init_sync))
    stats = _train(model, opt, range(warmup + 2), rank)
    opt.flush()
    opt.check_replicas()
    opt.close()
    applied = [s for s in stats if s.applied_step is not None]
    return {"labels": [s.auto_choice for s in stats], "ratios": [s.compression_ratio for s in applied],
            "calls": calls, "compression": opt.compression}


@pytest.mark.slow
def test_a_clearly_slow_link_runs_the_provisional_codec_from_step_0():
    """The early look: step 0 exchanges with q4 already (at 100 Mbit/s step 0's uncompressed exchange cost 136-197
    ms against q4's 20-66); one decision, at the warm-up's end, from q4's exchanges, with no uncompressed time."""
    results = run_ranks(_ranks_early_look, 2, True)
    assert results[1].pop("calls") == [] and results[0] == {**results[1], "calls": results[0]["calls"]}
    result = results[0]
    assert result["labels"][:PROBING] == ["warm-up: q4 + error feedback"] + [None] * (PROBING - 2) + [
        "width 2, q4 + error feedback"]  # too few steps after the look's to judge the all-reduces (as after a probe)
    assert all(ratio > 6 for ratio in result["ratios"]) and result["compression"] == "q4"
    assert result["calls"] == [(("q4", True), [])]
    # with 2 x MIN_STEPS warm-up steps after the look's, they alternate the all-reduces (allreduce_trial), from step 1
    labels = run_ranks(_ranks_early_look, 2, True, PROBING + 2)[0]["labels"]
    assert labels[:PROBING + 1] == [f"warm-up: q4 + error feedback, {name}" for name in ORDER * 3][:PROBING + 1]
    assert labels[PROBING + 1].startswith("width 2, q4 + error feedback, ")
    # without the initial broadcast (init_sync=False) there is nothing to look at: step 0 exchanges uncompressed
    result = run_ranks(_ranks_early_look, 2, False)[0]
    assert result["ratios"][0] == 1.0 and result["calls"] == [(("none", False), []), (("q4", True), ["none_exchange_s"])]


@pytest.mark.parametrize("link", [SLOW, FAST], ids=["provisional-codec", "none"])
def test_the_probes_own_time_and_a_switch_are_not_counted_as_compute(process_group, monkeypatch, link):
    """The probe times codecs and all-reduces after step 0's end; that time fell into step 1's gap and, in the median
    of a few warm-up gaps, made compute look 40 % longer on a busy host (and q8 look hidden where q4 was faster)."""
    computes = []

    def slow_probe(numel, device, dtype, group, *_):
        time.sleep(0.25)
        return {k: v for k, v in link.items() if k not in ("compute_s", "comm_s")}

    def decide(measured, *args, **kwargs):
        computes.append(measured["compute_s"])
        return real_decide(measured, *args, **kwargs)

    real_decide = auto.decide
    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)  # both links through the probe
    monkeypatch.setattr(auto.choices, "measure", slow_probe)
    monkeypatch.setattr(auto.choices, "decide", decide)
    model = _model()
    first = [True]

    def cold_start(*_):  # a first forward pass that is slow (allocations, first touches), as on a real host
        if first:
            time.sleep(0.15)
            first.clear()

    # 3 warm-up steps: 3 gaps (step 0's from its forward pass); with the cold one and the probe's, a median of 0.15 s
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=WARMUP)
    model.register_forward_pre_hook(cold_start)  # after the wrapper's, which marks where step 0's compute began
    _train(model, opt, range(WARMUP + 1))
    assert len(computes) == 2 and computes[-1] < 0.1, computes  # the model's other steps take milliseconds
    opt.flush()
    opt.close()


def test_the_step_stats_hold_autos_own_time(process_group, monkeypatch):
    """``StepStats.t_auto_s``: what the steps that measured spent on it (a ``measure`` that takes 0.2 s here), a few
    clock readings at every other step; None, and not in the metrics, without auto."""
    calls = []

    def slow_measure(*_args):
        calls.append(1)
        time.sleep(0.2)
        return {k: v for k, v in SLOW.items() if k not in ("compute_s", "comm_s")}

    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)
    monkeypatch.setattr(auto.choices, "measure", slow_measure)
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=WARMUP)
    spent = [s.t_auto_s for s in _train(model, opt, range(WARMUP + 2))]
    assert calls and sum(spent) >= 0.2 * len(calls) and spent[-1] < 0.05, spent
    assert "t_auto" in opt.last_stats.as_metrics()
    opt.flush()
    opt.close()
    plain = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="q8", warmup_steps=WARMUP)
    stats = _train(model, plain, range(WARMUP + 1))
    assert all(s.t_auto_s is None and "t_auto" not in s.as_metrics() for s in stats)
    plain.flush()
    plain.close()


def test_a_fast_link_keeps_the_warmup_uncompressed_and_times_nothing_else(process_group, monkeypatch):
    monkeypatch.setattr(auto.choices, "measure", _no_measuring)  # the uncompressed exchange hides: nothing else to time
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=PROBING)
    stats = _train(model, opt, range(PROBING + 1))
    assert [s.auto_choice for s in stats] == [None] * (PROBING - 1) + ["width 2, none", None]
    reason = opt.auto_choice["reason"]
    assert "gradient (none)" in reason and "neither the link's latency nor the codecs" in reason
    assert "small_allreduce_s" not in opt.auto_choice["measured"]  # not measured, so a re-check measures it
    opt.flush()
    opt.close()


def test_a_recheck_after_a_warmup_that_timed_nothing_measures_the_link_once(process_group, monkeypatch):
    calls = []
    monkeypatch.setattr(auto.choices, "measure", lambda *_args: calls.append(1) or dict(FAST))
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=WARMUP,
                  options=PipeSGDOptions(auto_recheck_every=2))
    _train(model, opt, range(WARMUP))
    assert calls == [] and "small_allreduce_s" not in opt.auto_choice["measured"]
    _train(model, opt, range(WARMUP, WARMUP + 6))  # three windows: the first decides (and measures), then nothing moved
    assert calls == [1] and opt.auto_choice["measured"]["small_allreduce_s"] == FAST["small_allreduce_s"]
    opt.flush()
    opt.close()


@pytest.mark.parametrize("width", [None, 1, 2, 3])
def test_where_the_uncompressed_exchange_hides_the_choice_needs_no_link_probe(width):
    """``uncompressed_hides`` from compute and the uncompressed exchange alone is the full decision's choice wherever
    that is uncompressed and hides at width 1 or 2 (or the named width), and None everywhere else (then the probes
    run): the ladder begins uncompressed, and the uncompressed exchange is predicted as measured."""
    knobs, quick = auto.Knobs(width, None, None), 0
    for comm_s, latency_share, comm_cv in itertools.product([1e-4, 0.01, 0.05, 0.095, 0.1, 0.3], [0, 0.5, 1],
                                                            [0, 0.3]):
        measured = {**_measured(comm_s, comm_s / 64 + latency_share * comm_s / 8), "comm_cv": comm_cv,
                    "compute_spread_s": 0.02}
        full = auto.decide(measured, 4, 4e6, knobs, hidden_only=True)
        wanted = full is not None and full["compression"] == "none" and (width is not None or full["width"] <= 2)
        got = auto.uncompressed_hides({k: measured[k] for k in ("compute_s", "comm_s", "comm_cv", "compute_spread_s")},
                                      4, 4e6, knobs)
        assert (got is not None) == wanted, (comm_s, latency_share, comm_cv)
        if got is not None:
            quick += 1
            assert (got["width"], got["compression"], got["error_feedback"]) == (full["width"], "none", False)
    assert quick >= 6  # the sweep reaches both sides
    assert auto.uncompressed_hides(FAST, 4, 4e6, auto.Knobs(None, "bf16", None)) is None  # a named codec: measured


def probing(monkeypatch) -> tuple[nn.Module, PipeSGD, list]:
    """A model and its wrapper under ``compression="auto"`` on a slow link, whose decision is always q4 + feedback
    at width 2 (the calls to it recorded in the list)."""
    calls = []
    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)
    monkeypatch.setattr(auto.choices, "measure", _slow_link)
    monkeypatch.setattr(auto.choices, "decide", _guesses(calls))
    model = _model()
    return model, PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto",
                          warmup_steps=PROBING), calls


@pytest.mark.parametrize("optimizer, provisional", [(torch.optim.SGD, "warm-up: q4 + error feedback"),
                                                    (torch.optim.AdamW, "warm-up: q8")])
def test_the_provisional_codec_is_the_most_compressed_the_choice_may_take(process_group, monkeypatch, optimizer,
                                                                          provisional):
    """The early decision at step 0 said bf16 (its compute inflated by first calls); the synchronous warm-up runs
    the fastest exchange the choice may take instead, and the last warm-up step decides as before."""
    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)
    monkeypatch.setattr(auto.choices, "measure", _slow_link)
    monkeypatch.setattr(auto.choices, "decide", lambda measured, *_args, **_kwargs: {
        "width": 2, "compression": "bf16", "error_feedback": False, "reason": "a test", "measured": measured})
    model = _model()
    opt = PipeSGD(optimizer(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=PROBING)
    stats = _train(model, opt, range(PROBING))
    assert [s.auto_choice for s in stats] == [provisional] + [None] * (PROBING - 2) + ["width 2, bf16"]
    opt.flush()
    opt.close()


def _ranks_measure(rank: int, world: int) -> float:
    return probes.measure(4096, torch.device("cpu"), torch.float32, None, ("q8",))["q8_encode_Bps"]


def test_every_rank_times_the_codecs():
    """Where ranks share a host's cores a codec runs at their shared speed, so every rank times it at once (timed on
    rank 0 alone it read twice as fast on 4 ranks on 2 cores, and q4 was chosen where it ran 1.9x slower)."""
    assert all(speed > 0 for speed in run_ranks(_ranks_measure, 2))


def test_a_state_saved_with_a_provisional_codec_resumes_with_it(process_group, monkeypatch):
    model, opt, calls = probing(monkeypatch)
    _train(model, opt, range(2))
    state = opt.state_dict()
    assert state["pipesgd"]["auto"]["provisional"] and state["pipesgd"]["compression"] == "auto"
    monkeypatch.setattr(auto.choices, "measure", _no_measuring)
    again = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=PROBING)
    again.load_state_dict(state)
    stats = _train(model, again, range(2, PROBING))
    assert stats[-1].auto_choice == "width 2, q4 + error feedback" and len(calls) == 2
    assert calls[-1] == (("q4", True), ["none_exchange_s"])
    assert stats[0].residual_norm is not None  # the provisional codec's exchange, with its feedback
    for wrapper in (opt, again):
        wrapper.flush()
        wrapper.close()


def _ranks_exchange(rank: int, world: int) -> list[float]:
    clock = auto.StepClock()
    clock.comm_busy = [[0.085, 0.030], [0.016, 0.041]][rank]  # rank 1 arrived last at step 0, rank 0 at step 1
    agreed_clock = probes.exchange_per_step(clock, None, torch.device("cpu"))
    assert clock.comm_busy == [[0.085, 0.030], [0.016, 0.041]][rank]  # the rank's own clock is left alone
    return agreed_clock.comm_busy


def test_a_probed_exchange_is_what_the_last_rank_to_arrive_saw():
    assert run_ranks(_ranks_exchange, 2) == [[0.016, 0.030]] * 2


def test_the_small_all_reduce_reads_the_least_of_its_timed_calls(monkeypatch):
    """After one call that sets up, ``REPEATS`` timed calls: the least is the link's (the host's noise only adds; on
    the 2-core emulated cluster the same 17 KB all-reduce read 5-12 ms where its bytes take 2)."""
    took = iter([0.050, 0.012, 0.005] + [0.0] * 10)  # the set-up call, then the timed ones
    now = [0.0]

    def all_reduce(*_args, **_kwargs):
        now[0] += next(took)

    monkeypatch.setattr(probes.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(probes.time, "perf_counter", lambda: now[0])
    assert probes.REPEATS == 2
    measured = probes.measure(64_000, torch.device("cpu"), torch.float32, None, codecs=())
    assert measured == {"small_allreduce_s": pytest.approx(0.005)}


def test_the_codecs_are_timed_on_one_vector_drawn_once(monkeypatch):
    """Drawing the timing vector took longer than timing bf16 and q8 on it (ResNet-20's 0.27 M elements): one draw
    for all the codecs, each timed on that same vector."""
    drawn, timed_on = [], []
    real_draw, real_time = probes.timing_vector, probes.measure_codec_gbps

    def draw(numel, device):
        drawn.append(numel)
        return real_draw(numel, device)

    def time_codec(compressor, numel, repeats, device, x):
        timed_on.append(x)
        return real_time(compressor, numel, repeats, device, x)

    monkeypatch.setattr(probes.dist, "all_reduce", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(probes, "timing_vector", draw)
    monkeypatch.setattr(probes, "measure_codec_gbps", time_codec)
    measured = probes.measure(3000, torch.device("cpu"), torch.float32, None, codecs=("bf16", "q8", "q4"))
    assert drawn == [3000] and len(timed_on) == 3 and all(x is timed_on[0] for x in timed_on)
    assert all(measured[f"{c}_{way}_Bps"] > 0 for c in ("bf16", "q8", "q4") for way in ("encode", "decode"))
