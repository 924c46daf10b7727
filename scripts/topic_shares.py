"""Negatives and rankings of trained synthetic runs, against the generator's topics.

Each argument is a run folder written by ``train.py`` on ``dataset=synthetic`` (an experiment
such as ``experiment=synthetic-1m`` included). Every run is rebuilt with its best checkpoint, its
sampler rebuilt from the trained item table, and measured by
:func:`recsys_midx.analysis.topic_shares`: the share of its training negatives in the target's
topic, and how its ranking of validation users splits into finding the topic and ordering the
items inside it. One markdown table is printed and one CSV row per run written.

Example:
    python scripts/topic_shares.py outputs/reproduce/synthetic-1m-frontier/*/seed-0 \\
        --out reports/topic_shares.csv
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
from pathlib import Path

from recsys_midx import load_run
from recsys_midx.analysis import TopicShares, topic_shares


def markdown_table(rows: list[TopicShares]) -> str:
    """The measurements as a markdown table, one row per run."""
    lines = [
        "| run | negatives a query | of them in the target's topic | top 10 in the target's topic "
        "| NDCG@10 | NDCG@10 within the topic |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        # The exact softmax draws nothing: it has no share to give.
        in_topic = "–" if math.isnan(row.negatives_in_topic) else f"{row.negatives_in_topic:.2%}"
        lines.append(
            f"| {row.label} | {row.negatives_per_query:.0f} | {in_topic} "
            f"| {row.top_in_topic:.1%} | {row.ndcg:.4f} | {row.ndcg_within_topic:.4f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[TopicShares]:
    """Parse arguments, measure every run, print the table and write the CSV; returns the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of train.py")
    parser.add_argument("--out", type=Path, default=Path("reports/topic_shares.csv"))
    parser.add_argument(
        "--labels", nargs="*", default=None, help="one name per run (default: the folder's name)"
    )
    parser.add_argument("--batches", type=int, default=8, help="training batches drawn for")
    parser.add_argument("--users", type=int, default=2048, help="validation users ranked")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="dataset folder, if not the one the runs' configs name",
    )
    args = parser.parse_args(argv)
    if args.labels and len(args.labels) != len(args.runs):
        parser.error(f"--labels needs one name per run ({len(args.runs)}), got {len(args.labels)}")
    labels = args.labels or [None] * len(args.runs)
    rows = []
    for run_dir, label in zip(args.runs, labels):
        run = load_run(run_dir, args.data_dir)
        label = label or (run_dir.parent.name if run_dir.name.startswith("seed-") else None)
        rows.append(topic_shares(run, args.batches, args.users, label=label))
        print(f"measured {rows[-1].label}", flush=True)
    print(markdown_table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, [field.name for field in dataclasses.fields(TopicShares)])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(row) for row in rows)
    print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
