"""An argparse parser for the experiment scripts that reports a bad flag as one line and exit status 2 (argparse
prints its whole usage first), as every other bad input is reported."""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)
