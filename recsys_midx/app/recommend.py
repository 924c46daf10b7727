"""Top-k recommendations of a trained sequential recommender, in the raw ids of the user's data.

``recommend(run, users=["u1", "u2"], k=10)`` ranks the whole catalog for each user's next item,
by the model's own ranking scores (the evaluation's order, output head included), from the
user's full history (training, validation and test items: "what comes next"), leaving out the
items already in the history. Users are scored in batches and the catalog in chunks, each
chunk's top items merged with the best so far, so scoring memory stays bounded whatever the
number of users and items; :func:`recommendation_batches` hands the batches over one at a time,
and the command line writes each as it comes.

Command line (``--all`` for every user, ``--histories-file`` for new users)::

    python -m recsys_midx.app.recommend RUN_DIR --users u1 u2 --k 10 --out recs.parquet
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, TextIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from recsys_midx.app.trained import LoadedRun, RunLike, UnknownIdsError, as_loaded_run
from recsys_midx.data.train_samples import left_padded_windows
from recsys_midx.lit.seqrec import SeqRecModule
from recsys_midx.metrics import top_labels
from recsys_midx.scoring import RankingQueries

__all__ = ["COLUMNS", "history_queries", "main", "recommend", "recommendation_batches"]

#: Columns of :func:`recommend`'s frame.
COLUMNS = ("user", "rank", "item", "score")

Histories = Sequence[Sequence[object]] | Mapping[object, Sequence[object]]


def recommend(
    run: RunLike,
    users: Sequence[object] | Literal["all"] | None = None,
    histories: Histories | None = None,
    k: int = 10,
    exclude_seen: bool = True,
    batch_size: int = 256,
    chunk_size: int = 65536,
    device: str | torch.device | None = None,
) -> pd.DataFrame:
    """The ``k`` best next items of known users or of given histories, in raw ids.

    Items are ranked by the model's ranking scores (:meth:`~recsys_midx.lit.base.CatalogModule.
    ranking_queries`, the order the evaluation ranks by): for a single-query head the dot
    product of the (head-projected) query with the item vector, which any increasing logit
    transform (sigsoftmax, PLIF) and the temperature leave in the same order; for a mixture of
    softmaxes (``head=mos``, ``head=mos_plif``) the log-probability. Scores are comparable
    within one run, not probabilities.

    Args:
        run: a run folder of ``train.py`` or a run from :func:`~recsys_midx.app.trained.load_run`
            (its module is moved to ``device`` when one is given).
        users: raw user ids of the run's dataset (``str()`` of each must be a raw id as in the
            processed ``user_map.parquet``), or ``"all"`` for every user of the split. A user's
            history is its full sequence: training items, validation and test targets.
        histories: for new or anonymous users, a list of raw item id lists (each oldest first;
            users are then labelled ``0, 1, ...``) or a mapping ``label -> raw item ids``. Every
            item must be in the run's catalog: unknown ones raise one error naming them.
        k: items per user; with ``exclude_seen`` a user whose history leaves fewer than ``k``
            unseen items gets only those.
        exclude_seen: leave the items of each user's history out of its recommendations.
        batch_size: users encoded and scored at once.
        chunk_size: items scored at once (memory is ``O(batch_size * chunk_size)``).
        device: where to score (``"cpu"``, ``"cuda"``, ...); default where the run's module is
            (the CPU after :func:`~recsys_midx.app.trained.load_run`).

    Returns:
        A frame with columns ``user`` (the raw user id as the id map holds it, or the history's
        label), ``rank`` (``1..k``), ``item`` (raw item id, a string as in the processed
        ``item_map.parquet``) and ``score`` (float32), ``k`` rows per user by increasing rank,
        users in the order given.

    Raises:
        ValueError: neither or both of ``users`` and ``histories``, ``k`` outside
            ``1..num_items``, a non-positive batch or chunk size, an empty history, or a run
            that is not a sequential recommender.
        UnknownIdsError: (a ``KeyError``) naming unknown raw user or item ids, or users the
            split dropped.

    Example:
        ```python
        recs = recommend("outputs/2026-01-01/12-00-00", users=["u1", "u2"], k=10)
        recs.head(2)
        # user  rank   item     score
        # 0   u1     1  i0042  7.123456
        # 1   u1     2  i0007  6.987654
        ```
    """
    frames = list(
        recommendation_batches(
            run, users, histories, k, exclude_seen, batch_size, chunk_size, device
        )
    )
    if not frames:
        return _empty_frame()
    return pd.concat(frames, ignore_index=True)


def recommendation_batches(
    run: RunLike,
    users: Sequence[object] | Literal["all"] | None = None,
    histories: Histories | None = None,
    k: int = 10,
    exclude_seen: bool = True,
    batch_size: int = 256,
    chunk_size: int = 65536,
    device: str | torch.device | None = None,
) -> Iterator[pd.DataFrame]:
    """:func:`recommend`'s frame one batch of ``batch_size`` users at a time.

    A caller that writes each batch out as it comes (as the command line does) holds one
    batch's recommendations, not every user's. The arguments, ids and histories are checked
    before this returns, so every error :func:`recommend` raises is raised here too, before the
    first batch is scored.

    Args:
        run: as for :func:`recommend`.
        users: as for :func:`recommend`.
        histories: as for :func:`recommend`.
        k: as for :func:`recommend`.
        exclude_seen: as for :func:`recommend`.
        batch_size: users per frame, encoded and scored at once.
        chunk_size: as for :func:`recommend`.
        device: as for :func:`recommend`.

    Returns:
        An iterator of frames with :func:`recommend`'s columns, users in the order given; none
        when no user is asked for.

    Raises:
        ValueError: as :func:`recommend`.
        UnknownIdsError: as :func:`recommend`.

    Example:
        ```python
        for frame in recommendation_batches("outputs/2026-01-01/12-00-00", users="all"):
            frame.to_csv(sys.stdout, index=False, header=False)
        ```
    """
    run = as_loaded_run(run)
    if not isinstance(run.module, SeqRecModule):
        raise ValueError("recommend needs a sequential recommendation run (task=seqrec)")
    num_items = run.datamodule.num_items
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= num_items:
        raise ValueError(f"k must be an integer in 1..{num_items}, got {k!r}")
    for name, value in (("batch_size", batch_size), ("chunk_size", chunk_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    labels, sequences = _requests(run, users, histories)
    if device is not None:
        run.module.to(torch.device(device))
    return _frames(run, labels, sequences, k, exclude_seen, batch_size, chunk_size)


def _frames(
    run: LoadedRun,
    labels: list[object],
    sequences: list[np.ndarray],
    k: int,
    exclude_seen: bool,
    batch_size: int,
    chunk_size: int,
) -> Iterator[pd.DataFrame]:
    """Recommendations of ``batch_size`` users at a time (:func:`recommendation_batches`)."""
    for first in range(0, len(sequences), batch_size):
        batch = sequences[first : first + batch_size]
        ranking = history_queries(run, batch, chunk_size)
        scores, ids = _top_items(ranking, run, batch, k, exclude_seen, chunk_size)
        rows, ranks = np.nonzero(ids > 0)
        yield pd.DataFrame(
            {
                "user": pd.Series([labels[first + row] for row in rows], dtype=object),
                "rank": (ranks + 1).astype(np.int64),
                "item": run.items.raw[ids[rows, ranks]],
                "score": scores[rows, ranks].astype(np.float32),
            }
        )


def _empty_frame() -> pd.DataFrame:
    """:func:`recommend`'s frame with no rows."""
    return pd.DataFrame(
        {
            name: pd.Series(dtype=dtype)
            for name, dtype in zip(COLUMNS, (object, np.int64, object, np.float32))
        }
    )


@torch.no_grad()
def history_queries(
    run: LoadedRun, histories: Sequence[np.ndarray], chunk_size: int = 65536
) -> RankingQueries:
    """The ranking queries of internal-id histories, as the evaluation computes them.

    Each history is cut to its last ``max_len`` items (left-padded), encoded, and passed through
    the head (:meth:`~recsys_midx.lit.base.CatalogModule.ranking_queries`).

    Args:
        run: a loaded sequential recommendation run (scored on its module's device).
        histories: ``int64`` arrays of internal item ids, oldest first, none empty.
        chunk_size: items scored at once where the head needs catalog normalisers (MoS).

    Returns:
        :class:`~recsys_midx.scoring.RankingQueries`: ``[B, D]`` queries, or ``[B, K, D]`` queries
        with ``[B, K]`` log-weights (and a transform) for a mixture, ready for
        :func:`~recsys_midx.metrics.top_labels`.

    Example:
        ```python
        queries = history_queries(run, run.histories(run.users.internal(["u1"]))).queries
        ```
    """
    lengths = np.fromiter((len(h) for h in histories), dtype=np.int64, count=len(histories))
    ends = np.cumsum(lengths)
    flat = np.concatenate(histories) if len(histories) else np.zeros(0, dtype=np.int64)
    inputs = left_padded_windows(flat, ends - lengths, ends, run.datamodule.max_len)
    module = run.module
    module.eval()
    query = module.encode({"inputs": torch.from_numpy(inputs).to(module.device)})
    return module.ranking_queries(query, chunk_size)


def _requests(
    run: LoadedRun, users: Sequence[object] | str | None, histories: Histories | None
) -> tuple[list[object], list[np.ndarray]]:
    """Labels and internal-id histories of the users asked for."""
    if (users is None) == (histories is None):
        raise ValueError("give exactly one of users (raw user ids, or 'all') and histories")
    if users is not None:
        if isinstance(users, str):
            if users != "all":
                raise ValueError(f"users must be a list of raw user ids or 'all', got {users!r}")
            internal = run.all_user_ids()
        else:
            internal = run.users.internal(users)
        return list(run.users.raw[internal]), run.histories(internal)
    assert histories is not None
    if isinstance(histories, Mapping):
        labels, raw_lists = list(histories), list(histories.values())
    else:
        labels, raw_lists = list(range(len(histories))), list(histories)
    empty = [label for label, items in zip(labels, raw_lists) if len(items) == 0]
    if empty:
        raise ValueError(f"histories must not be empty; empty for: {', '.join(map(repr, empty))}")
    flat = run.items.internal(item for items in raw_lists for item in items)
    return labels, np.split(flat, np.cumsum([len(items) for items in raw_lists])[:-1])


def _top_items(
    ranking: RankingQueries,
    run: LoadedRun,
    histories: Sequence[np.ndarray],
    k: int,
    exclude_seen: bool,
    chunk_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``[B, k]`` scores and internal ids of the best items, 0 where fewer than ``k`` remain."""
    num_items = run.datamodule.num_items
    seen = [np.unique(h) for h in histories] if exclude_seen else []
    # A user's top k unseen items are among its top k + (number of distinct seen items).
    extra = max((len(s) for s in seen), default=0)
    width = min(k + extra, num_items)
    scores_t, ids_t = top_labels(
        ranking.queries,
        run.module.encoder.item_table,
        width,
        chunk_size,
        ranking.log_weights,
        ranking.transform,
    )
    scores, ids = scores_t.cpu().numpy(), ids_t.cpu().numpy()
    if not exclude_seen:
        return scores, ids
    rows = np.arange(len(histories))
    stride = num_items + 1
    seen_keys = np.concatenate([row * stride + s for row, s in zip(rows, seen)])
    is_seen = np.isin(rows[:, None] * stride + ids, seen_keys)
    # Unseen candidates first, each group keeping its score order.
    order = np.argsort(is_seen, axis=1, kind="stable")[:, :k]
    kept = ~np.take_along_axis(is_seen, order, axis=1)
    ids = np.where(kept, np.take_along_axis(ids, order, axis=1), 0)
    scores = np.where(kept, np.take_along_axis(scores, order, axis=1), -np.inf)
    return scores, ids


def _read_histories(path: Path) -> Histories:
    """A JSON file: a list of raw item id lists, or an object ``label -> raw item id list``."""
    content = json.loads(path.read_text())
    if isinstance(content, dict) and all(isinstance(v, list) for v in content.values()):
        return content
    if isinstance(content, list) and all(isinstance(v, list) for v in content):
        return content
    raise ValueError(
        f"--histories-file {path}: expected a JSON list of item id lists or an object mapping "
        "each user label to its item id list"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recsys-midx-recommend",
        description="Top-k next-item recommendations of a trained run, in raw ids.",
    )
    parser.add_argument("run_dir", type=Path, help="the run folder of train.py")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--users", nargs="+", metavar="USER", help="raw user ids of the dataset")
    who.add_argument("--all", action="store_true", help="every user of the run's split")
    who.add_argument(
        "--histories-file",
        type=Path,
        metavar="F",
        help="JSON: a list of raw item id lists, or {label: [raw item ids]}",
    )
    parser.add_argument("--k", type=int, default=10, help="items per user (default 10)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output file, .parquet or .csv (default: CSV on stdout)",
    )
    parser.add_argument(
        "--include-seen",
        action="store_true",
        help="keep items of the user's history in its recommendations",
    )
    parser.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    parser.add_argument("--batch-size", type=int, default=256, help="users scored at once")
    parser.add_argument("--chunk-size", type=int, default=65536, help="items scored at once")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the run's dataset lives, if not where its config says",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write the recommendations of a run to Parquet or CSV.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0; errors (unknown users or items, bad arguments) exit with status 2 and one line.

    Example:
        ```python
        main(["outputs/run", "--users", "u1", "u2", "--k", "10", "--out", "recs.parquet"])
        # 0
        ```
    """
    from recsys_midx.app.trained import load_run

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.out is not None and args.out.suffix not in (".parquet", ".csv"):
            raise ValueError(f"--out must end with .parquet or .csv, got {args.out}")
        histories = _read_histories(args.histories_file) if args.histories_file else None
        run = load_run(args.run_dir, args.data_dir)
        batches = recommendation_batches(
            run,
            users="all" if args.all else args.users,
            histories=histories,
            k=args.k,
            exclude_seen=not args.include_seen,
            batch_size=args.batch_size,
            chunk_size=args.chunk_size,
            device=args.device,
        )
    except (UnknownIdsError, ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if args.out is None:
        _write_csv(batches, sys.stdout)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.out.suffix == ".parquet":
            _write_parquet(batches, args.out)
        else:
            with args.out.open("w", newline="") as stream:
                _write_csv(batches, stream)
    return 0


def _write_csv(batches: Iterator[pd.DataFrame], stream: TextIO) -> None:
    """Write the frames to ``stream`` as one CSV table, each as it comes."""
    header = True
    for frame in batches:
        frame.to_csv(stream, index=False, header=header)
        header = False
    if header:
        _empty_frame().to_csv(stream, index=False)


def _write_parquet(batches: Iterator[pd.DataFrame], path: Path) -> None:
    """Write the frames to one Parquet file, a row group per frame as it comes."""
    writer = None
    try:
        for frame in batches:
            if writer is None:
                schema = pa.Schema.from_pandas(frame, preserve_index=False)
                writer = pq.ParquetWriter(path, schema)
            writer.write_table(
                pa.Table.from_pandas(frame, schema=writer.schema, preserve_index=False)
            )
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        _empty_frame().to_parquet(path, index=False)


if __name__ == "__main__":
    sys.exit(main())
