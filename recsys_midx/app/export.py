"""Export a trained run's item vectors, with raw ids and a faiss index, for serving.

``export_items(run, "export/")`` writes three files:

``items.parquet``
    One row per item, in internal id order: ``item`` (string, the raw id as in the processed
    ``item_map.parquet``), ``item_id`` (int32, the internal id ``1..N``) and ``embedding`` (a
    fixed-size list of ``D`` float32: the vector the model ranks the item with).
``items.faiss``
    A faiss index of the same vectors, row ``r`` being row ``r`` of ``items.parquet``; by default
    an exact inner-product ``IndexFlatIP``. Searching it with a user's ranking query
    (:func:`~recsys_midx.app.recommend.history_queries`) gives the model's own top-k.
``export.json``
    ``dimension``, ``metric`` (``"inner_product"``), ``num_items``, ``index`` and
    ``index_type``, ``items`` (the id mapping file), ``row_order`` (index row ``r`` is
    ``items.parquet`` row ``r``), ``id_column`` / ``embedding_column``, ``head``,
    ``temperature`` and ``transforms_logits`` (the softmax is ``softmax(transform(q . v /
    temperature))``; the inner product alone gives the ranking), ``run_dir`` and ``checkpoint``.

Heads whose ranking is an inner product of one query with the item table are exported: the
plain dot product, sigsoftmax and PLIF (increasing transforms keep the order), and MoE (its
query is projected, the items are not). A mixture of softmaxes ranks by a log-sum-exp over
several queries, which no single inner-product index reproduces: it is refused.

Command line::

    python -m recsys_midx.app.export RUN_DIR --out DIR [--index-factory HNSW32]
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

from recsys_midx.app.trained import LoadedRun, RunLike, as_loaded_run

__all__ = ["EXPORT_FILE", "INDEX_FILE", "ITEMS_FILE", "export_items", "main"]

ITEMS_FILE = "items.parquet"
INDEX_FILE = "items.faiss"
EXPORT_FILE = "export.json"


def export_items(run: RunLike, out_dir: str | Path, index_factory: str | None = None) -> Path:
    """Write a run's item vectors with raw ids (Parquet), a faiss index and ``export.json``.

    See the module docstring for the files and their columns.

    Args:
        run: a run folder of ``train.py`` or a run from :func:`~recsys_midx.app.trained.load_run`.
        out_dir: the folder to write (created if missing; existing files are replaced).
        index_factory: a faiss index factory string (e.g. ``"HNSW32"``, approximate) built
            with the inner-product metric; default an exact ``IndexFlatIP``.

    Returns:
        The path of ``export.json``.

    Raises:
        ValueError: if the run is not a sequential recommender, or its head ranks by a mixture
            of several queries (``head=mos``), which an inner-product index cannot reproduce.

    Example:
        ```python
        meta = json.loads(export_items("outputs/run", "export").read_text())
        index = faiss.read_index("export/" + meta["index"])
        ```
    """
    run = as_loaded_run(run)
    _check_inner_product_ranking(run)
    vectors = run.module.encoder.item_table.detach().float().cpu()[1:].numpy()
    vectors = np.ascontiguousarray(vectors)
    num_items, dim = vectors.shape
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

    index = _build_index(vectors, index_factory)
    faiss.write_index(index, str(out_dir / INDEX_FILE))

    head = run.module.head
    meta: dict[str, Any] = {
        "dimension": dim,
        "metric": "inner_product",
        "num_items": num_items,
        "index": INDEX_FILE,
        "index_type": type(index).__name__ if index_factory is None else index_factory,
        "items": ITEMS_FILE,
        "row_order": f"row r of {INDEX_FILE} is row r of {ITEMS_FILE} (internal id r + 1)",
        "id_column": "item",
        "embedding_column": "embedding",
        "head": head.name,
        "temperature": head.temperature,
        "transforms_logits": bool(head.transforms_logits),
        "run_dir": str(run.config.paths.output_dir),
        "checkpoint": str(run.checkpoint),
    }
    path = out_dir / EXPORT_FILE
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path


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


def _build_index(vectors: np.ndarray, index_factory: str | None) -> faiss.Index:
    """An inner-product faiss index holding ``vectors`` (trained first if the type needs it)."""
    dim = vectors.shape[1]
    if index_factory is None:
        index = faiss.IndexFlatIP(dim)
    else:
        index = faiss.index_factory(dim, index_factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(vectors)
    index.add(vectors)
    return index


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: export a run's items (see the module docstring).

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0; errors exit with status 2 and one line.

    Example:
        ```python
        main(["outputs/run", "--out", "export"])
        # 0
        ```
    """
    from recsys_midx.app.trained import load_run

    parser = argparse.ArgumentParser(
        prog="recsys-midx-export",
        description="Export a trained run's item vectors (Parquet, raw ids) and a faiss index.",
    )
    parser.add_argument("run_dir", type=Path, help="the run folder of train.py")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument(
        "--index-factory",
        default=None,
        help="faiss index factory string (default: exact IndexFlatIP)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the run's dataset lives, if not where its config says",
    )
    args = parser.parse_args(argv)
    try:
        path = export_items(load_run(args.run_dir, args.data_dir), args.out, args.index_factory)
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    print(f"exported {path.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
