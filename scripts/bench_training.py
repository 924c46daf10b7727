"""Seconds per training step and peak memory of SASRec with the full softmax and sampled ones.

For each catalog size ``N`` the synthetic generator makes user sequences over exactly ``N`` items;
every (sampler, N) pair then runs in its own process (so its peak resident memory is its own):
a few optimiser steps of SASRec on batches of those sequences. The run is composed as
``recsys-midx-train`` composes it, ``sampler=NAME`` with this script's sizes as overrides, and
built as a training run builds it (:func:`recsys_midx.app.experiment.build_module`); a step is
the module's own ``training_step`` (forward and loss), backward and the configured optimiser's
update. The sampler's index is built once before timing and its build time is reported apart (in
training it is amortised over ``callbacks.sampler_refresh.every_n_epochs``). With
``--device cuda`` the model, sampler and batches live on the GPU and the peak memory reported is
the peak CUDA memory allocated (``--memory-limit-gib`` then only applies to host memory);
``--precision bf16-mixed`` runs the forward and loss under bfloat16 autocast, as
``trainer.precision=bf16-mixed`` does.

A run whose resident memory passes ``--memory-limit-gib`` is stopped and reported as not fitting;
one that outlasts ``--timeout`` is stopped too. For every sampler measured at two sizes or more, a
least-squares line through (N, peak memory) estimates the largest catalog that fits the limit.

A sampler is any ``sampler=`` config (``full``, ``uniform``, ``popularity``, ``midx``, ``kernel``,
...). ``midx`` is ``sampler=midx`` as configured: the exact softmax over each query's top cells
mixed in, their number sized from the catalog (``exact_top_items``), and the positive counted
exactly as that option wants. ``midx+topT`` fixes ``exact_top_codewords=T`` instead
(``midx+top0``: none, the positive logQ-corrected).
``full+window`` (any sampler with ``+window``) leaves each query's training sequence out of its
normaliser (``negatives.exclude_window=true``): the exact softmax outside the window, as SASRec+
trains. ``uniform/rowwise_adagrad`` (or ``/sparse_adam``) gives the item table its own optimizer
(``task.module.table_optimizer``): sparse gradients, only the rows a step read updated.
``--shared-negatives`` draws one set of negatives per batch instead of one per query
(``negatives=shared``). ``--train-samples`` builds the batches as
``task.datamodule.train_samples`` does: ``last_window`` (every position of each user's last
window is a query) or ``prefixes`` (one query per sample, its last position, which is all the
encoder computes then).

Example:
    python scripts/bench_training.py --sizes 1e5 1e6 5e6 --samplers full midx --steps 2
    python scripts/bench_training.py --device cuda --precision bf16-mixed --sizes 1e5 1e6 5e6
    python scripts/bench_training.py --sizes 1e6 --samplers uniform midx midx+top1 --steps 2
    python scripts/bench_training.py --sizes 1e6 --samplers uniform midx --train-samples prefixes \
        --batch-size 512 --negatives 32
    python scripts/bench_training.py --sizes 1e5 1e7 --samplers uniform uniform/sparse_adam \
        uniform/rowwise_adagrad
    python scripts/bench_training.py --sizes 3416 --samplers full full+window --max-len 200 \
        --steps 5
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import recsys_midx.conf
from recsys_midx.analysis.timing import timed
from recsys_midx.app.experiment import build_module
from recsys_midx.data.sources import Synthetic
from recsys_midx.data.splits import LeaveOneOutSplit
from recsys_midx.data.train_samples import SAMPLE_KINDS, TrainSamples
from recsys_midx.lit.table_optimizers import TABLE_OPTIMIZERS

CONF_DIR = Path(recsys_midx.conf.__file__).parent
#: The ``sampler=`` configs.
SAMPLERS = sorted(path.stem for path in (CONF_DIR / "sampler").glob("*.yaml"))
_EXACT_TOP = re.compile(r"midx\+top(\d+)")
#: The suffix of a sampler measured outside each query's window.
_WINDOW = "+window"


def parse_sampler(name: str) -> str:
    """``name`` if it is one of :data:`SAMPLERS` or ``midx+topT``, optionally followed by
    ``/TABLE_OPTIMIZER``, one of the item table's own optimizers
    (``task.module.table_optimizer``; without one the table is one of Adam's parameters)
    (argparse type).

    Example:
        >>> parse_sampler("midx_plain/rowwise_adagrad")
        'midx_plain/rowwise_adagrad'
    """
    sampler, _, table_optimizer = name.partition("/")
    sampler = sampler.removesuffix(_WINDOW)
    if (sampler in SAMPLERS or _EXACT_TOP.fullmatch(sampler)) and (
        not table_optimizer or table_optimizer in TABLE_OPTIMIZERS
    ):
        return name
    raise argparse.ArgumentTypeError(
        f"{name!r}: use one of {SAMPLERS} or midx+topT, optionally with {_WINDOW} and then "
        f"/{' or /'.join(TABLE_OPTIMIZERS)}"
    )


def compose_run(args: argparse.Namespace, sampler_name: str) -> DictConfig:
    """The config of one measured run: the default run with the sampler, the table's optimizer
    (dense Adam unless one is named) and this script's sizes as command-line overrides."""
    sampler_name, _, table_optimizer = sampler_name.partition("/")
    window = sampler_name.endswith(_WINDOW)
    sampler_name = sampler_name.removesuffix(_WINDOW)
    top = _EXACT_TOP.fullmatch(sampler_name)
    sampler = (
        ["sampler=midx", f"sampler.exact_top_codewords={top[1]}"]
        if top
        else [f"sampler={sampler_name}"]
    )
    overrides = [
        *sampler,
        f"sampler.num_negatives={args.negatives}",
        *(["negatives=shared"] if args.shared_negatives else []),
        *(["negatives.exclude_window=true"] if window else []),
        f"model.dim={args.dim}",
        f"model.max_len={args.max_len}",
        f"task.datamodule.batch_size={args.batch_size}",
        f"task.datamodule.train_samples={args.train_samples}",
        f"seed={args.seed}",
        # Without a named one the table is one of Adam's parameters, whatever the default.
        f"task.module.table_optimizer={table_optimizer or 'null'}",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def _split(num_items: int, num_users: int, seed: int) -> LeaveOneOutSplit:
    """Synthetic sequences over raw item ids ``1..num_items`` (no remapping: the catalog is N)."""
    raw = Synthetic(num_users=num_users, num_items=num_items, seed=seed).generate()
    frame = raw.rename(columns={"user": "user_id", "item": "item_id"})
    frame = frame.sort_values(["user_id", "timestamp"], kind="stable")
    return LeaveOneOutSplit.from_interactions(frame, num_items)


def measure(args: argparse.Namespace, sampler_name: str, num_items: int) -> dict[str, float]:
    """Time ``args.steps`` training steps (after one warm-up step) in this process."""
    cfg = compose_run(args, sampler_name)
    torch.manual_seed(cfg.seed)
    device = torch.device(args.device)
    split = _split(num_items, args.users, cfg.seed)
    module = build_module(cfg, {"num_items": num_items}, num_items).to(device)
    optimizer = module.configure_optimizers()
    counts = torch.from_numpy(split.train_item_counts()).to(device)

    # As the module's refresh at the start of fitting.
    build_seconds = timed(lambda: module.rebuild_indexes(counts), device)
    # The step logs its loss; without a trainer to take it, Lightning says so at every call.
    warnings.filterwarnings("ignore", message="You are trying to `self.log\\(\\)`")

    def train_step(batch: dict[str, torch.Tensor], step: int) -> None:
        with torch.autocast(device.type, torch.bfloat16, enabled=args.precision == "bf16-mixed"):
            loss = module.training_step(batch, step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    datamodule = cfg.task.datamodule
    samples = TrainSamples(
        split.items, split.spans("train"), cfg.model.max_len, datamodule.train_samples
    )
    rng = np.random.default_rng(cfg.seed)
    step_seconds = []
    for step in range(args.steps + 1):
        batch = samples.batch(rng.choice(len(samples), datamodule.batch_size))
        batch = {key: value.to(device) for key, value in batch.items()}
        seconds = timed(functools.partial(train_step, batch, step), device)
        if step:  # the first step warms up allocators and kernels
            step_seconds.append(seconds)
    return {
        "step_seconds": float(np.median(step_seconds)),
        "build_seconds": build_seconds,
        "peak_mb": (
            torch.cuda.max_memory_allocated(device) / 2**20
            if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ),
    }


def _rss_mb(pid: int) -> float:
    """Resident memory of a live process in MiB (0 once it has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    line = next((row for row in status.splitlines() if row.startswith("VmRSS:")), "VmRSS: 0 kB")
    return int(line.split()[1]) / 1024


def _run_isolated(args: argparse.Namespace, sampler_name: str, num_items: int) -> dict:
    """Measure one (sampler, N) in a child process, stopped past the memory limit or timeout."""
    command = [
        sys.executable,
        __file__,
        "--single",
        sampler_name,
        str(num_items),
        *[
            f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}")
            for k, v in vars(args).items()
            if k not in ("sizes", "samplers", "single") and v is not False
        ],
    ]
    limit_mb = args.memory_limit_gib * 1024
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.perf_counter()
    while True:
        try:
            stdout, stderr = child.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            # Polled rather than capped with setrlimit: an address-space cap also counts the
            # virtual reservations of allocators and thread stacks, which are not memory used.
            if _rss_mb(child.pid) > limit_mb:
                child.kill()
                child.communicate()
                return {"error": f"over {args.memory_limit_gib:g} GiB"}
            if time.perf_counter() - start > args.timeout:
                child.kill()
                child.communicate()
                return {"error": f"timed out after {args.timeout:.0f} s"}
    if child.returncode:
        return {"error": stderr.strip().splitlines()[-1] if stderr.strip() else "failed"}
    return json.loads(stdout.strip().splitlines()[-1])


def largest_fitting(points: list[tuple[int, float]], limit_mb: float) -> float | None:
    """Catalog size at which the least-squares line through ``(N, peak MiB)`` reaches the limit.

    Args:
        points: measured ``(N, peak resident MiB)`` of one sampler, at two sizes or more.
        limit_mb: the memory budget in MiB.

    Returns:
        The estimated largest ``N`` (rounded down to a float), or ``None`` with fewer than two
        distinct sizes or a memory that does not grow with ``N``.

    Example:
        >>> largest_fitting([(100, 150.0), (200, 250.0)], 1050.0)
        1000.0
    """
    sizes = np.array([n for n, _ in points], dtype=float)
    if len(np.unique(sizes)) < 2:
        return None
    slope, intercept = np.polyfit(sizes, [mb for _, mb in points], 1)
    return float(np.floor((limit_mb - intercept) / slope)) if slope > 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e4, 1e5, 1e6])
    parser.add_argument(
        "--samplers",
        nargs="+",
        type=parse_sampler,
        default=["full", "uniform", "midx"],
        help=f"{', '.join(SAMPLERS)} or midx+topT (exact top cells), each optionally with "
        f"/{' or /'.join(TABLE_OPTIMIZERS)} (the item table's own optimizer)",
    )
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=50)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--negatives", type=int, default=100)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--memory-limit-gib",
        type=float,
        default=20.0,
        help="stop a run whose resident memory passes this",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="stop a run that takes longer than this many seconds",
    )
    parser.add_argument(
        "--shared-negatives",
        action="store_true",
        help="one set of negatives per batch (negatives=shared)",
    )
    parser.add_argument(
        "--train-samples",
        choices=SAMPLE_KINDS,
        default="last_window",
        help="how batches are built (task.datamodule.train_samples)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--precision",
        choices=["32", "bf16-mixed"],
        default="32",
        help="bf16-mixed: forward and loss under bfloat16 autocast",
    )
    parser.add_argument("--single", nargs=2, metavar=("SAMPLER", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single:
        print(json.dumps(measure(args, args.single[0], int(args.single[1]))))
        return

    on_gpu = args.device.startswith("cuda")
    where = (
        torch.cuda.get_device_name(args.device)
        if on_gpu
        else (f"{torch.get_num_threads()} threads")
    )
    shared = ", shared by the batch" if args.shared_negatives else ""
    print(
        f"SASRec D={args.dim}, batch {args.batch_size} {args.train_samples} samples x max_len "
        f"{args.max_len}, {args.negatives} negatives{shared}, {where}, precision "
        f"{args.precision}, median of {args.steps} "
        "steps, memory limit "
        f"{args.memory_limit_gib:g} GiB\n"
    )
    print(
        "| N | sampler | s/step | speed-up over full | time / uniform's | index build s "
        f"| peak {'CUDA' if on_gpu else 'RSS'} MB |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    memory: dict[str, list[tuple[int, float]]] = {name: [] for name in args.samplers}
    for size in args.sizes:
        num_items = int(size)
        rows = {name: _run_isolated(args, name, num_items) for name in args.samplers}
        for name, row in rows.items():
            if "error" in row:
                print(f"| {num_items:.2g} | {name} | failed: {row['error']} | | | | |")
                continue
            memory[name].append((num_items, row["peak_mb"]))
            full, uniform = (rows.get(ref, {}).get("step_seconds") for ref in ("full", "uniform"))
            speedup = f"{full / row['step_seconds']:.1f}x" if full else "-"
            relative = f"{row['step_seconds'] / uniform:.2f}x" if uniform else "-"
            print(
                f"| {num_items:.2g} | {name} | {row['step_seconds']:.3f} | {speedup} | "
                f"{relative} | {row['build_seconds']:.2f} | {row['peak_mb']:.0f} |",
                flush=True,
            )
    print()
    for name, points in memory.items():
        largest = largest_fitting(points, args.memory_limit_gib * 1024)
        if largest is not None:
            print(
                f"{name}: peak memory grows linearly with N; about {largest:.2e} items fit in "
                f"{args.memory_limit_gib:g} GiB (extrapolated from {len(points)} sizes)"
            )


if __name__ == "__main__":
    main()
