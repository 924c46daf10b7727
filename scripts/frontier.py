"""The samplers' quality-time frontier: train every configuration of a task, one run at a time,
then draw validation quality against cumulative seconds and time each run to 90/95/97% of the
exact softmax's best.

Two tasks: ``seqrec`` is ``experiment=synthetic-100k`` (SASRec, 100k items, validation NDCG@10)
and ``xc`` is ``experiment=xc-synthetic-100k`` (100k labels, validation P@1). Each trains the
exact softmax; uniform and popularity sampling with 256, 1,024 and 4,096 negatives, drawn per
query and shared by the batch; in-batch negatives; MIDX without exact top cells at 32, 64 and 256
negatives, MIDX as configured by default (exact top cells sized from the catalog) at the task's
negatives and at 256, and both MIDX variants with 1,024 negatives shared by the batch; and the
kernel, SIR, DNS and LSH samplers at 256 (SIR and DNS from uniform pools of 512); and the
objectives gBCE (256 uniform negatives) and Scalable Cross-Entropy (``seqrec`` only).

Runs go to ``OUT/TASK/LABEL``, and the report of :mod:`recsys_midx.app.summarize`
(``summary.md``, ``time_to_quality.md``, ``val_quality_vs_time.png``...) to ``OUT/TASK``. A run
that finished (its ``results.json`` exists) is kept and an interrupted one resumes from its last
checkpoint, so running the command again continues the sweep; ``--max-minutes`` caps each run's
training time (a run that needs longer than the exact softmax to reach its quality is off the
frontier anyway).

Example:
    python scripts/frontier.py --task seqrec --threads 2
    python scripts/frontier.py --task xc --threads 2 --only full midx uniform-256
    python scripts/frontier.py --task seqrec --dry-run
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The experiment (conf/experiment) of each task.
EXPERIMENTS = {"seqrec": "synthetic-100k", "xc": "xc-synthetic-100k"}
#: Negatives per query (or per batch, shared) of the fixed-proposal samplers.
FIXED_NEGATIVES = (256, 1024, 4096)
#: Negatives of MIDX without exact top cells.
MIDX_NEGATIVES = (32, 64, 256)
#: Negatives of MIDX with its default exact top cells beside the task's own, and of the
#: competitors from the MIDX paper.
CHALLENGER_NEGATIVES = 256
#: Negatives of MIDX shared by the batch.
SHARED_MIDX_NEGATIVES = 1024
#: The large-catalog objectives of sequential recommendation beside the sampled softmax:
#: gSASRec's gBCE on uniform negatives, as its authors train it, and Scalable Cross-Entropy,
#: which picks its candidates by random-projection buckets and draws nothing from the sampler.
OBJECTIVES = {
    f"gbce-{CHALLENGER_NEGATIVES}": [
        "loss=gbce",
        "sampler=uniform",
        f"sampler.num_negatives={CHALLENGER_NEGATIVES}",
    ],
    "sce": ["loss=sce"],
}


def configurations(task: str) -> dict[str, list[str]]:
    """Each run's label and its ``train.py`` overrides for ``task`` (one of :data:`EXPERIMENTS`),
    the exact softmax (the reference) first and the costliest runs (per-query draws, the kernel
    sampler) last."""
    runs = {"full": ["sampler=full"], "midx": ["sampler=midx"]}
    runs[f"midx-{CHALLENGER_NEGATIVES}"] = [
        "sampler=midx",
        f"sampler.num_negatives={CHALLENGER_NEGATIVES}",
    ]
    for negatives in MIDX_NEGATIVES:
        runs[f"midx_plain-{negatives}"] = [
            "sampler=midx_plain",
            f"sampler.num_negatives={negatives}",
        ]
    for name in ("sir", "dns", "lsh", "inbatch"):
        runs[name] = [f"sampler={name}", f"sampler.num_negatives={CHALLENGER_NEGATIVES}"]
    for name in ("sir", "dns"):  # their uniform pool, twice the negatives kept from it
        runs[name].append(f"sampler.pool_size={2 * CHALLENGER_NEGATIVES}")
    for shared in (True, False):
        for negatives in FIXED_NEGATIVES:
            for family in ("uniform", "popularity"):
                label = f"{family}-{negatives}" + ("-shared" if shared else "")
                runs[label] = [
                    f"sampler={family}",
                    f"sampler.num_negatives={negatives}",
                    f"negatives={'shared' if shared else 'per_query'}",
                ]
    for name in ("midx", "midx_plain"):
        runs[f"{name}-{SHARED_MIDX_NEGATIVES}-shared"] = [
            f"sampler={name}",
            f"sampler.num_negatives={SHARED_MIDX_NEGATIVES}",
            "negatives=shared",
        ]
    if task == "seqrec":
        runs.update(OBJECTIVES)
    # Last: the kernel sampler scores a block of items per draw, the costliest epoch of the
    # sweep (docs/archive/results-2026-11.md, "The quality-time frontier", has the times).
    runs["kernel"] = ["sampler=kernel", f"sampler.num_negatives={CHALLENGER_NEGATIVES}"]
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(EXPERIMENTS), required=True)
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="LABEL",
        help="train only these runs (default: all); the report covers every "
        "finished run of the task",
    )
    parser.add_argument(
        "--max-minutes", type=int, default=60, help="training time limit per run (default 60)"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="CPU threads of each run (runs go one at a time)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="train.py overrides added to every run, e.g. task.module.table_optimizer=null",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "multirun" / "frontier")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the training commands and exit"
    )
    args = parser.parse_args(argv)
    runs = configurations(args.task)
    unknown = sorted(set(args.only or ()) - set(runs))
    if unknown:
        parser.error(f"--only: unknown runs {', '.join(unknown)}; choose from {', '.join(runs)}")
    if args.max_minutes < 1:
        parser.error(f"--max-minutes must be >= 1, got {args.max_minutes}")
    return args


def command(args: argparse.Namespace, label: str, overrides: list[str]) -> list[str]:
    """The ``train.py`` command of one run."""
    hours, minutes = divmod(args.max_minutes, 60)
    return [
        sys.executable,
        str(ROOT / "train.py"),
        f"experiment={EXPERIMENTS[args.task]}",
        *overrides,
        *args.overrides,
        f"seed={args.seed}",
        f"threads={args.threads}",
        "resume=auto",
        f"+trainer.max_time=00:{hours:02d}:{minutes:02d}:00",
        "callbacks.progress_bar.refresh_rate=0",
        f"hydra.run.dir={args.out / args.task / label}",
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    chosen = {
        label: overrides
        for label, overrides in configurations(args.task).items()
        if args.only is None or label in args.only
    }
    task_dir = args.out / args.task
    failed = []
    for label, overrides in chosen.items():
        line = command(args, label, overrides)
        if args.dry_run:
            print(shlex.join(line))
            continue
        if (task_dir / label / "results.json").exists():
            print(f"{label}: done before, kept", flush=True)
            continue
        print(f"{label}: training", flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        done = subprocess.run(line, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            failed.append(label)
            print(f"{label} failed:\n{done.stderr[-2000:]}", file=sys.stderr, flush=True)
    if args.dry_run:
        return
    from recsys_midx.app.summarize import main as summarize

    summarize([str(task_dir)])
    if failed:
        raise SystemExit(f"failed runs: {', '.join(failed)}")


if __name__ == "__main__":
    main()
