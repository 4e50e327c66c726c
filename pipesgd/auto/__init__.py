"""``PipeSGD(compression="auto", width="auto")``: width and codec chosen from the run's own measurements in the
warm-up, fed to the timing model (``timing_model.recommend``); how and why: docs/auto.md.

One module per concept: the step clock (``clock``), the knobs left free (``knobs``), the timed calls and agreement
(``probes``), the early look (``look``), the decision (``decision``), the all-reduce trial (``allreduce_trial``),
the hold against width 1 (``hold``), the cores' floor (``cores``), the decisions the chooser runs (``choices``) and
the chooser itself over the wrapper's steps (``config``).
"""
from pipesgd.auto.choices import CHANGED, early_look, first_choice, probe, recheck
from pipesgd.auto.clock import StepClock
from pipesgd.auto.config import PROVISIONAL_STEPS, AutoConfig
from pipesgd.auto.decision import (announce, codec_key, decide, describe, exchange_key, link_terms, run_key,
                                   uncompressed_hides)
from pipesgd.auto.hold import CONFIRM_STEPS, EARLY_HOLD_STEPS, held_against_width_1, held_steps
from pipesgd.auto.knobs import AUTO, CANDIDATES, MAX_WIDTH, SMALL_FRACTION, SWITCH_GAIN, TRIAL_GAIN, Knobs
from pipesgd.auto.look import BYTES_SHARE, SLOW_LOOK, clearly_slow, transfer_floor_s
from pipesgd.auto.probes import agreed, exchange_per_step, measure, on_rank0

__all__ = ["AUTO", "CANDIDATES", "MAX_WIDTH", "SMALL_FRACTION", "SWITCH_GAIN", "TRIAL_GAIN", "CHANGED",
           "PROVISIONAL_STEPS", "CONFIRM_STEPS", "EARLY_HOLD_STEPS", "SLOW_LOOK", "BYTES_SHARE", "Knobs", "StepClock",
           "AutoConfig",
           "early_look", "first_choice", "probe", "clearly_slow", "recheck", "transfer_floor_s", "measure", "agreed",
           "decide",
           "link_terms", "describe", "announce", "codec_key", "run_key", "exchange_key", "uncompressed_hides",
           "held_against_width_1", "held_steps", "exchange_per_step", "on_rank0"]
