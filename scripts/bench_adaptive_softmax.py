"""Benchmark AdaptiveSoftmax top-1 against the exact softmax and print a markdown table.

Two workloads:

* **LLM-head shape** (``--n`` x ``--d``, default 32,000 x 4,096, float32). Rows are Gaussian with
  log-normal column scales (a few hidden dimensions carry much of the energy, as the outlier
  features of transformer hidden states do), every row of unit expected norm. A query is a
  heavy-tailed random direction scaled so the logits of the bulk have standard deviation
  ``--logit-std`` (2 nats), plus a planted winner and two runners-up whose logits sit around
  ``log sum_bulk exp`` (winner probability between ~0.25 and ~0.95, runners-up 1-3 nats lower).
* **Trained model**: a run's item table (rows ``1..N``) and the scaled queries of its test
  points (``--run-dir``: a sequential recommender's test users, a language model's test
  positions; without it a seqrec model is trained first with
  ``python train.py trainer.max_epochs=3 task.datamodule.train_samples=last_window
  task.datamodule.batch_size=128``).

Per row: products computed by AdaptiveSoftmax as a fraction of ``n * d`` and the resulting
saving factor, median wall seconds per query of AdaptiveSoftmax, of the exact matrix-vector
product with ``torch.topk`` and of the exact product batched over all queries (per query), and
the success rate: top-1 id equal to the exact one and ``|p_hat / p - 1| <= eps``.

Example:
    python scripts/bench_adaptive_softmax.py --queries 20 --run-dir outputs/2026-01-01/12-00-00
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from recsys_midx.app.trained import load_run
from recsys_midx.inference import (
    AdaptiveSoftmax,
    ItemTableTopK,
    exact_softmax_topk,
)

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Row:
    """One line of the table."""

    workload: str
    variance_scale: float
    fraction: float
    adaptive_s: float
    exact_s: float
    batched_s: float
    successes: int
    queries: int


def llm_head_instance(
    n: int, d: int, num_queries: int, logit_std: float, g: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``A [n, d]`` and ``X [num_queries, d]`` of the LLM-head workload (see the module doc)."""
    column_scale = torch.exp(torch.randn(d, generator=g))
    A = torch.randn(n, d, generator=g) * (column_scale / column_scale.norm())
    queries = []
    for _ in range(num_queries):
        noise = torch.randn(d, generator=g) * torch.exp(0.5 * torch.randn(d, generator=g))
        noise *= logit_std / (A @ noise).std()
        bulk = A @ noise
        log_mass = torch.logsumexp(bulk, 0).item()
        x = noise.clone()
        planted = torch.randperm(n, generator=g)[:3]
        offsets = [float(torch.empty(1).uniform_(-1, 3, generator=g))]
        offsets += [
            offsets[0] - float(torch.empty(1).uniform_(1, 3, generator=g)) for _ in range(2)
        ]
        for row, offset in zip(planted.tolist(), offsets):
            # A[row] . (A[row] / |A[row]|^2) = 1: moves that row's logit to log_mass + offset.
            x += (log_mass + offset - bulk[row].item()) * A[row] / A[row].square().sum()
        queries.append(x)
    return A, torch.stack(queries)


