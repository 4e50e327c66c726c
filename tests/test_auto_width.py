"""``PipeSGD(width="auto")`` and the re-check (``auto_recheck_every``, ``pipesgd.auto``): width and codec decided
together, the link found from a compressed exchange, the switch rule that keeps a re-check from flipping on noise, a
chosen width that runs bitwise as the same width named, a resume that keeps it, and a re-check that switches at the
same step on every rank with every gradient applied once."""
from __future__ import annotations

import pytest
import torch

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD, auto
from pipesgd.auto import decision
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_auto_codec import FAST, SLOW, _measured, _model, _train, link_from_measure, never_hides
from timing_model.core.straggler import expected_max_of_two
from timing_model.predict import Scenario, predict

WARMUP = 3
FREE = auto.Knobs(None, None, None)


@pytest.mark.parametrize("measured, knobs, want", [
    (SLOW, FREE, (2, "q4", True)),  # nothing synchronous hides 480 ms; at width 2 only q4 does
    (FAST, FREE, (1, "none", False)),  # 4.8 ms beside a 100 ms step: synchronous SGD
    (FAST, auto.Knobs(2, None, None), (2, "none", False)),  # a named width is kept
    (FAST, auto.Knobs(None, "q8", True), (1, "q8", True)),  # a named codec is kept; the width is chosen for it
    # nothing hides: width 2 is the fastest (480 ms), width 1 (580 ms) within WIDER_GAIN of it
    (SLOW, auto.Knobs(None, "none", False), (1, "none", False)),
])
def test_width_and_codec_decided_together(measured, knobs, want):
    choice = auto.decide(measured, nodes=4, grad_bytes=4e6, knobs=knobs)
    assert (choice["width"], choice["compression"], choice["error_feedback"]) == want


def test_the_link_is_found_from_a_compressed_exchange():
    """Measured with q8 + feedback (a user's codec under width="auto"): the link that produced it comes back."""
    speeds = {"q8_encode_Bps": 2e9, "q8_decode_Bps": 3e9}
    truth = Scenario(nodes=4, grad_bytes=4e6, bandwidth_Bps=12.5e6, latency_s=1e-4, compression="q8",
                     error_feedback=True, encode_Bps=2e9, decode_Bps=3e9)
    measured = {"comm_s": predict(truth, ("pipe",)).result("pipe").comm_total_s,
                "small_allreduce_s": 6 * 1e-4 + 1.5 * (4e6 / 64) / 12.5e6, **speeds}
    terms = auto.link_terms(measured, nodes=4, grad_bytes=4e6, measured_with=("q8", True))
    assert terms["bandwidth_Bps"] == pytest.approx(12.5e6, rel=1e-6)
    assert terms["latency_s"] == pytest.approx(1e-4, rel=1e-5)


@pytest.mark.parametrize("comm_s, running, want", [
    (0.115, (2, "none", False), None),  # bf16 would hide, but none is only 15 % slower: no switch
    (0.135, (2, "none", False), "bf16"),  # 35 % slower: worth bf16's loss of exactness
    (FAST["comm_s"], (2, "none", False), None),  # already the choice
    (FAST["comm_s"], (2, "bf16", False), "none"),  # the more exact codec hides now: back to it
])
def test_a_recheck_switches_only_for_a_gain(comm_s, running, want):
    measured = _measured(comm_s, comm_s / 64 + 6e-4)
    width, codec, feedback = running
    measured_with = ("none", False)
    if codec != "none":  # what the running codec's exchange would take on that link
        link = auto.link_terms(measured, 4, 4e6)
        case = Scenario(nodes=4, grad_bytes=4e6, compression=codec, error_feedback=feedback, **link,
                        encode_Bps=measured[f"{codec}_encode_Bps"], decode_Bps=measured[f"{codec}_decode_Bps"])
        measured = {**measured, "comm_s": predict(case, ("pipe",)).result("pipe").comm_total_s}
        measured_with = (codec, feedback)
    choice = auto.decide(measured, 4, 4e6, auto.Knobs(2, None, None), measured_with, now=running)
    assert (choice and choice["compression"]) == want


@pytest.mark.parametrize("comm_s, want", [(0.015, (1, "none")), (0.048, None)])
def test_a_recheck_goes_back_to_width_1_where_the_pipeline_gains_too_little(comm_s, want):
    """Width 2 uncompressed hides a 15 ms all-reduce behind the 100 ms step, width 1 takes 115 ms: within
    ``WIDER_GAIN``, so a re-check running width 2 goes back to width 1 (the first decision's rule); beside 48 ms
    (1.48x) width 2 stays."""
    choice = auto.decide(_measured(comm_s, comm_s / 64 + 6e-4), 4, 4e6, FREE, now=(2, "none", False))
    assert (choice and (choice["width"], choice["compression"])) == want
    assert auto.uncompressed_hides(_measured(comm_s, 0.0), 4, 4e6, FREE)["width"] == (want or (2,))[0]


