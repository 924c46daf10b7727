"""Where a trained model's negatives and rankings fall among the topics of a synthetic catalog.

The synthetic generator (:class:`~recsys_midx.data.Synthetic`) walks each user through one
topic at a time: the next item is most often the chain successor of the current one, else an
item of the same topic, and only now and then one of another topic. A model that ranks well has
to learn two things: which topic comes next, and which item inside it. A sampled softmax learns
the second only from negatives of the target's own topic, and a proposal that rarely draws them
(uniform over a thousand topics draws one a thousandth of the time) leaves the order inside a
topic untaught. :func:`topic_shares` measures both sides on a trained run:

* the share of each training query's negatives that lie in its target's topic, drawn by the
  run's own negatives strategy from its own sampler, rebuilt from the trained item table;
* the share of each validation user's top 10 that lies in the target's topic, the NDCG@10 over
  the catalog, and the NDCG@10 of the target ranked among its own topic's items only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from recsys_midx.metrics import ranking_metrics
from recsys_midx.negatives import Negatives
from recsys_midx.scoring import catalog_scores

if TYPE_CHECKING:
    # Only the types: loading a run needs Lightning and Hydra, measuring a loaded one does not.
    from recsys_midx.app.trained import LoadedRun
    from recsys_midx.lit.seqrec import SeqRecModule

#: The cut-off of the ranking measures.
TOP_K = 10


@dataclass(frozen=True)
class TopicShares:
    """What :func:`topic_shares` measured on one run.

    Attributes:
        label: the name the run goes by in reports.
        negatives_per_query: drawn negatives each training query is scored against (0 for the
            exact softmax).
        negatives_in_topic: the share of them in the query's target topic, the target itself
            left out (NaN for the exact softmax, which scores every item).
        top_in_topic: the share of the validation users' top 10 (seen items excluded, as the
            evaluation excludes them) in the target's topic.
        ndcg: NDCG@10 of the target ranked among the whole catalog.
        ndcg_within_topic: NDCG@10 of the target ranked among its topic's items only.
    """

    label: str
    negatives_per_query: float
    negatives_in_topic: float
    top_in_topic: float
    ndcg: float
    ndcg_within_topic: float


def internal_item_topics(run: LoadedRun) -> Tensor:
    """``int64 [N + 1]`` topic of each internal item id of a synthetic run (``-1`` at padding).

    Raises:
        ValueError: if the run's dataset has no topics (its source has no ``item_topics()``).
    """
    source = getattr(run.datamodule, "source", None)
    if not hasattr(source, "item_topics"):
        raise ValueError(
            "topics are known only for dataset=synthetic runs, not "
            f"dataset={run.config.dataset.name}"
        )
    by_raw_id = torch.from_numpy(source.item_topics())
    raw_ids = torch.tensor([int(raw) for raw in run.items.raw[1:]], dtype=torch.int64)
    return torch.cat([torch.tensor([-1]), by_raw_id[raw_ids - 1]])


def negative_ids_per_query(negatives: Negatives, num_queries: int) -> Tensor:
    """``[Q, M]`` the ids each query is scored against, ``0`` where a column holds none or does
    not count for it; ``[Q, 0]`` for the exact softmax (catalog scope).

    Args:
        negatives: what the strategy drew for a batch of ``num_queries`` queries.
        num_queries: ``Q``.
    """
    if negatives.ids is None:
        return torch.zeros(num_queries, 0, dtype=torch.int64)
    ids, excluded = negatives.ids, negatives.excluded
    if negatives.scope == "batch":
        ids = ids.expand(num_queries, -1)
    elif negatives.scope == "sequence":
        # One row per sequence: every query of a sequence is scored against its row.
        assert negatives.sequences is not None, "per-sequence negatives carry their sequences"
        rows = negatives.sequences.rows
        ids, excluded = ids[rows], None if excluded is None else excluded[rows]
    if excluded is not None:
        ids = ids.masked_fill(excluded.expand_as(ids), 0)
    return ids


@torch.no_grad()
def _negatives_in_topic(run: LoadedRun, topics: Tensor, num_batches: int) -> tuple[float, float]:
    """Mean negatives per training query and the share of them in the target's topic."""
    module: SeqRecModule = run.module
    module.rebuild_indexes(run.datamodule.item_counts)  # from the trained table, as training does
    drawn = in_topic = num_queries = 0
    for _, batch in zip(range(num_batches), run.datamodule.train_dataloader()):
        query, positives, windows, positions = module.training_batch(batch)
        _, negatives = module.draw_negatives(query, positives, windows, positions)
        ids = negative_ids_per_query(negatives, len(positives))
        counted = (ids > 0) & (ids != positives[:, None])
        drawn += int(counted.sum())
        in_topic += int((counted & (topics[ids] == topics[positives][:, None])).sum())
        num_queries += len(positives)
    if drawn == 0:
        return 0.0, math.nan
    return drawn / num_queries, in_topic / drawn


