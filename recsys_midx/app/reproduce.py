"""The ``recsys-midx-reproduce`` command: run a published table's spec and render the table.

It trains the spec's runs that are missing (a run killed part way continues from its last
checkpoint; a run whose ``results.json`` holds today's config is skipped, one whose
``results.json`` holds another is set aside and trained again from scratch), collects every run
into the CSV beside the spec, and renders the table from that CSV into each page that shows it
(:mod:`recsys_midx.reproduce`). It collects and renders again each time a run finishes, so a
spec stopped part way leaves its finished rows in the CSV and on the pages. With
``--keep-recorded``, a run whose folder holds no results but which the CSV already records (its
row's name and seed) keeps that row and its curve instead of training again: a table gains seeds or
rows on a machine that no longer has the runs it was measured from, the table's ``checked:``
vouching that the code they ran is today's (a row whose overrides change takes a new name). A
spec that is malformed, or a run the pre-flight would refuse, stops it with one ``error: ...``
line before anything runs.

Example:
    recsys-midx-reproduce docs/results/tables/ml-1m-mission.yaml --jobs 1
    recsys-midx-reproduce docs/results/tables/ml-1m-mission.yaml --dry-run
    recsys-midx-reproduce docs/results/tables/ml-1m-mission.yaml --keep-recorded
    recsys-midx-reproduce docs/results/tables/ml-1m-mission.yaml --render
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_module
from hydra.errors import HydraException

from recsys_midx.app import preflight
from recsys_midx.errors import ConfigError
from recsys_midx.reproduce.collect import (
    Recorded,
    collect,
    collect_curves,
    curves_path,
    read_curves,
    read_runs,
)
from recsys_midx.reproduce.figure import plot_curves
from recsys_midx.reproduce.render import render_block, update_page
from recsys_midx.reproduce.runs import PlannedRun, execute, plan, status
from recsys_midx.reproduce.spec import TableSpec, load_spec

#: The pages whose blocks show the tables, looked for in the working directory: the docs pages
#: hold every table once, README.md the ones its first screen shows.
PAGES = ("README.md", "docs/results.md", "docs/results-lm.md", "docs/benchmarks.md")


def main(argv: Sequence[str] | None = None) -> int:
    """Run, collect and render a table spec (see the module docstring).

    Args:
        argv: the command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0, or 1 after an ``error:`` line or a failed run.
    """
    args = _parser().parse_args(argv)
    try:
        spec = load_spec(args.spec)
        csv = args.csv or Path(args.spec).with_suffix(".csv")
        runs = plan(spec, args.out, args.data_dir)
        if args.render:
            return _render(spec, read_runs(csv), read_curves(spec, csv), args)
        _check_runs(spec, runs)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    states: dict[PlannedRun, str] = {run: status(run) for run in runs}
    recorded = _recorded(spec, csv, runs, states) if args.keep_recorded else None
    if args.dry_run:
        for run in runs:
            print(f"# {run.label}: {states[run]}\n{run.shell()}")
        return 0
    todo = [run for run in runs if states[run] not in ("complete", "recorded")]
    kept = f" ({len(recorded.runs)} kept from {csv})" if recorded is not None else ""
    print(
        f"{spec.name}: {len(runs) - len(todo)} of {len(runs)} runs complete{kept}, "
        f"{len(todo)} to run"
    )

    def publish(echo: bool) -> None:
        frame = collect(spec, runs, csv, recorded)
        curves = collect_curves(spec, runs, curves_path(csv), recorded) if spec.validation else None
        _render(spec, frame, curves, args, echo)

    failed = execute(todo, spec.device, args.jobs, finished=lambda _: publish(echo=False))
    print(f"runs: {csv}")
    publish(echo=True)
    return 1 if failed else 0


def _render(
    spec: TableSpec,
    runs: pd.DataFrame,
    curves: pd.DataFrame | None,
    args: argparse.Namespace,
    echo: bool = True,
) -> int:
    """Write the table's block into the pages that show it and draw its figure; with ``echo``,
    print the block and where it went."""
    block = render_block(spec, runs, f"recsys-midx-reproduce {args.spec}", curves)
    report = print if echo else lambda _: None
    report(block)
    if curves is not None and not curves.empty:
        report(f"figure: {plot_curves(spec, curves, Path(args.spec).with_suffix('.png'))}")
    for page in PAGES:
        if Path(page).is_file() and update_page(Path(page), block, spec.name):
            report(f"rendered into {page}")
    return 0


def _recorded(
    spec: TableSpec, csv: Path, runs: list[PlannedRun], states: dict[PlannedRun, str]
) -> Recorded | None:
    """What ``csv`` records of the runs with nothing in their folders, each marked ``recorded``
    in ``states``; ``None`` without a CSV. A run with a checkpoint or results trains or is
    collected from its folder as ever."""
    if not csv.is_file():
        return None
    everything = Recorded(read_runs(csv), read_curves(spec, csv))
    kept = [run for run in runs if states[run] == "missing" and everything.holds(run)]
    for run in kept:
        states[run] = "recorded"
    return everything.only(kept)


def _check_runs(spec: TableSpec, runs: list[PlannedRun]) -> None:
    """Compose every run's config and run the pre-flight on it, before anything trains.

    Raises:
        ConfigError: naming the row and what the pre-flight or Hydra refused.
    """
    checked: set[str] = set()
    with initialize_config_module("recsys_midx.conf", version_base="1.3"):
        for run in runs:
            if run.row.name in checked:
                continue
            try:
                preflight.check(compose("config", overrides=run.config_overrides))
            except (ConfigError, HydraException) as error:
                problem = " ".join(str(error).split())
                raise ConfigError(f"{spec.name}: rows: {run.row.name}: {problem}") from None
            checked.add(run.row.name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("spec", type=Path, help="the table's spec (a YAML file)")
    parser.add_argument(
        "--out", type=Path, default=Path("outputs/reproduce"), help="where the runs go"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path("../shared/data"),
        help="the benchmark data folder the spec's {data} stands for",
    )
    parser.add_argument("--csv", type=Path, help="the runs' CSV (default: beside the spec)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print each run's command and state, run nothing"
    )
    parser.add_argument(
        "--keep-recorded",
        action="store_true",
        help="keep the CSV's rows of runs whose folders are empty instead of training them",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="render the table from its CSV into the pages, without running anything",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
