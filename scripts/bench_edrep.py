"""EDRep against sampled softmax (MIDX, uniform) and the exact softmax at equal training time.

Every configuration trains SASRec through ``train.py`` for the same wall-clock budget
(Lightning's ``trainer.max_time``; early stopping off, so the budget is what stops it), each in
its own process, then tests its best checkpoint (by validation NDCG@10). The table gives test
NDCG@10 and HR@10, the epochs the budget allowed, the mean training seconds per epoch, and the
validation NDCG@10 every run had reached after the same number of epochs.

EDRep runs keep ``sampler=midx``: the sampler is not used by the loss, but its rebuild schedule
(every epoch) is the one that rebuilds EDRep's cluster statistics.

Example:
    python scripts/bench_edrep.py --seconds 60 dataset=ml-100k \\
        dataset.raw_dir=/path/to/ml-100k
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: name -> overrides of each contender.
CONTENDERS = {
    "edrep": ["loss=edrep", "sampler=midx"],
    "edrep_grad_stats": ["loss=edrep", "sampler=midx", "loss.grad_through_stats=true"],
    "midx": ["sampler=midx"],
    "uniform": ["sampler=uniform"],
    "full": ["sampler=full"],
}


def run(name: str, overrides: list[str], args: argparse.Namespace, out_dir: Path) -> dict:
    """Train one contender in its own process; its ``results.json`` (or the error)."""
    run_dir = out_dir / name
    command = [
        sys.executable,
        "train.py",
        *CONTENDERS[name],
        *overrides,
        f"sampler.num_negatives={args.negatives}",
        f"loss.num_clusters={args.clusters}" if name.startswith("edrep") else None,
        # Lightning's "DD:HH:MM:SS" form (a Hydra dict would reach it as a DictConfig).
        f'+trainer.max_time="00:00:{args.seconds // 60:02d}:{args.seconds % 60:02d}"',
        "trainer.max_epochs=100000",
        "callbacks.early_stopping.patience=100000",
        "callbacks.progress_bar.refresh_rate=0",
        "logger=none",
        f"seed={args.seed}",
        f"hydra.run.dir={run_dir}",
    ]
    if name == "full":  # the exact loss draws no negatives
        command.remove(f"sampler.num_negatives={args.negatives}")
    done = subprocess.run(
        [c for c in command if c], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads((run_dir / "results.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    parser.add_argument("--seconds", type=int, default=60, help="training budget per run")
    parser.add_argument(
        "--contenders", nargs="+", choices=sorted(CONTENDERS), default=list(CONTENDERS)
    )
    parser.add_argument("--negatives", type=int, default=32)
    parser.add_argument("--clusters", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    args = parser.parse_args()
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="bench_edrep_"))

    print(
        f"{args.seconds} s of training per run, {args.negatives} negatives for the sampled "
        f"softmax, {args.clusters} EDRep clusters, seed {args.seed}; overrides: "
        f"{' '.join(args.overrides) or '(none)'}\n"
    )
    results = {name: run(name, args.overrides, args, out_dir) for name in args.contenders}
    curves = {
        name: [row["val/ndcg@10"] for row in _epochs(out_dir / name)]
        for name, result in results.items()
        if "error" not in result
    }
    # Validation NDCG@10 after the same number of epochs for all: progress per epoch, which a
    # busy machine (slower epochs for some runs) does not distort.
    common = min((len(curve) for curve in curves.values()), default=0)
    print(
        f"| objective | test NDCG@10 | test HR@10 | epochs | s/epoch | val NDCG@10 after "
        f"{common} epochs |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, result in results.items():
        if "error" in result:
            print(f"| {name} | failed: {result['error']} | | | | |")
            continue
        metrics = result["metrics"]
        at_common = f"{curves[name][common - 1]:.4f}" if common else "-"
        print(
            f"| {name} | {metrics['test/ndcg@10']:.4f} | {metrics['test/hr@10']:.4f} | "
            f"{result['epochs_run']} | {result['seconds_per_epoch']:.2f} | {at_common} |"
        )


def _epochs(run_dir: Path) -> list[dict[str, float]]:
    """The rows of a run's ``epochs.csv`` that hold validation metrics."""
    with (run_dir / "epochs.csv").open() as handle:
        rows = [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(handle)]
    return [row for row in rows if "val/ndcg@10" in row]


if __name__ == "__main__":
    main()
