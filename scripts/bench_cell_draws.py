"""Time MIDX's two ways of drawing cells against each other and print a markdown table.

For each catalog (``--spreads``: cluster noise per dimension; 4.0 fills every cell, 0.5 leaves
most of a fine grid empty), number of codewords ``K`` and negatives ``M``: milliseconds per
``sample`` call of ``Q`` queries with ``cell_draw="table"`` and ``cell_draw="two_stage"`` (same
codebooks, same draws), their ratio, and the way ``cell_draw="auto"`` picks
(:func:`recsys_midx.samplers.cell_draws.two_stages_are_cheaper`). The rows where ``auto``
picks the slower way by more than 10% are flagged.

Example:
    python scripts/bench_cell_draws.py --threads 1
    python scripts/bench_cell_draws.py --codewords 64 --negatives 64 100 --spreads 4.0
"""

from __future__ import annotations

import argparse

import torch
from bench_samplers import make_catalog

from recsys_midx.analysis.timing import best_seconds
from recsys_midx.samplers.cell_draws import two_stages_are_cheaper
from recsys_midx.samplers.midx import MIDXSampler

_CPU = torch.device("cpu")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=1e5, help="catalog size N")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--queries", type=int, default=1024, help="Q, one query chunk")
    parser.add_argument("--codewords", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--negatives", type=int, nargs="+", default=[16, 32, 64, 100, 160, 256])
    parser.add_argument("--spreads", type=float, nargs="+", default=[4.0, 0.5])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="default: torch's default")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    num_items = int(args.size)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; N={num_items}, "
        f"D={args.dim}, Q={args.queries}; ms per sample() call\n"
    )
    print("| spread | K | cells | M | table ms | two stages ms | table / two stages | auto picks |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for spread in args.spreads:
        catalog = make_catalog(num_items, args.dim, args.queries, 1, 10.0, spread, args.seed)
        for num_codewords in args.codewords:
            # The cell draws alone: no exact top cells.
            table = MIDXSampler(
                num_items, 1, num_codewords=num_codewords, cell_draw="table", exact_top_codewords=0
            )
            table.update(catalog.items)
            two = MIDXSampler(
                num_items,
                1,
                num_codewords=num_codewords,
                cell_draw="two_stage",
                exact_top_codewords=0,
            )
            two.load_state_dict(table.state_dict())
            for num_samples in args.negatives:
                seconds = [
                    best_seconds(
                        lambda s=sampler, c=catalog, m=num_samples: s.sample(c.queries, m),
                        args.repeats,
                        _CPU,
                    )
                    for sampler in (table, two)
                ]
                ratio = seconds[0] / seconds[1]
                picks_two = two_stages_are_cheaper(num_codewords, num_samples, table.num_cells)
                slower = ratio > 1.1 if not picks_two else ratio < 1 / 1.1
                pick = ("two stages" if picks_two else "table") + (" (slower)" if slower else "")
                print(
                    f"| {spread} | {num_codewords} | {table.num_cells} | {num_samples} "
                    f"| {seconds[0] * 1e3:.1f} | {seconds[1] * 1e3:.1f} | {ratio:.2f} "
                    f"| {pick} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
