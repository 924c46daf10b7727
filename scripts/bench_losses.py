"""Forward plus backward seconds of the sampled objectives at one batch's shape, against another
checkout's in the same process.

Each case builds queries, a catalog and uniform candidates with a fixed seed and times one
forward and backward of the loss function (the median of ``--repeats``), alternating between
this checkout and ``--baseline`` (another checkout's root, e.g. a ``git worktree`` of an older
commit) so both see the same machine load; the ratio is the baseline's time over this one's.
The losses get the same inputs, so their values are printed too: they agree to float rounding
when only the computation changed.

Cases are ``OBJECTIVE:M:D``: ``softmax`` (sampled softmax, ``M`` negatives per query, logQ
correction), ``bce`` (binary cross-entropy, ``M`` negatives per query; gBCE is the same
computation with another positive weight) and ``window`` (``M`` negatives per sequence shared by
its positions, as ``negatives=outside_window`` draws them).

Example:
    git worktree add /tmp/base HEAD~3
    OMP_NUM_THREADS=1 python scripts/bench_losses.py --baseline /tmp/base \\
        --cases softmax:100:64 bce:256:128 bce:1:64 window:3000:64
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_losses(root: Path) -> ModuleType:
    """``recsys_midx.losses`` of the checkout at ``root``, imported afresh."""
    for name in [name for name in sys.modules if name.split(".")[0] == "recsys_midx"]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module("recsys_midx.losses")
    finally:
        sys.path.remove(str(root))


def make_case(
    objective: str, negatives: int, dim: int, args: argparse.Namespace
) -> Callable[[ModuleType], float]:
    """A closure that runs one forward and backward of ``objective`` with a checkout's losses
    and returns the loss value."""
    generator = torch.Generator().manual_seed(args.seed)
    num_items, batch, length = args.items, args.batch_size, args.max_len
    # Left-padded windows of random lengths, as a batch of users' last windows.
    lengths = torch.randint(length // 10, length + 1, (batch,), generator=generator)
    positions = torch.arange(length)[None, :] >= (length - lengths)[:, None]
    queries = int(positions.sum())
    table = torch.randn(num_items + 1, dim, generator=generator) * 0.1
    query = torch.randn(queries, dim, generator=generator)
    targets = torch.randint(1, num_items + 1, (queries,), generator=generator)
    rows = batch if objective == "window" else queries
    neg_ids = torch.randint(1, num_items + 1, (rows, negatives), generator=generator)
    log_q = torch.full((queries, negatives), -float(torch.log(torch.tensor(num_items))))

    def run(losses: ModuleType) -> float:
        item_emb, q = table.clone().requires_grad_(True), query.clone().requires_grad_(True)
        if objective == "softmax":
            loss = losses.sampled_softmax_loss(q, item_emb, targets, neg_ids, log_q, log_q[:, 0])
        elif objective == "bce":
            loss = losses.binary_cross_entropy_loss(q, item_emb, targets, neg_ids)
        elif objective == "window":
            loss = losses.window_softmax_loss(q, item_emb, targets, positions, neg_ids)
        else:
            raise SystemExit(f"unknown objective {objective!r}: softmax, bce or window")
        loss = loss.mean()
        loss.backward()
        return loss.item()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=["softmax:100:64", "bce:256:128"])
    parser.add_argument("--baseline", type=Path, help="another checkout's root to compare with")
    parser.add_argument("--items", type=int, default=3416)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    checkouts = {"this": load_losses(ROOT)}
    if args.baseline is not None:
        checkouts["baseline"] = load_losses(args.baseline.resolve())
    threads = torch.get_num_threads()
    print(f"N={args.items}, batch {args.batch_size} x {args.max_len}, {threads} thread(s)")
    print("| case | s (this) | s (baseline) | baseline / this | loss (this) | loss (baseline) |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in args.cases:
        objective, negatives, dim = case.split(":")
        run = make_case(objective, int(negatives), int(dim), args)
        seconds: dict[str, list[float]] = {name: [] for name in checkouts}
        values: dict[str, float] = {}
        for name, losses in checkouts.items():  # warm-up
            values[name] = run(losses)
        for _ in range(args.repeats):
            for name, losses in checkouts.items():
                start = time.perf_counter()
                run(losses)
                seconds[name].append(time.perf_counter() - start)
        this = statistics.median(seconds["this"])
        if "baseline" in checkouts:
            base = statistics.median(seconds["baseline"])
            cells = (
                f"{base:.3f} | {base / this:.2f}x | {values['this']:.6f} | {values['baseline']:.6f}"
            )
        else:
            cells = f" | | {values['this']:.6f} |"
        print(f"| {case} | {this:.3f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
