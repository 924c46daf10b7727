"""Time to quality: how soon each group of runs reaches a share of the exact softmax's best.

The reference of a (dataset, model) panel is the exact softmax's best validation metric
(:func:`~recsys_midx.reports.summary_plots.exact_best`). For every group of the panel the
table gives the mean of its runs' best as a share of the reference and, for each share in
``fractions``, the mean cumulative seconds (training plus validation, from ``epochs.csv``) at
which its runs first reached it, with how many of them did. This is the sampled softmax's promise
measured directly: the same quality, sooner. Rows come frontier first: the soonest to the
highest share, then to the next highest, and so on; groups that reach none by their best share.

Example:
    ```python
    runs = with_labels(summarize.load_runs([Path("multirun/frontier")]))
    print(to_markdown(time_to_quality(epoch_rows(runs))))
    ```
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from recsys_midx.reports.shares import best_of, reached, share_of
from recsys_midx.reports.summary_plots import FRACTIONS, PANEL, exact_best, panel_lower


def time_to_quality(
    epochs: pd.DataFrame,
    fractions: Sequence[float] = FRACTIONS,
    metric: str = "quality",
    reference_sampler: str = "full",
) -> pd.DataFrame:
    """Best share of the reference and seconds to each share, per group of runs.

    Args:
        epochs: per-epoch rows of every run, as
            :func:`~recsys_midx.reports.summary_plots.epoch_rows` gives them (columns
            ``dataset``, ``model``, ``sampler``, ``label``, ``path``, ``epoch``, ``elapsed``,
            ``metric``; a run validating inside its epochs has several rows an epoch).
        fractions: shares of the reference to time.
        metric: the column of the validation metric; ``quality`` is the one each run's task
            monitors. Where that is perplexity (lower is better), a share ``f`` is reached at
            ``best / f`` and the best share is the reference over the group's best.
        reference_sampler: the sampler whose best is the reference.

    Returns:
        One row per (dataset, model, label), in the frontier order above within each panel:
        ``runs``, ``best share``, ``s per epoch`` (training plus validation, mean over the
        runs' epochs) and, for each fraction ``f``, ``s to f`` (mean seconds over the runs that
        reached it; NaN if none did) and ``reached f`` (how many did). Panels without a run of
        ``reference_sampler`` are left out.

    Raises:
        KeyError: if ``epochs`` lacks one of the columns above.

    Example:
        >>> epochs = pd.DataFrame({"dataset": "d", "model": "m", "sampler": ["full"] * 2,
        ...                        "label": "full", "path": "a", "epoch": [0, 1],
        ...                        "elapsed": [10.0, 20.0], "quality": [0.5, 1.0]})
        >>> time_to_quality(epochs, fractions=[0.9])["s to 0.9"].tolist()
        [20.0]
    """
    rows = []
    for (dataset, model), panel in epochs.groupby(PANEL, sort=True):
        reference = exact_best(panel, metric, reference_sampler)
        if reference is None:
            continue
        lower = panel_lower(panel)
        for label, group in panel.groupby("label", sort=True):
            row: dict[str, object] = {"dataset": dataset, "model": model, "label": label}
            runs = [run.sort_values("elapsed") for _, run in group.groupby("path")]
            row["runs"] = len(runs)
            mean_best = sum(best_of(run[metric], lower) for run in runs) / len(runs)
            row["best share"] = share_of(mean_best, reference, lower)
            # ``elapsed`` is cumulative, so its last value over the epoch count is the mean epoch.
            epochs_run = sum(run["epoch"].nunique() for run in runs)
            row["s per epoch"] = sum(run["elapsed"].iloc[-1] for run in runs) / epochs_run
            for fraction in fractions:
                firsts = [
                    run.loc[reached(run[metric], reference, fraction, lower), "elapsed"].min()
                    for run in runs
                ]
                times = [seconds for seconds in firsts if not pd.isna(seconds)]
                row[f"s to {fraction:g}"] = sum(times) / len(times) if times else float("nan")
                row[f"reached {fraction:g}"] = len(times)
            rows.append(row)
    return _frontier_first(pd.DataFrame(rows), fractions)


def _frontier_first(table: pd.DataFrame, fractions: Sequence[float]) -> pd.DataFrame:
    """``table`` ordered within each panel by seconds to the highest share, then the next
    highest..., never-reached last, then by best share (highest first)."""
    if table.empty:
        return table
    keys = [f"s to {fraction:g}" for fraction in sorted(fractions, reverse=True)]
    return table.sort_values(
        [*PANEL, *keys, "best share"],
        ascending=[True] * (len(PANEL) + len(keys)) + [False],
        na_position="last",
        kind="stable",
    ).reset_index(drop=True)


def to_markdown(table: pd.DataFrame, fractions: Sequence[float] = FRACTIONS) -> str:
    """The table in markdown: seconds to each share, ``(k/n runs)`` where not every run got
    there and ``-`` where none did, then the seconds per epoch.

    Example:
        ```python
        print(to_markdown(time_to_quality(epochs)))
        ```
    """
    header = [
        "dataset",
        "model",
        "run group",
        "runs",
        "best (share of exact)",
        *[f"seconds to {fraction:.0%}" for fraction in fractions],
        "seconds per epoch",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in table.iterrows():
        cells = [
            str(row["dataset"]),
            str(row["model"]),
            str(row["label"]),
            str(row["runs"]),
            f"{row['best share']:.1%}",
        ]
        for fraction in fractions:
            seconds, reached = row[f"s to {fraction:g}"], row[f"reached {fraction:g}"]
            cell = "-" if pd.isna(seconds) else f"{seconds:.0f}"
            if 0 < reached < row["runs"]:
                cell += f" ({reached}/{row['runs']} runs)"
            cells.append(cell)
        cells.append(f"{row['s per epoch']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