@torch.no_grad()
def _rankings_by_topic(
    run: LoadedRun, topics: Tensor, max_users: int, chunk_size: int
) -> tuple[float, float, float]:
    """Top-10 share in the target's topic, NDCG@10, and NDCG@10 within the target's topic, over
    the first ``max_users`` validation users (their other seen items excluded where the run's
    evaluation excludes them)."""
    module: SeqRecModule = run.module
    table = module.encoder.item_table.detach().float()
    top_in_topic = gains = topic_gains = 0.0
    users = 0
    for batch in run.datamodule.val_dataloader():
        targets = batch["targets"].reshape(-1)
        ranking = module.ranking_queries(module.encode(batch).float(), module.eval_chunk_size)
        for start in range(0, len(targets), chunk_size):
            rows = slice(start, min(start + chunk_size, len(targets), start + max_users - users))
            target = targets[rows, None]
            weights = None if ranking.log_weights is None else ranking.log_weights[rows]
            scores = catalog_scores(ranking.queries[rows], table, weights, ranking.transform)
            target_score = scores.gather(1, target)
            scores[:, 0] = -math.inf
            if module.exclude_seen:
                scores.scatter_(1, batch["history"][rows], -math.inf)
                scores.scatter_(1, target, target_score)  # a target seen before still counts
            target_topic = topics[target]
            # Ties rank above the target, as in the evaluation (metrics.target_ranks).
            above = scores >= target_score
            rank = above.sum(1) - 1
            topic_rank = (above & (topics[None, :] == target_topic)).sum(1) - 1
            top = scores.topk(TOP_K, dim=1).indices
            top_in_topic += float((topics[top] == target_topic).double().mean(1).sum())
            gains += float(_ndcg_gains(rank).sum())
            topic_gains += float(_ndcg_gains(topic_rank).sum())
            users += len(target)
            if users >= max_users:
                break
        if users >= max_users:
            break
    return top_in_topic / users, gains / users, topic_gains / users


def _ndcg_gains(rank: Tensor) -> Tensor:
    """NDCG@10 of each target at 0-based ``rank``, as the evaluation computes it."""
    return ranking_metrics(rank, (TOP_K,))[f"ndcg@{TOP_K}"]


def topic_shares(
    run: LoadedRun,
    num_batches: int = 8,
    max_users: int = 2048,
    chunk_size: int = 32,
    label: str | None = None,
) -> TopicShares:
    """Measure a trained synthetic run's negatives and rankings against the generator's topics.

    Args:
        run: from :func:`~recsys_midx.load_run`, trained on ``dataset=synthetic``.
        num_batches: training batches whose negatives are drawn (the loader's first ones).
        max_users: validation users ranked (the loader's first ones).
        chunk_size: users scored against the whole catalog at once (memory: ``chunk_size * N``
            floats).
        label: the name in reports (default: the run folder's name).

    Returns:
        The shares and NDCGs.

    Raises:
        ValueError: if the run's dataset is not synthetic.

    Example:
        ```python
        shares = topic_shares(load_run("outputs/synthetic-1m/midx"))
        shares.negatives_in_topic, shares.ndcg_within_topic
        ```
    """
    topics = internal_item_topics(run)
    torch.manual_seed(0)  # the draws, so that a report repeats
    per_query, in_topic = _negatives_in_topic(run, topics, num_batches)
    top_in_topic, ndcg, within = _rankings_by_topic(run, topics, max_users, chunk_size)
    return TopicShares(
        label=label or run.checkpoint.parent.parent.name,
        negatives_per_query=per_query,
        negatives_in_topic=in_topic,
        top_in_topic=top_in_topic,
        ndcg=ndcg,
        ndcg_within_topic=within,
    )
