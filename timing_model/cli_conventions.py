"""What the three command lines (``pipesgd-train``, ``pipesgd-timing``, ``pipesgd-cluster``) share: exit codes, the
one-line error, and argument types that refuse bad values while parsing. Torch-free.

The convention: bad input (an unknown flag, a bad value, an unusable path, a combination that cannot work) prints
exactly one line ``PROG: error: message`` on stderr and exits 2, before any work starts; a failure at run time
prints one line of the same form and exits 1. No traceback for either (``pipesgd-train --debug`` adds it).
"""
from __future__ import annotations

import argparse
import math
import re
import sys

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "UsageError", "RunFailure", "OneLineParser", "first_line", "print_error",
           "join_negative_values", "finite_float", "positive_float", "non_negative_int", "positive_int"]

EXIT_FAILURE = 1  # the run started and failed
EXIT_USAGE = 2  # bad input, refused before any work (argparse's own code for usage errors)


class UsageError(ValueError):
    """Bad input; the message is the one line shown to the user."""


class RunFailure(RuntimeError):
    """A failure after the work started; the message is the one line shown to the user."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` with its message instead of printing the usage block and exiting
    (sub-command parsers inherit the class). ``--help`` still prints and exits 0."""

    def error(self, message: str):  # type: ignore[override]  # noqa: D401 - argparse hook
        raise UsageError(message)


def first_line(exc: BaseException | str) -> str:
    """The first non-empty line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip()
    if text:
        return text.splitlines()[0]
    return type(exc).__name__ if isinstance(exc, BaseException) else ""


def print_error(prog: str, message: BaseException | str) -> None:
    """``PROG: error: message`` on stderr, one line."""
    print(f"{prog}: error: {first_line(message)}", file=sys.stderr, flush=True)


_NEGATIVE = re.compile(r"^-(?:\d|\.\d|inf|nan)", re.IGNORECASE)


def join_negative_values(argv: list[str]) -> list[str]:
    """``--bandwidth -1gbit`` -> ``--bandwidth=-1gbit``, so that a negative value reaches its flag's check (and its
    clear error) instead of argparse's "expected one argument". Stops at ``--`` (a command's own arguments)."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + list(argv[i:])
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NEGATIVE.match(token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


# -- argparse types: argparse prefixes the message with the flag ("argument --queue-ms: ...") ------------------
def finite_float(text: str) -> float:
    """A float that is neither NaN nor infinite (``1e400`` overflows to inf: refused too)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number (got {text!r})")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive (got {text!r})")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {text!r})")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {text!r})")
    return value
