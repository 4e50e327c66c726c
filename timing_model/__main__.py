"""``python -m timing_model`` runs the analytic subcommands of ``pipesgd-timing`` (predict, sweep, recommend,
validate); ``calibrate`` measures, so it lives with ``pipesgd-timing`` itself (``pipesgd.measure.cli``)."""
import sys

from timing_model.cli import main

sys.exit(main())
