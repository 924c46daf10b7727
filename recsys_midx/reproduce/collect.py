"""A table's runs as one CSV: a row per run, with where it ran and every metric it shows.

The CSV is what the page's table is rendered from (:mod:`recsys_midx.reproduce.render`) and is
committed beside the spec, so the table can be checked, and rendered again, without the runs.
A spec with ``validation`` also gets its runs' curves, one line per epoch, in a second CSV
beside the first (:func:`curves_path`). Collecting with the rows a CSV already records
(:class:`Recorded`) keeps them for the runs whose folders hold no results: a table gains seeds or
rows on a machine that no longer has the runs it was first measured from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from recsys_midx.reproduce.runs import ENVIRONMENT_FILE, EPOCHS_FILE, RESULTS_FILE, PlannedRun
from recsys_midx.reproduce.spec import TableSpec

#: The columns before the metrics, in order.
COLUMNS = (
    "row",
    "seed",
    "commit",
    "dirty",
    "date",
    "machine",
    "device",
    "threads",
    "jobs",
    "torch",
    "minutes",
    "epochs",
    "best_epoch",
    "stopped_by",
)


def run_row(spec: TableSpec, run: PlannedRun) -> dict[str, Any]:
    """One complete run as a CSV row: its row and seed, where it ran, how long, what stopped it
    and the spec's metrics.

    Raises:
        FileNotFoundError: the run has no ``results.json``.
    """
    results = json.loads((run.folder / RESULTS_FILE).read_text())
    where_file = run.folder / ENVIRONMENT_FILE
    where = json.loads(where_file.read_text()) if where_file.is_file() else {}
    return {
        "row": run.row.name,
        "seed": run.seed,
        "commit": where.get("commit"),
        "dirty": where.get("dirty"),
        "date": where.get("date"),
        "machine": where.get("machine"),
        "device": where.get("device"),
        "threads": spec.threads,
        "jobs": where.get("jobs", 1),
        "torch": where.get("torch"),
        "minutes": results["train_wall_seconds"] / 60,
        "epochs": results["epochs_run"],
        "best_epoch": results["best_epoch"],
        "stopped_by": results.get("stopped_by"),
        **{metric: results["metrics"].get(metric) for metric in spec.metrics},
    }


def read_runs(path: Path) -> pd.DataFrame:
    """A table's CSV as :func:`collect` wrote it: commits stay text (``327e972`` is not a number).

    Example:
        >>> import io
        >>> read_runs(io.StringIO("row,seed,commit\\nmidx,0,327e972\\n"))["commit"].tolist()
        ['327e972']
    """
    return pd.read_csv(path, dtype={"commit": str, "date": str, "machine": str, "device": str})


@dataclass(frozen=True)
class Recorded:
    """The runs a table's CSV (and its curves' CSV) already records, by row name and seed.

    Attributes:
        runs: the CSV's rows, as :func:`read_runs` reads them.
        curves: the curves' rows, as :func:`read_curves` reads them; ``None`` without.
    """

    runs: pd.DataFrame
    curves: pd.DataFrame | None = None

    def holds(self, run: PlannedRun) -> bool:
        """Whether the CSV has a row for ``run`` (its row's name and its seed)."""
        return bool(((self.runs["row"] == run.row.name) & (self.runs["seed"] == run.seed)).any())

    def only(self, runs: list[PlannedRun]) -> Recorded:
        """The recorded rows and curves of ``runs`` alone."""
        keys = {(run.row.name, run.seed) for run in runs}

        def kept(frame: pd.DataFrame) -> pd.DataFrame:
            mask = [key in keys for key in zip(frame["row"], frame["seed"])]
            return frame[mask].reset_index(drop=True)

        return Recorded(kept(self.runs), None if self.curves is None else kept(self.curves))


def collect(
    spec: TableSpec, runs: list[PlannedRun], path: Path, recorded: Recorded | None = None
) -> pd.DataFrame:
    """Write the CSV of ``runs`` (the complete ones, and those ``recorded`` holds) to ``path``,
    in the spec's row order.

    Args:
        spec: the table.
        runs: its planned runs.
        path: the CSV to write.
        recorded: rows kept as an earlier CSV recorded them, for runs whose folders hold no
            results; a run whose folder holds results is collected from it.

    Returns:
        The frame written.
    """
    rows = [run_row(spec, run) for run in runs if (run.folder / RESULTS_FILE).is_file()]
    frame = pd.DataFrame(rows, columns=[*COLUMNS, *spec.metrics])
    if recorded is not None:
        frame = _with_recorded(frame, recorded.runs, runs)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return frame


def curves_path(runs_csv: Path) -> Path:
    """Where the curves of the table whose runs are in ``runs_csv`` go: ``NAME.curves.csv``."""
    return runs_csv.with_name(f"{runs_csv.stem}.curves.csv")


def read_curves(spec: TableSpec, runs_csv: Path) -> pd.DataFrame | None:
    """The curves :func:`collect_curves` wrote beside ``runs_csv``; ``None`` for a spec
    without ``validation`` or before any were collected."""
    path = curves_path(runs_csv)
    return pd.read_csv(path) if spec.validation and path.is_file() else None


def run_curve(spec: TableSpec, run: PlannedRun) -> pd.DataFrame:
    """One run's curve: per validation, the minutes since it started (training plus validation)
    and the spec's ``validation`` metric (rows of ``epochs.csv`` without a validation only add
    their time)."""
    epochs = pd.read_csv(run.folder / EPOCHS_FILE)
    seconds = (epochs["train_seconds"] + epochs["val_seconds"].fillna(0.0)).cumsum()
    curve = pd.DataFrame(
        {
            "row": run.row.name,
            "seed": run.seed,
            "epoch": epochs["epoch"].astype(int),
            "minutes": seconds / 60,
            "value": epochs[spec.validation],
        }
    )
    return curve.dropna(subset=["value"]).reset_index(drop=True)


def collect_curves(
    spec: TableSpec, runs: list[PlannedRun], path: Path, recorded: Recorded | None = None
) -> pd.DataFrame:
    """Write the curves of ``runs`` (the complete ones, and those ``recorded`` holds) to
    ``path``, in the spec's row order (``recorded`` as for :func:`collect`).

    Returns:
        The frame written.
    """
    complete = [run for run in runs if (run.folder / RESULTS_FILE).is_file()]
    columns = ["row", "seed", "epoch", "minutes", "value"]
    frame = pd.concat([run_curve(spec, run) for run in complete] or [pd.DataFrame(columns=columns)])
    if recorded is not None and recorded.curves is not None:
        frame = _with_recorded(frame, recorded.curves, runs)
    frame.to_csv(path, index=False)
    return frame


def _with_recorded(
    collected: pd.DataFrame, recorded: pd.DataFrame, runs: list[PlannedRun]
) -> pd.DataFrame:
    """``collected`` with the ``recorded`` rows of the planned runs it lacks, in the order of
    ``runs`` (a run's own rows keep theirs: a curve's epochs)."""
    order = {(run.row.name, run.seed): position for position, run in enumerate(runs)}
    have = set(zip(collected["row"], collected["seed"]))
    keys = zip(recorded["row"], recorded["seed"])
    missing = recorded[[key in order and key not in have for key in keys]]
    parts = [part for part in (collected, missing) if not part.empty]
    frame = pd.concat(parts, ignore_index=True) if parts else collected
    place = [order[key] for key in zip(frame["row"], frame["seed"])]
    return (
        frame.assign(_place=place)
        .sort_values("_place", kind="stable")
        .drop(columns="_place")
        .reset_index(drop=True)
    )
