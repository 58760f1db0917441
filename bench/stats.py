"""Summaries of repeated bench measurements: `median (min-max)`, the form the bench scripts print.

Bench scripts import it as `from bench import stats` after their usual
`sys.path.insert(0, <repo root>)`, so `python bench/X.py` works from the repo root. A headline
ratio is the median of the per-repeat ratios: `fmt_spread(ratios(a, b), ".2f", "x")`, where a[i]
and b[i] were measured in the same repeat.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from plrl_operator.local import chaos_report


def median_spread(xs: Iterable[float]) -> tuple[float, float, float]:
    """(median, min, max) of `xs`; ValueError if there are none."""
    values = [float(x) for x in xs]
    if not values:
        raise ValueError("median_spread of no values")
    return statistics.median(values), min(values), max(values)


def fmt_spread(xs: Iterable[float], fmt: str = ".2f", unit: str = "", *, scale: float = 1.0) -> str:
    """`chaos_report.span` of `xs` times `scale`: `fmt_spread([1.1, 1.23, 1.4])` is "1.23 (1.10-1.40)",
    `fmt_spread([2.0, 2.5, 3.0], ".1f", "x")` is "2.5x (2.0-3.0)"; "-" if there are none."""
    return chaos_report.span([float(x) * scale for x in xs], fmt, unit)


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-repeat ratios `numerators[i] / denominators[i]`: pairs measured in the same repeat."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators for {len(denominators)} denominators")
    return [n / d for n, d in zip(numerators, denominators, strict=True)]
