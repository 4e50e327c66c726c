"""timing_model.errors: the error summary every report prints and its systematic-bias flag."""
from __future__ import annotations

import pytest

from timing_model.errors import bias, error_summary, summary_line


def test_summary_of_errors_that_scatter_around_zero_flags_no_bias():
    stats = error_summary([0.04, -0.03, 0.01, -0.02], flag=0.035)
    assert stats["runs"] == 4 and stats["median_abs_error"] == pytest.approx(0.025)
    assert stats["max_abs_error"] == pytest.approx(0.04) and stats["signed_mean_error"] == pytest.approx(0.0)
    assert (stats["too_fast"], stats["too_slow"], stats["over_flag"], stats["bias"]) == (2, 2, 1, None)
    assert summary_line(stats) == "runs: 4, median |error| 2.5 %, max |error| 4.0 %, signed mean +0.0 %"


def test_every_error_of_one_sign_is_a_bias_even_when_small():
    # The AlexNet validation: five runs, every prediction too fast.
    errors = [-0.056, -0.059, -0.102, -0.067, -0.081]
    assert bias(errors) == "systematic bias: 5 of 5 predictions too fast (signed mean -7.3 %)"
    assert bias([0.004, 0.002, 0.001]) == "systematic bias: 3 of 3 predictions too slow (signed mean +0.2 %)"
    assert summary_line(error_summary(errors)).endswith("\nsystematic bias: 5 of 5 predictions too fast "
                                                        "(signed mean -7.3 %)")


def test_a_leaning_mean_is_a_bias_only_when_most_errors_share_its_sign():
    leaning = [-0.10, -0.08, -0.05, -0.04, 0.01]  # mean -5.2 %, 4 of 5 too fast
    assert bias(leaning) == "systematic bias: 4 of 5 predictions too fast (signed mean -5.2 %)"
    one_outlier = [-0.40, 0.01, 0.02, 0.01, -0.01]  # mean -7.4 %, but only 2 of 5 too fast: an outlier, not a lean
    assert bias(one_outlier) is None
    assert bias([-0.3, -0.2]) is None  # too few runs to call it


def test_no_runs_give_empty_statistics():
    stats = error_summary([])
    assert stats["runs"] == 0 and stats["median_abs_error"] is None and stats["bias"] is None
    assert summary_line(stats) == "runs: 0"
