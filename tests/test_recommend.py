"""``pipesgd-timing recommend`` and ``timing_model.recommend``: the order of preference, the hide rule against the
model's own prediction, fixed knobs kept, the fastest when nothing hides, periodic averaging and its crossover
there, and bad input as one line and exit 2."""
from __future__ import annotations

import json
import math
import re

import pytest

from timing_model.cli import main
from timing_model.periodic import crossover
from timing_model.predict import Scenario, predict
from timing_model.recommend import HIDDEN_SHARE, WIDER_GAIN, candidate_knobs, recommend
from timing_model.trainer_defaults import SYNC_EVERY

CALIBRATION = "experiments/results/exchange_model/calibration.json"


def _pipe(scenario):
    return predict(scenario, ("pipe",)).result("pipe")


def _scenario(bandwidth_bits: float, compute_s: float = 0.1) -> Scenario:
    return Scenario(nodes=4, grad_bytes=4e6, bandwidth_Bps=bandwidth_bits / 8, compute_s=compute_s)


@pytest.mark.parametrize("bits, want", [
    (10e9, (1, "none", False)),  # the ring's 4.8 ms is under 5 % of the step: synchronous
    (1e9, (2, "none", False)),   # 48 ms hides behind a 100 ms step at width 2
    (100e6, (2, "q4", True)),    # 480 ms uncompressed, 120 with q8: only q4 (60 ms) hides
])
def test_the_choice_is_the_first_candidate_in_the_order_whose_all_reduce_hides(bits, want):
    answer = recommend(_scenario(bits), _pipe)
    choice = answer.choice
    assert (choice.width, choice.compression, choice.error_feedback) == want
    assert choice.hidden and choice.exposed_s <= HIDDEN_SHARE * choice.iteration_s
    earlier = answer.candidates[:answer.candidates.index(choice)]
    assert all(not c.hidden for c in earlier)
    assert _pipe(_scenario(bits).with_changes(width=want[0], compression=want[1], error_feedback=want[2])
                 ).iteration_s == choice.iteration_s  # the model's own prediction, not a second formula


def test_a_narrower_candidate_within_the_wider_gain_wins_over_one_that_hides():
    """A 100 ms step beside a 15 ms all-reduce: width 2 hides it (100 ms), width 1 takes 115 ms, 1.15x: not enough
    for a stale gradient, so width 1, and the reason says why; beside 48 ms (1.48x) width 2."""
    near = _scenario(1e9).with_changes(grad_bytes=4e6 * 15 / 48)
    answer = recommend(near, _pipe)
    hiding = next(c for c in answer.candidates if c.hidden)
    assert (hiding.width, answer.choice.width, answer.choice.compression) == (2, 1, "none")
    assert hiding.iteration_s < answer.choice.iteration_s <= WIDER_GAIN * hiding.iteration_s
    assert "within 1.25x" in answer.reason and "stale gradient" in answer.reason
    assert recommend(near, _pipe, width=2).choice.width == 2  # a named width is kept
    assert recommend(_scenario(1e9), _pipe).choice.width == 2


