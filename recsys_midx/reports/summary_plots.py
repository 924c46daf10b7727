"""Plots of a sweep, drawn from the runs table of :mod:`recsys_midx.app.summarize` and
each run's ``epochs.csv``.

Three PNG files, one panel per (dataset, model). A panel's quality metric is the one its task
monitors (``task.monitor``: NDCG@10 for sequential recommendation, P@1 for extreme
classification):

* ``test_quality.png``: the metric on the test split per sampler, mean over seeds with a
  one-standard-deviation bar;
* ``val_quality_vs_time.png``: the validation metric of every run against the cumulative
  wall-clock seconds of its epochs (training plus validation, from ``epochs.csv``, on a log
  scale), one colour per sampler family, with lines at :data:`FRACTIONS` of the exact
  softmax's best (:func:`exact_best`) when the panel has it, and then from :data:`BELOW_EXACT`
  of it up;
* ``epoch_time.png``: training and validation seconds per epoch per sampler (stacked bars of the
  means over seeds, with a standard-deviation bar on the total).

Example:
    ```python
    runs = with_labels(summarize.load_runs([Path("multirun/2026-11-22/10-00-00")]))
    plot_all(runs, epoch_rows(runs), Path("docs/results/ml-100k"))["test_quality"]
    # PosixPath('docs/results/ml-100k/test_quality.png')
    ```
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

# Figures made without pyplot render to files only and leave the caller's backend alone.
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from recsys_midx.reports.shares import best_of, lower_is_better, threshold

PANEL = ["dataset", "model"]
#: A panel's width and height in inches, from its rows.
Size = Callable[[pd.DataFrame], tuple[float, float]]

#: Shares of the exact softmax's best validation metric that the curves and the
#: time-to-quality table mark.
FRACTIONS = (0.90, 0.95, 0.97)
#: Where the validation curves' axis starts when the exact softmax is among the runs, as a share
#: of its best: curves below it are cut off.
BELOW_EXACT = 0.7


def plot_all(runs: pd.DataFrame, epochs: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """Draw the three plots of the module docstring into ``out_dir``.

    Args:
        runs: one row per run, as returned by ``summarize.load_runs``, labelled by
            :func:`with_labels` (columns ``dataset``, ``model``, ``sampler``, ``label``,
            ``family`` and ``colour`` of the sampler, ``seed``, ``monitor``, ``test quality``,
            ``path``...).
        epochs: the runs' per-epoch rows, :func:`epoch_rows` of ``runs``.
        out_dir: an existing folder.

    Returns:
        ``{"test_quality": PATH, "val_quality_vs_time": PATH, "epoch_time": PATH}``.
    """
    metrics = _panel_metric(runs)
    plots: dict[str, tuple[Callable[[Axes, pd.DataFrame], None], pd.DataFrame, str, Size]] = {
        "test_quality": (
            _test_bars,
            runs,
            f"Test {metrics} per sampler (mean ± std over seeds)",
            _bars_size,
        ),
        "val_quality_vs_time": (
            _val_curves,
            epochs,
            f"Validation {metrics} against training time",
            _curves_size,
        ),
        "epoch_time": (
            _epoch_bars,
            epochs,
            "Seconds per epoch (mean ± std over seeds)",
            _bars_size,
        ),
    }
    written = {}
    for name, (draw, frame, title, size) in plots.items():
        figure = _panels(frame, draw, title, size)
        written[name] = out_dir / f"{name}.png"
        figure.savefig(written[name], dpi=110, bbox_inches="tight")
    return written


def with_labels(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with a ``label`` column: :func:`run_label` of each row."""
    return runs.assign(label=[run_label(row) for _, row in runs.iterrows()])


def run_label(row: pd.Series) -> str:
    """The sampler, with its negatives when it samples (``uniform (M=32)``), the head when it
    is not the plain dot product (``midx (M=32), plif``), and the settings that set the run's
    group apart (``uniform (M=32), model.dim=16``)."""
    negatives = row.get("negatives")
    label = row["sampler"]
    if negatives is not None and not pd.isna(negatives):
        label = f"{label} (M={int(negatives)})"
    head = row.get("head", "dot")
    label = label if head == "dot" else f"{label}, {head}"
    settings = row.get("settings") or ""
    return f"{label}, {settings}" if settings else label


