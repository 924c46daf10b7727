"""Export a trained run's item vectors, a faiss index and its query encoder, for serving.

``export_items(run, "export/")`` writes four files:

``items.parquet``
    One row per item, in internal id order: ``item`` (string, the raw id as in the processed
    ``item_map.parquet``), ``item_id`` (int32, the internal id ``1..N``: what the query encoder
    takes) and ``embedding`` (a fixed-size list of ``D`` float32: the vector the model ranks the
    item with).
``items.faiss``
    A faiss index of the same vectors, row ``r`` being row ``r`` of ``items.parquet``; by default
    an exact inner-product ``IndexFlatIP``, or an approximate ``IndexIVFFlat`` or
    ``IndexHNSWFlat`` (:class:`~recsys_midx.inference.ann.IndexSpec`). Searching it with a user's
    ranking query gives the model's own top-k (exactly, for the exact index).
``encoder.pt``
    The query encoder in TorchScript (:func:`~recsys_midx.inference.query_encoder.
    trace_query_encoder`): ``[B, max_len]`` left-padded internal item ids (0: padding) to the
    ``[B, D]`` ranking queries; ``torch.jit.load`` reads it without this package.
``export.json``
    ``dimension``, ``metric`` (``"inner_product"``), ``num_items``, ``index``, ``index_kind``,
    ``index_type`` and ``index_parameters``, ``items`` (the id mapping file), ``row_order``
    (index row ``r`` is ``items.parquet`` row ``r``), ``id_column`` / ``item_id_column`` /
    ``embedding_column``, ``encoder``, ``encoder_format`` and ``max_len``, ``head``,
    ``temperature`` and ``transforms_logits`` (the softmax is ``softmax(transform(q . v /
    temperature))``; the inner product alone gives the ranking), ``run_dir`` and
    ``checkpoint``; and ``quality``: for an approximate index its recall@10 against the exact
    top-10 and both indexes' queries per second on the same queries (``null`` for the exact
    index).

Heads whose ranking is an inner product of one query with the item table are exported: the
plain dot product, sigsoftmax and PLIF (increasing transforms keep the order), and MoE (its
query is projected, the items are not). A mixture of softmaxes ranks by a log-sum-exp over
several queries, which no single inner-product index reproduces: it is refused.

Command line::

    python -m recsys_midx.app.export RUN_DIR --out DIR [--index exact|ivf|hnsw] [--nlist N]
        [--nprobe N] [--hnsw-m M] [--ef-search N] [--ef-construction N] [--index-factory S]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from recsys_midx.app.recommend import history_queries
from recsys_midx.app.trained import LoadedRun, RunLike, as_loaded_run
from recsys_midx.inference.ann import (
    INDEX_KINDS,
    IndexSpec,
    build_factory_index,
    build_index,
    item_like_queries,
    measure_index,
)
from recsys_midx.inference.query_encoder import trace_query_encoder

__all__ = ["ENCODER_FILE", "EXPORT_FILE", "INDEX_FILE", "ITEMS_FILE", "export_items", "main"]

ITEMS_FILE = "items.parquet"
INDEX_FILE = "items.faiss"
ENCODER_FILE = "encoder.pt"
EXPORT_FILE = "export.json"
#: Users whose queries measure an approximate index (a random sample when there are more).
MEASURED_USERS = 2000
#: The depth of the measured recall.
RECALL_AT = 10


def export_items(
    run: RunLike,
    out_dir: str | Path,
    index_factory: str | None = None,
    index: IndexSpec | None = None,
    measured_users: int = MEASURED_USERS,
) -> Path:
    """Write a run's item vectors with raw ids (Parquet), a faiss index, the query encoder
    (TorchScript) and ``export.json``.

    See the module docstring for the files and their columns. An approximate index is measured
    before anything is written: its recall@10 against the exact top-10 and the queries per
    second of both indexes, on the ranking queries of up to ``measured_users`` users of the run
    (their full histories, as :func:`~recsys_midx.recommend` serves them; no item is left out
    as seen), or on random item-like queries if the run has no users.

    Args:
        run: a run folder of ``train.py`` or a run from :func:`~recsys_midx.app.trained.load_run`.
        out_dir: the folder to write (created if missing; existing files are replaced).
        index_factory: a faiss index factory string (e.g. ``"IVF256,PQ16"``) built with the
            inner-product metric, instead of ``index``.
        index: the index to build (:class:`~recsys_midx.inference.ann.IndexSpec`); default the
            exact ``IndexFlatIP``.
        measured_users: at most this many users' queries measure an approximate index.

    Returns:
        The path of ``export.json``.

    Raises:
        ValueError: if the run is not a sequential recommender, its head ranks by a mixture of
            several queries (``head=mos``), which an inner-product index cannot reproduce, or
            the index settings do not fit the catalog (one line naming the option); nothing is
            written then.

    Example:
        ```python
        path = export_items("outputs/run", "export", index=IndexSpec("hnsw"))
        meta = json.loads(path.read_text())
        meta["quality"]["recall"], meta["quality"]["qps"], meta["quality"]["exact_qps"]
        ```
    """
    # Settings that need no catalog are refused before the run is loaded.
    _index_settings(index, index_factory, _ANY_CATALOG)
    run = as_loaded_run(run)
    _check_inner_product_ranking(run)
    vectors = run.module.encoder.item_table.detach().float().cpu()[1:].numpy()
    vectors = np.ascontiguousarray(vectors)
    num_items, dim = vectors.shape
    spec = _index_settings(index, index_factory, num_items)
    encoder = _traced_encoder(run)

    exact = build_index(vectors, IndexSpec())
    quality = None
    if index_factory is not None:
        built, index_type = build_factory_index(vectors, index_factory), index_factory
    elif spec.kind == "exact":
        built, index_type = exact, "IndexFlatIP"
    else:
        built = build_index(vectors, spec)
        index_type = type(built).__name__
    if built is not exact:
        queries = _measured_queries(run, vectors, measured_users)
        quality = measure_index(built, exact, queries[0], k=RECALL_AT)
        quality["query_source"] = queries[1]

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = np.arange(1, num_items + 1, dtype=np.int32)
    table = pa.table(
        {
            "item": pa.array(run.items.raw[ids].astype(str), type=pa.string()),
            "item_id": pa.array(ids, type=pa.int32()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim),
        }
    )
    pq.write_table(table, out_dir / ITEMS_FILE)
    faiss.write_index(built, str(out_dir / INDEX_FILE))
    torch.jit.save(encoder, str(out_dir / ENCODER_FILE))

    head = run.module.head
    meta: dict[str, Any] = {
        "dimension": dim,
        "metric": "inner_product",
        "num_items": num_items,
        "index": INDEX_FILE,
        "index_kind": "factory" if index_factory is not None else spec.kind,
        "index_type": index_type,
        "index_parameters": {} if index_factory is not None else spec.parameters(),
        "items": ITEMS_FILE,
        "row_order": f"row r of {INDEX_FILE} is row r of {ITEMS_FILE} (internal id r + 1)",
        "id_column": "item",
        "item_id_column": "item_id",
        "embedding_column": "embedding",
        "encoder": ENCODER_FILE,
        "encoder_format": "torchscript",
        "max_len": run.module.encoder.max_len,
        "padding": "left-padded with item id 0 to max_len items, the newest last",
        "head": head.name,
        "temperature": head.temperature,
        "transforms_logits": bool(head.transforms_logits),
        "quality": quality,
        "run_dir": str(run.config.paths.output_dir),
        "checkpoint": str(run.checkpoint),
    }
    path = out_dir / EXPORT_FILE
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path


#: A catalog size that no setting is too large for: settings checked against it fail only for
#: reasons that do not depend on the catalog.
_ANY_CATALOG = 1 << 62


def _index_settings(
    index: IndexSpec | None, index_factory: str | None, num_items: int
) -> IndexSpec:
    """The index spec resolved for ``num_items``; ``ValueError`` (one line) if it cannot be."""
    spec = (index or IndexSpec()).resolve(num_items)
    if index_factory is not None and spec.kind != "exact":
        raise ValueError(f"give --index-factory or --index {spec.kind}, not both")
    return spec


def _check_inner_product_ranking(run: LoadedRun) -> None:
    """Refuse runs whose ranking is not one inner product per user with the item table."""
    if not hasattr(run.datamodule, "user_sequences"):
        raise ValueError("export_items needs a sequential recommendation run (task=seqrec)")
    head = run.module.head
    dim = run.module.encoder.item_table.shape[1]
    with torch.no_grad():
        probe, _ = head.queries(torch.zeros(1, dim, device=run.module.device))
    if probe.dim() != 2:
        raise ValueError(
            f"head={head.name} ranks items by a mixture of {probe.shape[1]} queries: no single "
            "inner-product index reproduces its ranking, so its items are not exported"
        )


def _traced_encoder(run: LoadedRun) -> torch.jit.ScriptModule:
    """The run's query encoder in TorchScript, traced on the CPU (the module goes back after)."""
    module = run.module
    device = module.device
    module.cpu()
    try:
        return trace_query_encoder(module.encoder, module.head)
    finally:
        module.to(device)


