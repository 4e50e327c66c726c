"""``python -m timing_model`` runs the ``pipesgd-timing`` command line."""
import sys

from timing_model.cli import main

sys.exit(main())
