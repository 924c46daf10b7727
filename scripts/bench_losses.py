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
its positions, as ``negatives=outside_window`` draws them). ``exact:HEAD:D`` is the exact softmax
over the catalog through output head ``HEAD`` as the ``head`` group names it (``dot``, ``plif``,
``mos``, ``mos_plif``, ...: its defaults, seeded alike in both checkouts), every position of
every sequence a query, as in a language model.

Example:
    git worktree add /tmp/base HEAD~3
    OMP_NUM_THREADS=1 python scripts/bench_losses.py --baseline /tmp/base \\
        --cases softmax:100:64 bce:256:128 bce:1:64 window:3000:64
    OMP_NUM_THREADS=2 python scripts/bench_losses.py --baseline /tmp/base --items 10000 \\
        --batch-size 20 --max-len 35 --cases exact:dot:200 exact:plif:200 exact:mos:200
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parents[1]


class Checkout(NamedTuple):
    """The packages of one checkout a case runs with."""

    losses: ModuleType
    heads: ModuleType
    negatives: ModuleType


def load_checkout(root: Path) -> Checkout:
    """The losses, heads and negatives of the checkout at ``root``, imported afresh."""
    for name in [name for name in sys.modules if name.split(".")[0] == "recsys_midx"]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        packages = ("losses", "heads", "negatives")
        return Checkout(*(importlib.import_module(f"recsys_midx.{name}") for name in packages))
    finally:
        sys.path.remove(str(root))


def make_head(heads: ModuleType, name: str, dim: int, seed: int) -> torch.nn.Module:
    """The output head called ``name`` (the ``head`` group's spelling) with its defaults."""
    classes = [getattr(heads, attr) for attr in heads.__all__]
    chosen = [cls for cls in classes if isinstance(cls, type) and getattr(cls, "name", "") == name]
    if not chosen:
        raise SystemExit(f"unknown head {name!r}")
    torch.manual_seed(seed)
    if "dim" in inspect.signature(chosen[0]).parameters:
        return chosen[0](dim=dim)
    return chosen[0]()


def make_case(
    objective: str, negatives: str, dim: int, args: argparse.Namespace
) -> Callable[[Checkout], float]:
    """A closure that runs one forward and backward of ``objective`` with a checkout's losses
    and returns the loss value."""
    generator = torch.Generator().manual_seed(args.seed)
    num_items, batch, length = args.items, args.batch_size, args.max_len
    if objective == "exact":  # every position a query
        lengths = torch.full((batch,), length)
    else:  # left-padded windows of random lengths, as a batch of users' last windows
        lengths = torch.randint(length // 10, length + 1, (batch,), generator=generator)
    positions = torch.arange(length)[None, :] >= (length - lengths)[:, None]
    queries = int(positions.sum())
    table = torch.randn(num_items + 1, dim, generator=generator) * 0.1
    query = torch.randn(queries, dim, generator=generator)
    targets = torch.randint(1, num_items + 1, (queries,), generator=generator)
    rows = batch if objective == "window" else queries
    sampled = 0 if objective == "exact" else int(negatives)
    neg_ids = torch.randint(1, num_items + 1, (rows, sampled), generator=generator)
    log_q = torch.full((queries, sampled), -float(torch.log(torch.tensor(num_items))))

    def run(checkout: Checkout) -> float:
        losses = checkout.losses
        item_emb, q = table.clone().requires_grad_(True), query.clone().requires_grad_(True)
        if objective == "exact":
            head = make_head(checkout.heads, negatives, dim, args.seed)
            catalog = checkout.negatives.Negatives("catalog")
            loss = losses.SoftmaxLoss()(head(q), targets, item_emb, catalog)
        elif objective == "softmax":
            loss = losses.sampled_softmax_loss(q, item_emb, targets, neg_ids, log_q, log_q[:, 0])
        elif objective == "bce":
            loss = losses.binary_cross_entropy_loss(q, item_emb, targets, neg_ids)
        elif objective == "window":
            loss = losses.window_softmax_loss(q, item_emb, targets, positions, neg_ids)
        else:
            raise SystemExit(f"unknown objective {objective!r}: softmax, bce, window or exact")
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

    checkouts = {"this": load_checkout(ROOT)}
    if args.baseline is not None:
        checkouts["baseline"] = load_checkout(args.baseline.resolve())
    threads = torch.get_num_threads()
    print(f"N={args.items}, batch {args.batch_size} x {args.max_len}, {threads} thread(s)")
    print("| case | s (this) | s (baseline) | baseline / this | loss (this) | loss (baseline) |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in args.cases:
        objective, negatives, dim = case.split(":")
        run = make_case(objective, negatives, int(dim), args)
        seconds: dict[str, list[float]] = {name: [] for name in checkouts}
        values: dict[str, float] = {}
        for name, checkout in checkouts.items():  # warm-up
            values[name] = run(checkout)
        for _ in range(args.repeats):
            for name, checkout in checkouts.items():
                start = time.perf_counter()
                run(checkout)
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