def exact_best(
    panel: pd.DataFrame, metric: str = "quality", reference_sampler: str = "full"
) -> float | None:
    """The exact softmax's best validation metric in one panel's epoch rows.

    The best, over the groups of runs (``label``) of ``reference_sampler``, of the mean over
    the group's runs (``path``) of each run's best epoch; the smallest where the panel monitors
    a metric for which lower is better (perplexity, :func:`panel_lower`), else the largest.

    Args:
        panel: per-epoch rows of one (dataset, model), as :func:`epoch_rows` gives them.
        metric: the column of the validation metric.
        reference_sampler: the sampler whose best is the reference.

    Returns:
        The reference, or ``None`` when no run of ``reference_sampler`` is in ``panel``.

    Example:
        >>> exact_best(pd.DataFrame({"sampler": "full", "label": "full", "path": ["a", "a"],
        ...                          "quality": [0.5, 0.75]}))
        0.75
    """
    exact = panel[panel["sampler"] == reference_sampler]
    if exact.empty:
        return None
    lower = panel_lower(panel)
    per_run = exact.groupby(["label", "path"])[metric]
    return best_of((per_run.min() if lower else per_run.max()).groupby("label").mean(), lower)


def panel_lower(panel: pd.DataFrame) -> bool:
    """Whether the panel's runs monitor a metric for which lower is better (``monitor``
    column; a panel without it monitors a ranking metric)."""
    monitors = panel["monitor"].unique() if "monitor" in panel else []
    return any(lower_is_better(str(monitor)) for monitor in monitors)


def epoch_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run's ``epochs.csv`` rows with its panel keys, sampler (name, family and colour),
    label, seed, monitored metric (``monitor``) and its value (``quality``), and cumulative
    seconds (``elapsed``: training plus validation).

    A run without ``epochs.csv`` contributes nothing (its results still enter the table).

    Args:
        runs: one row per run, as returned by ``summarize.load_runs``, labelled by
            :func:`with_labels`.
    """
    frames = []
    for _, run in runs.iterrows():
        path = Path(run["path"]) / "epochs.csv"
        if not path.exists():
            continue
        epochs = pd.read_csv(path)
        epochs["elapsed"] = (epochs["train_seconds"] + epochs["val_seconds"]).cumsum()
        epochs["quality"] = epochs[run["monitor"]]
        for key in [*PANEL, "sampler", "family", "colour", "label", "seed", "path", "monitor"]:
            epochs[key] = run[key]
        frames.append(epochs)
    columns = [
        *PANEL,
        "sampler",
        "family",
        "colour",
        "label",
        "seed",
        "path",
        "monitor",
        "epoch",
        "elapsed",
        "train_seconds",
        "val_seconds",
        "quality",
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _panels(
    frame: pd.DataFrame, draw: Callable[[Axes, pd.DataFrame], None], title: str, size: Size
) -> Figure:
    """One subplot per (dataset, model) of ``frame``, each drawn by ``draw``, each ``size(frame)``
    inches."""
    groups = list(frame.groupby(PANEL, sort=True)) if len(frame) else []
    width, height = size(frame)
    figure = Figure(figsize=(width * max(len(groups), 1), height))
    axes = figure.subplots(1, max(len(groups), 1), squeeze=False)
    for ax, ((dataset, model), panel) in zip(axes[0], groups):
        draw(ax, panel)
        ax.set_title(f"{dataset}, {model}")
        ax.grid(alpha=0.3)
    if not groups:
        axes[0, 0].text(0.5, 0.5, "no data", ha="center", va="center")
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def _bars_size(frame: pd.DataFrame) -> tuple[float, float]:
    """A bar panel's inches: wide enough for every bar and its value label once samplers are
    crossed with heads, taller with longer (slanted) bar labels, which would otherwise squeeze
    the axes until the value labels run into the title."""
    bars, longest = _label_extent(frame)
    return max(6.5, 0.8 * bars + 2.0), 3.0 + max(1.5, 0.06 * longest)


def _curves_size(frame: pd.DataFrame) -> tuple[float, float]:
    """A curve panel's inches: axes of a fixed size and the legend beside them, one line per
    label."""
    labels, longest = _label_extent(frame)
    return 7.5 + 0.07 * longest, max(5.0, 0.19 * labels + 1.0)


def _label_extent(frame: pd.DataFrame) -> tuple[int, int]:
    """How many distinct labels ``frame`` has, and the length of the longest (0 and 0 if empty)."""
    if not len(frame):
        return 0, 0
    return frame["label"].nunique(), int(frame["label"].str.len().max())


def _test_bars(ax: Axes, runs: pd.DataFrame) -> None:
    stats = runs.groupby("label")["test quality"].agg(["mean", "std"])
    stats["seeds"] = runs.groupby("label")["seed"].nunique()
    ax.bar(
        stats.index,
        stats["mean"],
        yerr=stats["std"].fillna(0.0),
        capsize=4,
        color=[_colours(runs)[label] for label in stats.index],
    )
    for x, (_, row) in enumerate(stats.iterrows()):
        ax.annotate(
            f"{row['mean']:.4f}\n({int(row['seeds'])} seeds)",
            (x, row["mean"]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=8,
        )
    # Headroom above the tallest error bar for the value labels.
    ax.set_ylim(0, float((stats["mean"] + stats["std"].fillna(0.0)).max()) * 1.25)
    ax.set_ylabel(f"test {_panel_metric(runs)} (best checkpoint)")
    _slant_labels(ax)


def _val_curves(ax: Axes, epochs: pd.DataFrame) -> None:
    styles, colours = _variant_styles(epochs), _colours(epochs)
    seen: set[str] = set()
    for (label, _), run in epochs.groupby(["label", "path"], sort=True):
        linestyle, marker = styles[label]
        run = run.dropna(subset=["quality"])  # rows of an epoch that ended without validation
        ax.plot(
            run["elapsed"],
            run["quality"],
            marker=marker,
            markersize=3,
            linestyle=linestyle,
            color=colours[label],
            label=None if label in seen else label,
        )
        seen.add(label)
    reference = exact_best(epochs)
    if reference is not None:
        lower = panel_lower(epochs)
        for fraction in FRACTIONS:
            bound = threshold(reference, fraction, lower)
            ax.axhline(bound, color="grey", linewidth=0.8, linestyle=":")
            ax.annotate(
                f"{fraction:.0%} of exact",
                (1.0, bound),
                xycoords=("axes fraction", "data"),
                xytext=(-4, 2),
                textcoords="offset points",
                ha="right",
                fontsize=7,
                color="grey",
            )
        # The race to the shares above is what the plot is for: the first epochs of every run,
        # and runs that never come near, would squeeze it into the top of the axes.
        if lower:
            ax.set_ylim(top=threshold(reference, BELOW_EXACT, lower))
        else:
            ax.set_ylim(bottom=BELOW_EXACT * reference)
    # Samplers' epochs differ by two orders of magnitude; a linear axis hides the fast ones.
    ax.set_xscale("log")
    ax.set_xlabel("wall-clock seconds (training + validation, cumulative; log scale)")
    ax.set_ylabel(f"validation {_panel_metric(epochs)}")
    # Beside the axes: a legend of long labels inside them would hide the curves.
    ax.legend(
        title="sampler (one line per seed)",
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )


def _epoch_bars(ax: Axes, epochs: pd.DataFrame) -> None:
    # A run validating inside its epochs has several rows an epoch: sum them first.
    per_epoch = epochs.groupby(["label", "path", "epoch"])[["train_seconds", "val_seconds"]].sum()
    per_run = per_epoch.groupby(["label", "path"]).mean()
    per_run["total"] = per_run.sum(axis=1)
    stats = per_run.groupby("label").agg(["mean", "std"])
    labels = list(stats.index)
    train, val = stats[("train_seconds", "mean")], stats[("val_seconds", "mean")]
    ax.bar(
        labels,
        train,
        color=[_colours(epochs)[label] for label in labels],
        label="training (sampler colour)",
    )
    ax.bar(
        labels,
        val,
        bottom=train,
        color="lightgrey",
        label="validation",
        yerr=stats[("total", "std")].fillna(0.0),
        capsize=4,
    )
    ax.set_ylabel("seconds per epoch")
    _slant_labels(ax)
    ax.legend(fontsize=8)


def _metric_name(monitor: str) -> str:
    """``val/ndcg@10`` -> ``NDCG@10``."""
    return monitor.removeprefix("val/").upper()


def _panel_metric(frame: pd.DataFrame) -> str:
    """The readable name of the metric a panel's runs monitor."""
    return ", ".join(_metric_name(monitor) for monitor in sorted(frame["monitor"].unique()))


