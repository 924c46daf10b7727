"""Summarise runs: mean ± std over seeds of each group of runs that differ only in their seed,
and plots.

Reads every ``results.json`` below the given folders (e.g. a Hydra multirun directory), prints a
markdown table and writes it as ``summary.md`` and ``summary.csv`` together with three PNG plots
(see :mod:`recsys_midx.reports.summary_plots`) and, when the exact softmax is among the runs, the
time each group takes to reach 90/95/97% of its best (``time_to_quality.md``, see
:mod:`recsys_midx.reports.time_to_quality`) in the ``--plots`` folder (default: the first
folder). ``--csv FILE`` writes the CSV to another place as well.

Example:
    recsys-midx-summarize multirun/2026-11-22/10-00-00 --plots docs/results/ml-100k

(``python scripts/summarize.py ...`` in a clone of the repository does the same.)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from recsys_midx.app.auto_sampler import as_trained
from recsys_midx.reports import run_names
from recsys_midx.reports.summary_plots import epoch_rows, plot_all, with_labels
from recsys_midx.reports.sweeps import varying_settings
from recsys_midx.reports.time_to_quality import time_to_quality
from recsys_midx.reports.time_to_quality import to_markdown as time_to_quality_markdown

#: Table columns per task, keyed by the validation metric the task monitors (``task.monitor``):
#: that metric on the test split first, then its companions, then the metric itself.
METRICS = {
    "val/ndcg@10": ["test/ndcg@10", "test/hr@10", "test/mrr@10", "val/ndcg@10"],
    "val/p@1": ["test/p@1", "test/p@5", "test/psp@5", "val/p@1"],
}
#: The monitor of runs whose config predates ``task.monitor``.
DEFAULT_MONITOR = "val/ndcg@10"
#: Readable names of a run's setup; ``settings`` adds whatever else tells two groups apart.
NAMED = ["dataset", "model", "head", "sampler", "negatives"]
GROUP = [*NAMED, "settings"]


def load_runs(folders: list[Path]) -> pd.DataFrame:
    """One row per ``results.json``: its group keys, seed, metrics and timings.

    The group keys are the readable names of :data:`NAMED` and ``settings``: the config values
    that differ between runs of the same names other than the seed (``model.dim=16``), so runs
    are only ever averaged over seeds.
    """
    rows, configs, output_dirs = [], [], []
    for folder in folders:
        for path in sorted(folder.rglob("results.json")):
            result = json.loads(path.read_text())
            config = as_trained(result)
            configs.append(config)
            output_dirs.append(result.get("output_dir", str(path.parent)))
            monitor = config.get("task", {}).get("monitor", DEFAULT_MONITOR)
            rows.append(
                {
                    "dataset": config["dataset"]["name"],
                    "model": config["model"]["_target_"].rsplit(".", 1)[-1],
                    "head": _head_name(config),
                    "sampler": run_names.sampler_label(config, result),
                    "negatives": run_names.negatives_count(config),
                    "family": run_names.family(config),
                    "colour": run_names.colour(config),
                    "seed": config["seed"],
                    "monitor": monitor,
                    "test quality": result["metrics"].get(f"test/{monitor.removeprefix('val/')}"),
                    **{
                        name: result["metrics"].get(name)
                        for name in METRICS.get(monitor, [monitor])
                    },
                    "epochs": result["epochs_run"],
                    "best_epoch": result["best_epoch"],
                    "s/epoch": result["seconds_per_epoch"],
                    "train s": result["train_wall_seconds"],
                    "path": str(path.parent),
                }
            )
    if not rows:
        raise SystemExit(f"no results.json below {', '.join(map(str, folders))}")
    runs = pd.DataFrame(rows)
    runs["settings"] = _distinguishing_settings(runs, varying_settings(configs, output_dirs))
    return runs


def _distinguishing_settings(runs: pd.DataFrame, varying: list[dict]) -> list[str]:
    """Per run, ``key=value`` of each varying setting that the readable names leave open: one
    that takes several values among runs of the same names (a sweep over ``model.dim``). A run
    without the key (an older config) joins the runs that have it."""
    settings = pd.DataFrame(varying, index=runs.index)
    named = runs[NAMED].map(repr).agg("|".join, axis=1)
    open_keys = [
        key
        for key in settings.columns
        if (settings[key].map(repr, na_action="ignore").groupby(named).nunique() > 1).any()
    ]
    return [
        ", ".join(f"{key}={value}" for key, value in row.items() if _present(value))
        for _, row in settings[open_keys].iterrows()
    ]


def _present(value: object) -> bool:
    """Whether a setting is there (a list setting is a tuple, never missing)."""
    return not (value is None or (isinstance(value, float) and pd.isna(value)))


def _head_name(config: dict) -> str:
    """The output head (``dot`` for runs whose objective has none, or from before heads), and
    the objective when it is neither a softmax nor one naming the run (``dot, BCELoss``)."""
    loss = config.get("loss", {})
    # The head sits beside the encoder (task.module.head); older runs kept it in the loss.
    module = config.get("task", {}).get("module", {})
    head = (module.get("head") or loss.get("head") or {}).get("_target_", "DotHead")
    name = head.rsplit(".", 1)[-1].removesuffix("Head").lower()
    objective = loss.get("_target_", "").rsplit(".", 1)[-1]
    if objective.endswith("SoftmaxLoss") or not objective or run_names.objective_name(config):
        return name
    return f"{name}, {objective}"


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over the runs of each group, and its number of distinct
    seeds (``std`` is empty for a group of one run)."""
    numeric = [*_metrics(runs), "epochs", "s/epoch", "train s"]
    grouped = runs.fillna({"negatives": -1}).groupby(GROUP)
    table = grouped[numeric].agg(["mean", "std"])
    table.columns = [f"{name} {stat}" for name, stat in table.columns]
    table.insert(0, "seeds", grouped["seed"].nunique())
    return table.reset_index().replace({"negatives": {-1: None}})


