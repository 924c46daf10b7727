"""Softmax-bottleneck report of trained runs: spectra of log-probabilities and head Jacobians.

Each argument is a run folder written by ``train.py`` (``.hydra/config.yaml`` and
``checkpoints/``); every run is rebuilt, its best checkpoint loaded, and its spectra computed on
validation contexts and a uniform sample of items (see :mod:`recsys_midx.analysis`). All runs
go into one CSV and one plot, so heads can be compared side by side.

Example:
    python scripts/bottleneck_report.py outputs/dot outputs/plif outputs/mos --out reports/heads
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recsys_midx import load_run
from recsys_midx.analysis import bottleneck_spectra
from recsys_midx.analysis.report import write_report


def main(argv: list[str] | None = None) -> dict[str, Path]:
    """Parse arguments, compute every run's spectra and write the report; returns its paths."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of train.py")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("reports/bottleneck"),
        help="folder for bottleneck_spectra.csv and bottleneck_spectra.png",
    )
    parser.add_argument(
        "--labels",
        nargs="*",
        default=None,
        help="one name per run for the legend (default: head and folder name)",
    )
    parser.add_argument("--contexts", type=int, default=256, help="validation contexts")
    parser.add_argument("--items", type=int, default=512, help="items sampled from the catalog")
    parser.add_argument("--jacobian-contexts", type=int, default=64)
    parser.add_argument(
        "--jacobian-items",
        type=int,
        default=128,
        help="items per Jacobian (one backward pass over the catalog each)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="dataset folder, if not the one the runs' configs name",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the item sample")
    args = parser.parse_args(argv)
    if args.labels and len(args.labels) != len(args.runs):
        parser.error(f"--labels needs one name per run ({len(args.runs)}), got {len(args.labels)}")
    labels = args.labels or [None] * len(args.runs)
    spectra = []
    for run_dir, label in zip(args.runs, labels):
        entry = bottleneck_spectra(
            load_run(run_dir, args.data_dir),
            num_contexts=args.contexts,
            num_items=args.items,
            jacobian_contexts=args.jacobian_contexts,
            jacobian_items=args.jacobian_items,
            seed=args.seed,
            label=label,
        )
        print(
            f"{entry.label}: D={entry.dim}, centred log-prob rank {entry.log_prob_rank} "
            f"of {len(entry.log_prob)}"
        )
        spectra.append(entry)
    paths = write_report(spectra, args.out)
    print(f"wrote {paths['csv']} and {paths['plot']}")
    return paths


if __name__ == "__main__":
    main()
