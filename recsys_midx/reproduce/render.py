"""A table's markdown, rendered from its runs' CSV, and the block of a page that shows it.

Each row shows the mean ± standard deviation of every metric over its seeds, how many runs, and,
for the first metric, the difference to the reference row with its 95% interval (Welch's), read as
``better`` or ``worse`` only where the interval leaves out zero and as ``level`` otherwise. Runs
that the wall-time cap stopped are counted and marked. With the runs' validation curves (a spec
with ``validation``), a second table gives each row's minutes to 90, 95 and 97% of the best
validation value any run reached (the figure of the curves, drawn beside the spec, is linked by the
page). For perplexity lower is better: the verdicts turn round, and a share is reached at most
``1 / share`` times the best value. The block a page holds between ``<!-- reproduce: NAME -->`` and
``<!-- /reproduce: NAME -->`` carries the provenance marker, the caption (commits, dates,
machine, and the command that regenerates the table) and the table; :func:`update_page` writes
it, and the docs tests check that every page's block is what its CSV renders.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
from scipy import stats

from recsys_midx.reports.shares import best_of, lower_is_better, reached
from recsys_midx.reports.summary_plots import FRACTIONS
from recsys_midx.reproduce.spec import TableSpec

#: Confidence of the difference's interval.
CONFIDENCE = 0.95


def difference_interval(runs: pd.Series, reference: pd.Series) -> tuple[float, float, float]:
    """The difference of means ``runs - reference`` and its Welch interval at
    :data:`CONFIDENCE` (``nan`` bounds where either side has one run).

    Example:
        >>> runs, reference = pd.Series([0.20, 0.21, 0.22]), pd.Series([0.18, 0.19, 0.20])
        >>> mean, low, high = difference_interval(runs, reference)  # 3 seeds each: within noise
        >>> round(mean, 4), verdict(low, high)
        (0.02, 'level')
        >>> verdict(*difference_interval(runs, reference - 0.05)[1:])
        'better'
    """
    difference = float(runs.mean() - reference.mean())
    if len(runs) < 2 or len(reference) < 2:
        return difference, math.nan, math.nan
    a, b = runs.var(ddof=1) / len(runs), reference.var(ddof=1) / len(reference)
    if a + b == 0:
        return difference, difference, difference
    freedom = (a + b) ** 2 / (a**2 / (len(runs) - 1) + b**2 / (len(reference) - 1))
    half = float(stats.t.ppf((1 + CONFIDENCE) / 2, freedom)) * math.sqrt(a + b)
    return difference, difference - half, difference + half


def verdict(low: float, high: float, lower_is_better: bool = False) -> str:
    """``better`` or ``worse`` where the interval leaves out zero, ``level`` where it holds it,
    and nothing without an interval; a positive difference is better unless
    ``lower_is_better`` (perplexity).

    Example:
        >>> verdict(0.5, 1.5), verdict(0.5, 1.5, lower_is_better=True), verdict(-1.0, 1.0)
        ('better', 'worse', 'level')
    """
    if math.isnan(low):
        return ""
    if low > 0:
        return "worse" if lower_is_better else "better"
    if high < 0:
        return "better" if lower_is_better else "worse"
    return "level"


def render_table(spec: TableSpec, runs: pd.DataFrame) -> str:
    """The markdown table of ``runs`` (the spec's CSV), one line per row that has runs.

    Example:
        >>> from recsys_midx.reproduce.spec import parse_spec
        >>> spec = parse_spec("t", {"command": ["x=1"], "seeds": [0, 1], "code": ["y"],
        ...     "metrics": ["test/ndcg@10"], "rows": [{"name": "a", "overrides": ["z=2"]},
        ...     {"name": "b", "overrides": [], "reference": True}]})
        >>> runs = pd.DataFrame({"row": ["a", "a", "b", "b"], "test/ndcg@10": [.3, .3, .1, .1],
        ...     "minutes": [2.0, 2.0, 1.0, 1.0], "epochs": [5, 5, 4, 4],
        ...     "stopped_by": ["early stopping"] * 4})
        >>> print(render_table(spec, runs))
        | row | settings | runs | test/ndcg@10 | vs b (95% interval) | minutes | epochs |
        |---|---|---:|---:|---|---:|---:|
        | a | `z=2` | 2 | 0.3000 ± 0.0000 | +0.2000 [+0.2000, +0.2000] better | 2.0 | 5.0 |
        | b |  | 2 | 0.1000 ± 0.0000 | reference | 1.0 | 4.0 |

        A spec with a ``ceiling`` adds each row's share of it, after the metrics.
    """
    first = spec.metrics[0]
    reference = runs.loc[runs["row"] == spec.reference.name, first].astype(float)
    header = [
        "row",
        "settings",
        "runs",
        *spec.metrics,
        *([f"of the ceiling ({spec.ceiling:.4f})"] if spec.ceiling else []),
        f"vs {spec.reference.name} ({CONFIDENCE:.0%} interval)",
        "minutes",
        "epochs",
    ]
    shares = 1 if spec.ceiling else 0
    aligns = ["---", "---", "---:", *["---:"] * (len(spec.metrics) + shares), "---", "---:", "---:"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(aligns) + "|"]
    for row in spec.rows:
        own = runs[runs["row"] == row.name]
        if own.empty:
            continue
        capped = int((own["stopped_by"] == "max_time").sum())
        count = f"{len(own)}" + (f" ({capped} capped)" if capped else "")
        cells = [row.name, " ".join(f"`{word}`" for word in row.overrides), count]
        cells += [_mean_std(own[metric].astype(float)) for metric in spec.metrics]
        if spec.ceiling:
            cells.append(f"{own[first].astype(float).mean() / spec.ceiling:.1%}")
        if row.reference:
            cells.append("reference")
        elif reference.empty:
            cells.append("")
        else:
            mean, low, high = difference_interval(own[first].astype(float), reference)
            interval = "" if math.isnan(low) else f" [{low:+.4f}, {high:+.4f}]"
            judged = verdict(low, high, lower_is_better(first))
            cells.append(f"{mean:+.4f}{interval} {judged}".rstrip())
        cells += [f"{own['minutes'].mean():.1f}", f"{own['epochs'].mean():.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_times(spec: TableSpec, curves: pd.DataFrame) -> str:
    """Minutes each row's runs took to reach shares of the best validation value of any run.

    A cell is the mean over the runs that reached the share, with how many did of how many ran.

    Example:
        >>> from recsys_midx.reproduce.spec import parse_spec
        >>> spec = parse_spec("t", {"command": ["x=1"], "seeds": [0], "code": ["y"],
        ...     "metrics": ["test/ndcg@10"], "validation": "val/ndcg@10",
        ...     "rows": [{"name": "a"}, {"name": "b", "reference": True}]})
        >>> curves = pd.DataFrame({"row": ["a", "a", "b", "b"], "seed": 0,
        ...     "minutes": [1.0, 2.0, 3.0, 6.0], "value": [0.5, 0.96, 0.9, 1.0]})
        >>> print(render_times(spec, curves))
        | row | best val/ndcg@10 | minutes to 90% | minutes to 95% | minutes to 97% |
        |---|---:|---:|---:|---:|
        | a | 0.9600 | 2.0 (1/1) | 2.0 (1/1) | – (0/1) |
        | b | 1.0000 | 3.0 (1/1) | 6.0 (1/1) | 6.0 (1/1) |
    """
    lower = lower_is_better(str(spec.validation))
    best = best_of(curves["value"], lower)
    header = ["row", f"best {spec.validation}", *(f"minutes to {share:.0%}" for share in FRACTIONS)]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for row in spec.rows:
        own = curves[curves["row"] == row.name]
        if own.empty:
            continue
        runs = [run for _, run in own.groupby("seed", sort=True)]
        bests = [best_of(run["value"], lower) for run in runs]
        cells = [row.name, _mean_std(pd.Series(bests))]
        for share in FRACTIONS:
            first = [
                run.loc[reached(run["value"], best, share, lower), "minutes"].min() for run in runs
            ]
            times = pd.Series([minutes for minutes in first if not math.isnan(minutes)])
            mean = f"{times.mean():.1f}" if len(times) else "–"
            cells.append(f"{mean} ({len(times)}/{len(runs)})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean_std(values: pd.Series) -> str:
    if len(values) < 2:
        return f"{values.mean():.4f}"
    return f"{values.mean():.4f} ± {values.std(ddof=1):.4f}"


def render_block(
    spec: TableSpec, runs: pd.DataFrame, command: str, curves: pd.DataFrame | None = None
) -> str:
    """The page's block for the table: the provenance marker, the caption and the table; with
    ``curves``, the time table below it.

    Args:
        spec: the table.
        runs: its CSV.
        command: the command that regenerates it, as the caption names it.
        curves: its curves' CSV (a spec with ``validation``), or ``None``.
    """
    commits = list(dict.fromkeys(str(commit) for commit in runs["commit"].dropna()))
    dates = sorted({str(date) for date in runs["date"].dropna()})
    machines = sorted({str(machine) for machine in runs["machine"].dropna()})
    devices = sorted({str(device) for device in runs["device"].dropna()} - {"cpu"})
    torches = sorted({str(version) for version in runs["torch"].dropna()})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}" if dates else "?"
    where = "; ".join(machines) + (f", {'; '.join(devices)}" if devices else "")
    dirty = " with uncommitted changes" if runs["dirty"].fillna(False).astype(bool).any() else ""
    jobs = int(runs["jobs"].max())
    shared = f", {jobs} runs at a time" if jobs > 1 else ", one run at a time"
    caption = (
        f"*Measured at {', '.join(commits)}{dirty} ({when}) on {where}, torch "
        f"{', '.join(torches)}, {spec.threads} thread{'s' if spec.threads > 1 else ''} a run"
        f"{shared}; `{command}` regenerates it.*"
    )
    checked = f"; checked: {spec.checked}" if spec.checked else ""
    marker = f"<!-- measured: {' '.join(commits)}{checked}; code: {' '.join(spec.code)} -->"
    timed = ["", render_times(spec, curves)] if curves is not None and not curves.empty else []
    return "\n".join(
        [
            f"<!-- reproduce: {spec.name} -->",
            marker,
            "",
            caption,
            "",
            render_table(spec, runs),
            *timed,
            f"<!-- /reproduce: {spec.name} -->",
        ]
    )


def _block(name: str) -> re.Pattern[str]:
    start, end = re.escape(f"<!-- reproduce: {name} -->"), re.escape(f"<!-- /reproduce: {name} -->")
    return re.compile(f"{start}.*?{end}", re.DOTALL)


def page_block(text: str, name: str) -> str | None:
    """The block of table ``name`` in a page's text, or ``None``."""
    found = _block(name).search(text)
    return found.group(0) if found else None


def block_names(text: str) -> list[str]:
    """The tables whose blocks a page's text holds, in order."""
    return re.findall(r"<!-- reproduce: (\S+) -->", text)


def update_page(page: Path, block: str, name: str) -> bool:
    """Replace table ``name``'s block in ``page`` with ``block``; returns whether the page had
    one (a page without it is left as it is)."""
    text = page.read_text()
    if page_block(text, name) is None:
        return False
    page.write_text(_block(name).sub(lambda _: block, text, count=1))
    return True