@pytest.mark.parametrize("comm_s, want", [(0.015, 2), (0.0085, 2), (0.0045, 1)])
def test_the_warmups_choice_tries_a_wider_pipeline_on_a_smaller_predicted_gain(comm_s, want):
    """Width 2 hides a 15 ms all-reduce behind the 100 ms step, width 1 takes 115 ms: 1.15x, under ``WIDER_GAIN`` but
    over ``TRIAL_GAIN``, so the warm-up's choice (which the hold measures) tries width 2 and says it is on trial; a
    re-check's rule keeps width 1. So beside 8.5 ms (1.085x); 4.5 ms hides at width 1 (under 5 % of its step)."""
    measured = _measured(comm_s, comm_s / 64 + 6e-4)
    knobs = auto.Knobs(None, "none", False)
    tried = auto.decide(measured, 4, 4e6, knobs, wider_gain=auto.TRIAL_GAIN)
    assert tried["width"] == want and auto.decide(measured, 4, 4e6, knobs)["width"] == 1
    if want == 2:
        assert f"on trial: predicted {1 + comm_s / 0.1:.2f}x faster than width 1" in tried["reason"]
        assert "kept only if it runs 1.25x faster than the warm-up" in tried["reason"]
    else:
        assert "on trial" not in tried["reason"]
    hides = auto.uncompressed_hides(_measured(comm_s, 0.0), 4, 4e6, FREE, wider_gain=auto.TRIAL_GAIN)
    assert hides["width"] == want


@pytest.mark.parametrize("wider_gain", [auto.TRIAL_GAIN, None])
def test_a_width_is_on_trial_only_against_a_narrower_candidate_tried_before_it(wider_gain):
    """Width 2 uncompressed hides a 48 ms all-reduce behind the 100 ms step, 1.48x faster than width 1 uncompressed:
    taken on either rule, so not on trial, though width 1 with q4 (an eighth of the bytes, after width 2
    uncompressed in the ladder's order) is predicted within ``WIDER_GAIN`` of it. A choice on ``WIDER_GAIN`` (a
    re-check's, which nothing holds) never says it is on trial."""
    kwargs = {} if wider_gain is None else {"wider_gain": wider_gain}
    choice = auto.decide(_measured(0.048, 0.048 / 64 + 6e-4), 4, 4e6, FREE, **kwargs)
    assert (choice["width"], choice["compression"]) == (2, "none") and "on trial" not in choice["reason"]
    on_trial = auto.decide(_measured(0.015, 0.015 / 64 + 6e-4), 4, 4e6, auto.Knobs(None, "none", False), **kwargs)
    assert ("on trial" in on_trial["reason"]) == (wider_gain is not None)


@pytest.mark.parametrize("times, want, want_default", [
    ({1: 0.7, 2: 0.6, 3: 0.6}, 2, 1),  # width 2 1.17x width 1: tried (over 1.05x), not by the 1.25x rule
    ({1: 0.7, 2: 0.6, 3: 0.5}, 2, 2),  # width 3 1.2x width 2: under 1.25x, so no wider than width 2 on trial either
    ({1: 0.7, 2: 0.65, 3: 0.5}, 3, 3),  # width 3 1.3x width 2 and 1.4x width 1: by either rule
])
def test_a_trial_leaves_width_1_but_goes_no_wider_than_width_2_on_a_small_gain(times, want, want_default):
    """Nothing hides (uncompressed only; each width's iteration given): the trial's smaller margin applies against
    width 1 only, since the hold measures a trial against width 1; between widths 2 and 3 the full 1.25x holds."""
    from types import SimpleNamespace

    from timing_model.recommend import recommend

    def predict_pipe(case):
        t = times[case.width]
        return SimpleNamespace(iteration_s=t, exposed_comm_s=t / 2, codec_s=0.0, comm_total_s=t, allreduce="backend")
    scenario = Scenario(nodes=4, grad_bytes=4e6, bandwidth_Bps=1e7, compute_s=0.1)
    for gain, expected in ((auto.TRIAL_GAIN, want), (None, want_default)):
        extra = {} if gain is None else {"wider_gain": gain}
        answer = recommend(scenario, predict_pipe, compression="none", error_feedback=False, **extra)
        assert answer.choice.width == expected, (gain, times)


def test_the_exchange_hides_behind_the_update_in_step_too():
    """A 135 ms uncompressed all-reduce beside 100 ms of compute does not hide at width 2 (bf16's does, and q4 at
    width 1, 117 ms, is within 1.25x of it); with 50 ms of optimizer update in ``step()`` (the AlexNet-like model's
    AdamW took as long as its compute) the window is 150 ms and it does: width 2, uncompressed, and the reason names
    the update."""
    measured = _measured(0.135, 0.135 / 64 + 6e-4)
    without = auto.decide(measured, 4, 4e6, FREE)
    with_update = auto.decide({**measured, "update_s": 0.05}, 4, 4e6, FREE)
    assert (without["width"], without["compression"]) == (1, "q4")
    assert (with_update["width"], with_update["compression"]) == (2, "none")
    assert "50 ms in step()" in with_update["reason"]


