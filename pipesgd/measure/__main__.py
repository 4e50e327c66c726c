"""``python -m pipesgd.measure`` (and ``torchrun ... -m pipesgd.measure calibrate``) runs ``pipesgd-timing``."""
import sys

from pipesgd.measure.cli import main

sys.exit(main())
