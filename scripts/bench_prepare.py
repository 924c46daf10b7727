"""Time and peak memory of preparing a large dataset from its raw CSV, streamed.

``--shape ml-20m`` (default) writes a synthetic ``ratings.csv`` in ml-20m's format (header
``userId,movieId,rating,timestamp``, rows grouped by user, movies ascending within a user,
half-star ratings, second timestamps) and shape (138,493 users with at least 20 ratings each,
~26.7k movies with sparse ids up to 131,262, ~20M rows, ~0.5 GB) and prepares it as the ``ml-20m``
MovieLens variant. ``--shape amazon-books`` writes ``ratings_Books.csv`` in the Amazon 2014
format (no header, ``user,item,rating,timestamp``, text ids, rows grouped by item) and shape
(22.5M rows, ~8M reviewers, ~2.3M products) and prepares it as Amazon Books. Either way the
file goes to a temporary folder, is prepared (``raw_dir``, default 5-core) in a fresh process,
and the script prints that process's wall time and peak RSS (the log lines give each phase).

    python scripts/bench_prepare.py                       # ml-20m size
    python scripts/bench_prepare.py --rows 2000000        # a quicker run
    python scripts/bench_prepare.py --shape amazon-books
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

ML20M_USERS = 138_493
ML20M_MOVIES = 26_744
ML20M_MAX_MOVIE_ID = 131_262
ML20M_ROWS = 20_000_263
_START, _END = 789_652_009, 1_427_784_002  # ml-20m's first and last timestamps
BOOKS_USERS, BOOKS_ITEMS, BOOKS_ROWS = 8_026_324, 2_330_066, 22_507_155


def write_ratings(path: Path, rows: int, seed: int = 0) -> int:
    """Write an ml-20m-shaped ratings.csv of about ``rows`` rows; returns the exact count."""
    rng = np.random.default_rng(seed)
    users = max(1, round(ML20M_USERS * rows / ML20M_ROWS))
    # Every ml-20m user has >= 20 ratings; the excess is heavy-tailed (mean ~144 in total).
    excess = rng.pareto(1.5, users)
    lengths = 20 + np.floor(excess / excess.sum() * max(rows - 20 * users, 0)).astype(np.int64)
    movie_ids = np.sort(
        rng.choice(np.arange(1, ML20M_MAX_MOVIE_ID + 1), ML20M_MOVIES, replace=False)
    )
    popularity = 1.0 / np.arange(1, ML20M_MOVIES + 1) ** 0.9
    popularity = rng.permutation(popularity / popularity.sum())
    # Popular movies repeat within a user: draw more than needed, keep one rating per (user,
    # movie), then sample the wanted number of rows (keeping the file's order).
    user = np.repeat(np.arange(1, users + 1, dtype=np.int64), np.ceil(lengths * 1.5).astype(int))
    movie = movie_ids[rng.choice(ML20M_MOVIES, len(user), p=popularity)]
    key = np.unique(user * (ML20M_MAX_MOVIE_ID + 1) + movie)
    if len(key) > rows:
        key = key[np.sort(rng.choice(len(key), rows, replace=False))]
    user, movie = key // (ML20M_MAX_MOVIE_ID + 1), key % (ML20M_MAX_MOVIE_ID + 1)
    n = len(key)
    table = pa.table(
        {
            "userId": user,
            "movieId": movie,
            # Half stars written as ml-20m writes them ("3.5", "4.0").
            "rating": pa.array(np.char.mod("%.1f", rng.integers(1, 11, n) / 2.0)),
            "timestamp": rng.integers(_START, _END, n),
        }
    )
    pacsv.write_csv(table, path, pacsv.WriteOptions(quoting_style="none"))
    return n


def write_amazon_books(path: Path, rows: int, seed: int = 0) -> int:
    """Write an Amazon-Books-shaped ratings_Books.csv of ``rows`` rows; returns the count."""
    rng = np.random.default_rng(seed)
    users = max(1, round(BOOKS_USERS * rows / BOOKS_ROWS))
    items = max(1, round(BOOKS_ITEMS * rows / BOOKS_ROWS))
    # Half the rows spread uniformly (most reviewers and products occur, many once: the long
    # tail), half from a power law (the active head); the file groups each product's ratings.
    item = np.sort(_long_tailed(rng, items, rows))
    user = _long_tailed(rng, users, rows)
    reviewer = pc.binary_join_element_wise(
        "A", pc.utf8_lpad(pa.array(user).cast(pa.string()), 13, "0"), ""
    )
    # Books are ISBN-like (leading zeros); a few items are "B0..." ASINs.
    isbn = pc.utf8_lpad(pa.array(item).cast(pa.string()), 10, "0")
    asin = pc.if_else(pa.array(item % 10 == 0), pc.binary_join_element_wise("B", isbn, ""), isbn)
    table = pa.table(
        {
            "user": reviewer,
            "item": asin,
            "rating": pa.array(np.char.mod("%.1f", rng.integers(1, 6, rows).astype(float))),
            "timestamp": rng.integers(_START, _END, rows),
        }
    )
    pacsv.write_csv(table, path, pacsv.WriteOptions(include_header=False, quoting_style="none"))
    return rows


def _long_tailed(rng: np.random.Generator, size: int, rows: int) -> np.ndarray:
    """``rows`` ids in ``0..size-1``: half uniform, half Zipf-distributed, shuffled together."""
    head = (np.minimum(rng.zipf(1.3, rows - rows // 2), size) - 1) * 7919 % size
    return rng.permutation(np.concatenate([rng.integers(0, size, rows // 2), head]))


SHAPES = {
    "ml-20m": ("ratings.csv", write_ratings, ML20M_ROWS),
    "amazon-books": ("ratings_Books.csv", write_amazon_books, BOOKS_ROWS),
}


def _peak_rss() -> int:
    """This process's peak resident memory in bytes.

    VmHWM belongs to the current program image; ``ru_maxrss`` would also count the parent's
    pages that a freshly started child carried until its exec.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def prepare(folder: Path, shape: str) -> dict[str, float]:
    """Prepare the file in ``folder`` (into ``folder/data``); wall seconds and peak RSS."""
    from recsys_midx.data import Amazon, MovieLens  # only the measured child imports it

    logging.basicConfig(level=logging.INFO, format="  %(message)s", stream=sys.stderr)
    if shape == "ml-20m":
        source = MovieLens("ml-20m-bench", "ml-20m", url=None, md5=None, raw_dir=str(folder))
    else:
        source = Amazon("amazon-books-bench", "Books", raw_dir=str(folder))
    start = time.perf_counter()
    dataset = source.prepare(folder / "data")
    seconds = time.perf_counter() - start
    peak = _peak_rss()
    stats = dataset.stats
    return {
        "seconds": seconds,
        "peak_rss": peak,
        "raw_rows": stats["rows_after_step"]["input"],
        "users": stats["users"],
        "items": stats["items"],
        "interactions": stats["interactions"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="ml-20m")
    parser.add_argument("--rows", type=int, help="rows of the file (default: the real count)")
    parser.add_argument("--repeat", type=int, default=2, help="preparations to time")
    parser.add_argument("--prepare-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare_only is not None:
        print(json.dumps(prepare(args.prepare_only, args.shape)))
        return

    file_name, write, default_rows = SHAPES[args.shape]
    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        rows = write(folder / file_name, args.rows or default_rows)
        size_mb = (folder / file_name).stat().st_size / 2**20
        print(
            f"wrote {rows:,} rows ({size_mb:,.0f} MiB) in {time.perf_counter() - start:.1f} s",
            flush=True,
        )
        for run in range(args.repeat):
            # A fresh process per run: its peak RSS is the preparation's alone.
            child = subprocess.run(
                [sys.executable, __file__, "--shape", args.shape, "--prepare-only", str(folder)],
                stdout=subprocess.PIPE,
                text=True,
                check=True,
            )
            result = json.loads(child.stdout)
            print(
                f"run {run + 1}: {result['seconds']:.1f} s, peak RSS "
                f"{result['peak_rss'] / 2**30:.2f} GiB; {result['raw_rows']:,} rows -> "
                f"{result['users']:,} users, {result['items']:,} items, "
                f"{result['interactions']:,} interactions",
                flush=True,
            )
            shutil.rmtree(folder / "data")


if __name__ == "__main__":
    main()
