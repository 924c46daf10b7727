"""Extreme classification on xc-synthetic: P@1 / P@5 and seconds per epoch of each sampler.

Every sampler trains the same ``task=xc`` model on the same synthetic dataset (100k labels by
default) for the same number of epochs with the same number of negatives; each run is its own
``train.py`` process (so timings do not interfere), selects its checkpoint on validation P@1 and
reports test metrics. Seconds per epoch are the training part of an epoch plus the sampler's
rebuilds (amortised per epoch); validation, which scores every label exactly for all samplers,
is left out. The table compares each sampler with ``full``: P@1 as a share of full's, and the
speed-up of an epoch. A sampler written ``NAME:EPOCHS`` trains for that many epochs instead,
e.g. ``midx:12`` to see what a sampled run reaches with twice the epochs.

Example:
    python scripts/bench_xc.py --out outputs/bench_xc
    python scripts/bench_xc.py --labels 10000 --train 10000 --epochs 2 --samplers full midx midx:4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLERS = ("full", "uniform", "popularity", "midx", "midx_plain", "midx_rq")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--samplers",
        nargs="+",
        default=list(SAMPLERS),
        help=f"any of {', '.join(SAMPLERS)}, each optionally NAME:EPOCHS",
    )
    parser.add_argument("--labels", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=50_000)
    parser.add_argument(
        "--train",
        type=int,
        default=50_000,
        help="training points (10%% are held out for validation)",
    )
    parser.add_argument("--test", type=int, default=10_000)
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--negatives", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per run (1 keeps timings stable on a shared CPU)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_xc")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="data root (default: the config's paths.data_dir)",
    )
    return parser.parse_args(argv)


def parse_run(spec: str, default_epochs: int) -> tuple[str, int]:
    """``NAME`` or ``NAME:EPOCHS`` -> (sampler, epochs)."""
    name, _, epochs = spec.partition(":")
    if name not in SAMPLERS or (epochs and not epochs.isdigit()):
        raise SystemExit(
            f"bad sampler {spec!r}: use one of {', '.join(SAMPLERS)}, optionally :EPOCHS"
        )
    return name, int(epochs) if epochs else default_epochs


def run_name(sampler: str, epochs: int, default_epochs: int) -> str:
    """The label (and output folder) of a run: the sampler, plus its epochs when not the default."""
    return sampler if epochs == default_epochs else f"{sampler}-{epochs}ep"


def overrides(args: argparse.Namespace, sampler: str, epochs: int, folder: Path) -> list[str]:
    """The ``train.py`` command-line overrides of one run."""
    chosen = [
        "task=xc",
        f"sampler={sampler}",
        f"sampler.num_negatives={args.negatives}",
        f"dataset.num_labels={args.labels}",
        f"dataset.num_features={args.features}",
        f"dataset.num_train={args.train}",
        f"dataset.num_test={args.test}",
        f"dataset.num_topics={args.topics}",
        f"model.dim={args.dim}",
        f"model.hidden=[{args.hidden}]",
        f"task.datamodule.batch_size={args.batch_size}",
        f"trainer.max_epochs={epochs}",
        "trainer.accelerator=cpu",
        f"seed={args.seed}",
        "callbacks.progress_bar.refresh_rate=0",
        f"hydra.run.dir={folder}",
    ]
    if args.data_dir is not None:
        chosen.append(f"paths.data_dir={args.data_dir}")
    return chosen


def run(args: argparse.Namespace, sampler: str, epochs: int, folder: Path) -> dict[str, Any]:
    """Train one sampler in its own process and return its ``results.json``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    command = [sys.executable, str(ROOT / "train.py"), *overrides(args, sampler, epochs, folder)]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{sampler} failed:\n{done.stderr[-4000:]}")
    results = json.loads((folder / "results.json").read_text())
    results["process_seconds"] = time.perf_counter() - start
    return results


def summarise(name: str, sampler: str, results: dict[str, Any]) -> dict[str, Any]:
    """The table row of one run."""
    refresh = results["sampler"]
    refresh_per_epoch = (
        refresh["refreshes"]
        * (refresh["refresh_seconds_mean"] or 0.0)
        / max(results["epochs_run"], 1)
    )
    metrics = results["metrics"]
    return {
        "run": name,
        "sampler": sampler,
        "val_p@1": metrics["val/p@1"],
        "test_p@1": metrics["test/p@1"],
        "test_p@5": metrics["test/p@5"],
        "test_psp@5": metrics["test/psp@5"],
        "train_s": results["seconds_per_epoch"],
        "refresh_s": refresh_per_epoch,
        "epoch_s": results["seconds_per_epoch"] + refresh_per_epoch,
        "best_epoch": results["best_epoch"],
        "epochs": results["epochs_run"],
        "kl_last": refresh["kl_last"],
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """The comparison table, with P@1 and speed relative to ``full`` when it ran."""
    full = next((row for row in rows if row["sampler"] == "full"), None)
    lines = [
        "| run | test P@1 | test P@5 | test PSP@5 | P@1 / full | s/epoch | speed-up | best epoch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        share = f"{row['test_p@1'] / full['test_p@1']:.1%}" if full else "-"
        speed = f"{full['epoch_s'] / row['epoch_s']:.1f}x" if full else "-"
        lines.append(
            f"| {row['run']} | {row['test_p@1']:.4f} | {row['test_p@5']:.4f} | "
            f"{row['test_psp@5']:.4f} | {share} | {row['epoch_s']:.2f} | {speed} | "
            f"{row['best_epoch'] + 1} of {row['epochs']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [parse_run(spec, args.epochs) for spec in args.samplers]
    rows = []
    for sampler, epochs in runs:
        name = run_name(sampler, epochs, args.epochs)
        results = run(args, sampler, epochs, args.out / name)
        rows.append(summarise(name, sampler, results))
        print(
            f"{name}: test P@1 {rows[-1]['test_p@1']:.4f}, {rows[-1]['epoch_s']:.1f} s/epoch "
            f"({results['process_seconds']:.0f} s in all)",
            flush=True,
        )
    table = markdown(rows)
    print(table)
    (args.out / "summary.md").write_text(table + "\n")
    (args.out / "summary.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2)
        + "\n"
    )


if __name__ == "__main__":
    main()