def test_the_lookahead_replay_is_priced_at_width_2_and_up():
    """AlexNet-like under AdamW on unshaped links (the warm-up's numbers, 2-core host): 140 ms of compute, 140 ms in
    ``step()``, an 80 ms exchange. Width 2 hides it in a 280 ms window, 1.29x faster than width 1's 360 ms; with the
    look-ahead's replay priced as the optimizer's step (140 ms) the window is 420 ms and width 1 is taken; the
    reason names it. Without look-ahead (``staleness="none"``) nothing is added."""
    measured = {**_measured(0.08, 0.08 / 64 + 6e-4), "compute_s": 0.14, "update_s": 0.14}
    free = auto.Knobs.of("auto", "auto", False, (torch.optim.AdamW,), lookahead=True)
    without = auto.decide(measured, 4, 34e6, free)
    priced = auto.decide({**measured, "lookahead_s": free.lookahead_s(0.14)}, 4, 34e6, free)
    assert (without["width"], without["compression"]) == (2, "none")
    assert (priced["width"], priced["compression"]) == (1, "none") and "look-ahead's replay" in priced["reason"]
    assert auto.Knobs.of("auto", "auto", False, (torch.optim.AdamW,)).lookahead_s(0.14) == 0.0


@pytest.mark.parametrize("staleness", ["lookahead", "none"])
def test_the_warmup_measures_the_optimizers_step_for_the_lookahead(process_group, monkeypatch, staleness):
    """The warm-up's steps time the wrapped optimizer's ``step()`` (``StepStats.t_update_s``) and the choice's
    measurements carry it as the look-ahead's price, with look-ahead on; 0 with ``staleness="none"``."""
    monkeypatch.setattr(auto.choices, "uncompressed_hides", lambda measured, *_: _chooses(1)(measured))
    model = _model()
    opt = PipeSGD(torch.optim.AdamW(model.parameters(), lr=1e-3), model, width="auto", compression="auto",
                  warmup_steps=WARMUP, staleness=staleness)
    stats = _train(model, opt, range(WARMUP))
    timed = sorted(s.t_update_s for s in stats)[len(stats) // 2]
    want = timed if staleness == "lookahead" else 0.0
    assert opt.auto_choice["measured"]["lookahead_s"] == pytest.approx(want) and (want > 0) == (staleness != "none")
    opt.flush()
    opt.close()


def test_a_recheck_of_the_warmups_provisional_codec_finds_the_link_it_runs_on():
    """The warm-up ran q8 as its provisional codec (its exchange, 125 ms, is in the measurements) and kept it; then the
    link slows 3-fold. The re-check solves the link from q8's exchange now (375 ms), not pinned to the warm-up's
    125 ms, and moves to q4 (before the fix the solve ran to 1 kB/s and nothing else looked worth a switch)."""
    measured = {**SLOW, "q8_exchange_s": 0.125}
    assert auto.link_terms({**measured, "comm_s": 0.375}, 4, 4e6, ("q8", False))["bandwidth_Bps"] == \
        pytest.approx(12.5e6 / 3, rel=0.05)
    window = {"compute_s": 0.1, "comm_s": 0.375, "period_s": 0.38, "wait_s": 0.28}
    ran = {auto.run_key(2, "q8", False): {k: window[k] for k in ("comm_s", "period_s", "wait_s")}}
    choice = auto.decide({**measured, **window}, 4, 4e6, auto.Knobs(2, None, False), ("q8", False),
                         now=(2, "q8", False), ran=ran)
    assert choice is not None and choice["compression"] == "q4"


def test_a_recheck_decides_in_a_first_window_and_when_the_cluster_moved(process_group, monkeypatch):
    decided = []
    monkeypatch.setattr(auto.choices, "decide", lambda measured, *_args, **_kwargs: decided.append(measured["comm_s"]))
    current = {"width": 2, "compression": "none", "error_feedback": False, "measured": dict(FAST),
               "ran": {"1:none": {"comm_s": 0.010, "period_s": 0.03, "wait_s": 0.01}}}  # the warm-up's
    windows = [(0.010, 0.02), (0.013, 0.02), (0.007, 0.02),  # within 1.5x of the first window's 0.010
               (0.016, 0.02),  # 1.6x, and by 30 % of the iteration: the cluster moved
               (0.016, 0.02), (0.011, 0.02),  # within 1.5x of the new reference
               (0.030, 0.2)]  # 1.9x, but 7 % of a 200 ms step: noise that no switch could pay for
    for comm_s, period_s in windows:
        clock = auto.StepClock()
        clock.comm_busy, clock.gaps, clock.periods, clock.waits = [comm_s], [0.015], [period_s], [0.001]
        assert auto.recheck([], auto.Knobs(2, None, None), current, clock, None) is None
    assert decided == [0.010, 0.016]
    # the move dropped what ran before it (the warm-up's width 1): of another cluster
    assert current["ran"] == {"2:none": {"comm_s": 0.016, "period_s": 0.02, "wait_s": 0.001}}
    assert current["reference"]["comm_s"] == 0.016


def _chooses(width: int, compression: str = "none", feedback: bool = False):
    return lambda measured, *_args, **_kwargs: {"width": width, "compression": compression,
                                                "error_feedback": feedback, "reason": "a test", "measured": measured}


@pytest.mark.parametrize("staleness", ["lookahead", "none"])
def test_a_chosen_width_runs_bitwise_as_the_same_width_named(process_group, monkeypatch, staleness):
    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)
    monkeypatch.setattr(auto.choices, "measure", lambda *_args: dict(SLOW))
    monkeypatch.setattr(auto.choices, "decide", _chooses(2))
    monkeypatch.setattr(auto.config, "held_against_width_1", lambda *_args: None)  # width 2 stays (not this test's subject)
    finals, records = [], []
    for width in (2, "auto"):
        model = _model()
        opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model, width=width,
                      warmup_steps=WARMUP, staleness=staleness)
        records.append(_train(model, opt, range(WARMUP + 5)))  # before width 2 is held against width 1
        assert opt.width == 2 and (opt.lookahead_memory_bytes > 0) == (staleness == "lookahead")
        opt.flush()
        finals.append([p.detach().clone() for p in model.parameters()])
        opt.close()
    assert all(torch.equal(a, b) for a, b in zip(*finals))
    assert [s.auto_choice for s in records[1]] == [None] * (WARMUP - 1) + ["width 2, none"] + [None] * 5
    assert [s.applied_step for s in records[0]] == [s.applied_step for s in records[1]]


