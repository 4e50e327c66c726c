"""An argparse parser for the experiment scripts that reports a bad flag as one line and exit status 2 (argparse
prints its whole usage first), as every other bad input is reported; and the check of a comma list of names."""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def known_names(parser: argparse.ArgumentParser, text: str, valid, what: str) -> list[str]:
    """``text``'s comma-separated names, or ``parser.error`` naming those not in ``valid`` and listing the valid."""
    names = text.split(",")
    unknown = [n for n in names if n not in valid]
    if unknown:
        parser.error(f"unknown {what} {', '.join(unknown)}; valid: {', '.join(valid)}")
    return names