def _now(device: torch.device) -> float:
    """Wall-clock seconds once the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def measure(
    workload: str,
    head: AdaptiveSoftmax,
    queries: Tensor,
    eps: float,
    g: torch.Generator,
) -> Row:
    """Run AdaptiveSoftmax and the exact baseline on every query of ``queries``."""
    A = head.A
    device = A.device
    adaptive_times, exact_times, products, successes = [], [], 0, 0
    for x in queries:
        start = _now(device)
        exact = exact_softmax_topk(A, x)
        exact_times.append(_now(device) - start)
        start = _now(device)
        result = head.topk(x, generator=g)
        adaptive_times.append(_now(device) - start)
        products += result.multiplications
        error = abs(result.probs.item() / exact.probs.item() - 1)
        successes += result.ids.item() == exact.ids.item() and error <= eps
    (queries @ A.T).topk(1, dim=1)  # warm-up: the first call allocates
    start = _now(device)
    (queries @ A.T).topk(1, dim=1)
    batched = (_now(device) - start) / len(queries)
    return Row(
        workload,
        head.variance_scale,
        products / (len(queries) * A.numel()),
        statistics.median(adaptive_times),
        statistics.median(exact_times),
        batched,
        successes,
        len(queries),
    )


def trained_model_queries(run_dir: Path, num_queries: int) -> tuple[ItemTableTopK, Tensor, str]:
    """The item-table head of a finished run and up to ``num_queries`` queries of its first test
    batches (a language model's: the positions of its first stretches, state reset)."""
    run = load_run(run_dir)
    module, datamodule = run.module, run.datamodule
    datamodule.setup("test")
    head = ItemTableTopK(module)
    queries = []
    for batch in datamodule.test_dataloader():
        queries.append(head.queries(batch))
        if sum(len(q) for q in queries) >= num_queries:
            break
    table = head.table
    name = f"{type(module.encoder).__name__} N={table.shape[0]:,} D={table.shape[1]}"
    return head, torch.cat(queries)[:num_queries], name


def train_default_model(run_dir: Path) -> None:
    """Train the default seqrec model on last-window samples for three epochs into ``run_dir``."""
    command = [
        sys.executable,
        "train.py",
        "trainer.max_epochs=3",
        "task.datamodule.train_samples=last_window",
        "task.datamodule.batch_size=128",
        f"hydra.run.dir={run_dir}",
    ]
    print("training:", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=32_000, help="classes of the LLM-head workload")
    parser.add_argument("--d", type=int, default=4_096, help="dimension of the LLM-head workload")
    parser.add_argument("--queries", type=int, default=20, help="LLM-head queries (0: none)")
    parser.add_argument("--logit-std", type=float, default=2.0, help="std of the bulk logits")
    parser.add_argument("--run-dir", type=Path, default=None, help="finished seqrec or lm run")
    parser.add_argument("--model-queries", type=int, default=256, help="trained-model queries")
    parser.add_argument("--model-init-pulls", type=int, default=8, help="pilot size, model")
    parser.add_argument("--eps", type=float, default=0.3)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--variance-scales", type=float, nargs="+", default=[1.0, 0.1])
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every method")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    device = torch.device(args.device)
    device_g = torch.Generator(device).manual_seed(args.seed)

    rows = []
    if args.queries > 0:
        A, X = llm_head_instance(args.n, args.d, args.queries, args.logit_std, g)
        A, X = A.to(device), X.to(device)
        name = f"LLM head n={args.n:,} d={args.d:,}"
        for scale in args.variance_scales:
            head = AdaptiveSoftmax(A, args.eps, args.delta, variance_scale=scale)
            rows.append(measure(name, head, X, args.eps, device_g))
        del A, X

    run_dir = args.run_dir
    if run_dir is None:
        run_dir = ROOT / "outputs" / "bench_adaptive_softmax"
        if not (run_dir / "results.json").is_file():
            train_default_model(run_dir)
    item_head, Z, name = trained_model_queries(run_dir, args.model_queries)
    table, Z = item_head.table.to(device), Z.to(device)
    for scale in args.variance_scales:
        head = AdaptiveSoftmax(
            table, args.eps, args.delta, init_pulls=args.model_init_pulls, variance_scale=scale
        )
        rows.append(measure(name, head, Z, args.eps, device_g))

    print(f"\neps={args.eps}, delta={args.delta}, k=1, {args.threads} thread(s), {device}\n")
    print(
        "| workload | variance_scale | products / n·d | saving | adaptive s/query "
        "| exact s/query | exact batched s/query | success |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.workload} | {r.variance_scale:g} | {r.fraction:.3f} | {1 / r.fraction:.1f}x "
            f"| {r.adaptive_s:.4f} | {r.exact_s:.4f} | {r.batched_s:.5f} "
            f"| {r.successes}/{r.queries} ({r.successes / r.queries:.1%}) |"
        )


if __name__ == "__main__":
    main()