def test_a_resume_keeps_the_chosen_width_and_what_is_in_flight(process_group, monkeypatch):
    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)
    monkeypatch.setattr(auto.choices, "measure", lambda *_args: dict(SLOW))
    monkeypatch.setattr(auto.choices, "decide", _chooses(2, "q8", True))
    monkeypatch.setattr(auto.config, "held_against_width_1", lambda *_args: None)  # width 2 stays (not this test's subject)
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width="auto", warmup_steps=WARMUP)
    _train(model, opt, range(WARMUP + 2))
    state, weights = opt.state_dict(), [p.detach().clone() for p in model.parameters()]
    assert state["pipesgd"]["width"] == 2 and len(state["pipesgd"]["in_flight"]) == 1
    _train(model, opt, range(WARMUP + 2, WARMUP + 5))
    opt.flush()
    opt.close()  # its look-ahead hook leaves the model
    uninterrupted = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(w)
            p.grad = None  # as a fresh process has it
    again = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width="auto", warmup_steps=WARMUP)
    again.optimizer.load_state_dict(opt.optimizer.state_dict())  # SGD without momentum: no state to differ
    again.load_state_dict(state)
    assert again.width == 2 and again.compression == "q8" and again.in_flight == 1
    _train(model, again, range(WARMUP + 2, WARMUP + 5))
    again.flush()
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted, model.parameters()))
    again.close()


EVERY = 3


def _recheck_ranks(rank: int, world: int) -> dict:
    # The warm-up measures a slow link (q4 + feedback); every later window a fast one (none hides again).
    link_from_measure()
    auto.choices.measure = lambda *_args: dict(SLOW)
    auto.StepClock.compute_s = property(lambda self: 0.1)
    chosen, first_choice = [], auto.first_choice
    auto.config.first_choice = lambda *args, **kwargs: chosen.append(first_choice(*args, **kwargs)) or chosen[-1]
    auto.StepClock.comm_s = property(lambda self: 0.001 if chosen else 0.2)  # the provisional codec's: slow too
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model, width=2, compression="auto",
                  error_feedback=False, warmup_steps=WARMUP, options=PipeSGDOptions(auto_recheck_every=EVERY))
    updates = []
    opt.optimizer.register_step_post_hook(lambda *_: updates.append(1))
    steps = WARMUP + 2 * EVERY + 2
    stats = _train(model, opt, range(steps), rank)
    opt.flush()
    opt.check_replicas()
    opt.close()
    return {"choices": [(s.step, s.auto_choice) for s in stats if s.auto_choice], "updates": len(updates),
            "steps": steps, "compression": opt.compression}


@pytest.mark.slow
def test_a_recheck_switches_at_the_same_step_on_every_rank_and_applies_every_gradient_once():
    results = run_ranks(_recheck_ranks, 2)
    assert results[0] == results[1]
    first, switch = WARMUP - 1, WARMUP + EVERY - 1
    choices = [(step, label) for step, label in results[0]["choices"] if not label.startswith("warm-up: ")]
    (at_first, chose_first), (at_switch, chose_then) = choices
    assert at_first == first and chose_first.endswith(" + error feedback")  # the slow link: a lossy codec
    assert (at_switch, chose_then) == (switch, "width 2, none")
    assert results[0]["compression"] == "none" and results[0]["updates"] == results[0]["steps"]


def test_a_switch_between_codecs_with_feedback_carries_the_residuals(process_group, monkeypatch):
    choices = iter([("q8", True), ("q8", True), ("q4", True)])  # the warm-up's provisional codec, its end, a re-check
    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)
    monkeypatch.setattr(auto.choices, "measure", lambda *_args: dict(SLOW))
    monkeypatch.setattr(auto.choices, "decide", lambda measured, *_args, **_kwargs: dict(
        zip(("compression", "error_feedback"), next(choices)), width=2, reason="a test", measured=measured))
    monkeypatch.setattr(auto.StepClock, "comm_s", property(lambda self: 0.01))
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, compression="auto", warmup_steps=WARMUP,
                  options=PipeSGDOptions(auto_recheck_every=EVERY))
    _train(model, opt, range(WARMUP + EVERY - 1))
    old = opt._parts.exchange
    _train(model, opt, range(WARMUP + EVERY - 1, WARMUP + EVERY))  # the re-check switches to q4
    assert opt.compression == "q4" and opt._parts.exchange is not old
    owed = old.feedback.residuals_state()
    assert owed and owed.keys() == opt._parts.exchange.feedback.residuals_state().keys()
    assert all(torch.equal(owed[k], opt._parts.exchange.feedback.residuals_state()[k]) for k in owed)
    opt.flush()
    opt.close()