def _metrics(runs: pd.DataFrame) -> list[str]:
    """The table's metric columns: those of each task among the runs, in order of appearance."""
    names = [METRICS.get(monitor, [monitor]) for monitor in runs["monitor"].unique()]
    return list(dict.fromkeys(name for group in names for name in group))


def to_markdown(table: pd.DataFrame) -> str:
    """The table in markdown; the ``settings`` column only when some group has settings, and
    no ``±`` for a group of one run."""
    keys = GROUP if (table["settings"] != "").any() else NAMED
    metrics = [
        column.removesuffix(" mean")
        for column in table.columns
        if column.startswith(("test/", "val/")) and column.endswith(" mean")
    ]
    header = [*keys, "seeds", *metrics, "epochs", "s/epoch"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in table.iterrows():
        cells = [_cell(row[key]) for key in keys]
        cells.append(str(row["seeds"]))
        for name in [*metrics, "epochs", "s/epoch"]:
            mean, std = row[f"{name} mean"], row[f"{name} std"]
            spread = "" if pd.isna(std) else f" ± {std:.4f}"
            cells.append(f"{mean:.4f}{spread}" if name in metrics else f"{mean:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None or value == "" or (isinstance(value, float) and pd.isna(value)):
        return "-"
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def write_report(folders: list[Path], out_dir: Path) -> dict[str, Path]:
    """Write ``summary.md``, ``summary.csv`` and the plots of the runs below ``folders``.

    Args:
        folders: folders searched (recursively) for ``results.json``.
        out_dir: where the files go (created if missing).

    Returns:
        The written files by kind: ``markdown``, ``csv``, then the plots (see
        :func:`recsys_midx.reports.summary_plots.plot_all`), then ``time_to_quality``
        (``time_to_quality.md``, see :mod:`recsys_midx.reports.time_to_quality`) when the
        runs include the exact softmax.

    Raises:
        SystemExit: if no ``results.json`` is found.
    """
    runs = load_runs(folders)
    table = summarize(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {"markdown": out_dir / "summary.md", "csv": out_dir / "summary.csv"}
    written["markdown"].write_text(to_markdown(table) + "\n")
    table.to_csv(written["csv"], index=False)
    labelled = with_labels(runs)
    epochs = epoch_rows(labelled)  # read once, for the plots and the time-to-quality table
    written.update(plot_all(labelled, epochs, out_dir))
    quality = time_to_quality(epochs)
    if not quality.empty:
        written["time_to_quality"] = out_dir / "time_to_quality.md"
        written["time_to_quality"].write_text(time_to_quality_markdown(quality) + "\n")
    return written


def main(argv: Sequence[str] | None = None) -> None:
    """The ``recsys-midx-summarize`` command: print and write the summary of some folders.

    Args:
        argv: the command-line arguments (default: ``sys.argv[1:]``).

    Example:
        ```python
        main(["multirun/2026-11-22/10-00-00", "--plots", "docs/results/ml-100k"])
        ```
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--csv", type=Path, help="also write the table as CSV to this file")
    parser.add_argument(
        "--plots",
        type=Path,
        help="folder for summary.md, summary.csv and the PNG plots (default: the first folder)",
    )
    args = parser.parse_args(argv)
    written = write_report(args.folders, args.plots or args.folders[0])
    print(written["markdown"].read_text(), end="")
    if "time_to_quality" in written:
        print(written["time_to_quality"].read_text(), end="")
    if args.csv:
        args.csv.write_bytes(written["csv"].read_bytes())
    for kind, path in written.items():
        print(f"{kind}: {path}")


if __name__ == "__main__":
    main()
