"""Render lists of flat dicts as markdown, CSV or JSON; the CLI's only formatting code.

JSON keeps full-precision numbers (seconds, bytes/s); markdown and CSV use the same column keys,
markdown rounds to four significant digits in plain decimals (no e-notation) for reading.
"""
from __future__ import annotations

import csv
import io
import json
import math

from .units import format_number

__all__ = ["FORMATS", "render", "render_markdown", "render_csv", "render_json"]

FORMATS = ("markdown", "csv", "json")


def _cell(value, precise: bool) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value) if precise else format_number(value)
    return "" if value is None else str(value)


def _columns(rows: list[dict], columns: list[str] | None) -> list[str]:
    if columns:
        return columns
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    return list(seen)


def render_markdown(rows: list[dict], columns: list[str] | None = None, title: str | None = None) -> str:
    cols = _columns(rows, columns)
    lines = [f"### {title}", ""] if title else []
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join("---" for _ in cols) + "|")
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c), False) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def render_csv(rows: list[dict], columns: list[str] | None = None) -> str:
    cols = _columns(rows, columns)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(cols)
    for row in rows:
        writer.writerow([_cell(row.get(c), True) for c in cols])
    return out.getvalue()


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def render_json(rows: list[dict], columns: list[str] | None = None) -> str:
    cols = _columns(rows, columns)
    return json.dumps([{c: _jsonable(row.get(c)) for c in cols} for row in rows], indent=2) + "\n"


def render(rows: list[dict], fmt: str, columns: list[str] | None = None, title: str | None = None) -> str:
    """Render ``rows`` in ``fmt`` (markdown, csv or json)."""
    if fmt == "markdown":
        return render_markdown(rows, columns, title)
    if fmt == "csv":
        return render_csv(rows, columns)
    if fmt == "json":
        return render_json(rows, columns)
    raise ValueError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