def _slant_labels(ax: Axes) -> None:
    """Sampler (and head) names under the bars, slanted and right-aligned to their bars."""
    ax.set_xlabel("sampler, head")
    for label in ax.get_xticklabels():
        label.set(rotation=35, ha="right", rotation_mode="anchor")


def _colours(frame: pd.DataFrame) -> dict[str, str]:
    """Each label's colour, its sampler family's (the ``colour`` column), so the three plots
    agree."""
    return dict(zip(frame["label"], frame["colour"], strict=True))


def _variant_styles(frame: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """Line style and marker per label: the variants of one family (the ``family`` column)
    share its colour, so the curves tell them apart by style (first variant in label order
    solid with dots, then dashed, dotted...; the ninth repeats the first)."""
    styles = [
        ("-", "o"),
        ("--", "s"),
        (":", "^"),
        ("-.", "D"),
        ("-", "v"),
        ("--", "P"),
        (":", "x"),
        ("-.", "*"),
    ]
    families = dict(zip(frame["label"], frame["family"], strict=True))
    seen_in_family: dict[str, int] = {}
    out = {}
    for label in sorted(families):
        index = seen_in_family.get(families[label], 0)
        seen_in_family[families[label]] = index + 1
        out[label] = styles[index % len(styles)]
    return out