def test_a_codec_at_width_1_near_the_width_2_that_hides_wins_over_it():
    """A 100 ms step beside a 240 ms uncompressed all-reduce (120 ms in bf16, 60 in q8, 30 in q4): q8 hides at
    width 2 (100 ms per iteration); at width 1 bf16 takes 220 ms, q8 160, q4 130: width 2. With the look-ahead's
    replay (100 ms more at width 2 and up: AdamW's step beside its compute) bf16 hides at width 2 in 200 ms, and
    every codec at width 1 is within 1.25x of it: q4 is the fastest of them and q8 is 23 % slower, so synchronous
    q4 + error feedback (no stale gradient); under AdamW's limits (nothing below q8) synchronous q8. The reason says
    so; a named width keeps width 2."""
    plain = recommend(_scenario(200e6), _pipe)
    assert (plain.choice.width, plain.choice.compression) == (2, "q8")
    replayed = recommend(_scenario(200e6).with_changes(lookahead_s=0.1), _pipe)
    hiding = next(c for c in replayed.candidates if c.hidden)
    assert (hiding.width, hiding.compression) == (2, "bf16") and hiding.iteration_s == pytest.approx(0.2)
    assert (replayed.choice.width, replayed.choice.compression) == (1, "q4")
    assert replayed.choice.iteration_s == pytest.approx(0.13, rel=1e-3)
    assert "width 1, q4" in replayed.reason and "within 1.25x" in replayed.reason
    adamw = recommend(_scenario(200e6).with_changes(lookahead_s=0.1), _pipe, error_feedback=False,
                      codecs=("none", "bf16", "q8"))
    assert (adamw.choice.width, adamw.choice.compression, adamw.choice.error_feedback) == (1, "q8", False)
    assert recommend(_scenario(200e6).with_changes(lookahead_s=0.1), _pipe, width=2).choice.width == 2


def test_when_nothing_hides_the_first_near_the_fastest_is_taken_and_the_reason_says_so():
    answer = recommend(_scenario(1e6), _pipe)
    assert not any(c.hidden for c in answer.candidates)
    fastest = min(c.iteration_s for c in answer.candidates)  # width 2, q4: half of q8's time
    assert answer.choice.iteration_s <= 1.10 * fastest  # width 1, q4: 2 % slower and no stale gradient
    assert (answer.choice.width, answer.choice.compression) == (1, "q4") and "nothing tried hides" in answer.reason
    # a codec barely faster than a more exact one is not taken: on a latency-bound link (50 ms per message, a 40 KB
    # gradient) every codec saves under 2 % and nothing hides: width 2 uncompressed, not q4
    latency_bound = Scenario(nodes=4, grad_bytes=4e4, bandwidth_Bps=100e6 / 8, latency_s=0.05, compute_s=0.1)
    answer = recommend(latency_bound, _pipe)
    fastest = min(c.iteration_s for c in answer.candidates)
    assert not any(c.hidden for c in answer.candidates) and fastest < answer.choice.iteration_s <= 1.10 * fastest
    assert (answer.choice.width, answer.choice.compression) == (2, "none") and "within 10%" in answer.reason


def test_where_nothing_hides_a_narrower_candidate_within_the_wider_gain_wins_too():
    """A 100 ms step beside an exchange too long to hide at any width (uncompressed only): width 2 is the fastest
    prediction, and width 1 within 1.25x of it is taken (a stale gradient for too little); beyond 1.25x, width 2."""
    def answer(comm_ms: float):
        scenario = _scenario(1e9).with_changes(grad_bytes=4e6 * comm_ms / 48, latency_s=0.0)
        return recommend(scenario, _pipe, compression="none")
    near, far = answer(600), answer(200)  # width 1: 700 ms against 600 (1.17x), 300 against 200 (1.5x)
    for result in (near, far):
        assert not any(c.hidden for c in result.candidates) and "nothing tried hides" in result.reason
    width_1, width_2, _ = near.candidates
    assert width_2.iteration_s < width_1.iteration_s <= WIDER_GAIN * width_2.iteration_s
    assert near.choice == width_1 and "within 1.25x" in near.reason and "stale gradient" in near.reason
    assert far.choice.width == 2 and "within 1.25x" not in far.reason


def test_the_order_of_preference():
    assert candidate_knobs(3, allow_sign=False) == [
        (1, "none", False), (2, "none", False), (1, "bf16", False), (1, "q8", True), (1, "q4", True),
        (2, "bf16", False), (2, "q8", True), (2, "q4", True),
        (3, "none", False), (3, "bf16", False), (3, "q8", True), (3, "q4", True)]
    assert candidate_knobs(2, allow_sign=True)[-1] == (2, "sign", True)


