"""Does the timing model rank the modes of a cell as the measurements do? (issue 14, item 5)

A speedup table is read for its ordering: which variant is fastest, which baseline Pipe-SGD beats. Per cell of the
comparison grid, every pair of predicted runs whose measured iteration times differ by more than ``tie`` (relative
to the faster one; closer pairs are within the machine's noise and the measurement itself does not order them) is
an *inversion* when the model orders it the other way. Reads only runs.json records.

For scale, ``orders_kept_between`` asks the same of the measurements themselves: of the pairs one sitting of the
grid orders, how many another sitting of the same runs orders alike (``experiments.harness.repeatability`` prints it).
"""
from __future__ import annotations

from itertools import combinations

__all__ = ["TIE", "cell_orderings", "ordering_table", "orders_kept_between"]

TIE = 0.05  # measured pairs closer than this (relative) are not ordered by the measurement


def cell_orderings(runs: list[dict], tie: float = TIE) -> list[dict]:
    """Per cell with two or more predicted runs: ``{cell, runs, pairs, inversions}``, ``pairs`` the measured-ordered
    pairs and ``inversions`` those the model orders the other way, as ``(faster, slower, measured ratio,
    predicted ratio)`` (ratio = slower / faster time; the predicted one below 1)."""
    cells: dict[str, list[dict]] = {}
    for r in runs:
        if r.get("status") == "ok" and r.get("model"):
            cells.setdefault(r["cell"], []).append(r)
    out = []
    for cell, predicted in cells.items():
        if len(predicted) < 2:
            continue
        pairs, inversions = 0, []
        for a, b in combinations(predicted, 2):
            fast, slow = (a, b) if a["model"]["measured_s"] <= b["model"]["measured_s"] else (b, a)
            measured = slow["model"]["measured_s"] / fast["model"]["measured_s"]
            if measured - 1 <= tie:
                continue
            pairs += 1
            model = slow["model"]["predicted_s"] / fast["model"]["predicted_s"]
            if model < 1:
                inversions.append((fast["variant"], slow["variant"], measured, model))
        out.append({"cell": cell, "runs": len(predicted), "pairs": pairs, "inversions": inversions})
    return out


def ordering_table(runs: list[dict], tie: float = TIE) -> str:
    """Markdown: per cell the ordered pairs, how many the model keeps, and each inversion."""
    rows = cell_orderings(runs, tie)
    if not rows:
        return ""
    lines = [f"### Does the model keep the measured order? (pairs measured more than {100 * tie:.0f} % apart)", "",
             "| cell | predicted runs | ordered pairs | kept | inversions (measured faster < slower: measured, "
             "model ratio) |", "|---|---|---|---|---|"]
    for r in rows:
        flips = "; ".join(f"{f} < {s}: {m:.2f}x, model {p:.2f}x" for f, s, m, p in r["inversions"]) or "none"
        lines.append(f"| {r['cell']} | {r['runs']} | {r['pairs']} | {r['pairs'] - len(r['inversions'])} | {flips} |")
    total = sum(r["pairs"] for r in rows)
    kept = total - sum(len(r["inversions"]) for r in rows)
    lines += ["", f"The model keeps {kept} of {total} measured orderings ({100 * kept / total:.0f} %)." if total
              else "No pair of runs is measured more than the tie apart.", ""]
    return "\n".join(lines)


def orders_kept_between(first: list[dict], second: list[dict], tie: float = TIE) -> tuple[int, int]:
    """(kept, pairs): the pairs of predicted runs that ``first`` measured more than ``tie`` apart in one cell, and how
    many of them ``second`` (another sitting's runs) measured in the same order; runs predicted in both only."""
    later = {(r["cell"], r["variant"]): _measured(r) for r in second if r.get("status") == "ok" and r.get("model")}
    # the second sitting's times stand in for the model's: an inversion is a pair the sittings order apart
    paired = [{**r, "model": {"measured_s": _measured(r), "predicted_s": later[(r["cell"], r["variant"])]}}
              for r in first if r.get("status") == "ok" and r.get("model") and (r["cell"], r["variant"]) in later]
    rows = cell_orderings(paired, tie)
    pairs = sum(r["pairs"] for r in rows)
    return pairs - sum(len(r["inversions"]) for r in rows), pairs


def _measured(run: dict) -> float:
    """The run's measured iteration as its prediction saw it, else as the run recorded it."""
    return run["model"].get("measured_s") or run["t_iter_s"]