@pytest.mark.parametrize("width", ["auto", 2])
def test_a_chosen_width_is_held_once_against_the_warmups_synchronous_steps(process_group, monkeypatch, width):
    """Width chosen above 1 after an uncompressed warm-up: the warm-up counts as width 1's run, and the pipelined
    steps are held against it once at ``EARLY_HOLD_STEPS`` and, held on, in full at ``CONFIRM_STEPS`` (re-checks
    off; no more often: each hold's agreement waits behind the exchange in flight), one window that grows. A named
    width has nothing to hold."""
    monkeypatch.setattr(auto.choices, "uncompressed_hides", lambda measured, *_: _chooses(2)(measured))
    checks = []
    monkeypatch.setattr(auto.config, "held_against_width_1", lambda current, clock, *_args: checks.append(
        (dict(current.get("ran", {})), len(clock.periods), len(clock.comm_busy), _args[-1])))
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width=width, compression="auto",
                  warmup_steps=WARMUP)
    _train(model, opt, range(WARMUP + auto.CONFIRM_STEPS + 3))
    if width == 2:
        assert checks == []
    else:
        ran = checks[0][0]
        assert list(ran) == ["1:none"] and ran["1:none"]["period_s"] > ran["1:none"]["comm_s"] > 0
        # pipelined steps only, the first filling the pipeline; then whether it is the final hold
        assert [check[1:] for check in checks] == [
            (n - 1, n - 1, n == auto.CONFIRM_STEPS) for n in (auto.EARLY_HOLD_STEPS, auto.CONFIRM_STEPS)]
    opt.flush()
    opt.close()


def test_a_run_resumed_before_its_hold_ended_holds_the_width_again(process_group, monkeypatch):
    """A checkpoint saved between the choice and its final hold marks the choice as held; the resumed run holds it
    again over its own steps (the steps it was measured on are gone), early and in full, and a checkpoint saved after
    the hold carries no mark: the width it kept stays without being held again."""
    monkeypatch.setattr(auto.choices, "uncompressed_hides", lambda measured, *_: _chooses(2)(measured))
    checks = []
    monkeypatch.setattr(auto.config, "held_against_width_1", lambda current, clock, *_args: checks.append(
        (len(clock.periods), _args[-1])))
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width="auto", compression="auto",
                  warmup_steps=WARMUP)
    _train(model, opt, range(WARMUP + 1))  # the choice at step WARMUP - 1, one pipelined step since
    assert checks == [] and opt.width == 2
    opt.flush()
    state = opt.state_dict()
    assert state["pipesgd"]["auto"][auto.config.HOLDING] and "holding" not in opt.auto_choice
    opt.close()
    again = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width="auto", compression="auto",
                    warmup_steps=WARMUP)
    again.load_state_dict(state)
    assert again.width == 2
    resumed = WARMUP + 1
    _train(model, again, range(resumed, resumed + auto.CONFIRM_STEPS + 3))
    assert checks == [(n - 1, n == auto.CONFIRM_STEPS) for n in (auto.EARLY_HOLD_STEPS, auto.CONFIRM_STEPS)]
    again.flush()
    assert auto.config.HOLDING not in again.state_dict()["pipesgd"]["auto"]
    again.close()


def _held_ranks(rank: int, world: int) -> dict:
    """Rank 0's own warm-up would call width 1 far faster, rank 1's far slower: every rank must hold the same. No
    early look: on loopback it could read the tiny model's initial broadcast as a slow link and run a provisional
    codec, whose warm-up holds nothing (CI, once: rank 1 had no ``ran``)."""
    auto.choices.transfer_floor_s = lambda *_: 0.0
    auto.choices.uncompressed_hides = lambda measured, *_: _chooses(2)(measured)
    period = 1e-6 if rank == 0 else 1e3
    auto.StepClock.synchronous = lambda self: {"comm_s": 0.01, "period_s": period, "wait_s": 0.01}
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width="auto", compression="auto",
                  warmup_steps=WARMUP)
    stats = _train(model, opt, range(WARMUP + auto.CONFIRM_STEPS + 2), rank)
    opt.flush()
    opt.check_replicas()
    opt.close()
    return {"width": opt.width, "ran": opt.auto_choice["ran"], "labels": [s.auto_choice for s in stats]}


@pytest.mark.slow
def test_every_rank_holds_the_chosen_width_against_the_same_warmup():
    results = run_ranks(_held_ranks, 2)
    assert results[0] == results[1] and results[0]["width"] == 2 and results[0]["ran"]["1:none"]["period_s"] == 1e3


