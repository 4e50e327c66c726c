"""Comments and docstrings in the product say why in words: no measured figures (ms, %, x, Mbit/s, a GPU's name, a
count of seeds or sittings) and no issue numbers in ``pipesgd/`` and ``timing_model/`` (they live in ``docs/results``
and ``experiments/results`` beside the command that printed them), and no module docstring past 15 lines.

Text inside backticks is code or an input example (``--bandwidth 100mbit``), not a measurement, and is not read."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(p for package in ("pipesgd", "timing_model") for p in (ROOT / package).rglob("*.py"))
MAX_MODULE_DOCSTRING_LINES = 15

_UNITS = r"ms|µs|us|%|x|Mbit/s|Gbit/s|Mbit|Gbit|GB/s|MB/s|GiB/s|MiB/s"
FIGURE = re.compile(
    rf"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:{_UNITS})(?!\w)"  # 12 ms, 1.06-1.10x, 97.8 %
    r"|\bH[12]00\b|\bissue\s+#?\d+|\b\d+\s+seeds\b|\bsittings?\b",
    re.IGNORECASE,
)
_CODE = re.compile(r"``.*?``|`[^`]*`", re.DOTALL)


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in ``source``, code spans in backticks removed."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return [(line, _CODE.sub("", text)) for line, text in found]


def figures(source: str) -> list[str]:
    """'line: figure' for every measured figure or issue number in the comments and docstrings of ``source``."""
    return [f"{line}: {m.group(0)}" for line, text in prose(source) for m in FIGURE.finditer(text)]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_figures_or_issue_numbers_in_comments(path: Path) -> None:
    assert figures(path.read_text()) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_docstring_is_short(path: Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    assert len(doc.strip().splitlines()) <= MAX_MODULE_DOCSTRING_LINES


def test_the_check_finds_figures_and_skips_code_spans() -> None:
    source = ('"""Runs 1.06-1.10x faster (issue 77)."""\n'
              "x = 1  # took 9.6 ms on the H100\n"
              "# parse ``--bandwidth 100mbit`` or `1.25GB/s`; keeps 3 buffers\n")
    assert figures(source) == ["2: 9.6 ms", "2: H100", "1: 1.06-1.10x", "1: issue 77"]
