"""The many-workers simulation (``experiments/harness/staleness_sim.py``): with the true average standing in, look-ahead
is synchronous SGD bit for bit (so the diagnostic isolates the stand-in's noise); with a worker's own gradient it is
not; the charlm recipe is the accuracy study's; a bad stand-in name is one line and exit 2."""
from __future__ import annotations

import subprocess
import sys

import pytest

from experiments.harness.staleness_sim import SimSpec, plan, simulate, summarise, summary_markdown

ONE_EPOCH = dict(task="digits", workers=2, epochs=1, warmup_steps=2)


def test_the_true_average_as_stand_in_is_synchronous_sgd_and_a_workers_own_gradient_is_not():
    sync = simulate(SimSpec(width=1, **ONE_EPOCH))
    oracle = simulate(SimSpec(width=3, staleness="lookahead", standin="oracle", **ONE_EPOCH))
    local = simulate(SimSpec(width=3, staleness="lookahead", **ONE_EPOCH))
    assert oracle["final_loss"] == sync["final_loss"] and oracle["final_accuracy"] == sync["final_accuracy"]
    assert local["final_loss"] != sync["final_loss"]
    assert oracle["key"].endswith("oracle-stand-in seed=0") and "oracle" not in local["key"]


def test_the_charlm_plan_is_the_studys_recipe_and_its_table_reports_the_loss():
    specs = plan(["charlm"], [2], [0], width=3, standins=("local", "oracle"))
    assert [(s.width, s.staleness, s.standin) for s in specs] == [
        (1, "none", "local"), (3, "none", "local"), (3, "lookahead", "local"), (3, "lookahead", "oracle")]
    assert all(s.global_batch == 64 and s.lr == 1e-3 for s in specs)
    runs = [{**{k: getattr(s, k) for k in ("task", "workers", "width", "staleness", "standin", "global_batch",
                                           "seed")}, "final_accuracy": 0.5, "final_loss": 2.0 + i / 10}
            for i, s in enumerate(specs)]
    table = summary_markdown(summarise(runs))
    assert "true-average stand-in" in table and "2.3000 ± 0.0000 (+15.0 %)" in table


def test_an_unknown_stand_in_is_one_line_and_exit_2():
    result = subprocess.run([sys.executable, "experiments/staleness_sim.py", "--standins", "psychic"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "psychic" in result.stderr and "oracle" in result.stderr


@pytest.mark.parametrize("bad", [dict(standin="psychic"), dict(task="imagenet")])
def test_a_bad_spec_is_refused(bad):
    with pytest.raises(ValueError):
        SimSpec(**bad)