@pytest.mark.parametrize("width", [1, 2])
def test_the_first_choice_counts_the_warmup_as_width_1_measured(process_group, monkeypatch, width):
    """The warm-up's synchronous steps ran width 1 with its codec: the decision predicts that configuration as it
    ran (its iteration, not its exchange: that would anchor the codec's model, ``_predictor``), and a width chosen
    above 1 is held against the whole run, exchange included."""
    seen = []
    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)
    monkeypatch.setattr(auto.choices, "measure", lambda *_args: dict(SLOW))
    monkeypatch.setattr(auto.choices, "decide", lambda measured, *_args, ran, wider_gain: seen.append(ran) or gains.append(
        wider_gain) or _chooses(width)(measured))
    gains = []
    clock = auto.StepClock(cores=lambda: None)
    clock.gaps, clock.durations, clock.comm_busy = [0.10, 0.12, 0.10], [0.05, 0.06, 0.05], [0.04, 0.04, 0.05]
    clock.waits, clock.iterations = [0.03, 0.04, 0.03], [0.16, 0.15]
    choice = auto.first_choice([], FREE, clock, None)
    assert seen == [{"1:none": {"period_s": pytest.approx(0.15), "wait_s": 0.03, "fastest_s": 0.15}}]
    assert gains == [auto.TRIAL_GAIN]  # the warm-up's choice tries a width on a smaller predicted gain: it is held
    if width == 1:
        assert "ran" not in choice
    else:
        assert choice["ran"] == {"1:none": {"comm_s": 0.04, **seen[0]["1:none"]}}


@pytest.mark.parametrize("warmup", ["1:none", "1:q8", "1:q4+ef"])
@pytest.mark.parametrize("pipelined_s, want", [(0.548, 1), (0.30, 1), (0.26, None)])
def test_width_1_comes_back_unless_the_pipeline_ran_clearly_faster(process_group, pipelined_s, want, warmup):
    """The warm-up's 330 ms against the pipelined steps' 548 ms (AlexNet-like, AdamW, unshaped links, scratch): back
    to width 1 with the warm-up's codec; against 300 ms (1.1x faster, within ``WIDER_GAIN``: a stale gradient for
    too little) too; against 260 ms (1.27x faster) the chosen width stays."""
    current = {"width": 2, "compression": "q8", "error_feedback": False, "measured": dict(FAST), "reason": "a test",
               "ran": {warmup: {"comm_s": 0.091, "period_s": 0.330, "wait_s": 0.122}}}
    codec = warmup.split(":")[1]
    want = want and (want, codec.removesuffix("+ef"), codec.endswith("+ef"))
    clock = auto.StepClock()
    clock.comm_busy, clock.gaps, clock.periods, clock.waits = [0.09] * 5, [0.4] * 5, [pipelined_s] * 5, [0.1] * 5
    choice = auto.held_against_width_1(current, clock, None, torch.device("cpu"))
    assert (choice and (choice["width"], choice["compression"], choice["error_feedback"])) == want
    if choice:
        assert "330 ms" in choice["reason"] and f"{pipelined_s * 1e3:.3g} ms" in choice["reason"]
        assert "not 1.25x faster" in choice["reason"] and list(choice["ran"]) == [warmup]


WARMUP_RUN = {"comm_s": 0.091, "period_s": 0.330, "wait_s": 0.122, "fastest_s": 0.320}


@pytest.mark.parametrize("iterations, warmup, back", [
    ([0.592] * 2, WARMUP_RUN, True), ([0.310] * 2, WARMUP_RUN, True), ([0.300] * 2, WARMUP_RUN, False),
    ([1.3, 0.250], WARMUP_RUN, False), ([0.250] * 2, WARMUP_RUN, False),
    ([0.310] * 2, {**WARMUP_RUN, "period_s": 0.500}, True),
    ([0.250] * 2, {k: v for k, v in WARMUP_RUN.items() if k != "fastest_s"}, False),
    ([0.320] * 2, {k: v for k, v in WARMUP_RUN.items() if k != "fastest_s"}, True)])
def test_a_pipeline_whose_fastest_is_not_clearly_faster_goes_back_at_the_early_hold(process_group, iterations,
                                                                                     warmup, back):
    """Before the final hold a pipeline goes back when not even its fastest iteration ran ``TRIAL_GAIN`` faster than
    the warm-up's fastest (320 ms; AlexNet-like, AdamW, unshaped links: 592 ms at width 2): 310 ms, 1.03x faster, goes
    back too, 300 ms (1.07x) and 250 ms (1.28x) hold on to the final hold, and so does one whose first iteration held
    the look-ahead's first calls (1.3 s) but the next ran faster. Fastest against fastest: a warm-up whose median
    read 500 ms (after a provisional codec) does not make 310 ms look faster. A warm-up saved without its fastest
    iteration (a checkpoint from before) is held by its median."""
    current = {"width": 2, "compression": "none", "error_feedback": False, "measured": dict(FAST), "reason": "a test",
               "ran": {"1:none": dict(warmup)}}
    clock = auto.StepClock()
    clock.comm_busy, clock.gaps, clock.periods, clock.waits = [0.09] * 2, [0.4] * 2, list(iterations), [0.1] * 2
    clock.iterations = list(iterations)
    choice = auto.held_against_width_1(current, clock, None, torch.device("cpu"), final=False)
    assert (choice and (choice["width"], choice["compression"], choice["error_feedback"])) == (
        (1, "none", False) if back else None)
    if choice:
        reference = warmup.get("fastest_s", warmup["period_s"])
        assert f"fastest synchronous iteration took {reference * 1e3:.3g} ms" in choice["reason"]
        assert f"fastest of 2 {min(iterations) * 1e3:.3g} ms" in choice["reason"]
        assert "not 1.05x faster" in choice["reason"]


