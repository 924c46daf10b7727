"""Benchmark negative samplers on a clustered synthetic catalog and print a markdown table.

For each sampler and catalog size ``N``: index build time (first ``update``) and refresh time
(``update`` after the table moved, warm-started), sampling throughput for ``Q`` queries x ``M``
negatives, ``KL(softmax || q)`` and the importance-sampling ESS per draw on held-out queries
(:func:`recsys_midx.samplers.diagnostics.proposal_divergence`), and the peak resident memory
added by one ``sample`` call (on ``--device cuda``: the peak CUDA memory it allocates). A second
table gives that peak for a large batch.

Items and queries are unit vectors around shared cluster centres, scaled so that
``|z.v| <= --max-logit``: the softmax is peaked on a few clusters but far from one-hot (its
perplexity is printed).

Example:
    python scripts/bench_samplers.py --sizes 1e4 1e5 --samplers uniform midx
    python scripts/bench_samplers.py --device cuda
    python scripts/bench_samplers.py --sizes 1e5 --samplers midx --negatives 32 --codewords 128 \
        --cell-draws table two_stage
    python scripts/bench_samplers.py --sizes 1e5 1e6 --samplers midx midx+top8 --exact-tops 8
    python scripts/bench_samplers.py --sizes 3416 1e5 --samplers midx --queries 25600 \
        --query-chunk-sizes 512 1024 4096 0 --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from recsys_midx.analysis.timing import best_seconds, timed
from recsys_midx.samplers.base import Sampler
from recsys_midx.samplers.diagnostics import proposal_divergence
from recsys_midx.samplers.midx import MIDXSampler
from recsys_midx.samplers.popularity import PopularitySampler
from recsys_midx.samplers.uniform import UniformSampler

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass
class Catalog:
    """A synthetic catalog: item table ``[N+1, D]``, counts ``[N+1]`` and query sets."""

    items: Tensor
    counts: Tensor
    queries: Tensor
    kl_queries: Tensor


def make_catalog(
    num_items: int,
    dim: int,
    num_queries: int,
    num_kl_queries: int,
    max_logit: float,
    spread: float,
    seed: int,
) -> Catalog:
    """Clustered items and queries (``sqrt(N)`` clusters) and Zipf-like counts.

    Args:
        num_items: ``N``.
        dim: ``D``.
        num_queries: queries for the throughput and memory runs.
        num_kl_queries: held-out queries for the divergence.
        max_logit: bound on ``|z.v|`` (both sides have norm ``sqrt(max_logit)``).
        spread: per-dimension noise around the ``N(0, I)`` cluster centres.
        seed: random seed.

    Returns:
        The catalog.
    """
    g = torch.Generator().manual_seed(seed)
    num_clusters = max(8, round(math.sqrt(num_items)))
    centers = torch.randn(num_clusters, dim, generator=g)
    norm = math.sqrt(max_logit)

    def around_centers(count: int) -> Tensor:
        labels = torch.randint(0, num_clusters, (count,), generator=g)
        points = centers[labels] + spread * torch.randn(count, dim, generator=g)
        return torch.nn.functional.normalize(points, dim=1) * norm

    items = around_centers(num_items + 1)
    items[0] = 0.0
    ranks = torch.randperm(num_items, generator=g).double() + 1
    counts = torch.cat([torch.zeros(1, dtype=torch.float64), (num_items / ranks).floor()])
    return Catalog(items, counts, around_centers(num_queries), around_centers(num_kl_queries))


def sampler_factories(
    num_negatives: int,
    num_codewords: int,
    cell_draws: list[str],
    exact_tops: list[int],
    query_chunk_sizes: list[int | None],
) -> dict[str, Callable[[int], Sampler]]:
    """Constructors ``N -> sampler`` by name; with several ``cell_draws`` each MIDX sampler
    appears once per way of drawing cells, named ``"midx (table)"`` and so on, and with several
    ``query_chunk_sizes`` once per chunk (``"midx (chunk 4096)"``; ``None``: the device's).
    Each of ``exact_tops`` adds ``"midx+topT"``: MIDX with the exact softmax over the top
    ``T**2`` cells mixed in."""
    factories: dict[str, Callable[[int], Sampler]] = {
        "uniform": lambda n: UniformSampler(n, num_negatives),
        "popularity": lambda n: PopularitySampler(n, num_negatives, alpha=0.75, smoothing=1.0),
    }
    midx_variants = {
        "midx": {},
        "midx_pop": {"last_stage": "popularity"},
        "midx_rq": {"quantizer": "rq"},
        "midx_exact": {"last_stage": "residual"},
        **{f"midx+top{t}": {"exact_top_codewords": t} for t in exact_tops},
    }
    for name, kwargs in midx_variants.items():
        for draw, chunk in itertools.product(cell_draws, query_chunk_sizes):
            parts = [draw] if len(cell_draws) > 1 else []
            parts += [f"chunk {chunk or 'auto'}"] if len(query_chunk_sizes) > 1 else []
            label = f"{name} ({', '.join(parts)})" if parts else name
            # No exact top cells but those of midx+topT.
            factories[label] = lambda n, kw=kwargs, draw=draw, chunk=chunk: MIDXSampler(
                n,
                num_negatives,
                num_codewords=num_codewords,
                cell_draw=draw,
                query_chunk_size=chunk,
                **{"exact_top_codewords": 0, **kw},
            )
    return factories


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _release_free_heap() -> None:
    """Return free malloc memory to the OS, so that reusing it later shows up as RSS growth.

    glibc raises its mmap threshold after large frees, so later tensors of similar size come from
    the heap and stay resident after being freed; without a trim they would hide from the peak.
    """
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(libc_name).malloc_trim(0)


@contextlib.contextmanager
def peak_cuda_growth(device: torch.device) -> Iterator[list[float]]:
    """Yield a list that receives the peak CUDA memory (MiB) allocated over the body."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result: list[float] = []
    yield result
    torch.cuda.synchronize(device)
    result.append((torch.cuda.max_memory_allocated(device) - base) / 2**20)


def peak_memory_growth(device: torch.device) -> contextlib.AbstractContextManager[list[float]]:
    """Peak growth of the memory that holds ``device``'s tensors: CUDA memory or host RSS."""
    return peak_cuda_growth(device) if device.type == "cuda" else peak_rss_growth()


@contextlib.contextmanager
def peak_rss_growth() -> Iterator[list[float]]:
    """Yield a list that receives the peak RSS growth (MiB) over the body, or NaN off Linux.

    Trims the heap and resets the kernel's high-water mark (``clear_refs`` 5) first, so the peak
    is the body's own: its temporaries while alive and its outputs.
    """
    result: list[float] = []
    _release_free_heap()
    try:
        _CLEAR_REFS.write_text("5")
        base = _status_kib("VmRSS")
    except OSError:
        yield result
        result.append(math.nan)
        return
    yield result
    result.append((_status_kib("VmHWM") - base) / 1024)


def bench_one(
    sampler: Sampler, catalog: Catalog, args: argparse.Namespace, num_queries: int
) -> dict[str, float]:
    """Build, refresh, throughput, divergence and peak memory of one sampler on one catalog."""
    device = catalog.items.device
    build = timed(lambda: sampler.update(catalog.items, catalog.counts), device)
    moved = catalog.items + 0.05 * torch.randn_like(catalog.items)
    refresh = timed(lambda: sampler.update(moved, catalog.counts), device)
    sampler.update(catalog.items, catalog.counts)

    queries = catalog.queries[:num_queries]
    sampler.sample(queries[:8], args.negatives)  # warm-up
    seconds = best_seconds(lambda: sampler.sample(queries, args.negatives), args.repeats, device)
    with peak_memory_growth(device) as peak:
        sampler.sample(queries, args.negatives)
    divergence = proposal_divergence(sampler, catalog.kl_queries, catalog.items)
    return {
        "build": build,
        "refresh": refresh,
        "rate": num_queries * args.negatives / seconds,
        "queries": num_queries,
        "kl": divergence["kl"],
        "ess": divergence["ess_fraction"],
        "peak": peak[0],
    }


def softmax_perplexity(catalog: Catalog) -> tuple[float, float]:
    """Largest ``|z.v|`` and mean softmax perplexity ``exp(H)`` over the held-out queries."""
    logits = catalog.kl_queries @ catalog.items[1:].T
    log_p = torch.log_softmax(logits, dim=1)
    entropy = -(log_p.exp() * log_p).sum(1)
    return float(logits.abs().max()), float(entropy.exp().mean())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e4, 1e5, 1e6])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--codewords", type=int, default=64)
    parser.add_argument("--queries", type=int, default=4096)
    parser.add_argument("--negatives", type=int, default=100)
    parser.add_argument("--kl-queries", type=int, default=256)
    parser.add_argument(
        "--exact-queries",
        type=int,
        default=256,
        help="queries for midx_exact, whose cost is O(N*D) per query",
    )
    parser.add_argument("--max-logit", type=float, default=10.0)
    parser.add_argument("--spread", type=float, default=0.5, help="cluster noise per dimension")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peak-queries", type=int, default=12_800)
    parser.add_argument("--peak-negatives", type=int, default=256)
    parser.add_argument("--samplers", nargs="+", default=None, help="default: all available")
    parser.add_argument(
        "--cell-draws",
        nargs="+",
        default=["auto"],
        choices=["auto", "table", "two_stage"],
        help="MIDX cell_draw settings; several give one row per setting",
    )
    parser.add_argument(
        "--exact-tops",
        type=int,
        nargs="*",
        default=[],
        help="add a 'midx+topT' row per T: the exact softmax over the top T**2 cells mixed in",
    )
    parser.add_argument(
        "--query-chunk-sizes",
        type=int,
        nargs="+",
        default=None,
        help="MIDX query_chunk_size settings, one row per setting (0: sized by the device); "
        "default: sized by the device",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="default: torch's default")
    parser.add_argument(
        "--device",
        type=torch.device,
        default=torch.device("cpu"),
        help="where items, queries and samplers live (cpu, cuda)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    chunks = [size or None for size in args.query_chunk_sizes or [0]]
    factories = sampler_factories(
        args.negatives, args.codewords, args.cell_draws, args.exact_tops, chunks
    )
    # "midx" selects all of its --cell-draws rows ("midx (table)", ...).
    bases = {label: label.split(" (")[0] for label in factories}
    wanted = set(args.samplers or bases.values())
    unknown = sorted(wanted - set(bases.values()))
    if unknown:
        raise SystemExit(
            f"unknown or unavailable samplers: {unknown}; have {sorted(set(bases.values()))}"
        )
    names = [label for label, base in bases.items() if base in wanted]
    sizes = [int(n) for n in args.sizes]
    where = (
        torch.cuda.get_device_name(args.device)
        if args.device.type == "cuda"
        else f"{torch.get_num_threads()} threads"
    )
    print(
        f"torch {torch.__version__}, {where}; D={args.dim}, "
        f"K={args.codewords}, Q={args.queries}, M={args.negatives}, "
        f"KL on {args.kl_queries} queries\n"
    )
    print("| sampler | N | build s | refresh s | samples/s | KL(p‖q) nats | ESS/draw | peak MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    largest = None
    for num_items in sizes:
        catalog = make_catalog(
            num_items,
            args.dim,
            args.queries,
            args.kl_queries,
            args.max_logit,
            args.spread,
            args.seed,
        )
        catalog = Catalog(*(t.to(args.device) for t in vars(catalog).values()))
        largest = catalog
        max_logit, perplexity = softmax_perplexity(catalog)
        for name in names:
            num_queries = args.exact_queries if name.startswith("midx_exact") else args.queries
            sampler = factories[name](num_items).to(args.device)
            row = bench_one(sampler, catalog, args, num_queries)
            queries_note = "" if num_queries == args.queries else f" (Q={num_queries})"
            kl = max(row["kl"], 0.0)  # an exact proposal can round to -1e-7
            print(
                f"| {name} | {num_items:.0e} | {row['build']:.2f} | {row['refresh']:.2f} "
                f"| {row['rate']:.2e}{queries_note} | {kl:.3f} | {row['ess']:.4f} "
                f"| {row['peak']:.0f} |"
            )
        print(
            f"<!-- N={num_items:.0e}: max |z.v| = {max_logit:.1f}, "
            f"softmax perplexity = {perplexity:.0f} items -->"
        )

    peak_names = [n for n in names if n.startswith("midx") and not n.startswith("midx_exact")]
    if largest is None or not peak_names:
        return
    queries = torch.cat([largest.queries] * math.ceil(args.peak_queries / args.queries))
    queries = queries[: args.peak_queries]
    output_mib = args.peak_queries * args.peak_negatives * 12 / 2**20
    memory = "CUDA memory" if args.device.type == "cuda" else "RSS growth"
    print(
        f"\nPeak {memory} of one sample() call, N={sizes[-1]:.0e}, Q={args.peak_queries}, "
        f"M={args.peak_negatives} (outputs alone: {output_mib:.0f} MiB)\n"
    )
    print("| sampler | peak MiB | seconds (one run) |")
    print("|---|---:|---:|")
    for name in peak_names:
        sampler = factories[name](sizes[-1]).to(args.device)
        sampler.update(largest.items, largest.counts)
        with peak_memory_growth(args.device) as peak:
            seconds = timed(lambda s=sampler: s.sample(queries, args.peak_negatives), args.device)
        print(f"| {name} | {peak[0]:.0f} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
