"""Two CPU checks behind docs/guides/scaling.md, run in 2 processes over gloo.

``fsdp``: how torch's FSDP, which Lightning's ``FSDPStrategy`` (FSDP1, ``FullyShardedDataParallel``)
and ``ModelParallelStrategy`` (FSDP2, ``fully_shard``) wrap, treats an ``[N+1, D]``
``nn.Embedding``: the shape the forward sees, what each rank keeps, the gradient's layout, and
what happens with ``sparse=True``. FSDP1 is also built as Lightning builds it on a CPU device
(``device_id=None``).

``refresh``: a MIDX codebook refresh over a row-sharded table. Each rank holds a contiguous
block of item rows and draws its share of the k-means sample; rank 0 gathers the sample and
trains the codewords, broadcasts them, every rank encodes its own rows, and the per-cell counts
are summed over the ranks. The codes and counts are compared with one process encoding the
whole table under the same codewords, and the bytes each collective carries are printed.

Example:
    OMP_NUM_THREADS=1 python scripts/shard_probe.py
    OMP_NUM_THREADS=1 python scripts/shard_probe.py --items 20000 --dim 32 --codewords 32
"""

from __future__ import annotations

import argparse
import math
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from recsys_midx.index import ProductCodebooks
from recsys_midx.samplers.cell_layout import cell_keys

WORLD = 2


class Table(nn.Module):
    """An item table scored against queries, recording the weight shape its forward sees."""

    def __init__(self, num_items: int, dim: int, sparse: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(num_items + 1, dim, padding_idx=0, sparse=sparse)
        self.seen: tuple[int, ...] = ()

    def forward(self, query: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        self.seen = tuple(self.emb.weight.shape)
        return (query.unsqueeze(1) * self.emb(ids)).sum(-1)


def _attempt(run) -> str:
    try:
        return run()
    except Exception as exc:  # the point is to report it
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def probe_fsdp(args: argparse.Namespace, rank: int) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    torch.manual_seed(0)
    query = torch.randn(4, args.dim)
    ids = torch.randint(1, args.items + 1, (4, 8))

    def step(module: nn.Module) -> None:
        module(query, ids).logsumexp(1).sum().backward()

    def fsdp1(sparse: bool, device_id: torch.device | None):
        def run() -> str:
            table = Table(args.items, args.dim, sparse)
            model = FullyShardedDataParallel(table, use_orig_params=True, device_id=device_id)
            step(model)
            weight = next(model.parameters())
            grad = weight.grad
            return (
                f"forward saw {table.seen}; rank keeps {weight.numel()} of "
                f"{(args.items + 1) * args.dim} values; grad {grad.layout} {tuple(grad.shape)}"
            )

        return run

    def fsdp2(sparse: bool):
        def run() -> str:
            table = Table(args.items, args.dim, sparse)
            fully_shard(table)
            step(table)
            weight = table.emb.weight
            return (
                f"forward saw {table.seen}; rank keeps {tuple(weight.to_local().shape)} of "
                f"{tuple(weight.shape)} ({weight.placements[0]}); grad {weight.grad.layout} "
                f"{tuple(weight.grad.to_local().shape)}"
            )

        return run

    cpu = torch.device("cpu")
    cases = {
        "FSDP1, device_id=None (as Lightning on CPU)": fsdp1(False, None),
        "FSDP1, dense gradient": fsdp1(False, cpu),
        "FSDP1, sparse=True": fsdp1(True, cpu),
        "FSDP2, dense gradient": fsdp2(False),
        "FSDP2, sparse=True": fsdp2(True),
    }
    for name, run in cases.items():
        outcome = _attempt(run)
        if rank == 0:
            print(f"{name}: {outcome}", flush=True)


def probe_refresh(args: argparse.Namespace, rank: int) -> None:
    n, dim, k, b = args.items, args.dim, args.codewords, args.codebooks
    table = torch.randn(n, dim, generator=torch.Generator().manual_seed(args.seed))  # rows 1..N
    block = math.ceil(n / WORLD)  # contiguous row blocks, as row-wise sharding lays them out
    lo, hi = rank * block, min(n, (rank + 1) * block)
    local = table[lo:hi]  # all this rank would hold

    books = ProductCodebooks(k, b, kmeans_iters=args.kmeans_iters)
    sample_size = min(n, books.max_points_per_centroid * k)
    share = math.ceil(sample_size * (hi - lo) / n)
    rows = torch.randperm(hi - lo, generator=torch.Generator().manual_seed(args.seed + rank))
    sample = local[rows[:share]]
    gathered = [None] * WORLD if rank == 0 else None
    dist.gather_object(sample, gathered, dst=0)
    codewords = torch.empty(b, k, dim // b)
    if rank == 0:
        books.fit(torch.cat(gathered))
        codewords = books.codewords.contiguous()
    dist.broadcast(codewords, src=0)
    books.codewords = codewords
    codes = books.encode(local)  # [hi - lo, B], computed where the rows live
    counts = torch.bincount(cell_keys(codes, k), minlength=k**b)
    dist.all_reduce(counts)

    all_codes = [torch.empty(block, b, dtype=torch.long) for _ in range(WORLD)]
    padded = torch.cat([codes, codes.new_zeros(block - codes.shape[0], b)])
    dist.all_gather(all_codes, padded)  # for the check only; a sharded index would not do this
    if rank == 0:
        sharded = torch.cat(all_codes)[:n]
        reference = books.encode(table)
        assert torch.equal(sharded, reference), "local codes differ from one process's"
        assert torch.equal(counts, torch.bincount(cell_keys(reference, k), minlength=k**b))
        print(
            f"refresh: N={n} D={dim} K={k} B={b}, {WORLD} ranks of {block} rows: codes and "
            f"per-cell counts equal one process's under the same codewords",
            flush=True,
        )
        print(f"  gathered sample: {sample_size} x {dim} floats = {sample_size * dim * 4} bytes")
        print(f"  broadcast codewords: {codewords.numel()} floats = {codewords.numel() * 4} bytes")
        print(f"  all-reduced cell counts: {k**b} int64 = {k**b * 8} bytes per rank")


def _worker(rank: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        if "fsdp" in args.parts:
            probe_fsdp(args, rank)
        if "refresh" in args.parts:
            probe_refresh(args, rank)
    finally:
        dist.destroy_process_group()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts", nargs="+", choices=["fsdp", "refresh"], default=["fsdp", "refresh"]
    )
    parser.add_argument("--items", type=int, default=20000, help="N")
    parser.add_argument("--dim", type=int, default=16, help="D")
    parser.add_argument("--codewords", type=int, default=16, help="K")
    parser.add_argument("--codebooks", type=int, default=2, help="B")
    parser.add_argument("--kmeans-iters", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


if __name__ == "__main__":
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free_port = sock.getsockname()[1]
    mp.spawn(_worker, args=(free_port, parse_args()), nprocs=WORLD, join=True)