@pytest.mark.parametrize("synchronous_s, back_at", [(1e-9, auto.EARLY_HOLD_STEPS), (1e3, None)])
def test_a_held_width_goes_back_early_only_where_it_ran_no_faster(process_group, monkeypatch, synchronous_s,
                                                                   back_at):
    """A warm-up far faster than any pipelined step: back to width 1 at the early hold's step; far slower: width 2
    stays past the full hold."""
    monkeypatch.setattr(auto.choices, "uncompressed_hides", lambda measured, *_: _chooses(2)(measured))
    monkeypatch.setattr(auto.StepClock, "synchronous",
                        lambda self: {"comm_s": 0.01, "period_s": synchronous_s, "wait_s": 0.01})
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width="auto", compression="auto",
                  warmup_steps=WARMUP)
    stats = _train(model, opt, range(WARMUP + auto.CONFIRM_STEPS + 2))
    labels = {s.step: s.auto_choice for s in stats if s.auto_choice}
    assert labels[WARMUP - 1] == "width 2, none"
    if back_at is None:
        assert list(labels) == [WARMUP - 1] and opt.width == 2
    else:
        assert labels == {WARMUP - 1: "width 2, none", WARMUP - 1 + back_at: "width 1, none"} and opt.width == 1
        assert "fastest of 2" in opt.auto_choice["reason"]
    opt.flush()
    opt.close()


def test_after_a_provisional_codec_a_held_width_goes_back_to_width_1_with_that_codec(process_group, monkeypatch):
    """A slow link's warm-up: step 0 probes, the rest runs q4 + feedback (provisional), and the choice is width 2
    with it. Its synchronous steps are width 1 with q4 + feedback, measured: the pipeline is held against them and,
    no faster, goes back there (not to width 1 uncompressed, which never ran: AlexNet-like on unshaped links, seed
    11, where the early look misread the link and width 2 q8 ran at 2.8x synchronous SGD's time to target)."""
    from tests.test_auto_codec import PROBING, _slow_link

    monkeypatch.setattr(auto.choices, "uncompressed_hides", never_hides)
    monkeypatch.setattr(auto.choices, "transfer_floor_s", lambda *_: 0.0)  # the probe at step 0, not the early look
    monkeypatch.setattr(auto.choices, "measure", _slow_link)
    monkeypatch.setattr(auto.choices, "decide", _chooses(2, "q4", True))
    monkeypatch.setattr(auto.StepClock, "synchronous",
                        lambda self: {"comm_s": 0.01, "period_s": 1e-9, "wait_s": 0.01})
    model = _model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, width="auto", compression="auto",
                  warmup_steps=PROBING)
    stats = _train(model, opt, range(PROBING + auto.CONFIRM_STEPS + 2))
    labels = {s.step: s.auto_choice for s in stats if s.auto_choice}
    assert labels[0] == "warm-up: q4 + error feedback" and labels[PROBING - 1] == "width 2, q4 + error feedback"
    assert labels[PROBING - 1 + auto.EARLY_HOLD_STEPS] == "width 1, q4 + error feedback"
    assert (opt.width, opt.compression, opt.auto_choice["error_feedback"]) == (1, "q4", True)
    assert opt._parts.exchange.feedback is not None and list(opt.auto_choice["ran"]) == ["1:q4+ef"]
    assert "held against the warm-up" in opt.auto_choice["reason"]
    opt.flush()
    opt.check_replicas()
    opt.close()


def test_a_narrower_configuration_that_ran_faster_wins_over_a_prediction_that_hides():
    """AlexNet-like (34 MB of gradient) on unshaped links, 4 ranks on 2 shared cores (scratch): the synchronous
    warm-up took 330 ms per step, width 2 uncompressed 548 ms (its compute slowed beside the exchange, which the
    model does not see), and bf16, scaled as none was, would hide: measured beats that prediction, and the re-check
    goes back to width 1. Without width 1's run it stays."""
    measured = _measured(0.091, 0.091 / 64 + 6e-4, compute_s=0.126)
    ran = {"2:none": {"comm_s": 0.091, "period_s": 0.548, "wait_s": 0.157}}
    warmup = {"1:none": {"comm_s": 0.091, "period_s": 0.330, "wait_s": 0.122}}
    for seen, want in ((ran, None), ({**ran, **warmup}, (1, "none"))):
        choice = auto.decide(measured, 4, 34e6, FREE, now=(2, "none", False), ran=seen)
        assert (choice and (choice["width"], choice["compression"])) == want