def _measured_queries(
    run: LoadedRun, vectors: np.ndarray, measured_users: int
) -> tuple[np.ndarray, str]:
    """Ranking queries of up to ``measured_users`` users (a seeded sample), and their source."""
    users = run.all_user_ids()
    if len(users) == 0:
        return item_like_queries(vectors, measured_users), "random item-like queries"
    if len(users) > measured_users:
        users = np.sort(np.random.default_rng(0).choice(users, measured_users, replace=False))
    histories = run.histories(users)
    batches = [
        history_queries(run, histories[first : first + 256]).queries.float().cpu().numpy()
        for first in range(0, len(histories), 256)
    ]
    return np.concatenate(batches), "user histories"


def _summary(meta: dict[str, Any], out_dir: Path) -> str:
    """What the command prints: the index, and an approximate index's recall and speed."""
    parameters = ", ".join(f"{k}={v}" for k, v in meta["index_parameters"].items())
    lines = [
        f"index: {meta['index_type']}"
        + (f" ({parameters})" if parameters else "")
        + f" over {meta['num_items']} items of dimension {meta['dimension']}"
    ]
    quality = meta["quality"]
    if quality is not None:
        lines += [
            f"recall@{quality['k']} against the exact top-{quality['k']}: "
            f"{quality['recall']:.4f} on {quality['queries']} queries ({quality['query_source']})",
            f"queries per second ({_threads(quality['threads'])}, one batch): "
            f"{quality['qps']:,.0f} approximate, {quality['exact_qps']:,.0f} exact",
        ]
    lines.append(f"exported {out_dir}")
    return "\n".join(lines)