def test_a_knob_the_user_fixed_is_never_changed():
    assert {c.width for c in recommend(_scenario(100e6), _pipe, width=3).candidates} == {3}
    fixed = recommend(_scenario(100e6), _pipe, compression="bf16")
    assert {(c.compression, c.error_feedback) for c in fixed.candidates} == {("bf16", False)}
    assert fixed.choice.width == 2  # nothing hides bf16's 240 ms; width 2 overlaps 100 of it (width 1: 340 ms)
    assert candidate_knobs(2, False, compression="fp16") == [(1, "fp16", False), (2, "fp16", False)]
    assert candidate_knobs(2, False, compression="q8", error_feedback=False) == [(1, "q8", False), (2, "q8", False)]
    assert candidate_knobs(1, False, width=1) == [(1, "none", False), (1, "bf16", False), (1, "q8", True),
                                                  (1, "q4", True)]
    assert candidate_knobs(1, False, width=1, error_feedback=False, allowed=("none", "bf16", "q8")) == [
        (1, "none", False), (1, "bf16", False), (1, "q8", False)]  # Adam and AdamW under compression="auto"


def test_the_cli_prints_the_decision_and_every_candidate(capsys):
    assert main(["recommend", "--nodes", "4", "--bandwidth", "100mbit", "--params", "1M", "--compute", "100ms"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("recommended: width 2, q4 + error feedback, two-collective exchange\nwhy: ")
    assert out.count("| yes |") + out.count("| no |") >= 9
    assert main(["recommend", "--nodes", "4", "--bandwidth", "100mbit", "--params", "1M", "--compute", "100ms",
                 "--width", "3", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["choice"]["width"] == 3 and all(c["width"] == 3 for c in answer["candidates"])


def test_the_cli_names_the_optimizer_for_the_feedback(capsys):
    argv = ["recommend", "--nodes", "4", "--bandwidth", "100mbit", "--params", "1M", "--compute", "100ms"]
    assert main([*argv, "--optimizer", "adamw"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("recommended: width 2, q8, two-collective exchange\nwhy: ")  # SGD: q4 + feedback
    assert "no error feedback and nothing below q8 under Adam/AdamW" in out
    assert "| q4 |" not in out and "| q8 | yes |" not in out
    assert main([*argv, "--optimizer", "adam", "--compression", "q8", "--error-feedback"]) == 0  # named: kept
    assert capsys.readouterr().out.startswith("recommended: width 2, q8 + error feedback")


def test_the_cli_takes_a_calibration(capsys):
    assert main(["recommend", "--nodes", "4", "--bandwidth", "1gbit", "--params", "1M", "--compute", "100ms",
                 "--calibration", CALIBRATION]) == 0
    assert capsys.readouterr().out.startswith("recommended: width ")


MODEL_CALIBRATION = "experiments/results/gpu/model-resnet20-calibration.json"  # timed ResNet-20 on 4 ranks


def test_a_calibration_alone_gives_the_cluster_and_the_compute(capsys):
    """The short form: nodes from the calibration's world size, the link from its fit, compute from the model it
    timed; the same decision as with those given."""
    assert main(["recommend", "--calibration", MODEL_CALIBRATION, "--params", "0.27M", "--format", "json"]) == 0
    short = json.loads(capsys.readouterr().out)
    with open(MODEL_CALIBRATION) as f:
        cal = json.load(f)
    assert main(["recommend", "--calibration", MODEL_CALIBRATION, "--params", "0.27M", "--format", "json",
                 "--nodes", str(cal["world_size"]), "--bandwidth", "1gbit",
                 "--compute", f"{cal['compute']['compute_s']}s"]) == 0
    assert json.loads(capsys.readouterr().out) == short
    assert main(["recommend", "--calibration", MODEL_CALIBRATION, "--params", "0.27M", "--compute", "1s",
                 "--format", "json"]) == 0  # a given --compute wins over the calibration's
    assert json.loads(capsys.readouterr().out)["choice"]["iteration_s"] >= 1.0


@pytest.mark.parametrize("argv, needle", [
    (["--params", "1M", "--compute", "5ms"], "recommend needs --nodes and --bandwidth, or --calibration FILE"),
    (["--nodes", "4", "--params", "1M", "--compute", "5ms"], "recommend needs --bandwidth, or --calibration FILE"),
])
def test_without_a_calibration_the_cluster_is_required(capsys, argv, needle):
    assert main(["recommend", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err


@pytest.mark.parametrize("extra, needle", [
    ([], "recommend needs --compute"),
    (["--compute", "100ms", "--max-width", "0"], "--max-width 0"),
    (["--compute", "100ms", "--max-width", "two"], "--max-width 'two'"),
    (["--compute", "100ms", "--compression", "zip"], "unknown compression 'zip'"),
    (["--compute", "100ms", "--width", "0"], "--width"),
    (["--compute", "100ms", "--optimizer", "lion"], "invalid choice: 'lion'"),
    (["--compute", "100ms", "--sync-every", "0"], "--sync-every 0: must be >= 1"),
    (["--compute", "100ms", "--sync-every", "-3"], "--sync-every -3: must be >= 1"),
    (["--compute", "100ms", "--sync-delay", "16"], "--sync-delay 16"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, extra, needle):
    assert main(["recommend", "--nodes", "4", "--bandwidth", "100mbit", "--params", "1M", *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_the_cli_gives_the_why_as_a_short_list(capsys):
    """One point per clause of the reason, none run on with a semicolon; the times without e-notation."""
    assert main(["recommend", "--nodes", "4", "--bandwidth", "100mbit", "--params", "1.5B", "--compute", "100ms"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].startswith("why: - nothing tried hides its all-reduce") and lines[2].startswith("     - ")
    why = [line for line in lines[1:] if line.startswith(("why: - ", "     - "))]
    assert len(why) >= 2 and not any(";" in line for line in why)
    assert not re.search(r"\de[+-]\d", out) and "| 12 min | 12 min | no |" in out


def test_under_adamw_a_width_above_1_comes_with_the_fastest_width_1_to_compare_losses(capsys):
    """The character GPT at 100 Mbit/s (430 K params, 133 ms of compute): width 2 hides and is chosen, and under
    AdamW the output also names the fastest width-1 candidate and its predicted iteration, since a stale AdamW update
    learns less per step (experiments/results/charlm_slow_links: sync + q8 reached the target loss first). Not under
    SGD, not with a named width, not where width 1 is the choice; in JSON too."""
    gpt = ["recommend", "--nodes", "4", "--bandwidth", "100mbit", "--params", "429824", "--compute", "133ms",
           "--update", "3ms"]
    assert main([*gpt, "--optimizer", "adamw"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("recommended: width 2")
    line = next(line for line in out.splitlines() if line.startswith("to a target loss under adamw"))
    assert "also try width 1, q8" in line and "x the choice's" in line
    for other in (["--optimizer", "sgd"], ["--optimizer", "adamw", "--width", "2"]):
        assert main([*gpt, *other]) == 0
        assert "to a target loss" not in capsys.readouterr().out
    assert main([*gpt[:4], "10gbit", *gpt[5:], "--optimizer", "adamw"]) == 0  # width 1 hides: nothing to add
    out = capsys.readouterr().out
    assert out.startswith("recommended: width 1") and "to a target loss" not in out
    assert main([*gpt, "--optimizer", "adamw", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["width_1_to_target"]["width"] == 1 and answer["width_1_to_target"]["compression"] == "q8"
    assert main([*gpt, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["width_1_to_target"] is None
    assert main([*gpt, "--optimizer", "muon"]) == 0  # Muon's codecs are SGD's: q4 + feedback hides at width 1
    assert capsys.readouterr().out.startswith("recommended: width 1, q4 + error feedback")
    assert main([*gpt, "--optimizer", "muon", "--compression", "q8"]) == 0  # its stale update costs loss too
    out = capsys.readouterr().out
    assert "to a target loss under muon: also try width 1, q8" in out and "stale muon update" in out


def test_under_adamw_a_wider_choice_says_the_low_rank_stand_ins_bytes_are_not_predicted(capsys):
    """The trainer's default stand-in under Adam/AdamW all-reduces a low-rank part of every weight matrix before
    each exchange; the model, which knows only the gradient's size, leaves it out and says so at width 2 under
    those optimizers only (text and JSON)."""
    gpt = ["recommend", "--nodes", "4", "--bandwidth", "100mbit", "--params", "429824", "--compute", "133ms",
           "--update", "3ms"]
    assert main([*gpt, "--optimizer", "adamw"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("recommended: width 2") and "not in these predictions: under adamw" in out
    for other in (["--optimizer", "sgd"], ["--optimizer", "muon", "--compression", "q8"],
                  ["--optimizer", "adamw", "--width", "1"]):
        assert main([*gpt, *other]) == 0
        assert "not in these predictions" not in capsys.readouterr().out
    assert main([*gpt, "--optimizer", "adam", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["not_predicted"] == ["lowrank_standin_allreduce"]
    assert main([*gpt, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["not_predicted"] == []


# periodic averaging (pipesgd-train --mode localsgd|diloco) where no per-step all-reduce hides
SLOW = ["recommend", "--nodes", "4", "--bandwidth", "100mbit", "--params", "25M", "--compute", "100ms"]


def _periodic(mode):
    return lambda scenario: predict(scenario, (mode,)).result(mode)


def test_periodic_averaging_is_compute_plus_update_plus_the_full_all_reduce_over_h():
    """The model's own all-reduce of the model in full precision, one call: the ring's 2(p-1)/p·M/B; diloco's
    overlap hides τ steps of compute + update of it."""
    base = Scenario(nodes=4, grad_bytes=1e8, bandwidth_Bps=100e6 / 8, compute_s=0.1, update_s=0.01, bucket_bytes=0.0)
    ring = 2 * 3 / 4 * 1e8 / (100e6 / 8)  # 12 s
    local = _periodic("localsgd")(base.with_changes(sync_every=16))
    assert local.iteration_s == pytest.approx(0.11 + ring / 16) and local.allreduce == "backend"
    assert local.exposed_comm_s == pytest.approx(ring / 16) and local.comm_total_s == pytest.approx(ring / 16)
    overlapped = _periodic("diloco")(base.with_changes(sync_every=16, sync_delay=4))
    assert overlapped.iteration_s == pytest.approx(0.11 + (ring - 4 * 0.11) / 16)
    hidden = _periodic("diloco")(base.with_changes(grad_bytes=1e5, sync_every=16, sync_delay=4))  # 12 ms < 4 steps
    assert hidden.iteration_s == pytest.approx(0.11) and hidden.exposed_comm_s == pytest.approx(0.0, abs=1e-12)
    compressed = base.with_changes(sync_every=16, compression="q8", bucket_bytes=4e6)  # never compressed nor bucketed
    assert _periodic("localsgd")(compressed).iteration_s == pytest.approx(local.iteration_s)
    with pytest.raises(ValueError, match="sync_every >= 2"):
        _periodic("localsgd")(base.with_changes(sync_every=1))
    with pytest.raises(ValueError, match="sync_delay"):
        _periodic("diloco")(base.with_changes(sync_every=4, sync_delay=4))
    assert "diloco" not in {r.mode for r in predict(base).results}  # not in every table


def test_on_a_slow_link_periodic_averaging_is_named_with_its_crossover(capsys):
    assert main([*SLOW, "--format", "json"]) == 0
    periodic = json.loads(capsys.readouterr().out)["periodic"]
    assert periodic["named"] and (periodic["mode"], periodic["sync_every"]) == ("localsgd", SYNC_EVERY)
    assert periodic["per_step_s"] >= WIDER_GAIN * periodic["iteration_s"]
    assert periodic["crossover_axis"] == "bandwidth_Bps" and periodic["crossover"] > 100e6 / 8
    assert periodic["crossover_ratio"] > 1 and "2311.08105" in periodic["caveat"]
    assert main(SLOW) == 0
    out = capsys.readouterr().out
    assert out.startswith("recommended: width 1, q4 + error feedback")  # the per-step choice stays the answer
    assert "instead: periodic averaging, pipesgd-train --mode localsgd --sync-every 16\n" in out
    assert "predicted faster below " in out and "changes the algorithm" in out
    assert main([*SLOW, "--optimizer", "adamw", "--sync-every", "64", "--sync-delay", "8"]) == 0
    assert "pipesgd-train --mode diloco --sync-every 64 --sync-delay 8\n" in capsys.readouterr().out


def test_on_a_fast_link_periodic_averaging_is_not_named(capsys):
    assert main(["recommend", "--nodes", "4", "--bandwidth", "10gbit", "--params", "1M", "--compute", "100ms",
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["periodic"] is None  # something hides: not asked
    argv = ["recommend", "--nodes", "4", "--bandwidth", "1gbit", "--params", "25M", "--compute", "100ms"]
    assert main([*argv, "--format", "json"]) == 0  # nothing hides, but the pipeline is near periodic averaging
    periodic = json.loads(capsys.readouterr().out)["periodic"]
    assert not periodic["named"] and periodic["crossover"] < 1e9 / 8
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "instead:" not in out and "is not named" in out and "it would be faster below " in out


@pytest.mark.parametrize("sync_every, sync_delay", [(16, 0), (64, 8)])
def test_the_crossover_is_where_the_prediction_flips(sync_every, sync_delay):
    mode = "diloco" if sync_delay else "localsgd"
    scenario = Scenario(nodes=4, grad_bytes=1e8, bandwidth_Bps=100e6 / 8, compute_s=0.1, sync_every=sync_every,
                        sync_delay=sync_delay)

    def named(bandwidth_Bps):
        answer = recommend(scenario.with_changes(bandwidth_Bps=bandwidth_Bps), _pipe,
                           predict_periodic=_periodic(mode))
        return answer.periodic is not None and answer.periodic.named

    at = recommend(scenario, _pipe, predict_periodic=_periodic(mode)).periodic.crossover
    assert named(at * (1 - 1e-4)) and not named(at * (1 + 1e-4))
    again = recommend(scenario.with_changes(bandwidth_Bps=at * 1.1), _pipe, predict_periodic=_periodic(mode))
    assert again.periodic.crossover == pytest.approx(at, rel=1e-5)  # the same from above it


def test_the_crossover_search_reports_none_and_everywhere():
    assert crossover(lambda x: x < 5.0, 1.0) == pytest.approx(5.0, rel=1e-5)
    assert crossover(lambda x: x < 5.0, 80.0) == pytest.approx(5.0, rel=1e-5)
    assert crossover(lambda x: True, 1.0) == math.inf and crossover(lambda x: False, 1.0) is None
    # a sync every step without overlap is synchronous SGD uncompressed: never faster than the per-step choice
    scenario = Scenario(nodes=4, grad_bytes=1e8, bandwidth_Bps=100e6 / 8, compute_s=0.1, sync_every=1)
    periodic = recommend(scenario, _pipe, predict_periodic=_periodic("diloco")).periodic
    assert not periodic.named and periodic.crossover is None


def test_with_a_calibration_the_crossover_is_in_compute(capsys):
    assert main(["recommend", "--calibration", CALIBRATION, "--nodes", "4", "--params", "25M", "--compute", "100ms",
                 "--format", "json"]) == 0
    periodic = json.loads(capsys.readouterr().out)["periodic"]
    assert periodic["crossover_axis"] == "compute_s" and periodic["crossover"] > 0


def test_the_default_sync_every_is_the_trainers():
    from pipesgd import defaults
    assert defaults.SYNC_EVERY is SYNC_EVERY
