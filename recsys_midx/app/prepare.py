"""Prepare datasets, or show the statistics of prepared ones, without training.

    python -m recsys_midx.data prepare dataset=ml-1m
    python -m recsys_midx.data prepare dataset=ml-100k dataset.raw_dir=PATH preprocess=recbole
    python -m recsys_midx.data describe dataset=ml-1m
    python -m recsys_midx.data describe experiment=synthetic-1m   # with the generator's ceiling

Arguments after the command are Hydra overrides of the project's ``recsys_midx/conf/config.yaml``,
exactly as for ``recsys-midx-train`` (``train.py``), so a dataset prepared here is the one a
training run with the same overrides reuses.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from recsys_midx.data.errors import DataError
from recsys_midx.data.pipeline import cache_directory, load_stats
from recsys_midx.data.sources.base import Source
from recsys_midx.data.sources.synthetic import Synthetic

#: The project's Hydra configs (``recsys_midx/conf/``, shipped with the package).
CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides: Sequence[str], config_dir: Path = CONFIG_DIR) -> DictConfig:
    """Compose ``config.yaml`` with command-line overrides, as ``train.py`` does.

    Args:
        overrides: Hydra overrides, e.g. ``["dataset=ml-1m", "preprocess=recbole"]``.
        config_dir: the folder holding ``config.yaml``.

    Returns:
        The composed configuration.
    """
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def stats_table(name: str, directory: Path, stats: dict[str, Any]) -> Table:
    """A table of a prepared dataset's statistics.

    Args:
        name: the dataset's name.
        directory: its processed folder.
        stats: the content of its ``stats.json``.

    Returns:
        A ``rich`` table: sizes, density, sequence lengths, rows left after each step, settings.
    """
    table = Table(title=f"{name}  ({directory})", show_header=False, title_justify="left")
    table.add_column("statistic", style="bold")
    table.add_column("value", justify="right")
    for key in ("users", "items", "interactions"):
        table.add_row(key, f"{stats[key]:,}")
    table.add_row("density", f"{stats['density']:.4%}")
    lengths = stats["sequence_length"]
    table.add_row(
        "sequence length",
        f"min {lengths['min']:,}  median {lengths['p50']:,.0f}  mean {lengths['mean']:,.1f}  "
        f"p90 {lengths['p90']:,.0f}  max {lengths['max']:,}",
    )
    table.add_section()
    for step, rows in stats["rows_after_step"].items():
        table.add_row(f"rows after {step}", f"{rows:,}")
    table.add_row("k-core passes", str(stats["core_passes"]))
    table.add_section()
    for key, value in stats["settings"].items():
        table.add_row(f"preprocess.{key}", str(value))
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: ``["prepare" | "describe", *overrides]``; None reads ``sys.argv``.

    Returns:
        The exit status: 0 on success, 1 when the data cannot be prepared or is not prepared yet,
        2 on a configuration error (unknown dataset, bad override or setting).

    Example:
        ```python
        main(["describe", "dataset=ml-100k"])
        # 0
        ```
    """
    parser = argparse.ArgumentParser(
        prog="python -m recsys_midx.data",
        description="Prepare a dataset (download, preprocess, cache as Parquet) or describe a "
        "prepared one.",
    )
    parser.add_argument("command", choices=("prepare", "describe"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. dataset=ml-1m")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    console = Console()
    try:
        cfg = compose_config(args.overrides)
        source: Source = instantiate(cfg.dataset)
        data_dir = Path(cfg.paths.data_dir)
        if args.command == "prepare":
            dataset = source.prepare(data_dir)
            directory, stats = dataset.directory, dataset.stats
        else:
            directory = cache_directory(source, data_dir)
            if not directory.is_dir():
                console.print(
                    f"{source.name} is not prepared with these settings (no {directory}); run\n"
                    f"  python -m recsys_midx.data prepare {' '.join(args.overrides)}",
                    style="red",
                    highlight=False,
                    markup=False,
                )
                return 1
            stats = load_stats(directory)
    except (DataError, HydraException) as e:
        # Hydra wraps what a constructor raises; a data problem is reported as itself.
        cause = _data_error(e)
        console.print(f"error: {cause or e}", style="red", highlight=False, markup=False)
        return 1 if cause is not None else 2
    console.print(stats_table(source.name, directory, stats))
    if isinstance(source, Synthetic):
        ceiling = source.ceiling(10)
        console.print(
            f"ceiling (ranking by the generator's next-item probabilities, each user's last item, "
            f"history excluded): NDCG@10 {ceiling['ndcg@10']:.4f}, HR@10 {ceiling['hr@10']:.4f}",
            highlight=False,
            markup=False,
        )
    return 0


def _data_error(error: BaseException | None) -> DataError | None:
    """The DataError that ``error`` is or was caused by, if any."""
    while error is not None:
        if isinstance(error, DataError):
            return error
        error = error.__cause__
    return None


if __name__ == "__main__":
    sys.exit(main())