def test_what_ran_stands_in_for_the_model_and_scales_what_did_not():
    measured = _measured(0.135, 0.135 / 64 + 6e-4)
    link = auto.link_terms(measured, 4, 4e6)
    ran = {"2:bf16": {"comm_s": 0.05, "period_s": 0.14, "wait_s": 0.001}}
    predict_pipe = decision._predictor(measured, ran, scale=2.0)
    raw = decision._predictor(measured)
    case = Scenario(nodes=4, grad_bytes=4e6, compute_s=0.1, compression="bf16", **link)
    ran_bf16 = predict_pipe(case)
    assert (ran_bf16.iteration_s, ran_bf16.exposed_comm_s, ran_bf16.codec_s) == (0.14, 0.001, 0.0)
    wider = predict_pipe(case.with_changes(width=3))  # bf16 did not run at width 3: modelled, its exchange as measured
    assert wider.comm_total_s == pytest.approx(0.05) and wider.iteration_s == pytest.approx(
        2.0 * decision._predictor(measured, ran, as_measured=False)(case.with_changes(width=3)).iteration_s)
    q8 = case.with_changes(compression="q8", error_feedback=True)
    assert predict_pipe(q8).iteration_s == pytest.approx(2.0 * raw(q8).iteration_s)


def test_the_larger_of_two_varying_times_is_their_expected_maximum():
    assert expected_max_of_two(0.05, 0.03, 0.0) == 0.05
    assert expected_max_of_two(0.05, 0.05, 0.01) == pytest.approx(0.05 + 0.01 / (2 * torch.pi) ** 0.5)
    assert expected_max_of_two(0.05, 0.01, 0.001) == pytest.approx(0.05)  # 40 spreads apart: the larger
    torch.manual_seed(0)  # against sampling: the window 50 ± 8 ms, the exchange 45 ± 6 ms
    a, b = 0.05 + 0.008 * torch.randn(1_000_000, dtype=torch.float64), 0.045 + 0.006 * torch.randn(
        1_000_000, dtype=torch.float64)
    assert expected_max_of_two(0.05, 0.045, 0.01) == pytest.approx(torch.maximum(a, b).mean().item(), rel=1e-3)


def test_a_pipelined_step_that_varies_hides_less_than_its_means_say():
    measured = {**_measured(0.040, 0.040 / 64 + 6e-4), "compute_spread_s": 0.02, "comm_cv": 0.25}
    case = Scenario(nodes=4, grad_bytes=4e6, compute_s=0.04, **auto.link_terms(measured, 4, 4e6))
    plain = decision._predictor({k: v for k, v in measured.items() if "spread" not in k})
    varying = decision._predictor(measured)
    for width in (1, 2):
        steady, jittered = plain(case.with_changes(width=width)), varying(case.with_changes(width=width))
        if width == 1:  # synchronous: a sum, not a maximum
            assert jittered == steady
            continue
        window = steady.iteration_s - steady.exposed_comm_s - steady.codec_s
        spread = (0.02 ** 2 + (0.25 * steady.comm_total_s) ** 2) ** 0.5
        assert jittered.iteration_s == pytest.approx(expected_max_of_two(window, steady.comm_total_s, spread))
        assert jittered.iteration_s > steady.iteration_s
        assert jittered.exposed_comm_s + jittered.codec_s == pytest.approx(jittered.iteration_s - window)


def test_the_warmups_provisional_codec_counts_with_its_measured_exchange():
    measured = {**_measured(0.135, 0.135 / 64 + 6e-4), "q4+ef_exchange_s": 0.05}
    case = Scenario(nodes=4, grad_bytes=4e6, compute_s=0.1, **auto.link_terms(measured, 4, 4e6))
    q4 = case.with_changes(compression="q4", error_feedback=True)
    assert decision._predictor(measured)(q4).comm_total_s == pytest.approx(0.05)
    q8 = case.with_changes(compression="q8", error_feedback=True)  # modelled from the uncompressed link
    assert decision._predictor(measured)(q8).comm_total_s == decision._predictor(_measured(0.135, 0.135 / 64 + 6e-4))(
        q8).comm_total_s


def _on_rank0_ranks(rank: int, world: int) -> dict:
    from pipesgd.auto.probes import on_rank0

    made = []
    chosen = on_rank0(lambda: made.append(rank) or {"width": 2, "by": rank}, None, torch.device("cpu"))

    def fails():
        raise ValueError("no candidate")
    try:
        on_rank0(fails, None, torch.device("cpu"))
        error = None
    except Exception as raised:  # noqa: BLE001 - which one each rank sees is the test
        error = f"{type(raised).__name__}: {raised}"
    return {"made": made, "chosen": chosen, "error": error}


@pytest.mark.slow
def test_the_decision_is_made_on_rank_0_and_an_error_there_reaches_every_rank():
    """``probes.on_rank0``: one rank computes, every rank holds its result; an error on rank 0 is raised on every
    rank (a rank waiting in the broadcast would otherwise hang until the timeout)."""
    results = run_ranks(_on_rank0_ranks, 3, timeout_s=60)
    assert [r["made"] for r in results] == [[0], [], []]
    assert all(r["chosen"] == {"width": 2, "by": 0} for r in results)
    assert results[0]["error"] == "ValueError: no candidate"
    assert [r["error"] for r in results[1:]] == ["RuntimeError: PipeSGD auto: the decision failed on rank 0: "
                                                 "ValueError: no candidate"] * 2