def _threads(count: int) -> str:
    return f"{count} thread" + ("" if count == 1 else "s")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: export a run's items, index and query encoder (see the module docstring).

    Prints the index built and, for an approximate one, its recall@10 and queries per second
    beside the exact index's.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0; errors exit with status 2 and one line.

    Example:
        ```python
        main(["outputs/run", "--out", "export", "--index", "hnsw"])
        # 0
        ```
    """
    from recsys_midx.app.trained import load_run

    parser = argparse.ArgumentParser(
        prog="recsys-midx-export",
        description="Export a trained run's item vectors (Parquet, raw ids), a faiss index and "
        "its query encoder (TorchScript).",
    )
    parser.add_argument("run_dir", type=Path, help="the run folder of train.py")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument(
        "--index",
        choices=INDEX_KINDS,
        default="exact",
        help="exact (IndexFlatIP, default), ivf (IndexIVFFlat) or hnsw (IndexHNSWFlat)",
    )
    ivf = "for --index ivf: "
    parser.add_argument(
        "--nlist", type=int, help=ivf + "inverted lists (default ~4*sqrt(items), >= 39 items each)"
    )
    parser.add_argument("--nprobe", type=int, help=ivf + "lists searched (default nlist/16)")
    hnsw = "for --index hnsw: "
    parser.add_argument("--hnsw-m", type=int, help=hnsw + "neighbours per node (default 32)")
    parser.add_argument("--ef-search", type=int, help=hnsw + "search breadth (default 128)")
    parser.add_argument("--ef-construction", type=int, help=hnsw + "build breadth (default 200)")
    parser.add_argument(
        "--index-factory",
        default=None,
        help="a faiss index factory string instead of --index (inner-product metric)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the run's dataset lives, if not where its config says",
    )
    args = parser.parse_args(argv)
    spec = IndexSpec(
        args.index, args.nlist, args.nprobe, args.hnsw_m, args.ef_search, args.ef_construction
    )
    try:
        # Settings that need no catalog are refused before the run is loaded.
        _index_settings(spec, args.index_factory, _ANY_CATALOG)
        path = export_items(
            load_run(args.run_dir, args.data_dir), args.out, args.index_factory, spec
        )
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    print(_summary(json.loads(path.read_text()), path.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
