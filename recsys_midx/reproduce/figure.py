"""The figure of a table's validation curves: the metric against minutes, one line per run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib import rcParams

# A figure made without pyplot renders to a file only and leaves the caller's backend alone.
from matplotlib.figure import Figure

from recsys_midx.reports.shares import best_of, lower_is_better, threshold
from recsys_midx.reports.summary_plots import FRACTIONS
from recsys_midx.reproduce.spec import TableSpec


def plot_curves(spec: TableSpec, curves: pd.DataFrame, path: Path) -> Path:
    """Draw every run's validation curve, coloured by row, with the shares the time table times.

    Args:
        spec: the table (its rows give the colours and the legend's order).
        curves: its curves' CSV (columns ``row``, ``seed``, ``minutes``, ``value``).
        path: the PNG to write.

    Returns:
        ``path``.
    """
    figure = Figure(figsize=(7.0, 4.0))
    ax = figure.subplots()
    colours = rcParams["axes.prop_cycle"].by_key()["color"]
    for index, row in enumerate(row for row in spec.rows if (curves["row"] == row.name).any()):
        own = curves[curves["row"] == row.name]
        for number, (_, run) in enumerate(own.groupby("seed", sort=True)):
            ax.plot(
                run["minutes"],
                run["value"],
                color=colours[index % len(colours)],
                marker="o",
                markersize=2,
                linewidth=1,
                label=row.name if number == 0 else None,
            )
    lower = lower_is_better(str(spec.validation))
    best = best_of(curves["value"], lower)
    for share in FRACTIONS:
        ax.axhline(threshold(best, share, lower), color="grey", linewidth=0.7, linestyle=":")
    if lower:
        ax.set_ylim(top=max(1.25 * best, float(curves["value"].quantile(0.95))))
    else:
        ax.set_ylim(bottom=min(0.8 * best, float(curves["value"].quantile(0.05))))
    ax.set_xlabel("minutes (training and validation)")
    ax.set_ylabel(str(spec.validation))
    ax.set_title(spec.title, fontsize=9)
    ax.legend(fontsize=8, loc="upper right" if lower else "lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path
