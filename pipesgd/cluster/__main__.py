"""``python -m pipesgd.cluster``: same as the ``pipesgd-cluster`` console script."""
import sys

from .cli import main

sys.exit(main())
