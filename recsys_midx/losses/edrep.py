"""EDRep: the softmax normaliser estimated from a Gaussian mixture over the item table.

Dall'Amico & Belliardo (arXiv:2303.17475) replace ``Z(z) = sum_{i=1..N} exp(z . v_i)`` by a sum over
``k`` clusters of items. Cluster ``a`` holds ``n_a`` items with mean ``mu_a`` and (population)
covariance ``Omega_a``; treating ``z . v`` inside the cluster as Gaussian with mean ``z . mu_a``
and variance ``z^T Omega_a z`` and using ``E[exp(s)] = exp(mean + var / 2)`` gives

    Z(z) ~ sum_a n_a exp(z . mu_a + 1/2 z^T Omega_a z),

computed in log space as ``logsumexp_a(log n_a + z . mu_a + 1/2 z^T Omega_a z)``. A query costs
``O(k * D^2)`` instead of ``O(N * D)`` and the statistics take ``O(k * D^2)`` memory. The estimate
is exact for a cluster of identical vectors (a singleton has ``Omega = 0``), hence exact with one
cluster per item, and close whenever the scores inside a cluster are nearly Gaussian.

Clusters come from the faiss k-means of the MIDX codebooks (a one-level
:class:`~recsys_midx.index.ResidualCodebooks`, warm-started at each rebuild), fitted
to the live item table whenever :meth:`EDRepLoss.update` runs: the Lightning modules call it at
the start of fitting and on the refresh schedule of
:class:`~recsys_midx.lit.callbacks.SamplerRefresh`, with the sampler's rebuild. Counts, means,
covariances and the assignment are buffers, so a checkpoint restores them and a resumed run
continues identically.

Exact positive terms (``exact_positives=True``, the default): each query's positives are taken
out of their clusters' statistics (an ``O(D)`` downdate of count, mean and variance of the
scores, per positive) and added back exactly, so for positive ``p`` of a query with positives
``P``

    loss(p) = log(exp(s_p) + Z_est(z without P)) - s_p = softplus(log Z_est(z without P) - s_p).

This is the same normaliser as :class:`~recsys_midx.losses.MultiLabelSoftmaxLoss` (``p`` against
itself and the labels outside ``P``), and it keeps the loss a cross-entropy (``>= 0``): the bare
estimate can underrate a cluster in which the positive is an outlier, and the model could then
push ``s_p`` up without bound. With constant statistics the positives leave them with their
current vectors, standing for the (not stored) vectors the statistics were built from; the two
agree right after a rebuild. With ``exact_positives=False`` the loss is the paper's
``log Z_est(z) - s_p`` over all items (other positives of the query included).

The loss takes no drawn negatives, only the whole catalog (``negatives=none``, which
``loss=edrep`` selects): the objective stays one estimate plus the exact positives, with no
draw to correct for.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..heads import DotHead, HeadOutput
from ..index import IndexModule, ResidualCodebooks
from ..negatives import Negatives, Scope
from ..scoring import compute_dtype, lookup_rows, row_chunks
from .full_softmax import check_scoring_inputs
from .multilabel import _positive_entries
from .softmax import check_scope

#: Items whose outer products are summed at once by :func:`cluster_statistics` (bounds memory
#: to about this many floats, whatever ``N``).
_OUTER_BLOCK_ELEMENTS = 1 << 22


class ClusterStatistics(NamedTuple):
    """The Gaussian mixture of an item table.

    Attributes:
        counts: ``[k]`` items per cluster (float; ``0`` for an empty cluster).
        means: ``[k, D]`` cluster means ``mu_a`` (zero for an empty cluster).
        covariances: ``[k, D, D]`` population covariances ``Omega_a`` (divided by ``n_a``, so a
            singleton has ``Omega = 0``).
    """

    counts: Tensor
    means: Tensor
    covariances: Tensor


def cluster_statistics(items: Tensor, assignments: Tensor, num_clusters: int) -> ClusterStatistics:
    """Count, mean and population covariance of the items of each cluster.

    Differentiable in ``items``. Covariances are sums of outer products of centred items,
    accumulated a block of items at a time, so memory stays ``O(k * D^2)`` plus one block.

    Args:
        items: ``[n, D]`` vectors (no padding row).
        assignments: ``[n]`` cluster of each item, in ``0..num_clusters-1``.
        num_clusters: ``k``.

    Returns:
        The statistics, in the dtype of ``items``.

    Raises:
        ValueError: if the shapes disagree or an assignment is outside ``0..num_clusters-1``.

    Example:
        >>> stats = cluster_statistics(torch.tensor([[0.0, 2.0], [2.0, 0.0], [5.0, 5.0]]),
        ...                            torch.tensor([0, 0, 1]), 2)
        >>> stats.counts.tolist(), stats.means[0].tolist(), stats.covariances[1].abs().sum().item()
        ([2.0, 1.0], [1.0, 1.0], 0.0)
    """
    if items.dim() != 2 or assignments.shape != items.shape[:1]:
        raise ValueError(
            f"items must be [n, D] and assignments [n], got {tuple(items.shape)} and "
            f"{tuple(assignments.shape)}"
        )
    if assignments.numel() and not (
        0 <= int(assignments.min()) and int(assignments.max()) < num_clusters
    ):
        raise ValueError(f"assignments must lie in 0..{num_clusters - 1}")
    dim = items.shape[1]
    counts = torch.zeros(num_clusters, dtype=items.dtype, device=items.device)
    counts = counts.index_add(0, assignments, torch.ones_like(items[:, 0]))
    sums = items.new_zeros(num_clusters, dim).index_add(0, assignments, items)
    # An empty cluster keeps a zero mean rather than 0/0.
    means = sums / counts.clamp_min(1.0)[:, None]
    # Centring first (rather than E[vv^T] - mu mu^T) avoids cancellation when |mu| >> spread.
    centred = items - means[assignments]
    covariances = items.new_zeros(num_clusters, dim, dim)
    block = max(1, _OUTER_BLOCK_ELEMENTS // (dim * dim))
    for part, x in row_chunks(centred, block):
        covariances = covariances.index_add(0, assignments[part], x[:, :, None] * x[:, None, :])
    covariances = covariances / counts.clamp_min(1.0)[:, None, None]
    return ClusterStatistics(counts, means, covariances)


def score_moments(query: Tensor, means: Tensor, covariances: Tensor) -> tuple[Tensor, Tensor]:
    """Mean ``z . mu_a`` and variance ``z^T Omega_a z`` of the scores in every cluster.

    Args:
        query: ``[Q, D]`` scaled queries.
        means: ``[k, D]`` cluster means.
        covariances: ``[k, D, D]`` symmetric cluster covariances.

    Returns:
        ``mean`` and ``variance``, both ``[Q, k]``. The variance is clamped at 0 (rounding can
        make ``z^T Omega z`` of a singular ``Omega`` slightly negative). Cost ``O(Q * k * D^2)``;
        the intermediate ``Omega_a z`` takes ``Q * k * D`` floats.

    Example:
        >>> mean, var = score_moments(torch.ones(1, 2), torch.ones(1, 2), torch.eye(2)[None])
        >>> mean.item(), var.item()
        (2.0, 2.0)
    """
    k, dim = means.shape
    # One matmul for all clusters: row a*D + e of the stacked covariances gives (Omega_a z)_e.
    projected = (query @ covariances.reshape(k * dim, dim).T).view(-1, k, dim)
    variance = (projected * query[:, None, :]).sum(dim=2).clamp_min(0.0)
    return query @ means.T, variance


def gaussian_log_partition(
    query: Tensor, counts: Tensor, means: Tensor, covariances: Tensor
) -> Tensor:
    """EDRep's ``log Z(z) ~ logsumexp_a(log n_a + z . mu_a + 1/2 z^T Omega_a z)``.

    Args:
        query: ``[Q, D]`` scaled queries.
        counts: ``[k]`` cluster sizes (empty clusters contribute nothing).
        means: ``[k, D]`` cluster means.
        covariances: ``[k, D, D]`` cluster covariances.

    Returns:
        ``[Q]`` estimated log-normalisers.

    Example:
        With one cluster per item the estimate is exact:

        >>> items = torch.randn(5, 3, dtype=torch.float64)
        >>> query = torch.randn(2, 3, dtype=torch.float64)
        >>> stats = cluster_statistics(items, torch.arange(5), 5)
        >>> torch.allclose(gaussian_log_partition(query, *stats),
        ...                torch.logsumexp(query @ items.T, dim=1))
        True
    """
    mean, variance = score_moments(query, means, covariances)
    return torch.logsumexp(counts.log() + mean + 0.5 * variance, dim=1)


def _check_distinct(positives: Tensor) -> None:
    """Raise ValueError if a row of ``[Q, P]`` positives repeats a (non-padding) id: each
    positive leaves its cluster once, so a repeat would remove an item twice."""
    if positives.dim() == 2 and positives.shape[1] > 1:
        ordered = positives.sort(dim=1).values
        if bool(((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] > 0)).any()):
            raise ValueError("positives must be distinct within a row (0 is padding)")


class EDRepLoss(IndexModule):
    """Softmax cross-entropy over the catalog with EDRep's Gaussian-mixture normaliser.

    Called like :class:`~recsys_midx.losses.SoftmaxLoss` and
    :class:`~recsys_midx.losses.MultiLabelSoftmaxLoss` (``loss(head(query), targets, item_emb,
    negatives)``) with the whole catalog as negatives (``Negatives("catalog")``), and ``[Q]``
    targets (one per query) or ``[Q, P]`` positives padded with ``0`` (several per query; the
    loss averages over all positives of the batch). Scores are ``s(z, v) = z . v`` for the
    head's scaled queries ``z = query / temperature``; the Gaussian estimate is that of the
    plain dot product, so only a :class:`~recsys_midx.heads.DotHead` is accepted
    (``accepted_heads``). The normaliser comes from the cluster statistics, which :meth:`update`
    rebuilds from the item table (the Lightning modules call it with the sampler's rebuild,
    which ``refreshable`` asks for).

    By default the statistics are constants between rebuilds, so only the positives' rows of the
    item table get gradients from the loss. With ``grad_through_stats=True`` the means and
    covariances are recomputed from the live table at every call (assignments and counts held
    fixed), so every item gets the gradient of the estimated normaliser; that costs
    ``O(N * D^2)`` per call. See the module docstring for ``exact_positives``.

    Args:
        num_clusters: ``k``, Gaussian components (k-means clusters of the item table).
        exact_positives: take each query's positives out of the estimate and add them exactly.
        grad_through_stats: let gradients flow through the means and covariances.
        kmeans_iters: k-means iterations of the first build.
        warm_start_iters: k-means iterations of a rebuild (warm-started from the last centroids).
        seed: base seed of k-means (each rebuild uses the next one, so a resumed run matches).

    Raises:
        ValueError: if ``num_clusters < 1`` or an iteration count is invalid; on malformed
            inputs, duplicate positives in a row, or a call before :meth:`update`.

    Example:
        >>> from recsys_midx.heads import DotHead
        >>> head, loss_fn = DotHead(), EDRepLoss(num_clusters=4)
        >>> item_emb = torch.randn(101, 8, requires_grad=True)
        >>> loss_fn.update(item_emb.detach())
        >>> query = torch.randn(3, 8, requires_grad=True)
        >>> loss = loss_fn(head(query), torch.tensor([1, 50, 100]), item_emb, Negatives("catalog"))
        >>> loss.backward()
    """

    name: ClassVar[str] = "edrep"
    #: The Gaussian estimate is that of plain dot products of one query.
    accepted_heads: ClassVar[tuple[type[DotHead], ...]] = (DotHead,)
    #: Estimates the whole catalog's normaliser itself.
    scopes: ClassVar[frozenset[Scope]] = frozenset({"catalog"})
    corrects_by_log_q: ClassVar[bool] = False
    exact_on_catalog: ClassVar[bool] = False
    #: The cluster statistics are built from the item table: :meth:`update` rebuilds them.
    refreshable: ClassVar[bool] = True

    def __init__(
        self,
        num_clusters: int = 16,
        exact_positives: bool = True,
        grad_through_stats: bool = False,
        kmeans_iters: int = 20,
        warm_start_iters: int = 5,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
        self.exact_positives = bool(exact_positives)
        self.grad_through_stats = bool(grad_through_stats)
        # One residual level is plain k-means on whole vectors: the MIDX code, warm starts and
        # per-fit seeding included. Its constructor validates the iteration counts.
        self.clusters = ResidualCodebooks(
            num_codewords=num_clusters,
            num_codebooks=1,
            kmeans_iters=kmeans_iters,
            warm_start_iters=warm_start_iters,
            seed=seed,
        )
        self.register_buffer("counts", torch.empty(0))
        self.register_buffer("means", torch.empty(0, 0))
        self.register_buffer("covariances", torch.empty(0, 0, 0))

    @property
    def num_clusters(self) -> int:
        """``k``."""
        return self.clusters.num_codewords

    @property
    def assignments(self) -> Tensor:
        """``[N]`` cluster of items ``1..N`` (entry ``i - 1`` is item ``i``)."""
        return self.clusters.codes[:, 0]

    @torch.no_grad()
    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """Re-cluster the item table and rebuild the statistics (float32, on its device).

        Args:
            item_emb: ``[N+1, D]`` item table, row 0 padding.
            item_counts: accepted for the sampler protocol's signature and ignored: the
                normaliser weighs every item once.

        Raises:
            ValueError: if the table is not ``[N+1, D]`` or ``N < num_clusters``.
        """
        if item_emb.dim() != 2 or item_emb.shape[0] < 2:
            raise ValueError(f"item_emb must have shape [N+1, D], got {tuple(item_emb.shape)}")
        items = item_emb[1:].detach().float()
        if items.shape[0] < self.num_clusters:
            raise ValueError(
                f"num_clusters={self.num_clusters} exceeds the {items.shape[0]} items; "
                f"use num_clusters <= {items.shape[0]}"
            )
        codes = self.clusters.fit(items)
        # float64 accumulation: the buffers are the reference every call relies on.
        stats = cluster_statistics(items.double(), codes[:, 0], self.num_clusters)
        self.counts, self.means, self.covariances = (t.float() for t in stats)

    def statistics(self, item_emb: Tensor | None, dtype: torch.dtype) -> ClusterStatistics:
        """The statistics a call uses, in ``dtype``: the buffers, or (``grad_through_stats``)
        means and covariances recomputed from ``item_emb`` ``[N+1, D]`` with the stored
        assignments and counts.

        Raises:
            ValueError: with ``grad_through_stats`` and no ``item_emb``.
        """
        counts = self.counts.to(dtype)
        if not self.grad_through_stats:
            return ClusterStatistics(counts, self.means.to(dtype), self.covariances.to(dtype))
        if item_emb is None:
            raise ValueError("grad_through_stats needs item_emb to recompute the statistics")
        live = cluster_statistics(item_emb[1:].to(dtype), self.assignments, self.num_clusters)
        return ClusterStatistics(counts, live.means, live.covariances)

    def log_partition(self, query: Tensor, item_emb: Tensor | None = None) -> Tensor:
        """Estimated ``log Z(z)`` over all items for scaled queries ``z`` ``[Q, D]``.

        Args:
            query: ``[Q, D]`` scaled queries.
            item_emb: the ``[N+1, D]`` item table; needed only with ``grad_through_stats``.

        Returns:
            ``[Q]`` log-normalisers, in float32 at least.
        """
        self._check_built()
        dtype = compute_dtype(query, self.means)
        return gaussian_log_partition(query.to(dtype), *self.statistics(item_emb, dtype))

    def forward(
        self, output: HeadOutput, targets: Tensor, item_emb: Tensor, negatives: Negatives
    ) -> Tensor:
        """Mean loss over the positives of a batch.

        Args:
            output: the :class:`~recsys_midx.heads.DotHead`'s output: ``[Q, D]`` scaled
                queries.
            targets: ``[Q]`` target ids in ``1..N``, or ``[Q, P]`` distinct positive ids per row
                padded with ``0``.
            item_emb: ``[N+1, D]`` item table, row 0 padding; it must have ``N`` rows of the
                table the statistics were built from.
            negatives: the whole catalog (``Negatives("catalog")``), whose normaliser the
                statistics estimate.

        Returns:
            Scalar loss.

        Raises:
            ValueError: for drawn negatives or windows to leave out, or before :meth:`update`.
        """
        check_scope(self, negatives, windows=False)
        self._check_built()
        query = output.queries
        if targets.dim() == 1:
            check_scoring_inputs(query, item_emb, targets)
            targets = targets[:, None]
        else:
            _check_distinct(targets)
        rows, _, ids = _positive_entries(query, item_emb, targets)
        if item_emb.shape[0] - 1 != self.assignments.shape[0]:
            raise ValueError(
                f"item_emb has {item_emb.shape[0] - 1} items but the statistics were built for "
                f"{self.assignments.shape[0]}"
            )
        dtype = compute_dtype(query, item_emb)
        z = query.to(dtype)
        counts, means, covariances = self.statistics(item_emb, dtype)
        mean, variance = score_moments(z, means, covariances)
        pos_emb = lookup_rows(item_emb, ids).to(dtype)
        pos_scores = (z[rows] * pos_emb).sum(dim=1)
        if not self.exact_positives:
            log_z = torch.logsumexp(counts.log() + mean + 0.5 * variance, dim=1)
            return (log_z[rows] - pos_scores).mean()
        # Constant statistics hold no item gradient: the positives leave them as constants too
        # (their current vectors stand for the ones the statistics were built from).
        removed_scores = (
            pos_scores if self.grad_through_stats else (z[rows] * pos_emb.detach()).sum(dim=1)
        )
        log_rest = self._log_partition_without(counts, mean, variance, rows, ids, removed_scores)
        return F.softplus(log_rest[rows] - pos_scores).mean()

    def _log_partition_without(
        self,
        counts: Tensor,
        mean: Tensor,
        variance: Tensor,
        rows: Tensor,
        ids: Tensor,
        removed_scores: Tensor,
    ) -> Tensor:
        """``[Q]`` estimated log-normaliser of each query over the items that are not its
        positives: each positive leaves its cluster's score statistics.

        With ``d = s_p - m_a`` for the positives of query ``q`` in cluster ``a`` (``c`` of them),
        the remaining ``n' = n_a - c`` scores have mean ``m_a - sum(d) / n'`` and variance
        ``(n_a var_a - sum(d^2)) / n' - (sum(d) / n')^2``: centred sums, so no cancellation of
        large raw moments. A cluster left empty contributes nothing.
        """
        clusters = self.assignments[ids - 1]
        deviation = removed_scores - mean[rows, clusters]
        where = (rows, clusters)
        removed = torch.zeros_like(mean).index_put(
            where, torch.ones_like(deviation), accumulate=True
        )
        sum_d = torch.zeros_like(mean).index_put(where, deviation, accumulate=True)
        sum_d2 = torch.zeros_like(mean).index_put(where, deviation.square(), accumulate=True)
        rest = counts - removed
        safe = rest.clamp_min(1.0)
        shift = sum_d / safe
        rest_var = ((counts * variance - sum_d2) / safe - shift.square()).clamp_min(0.0)
        # log 0 = -inf drops a cluster that the positives emptied.
        return torch.logsumexp(rest.log() + (mean - shift) + 0.5 * rest_var, dim=1)

    def _check_built(self) -> None:
        if self.counts.numel() == 0:
            raise ValueError("EDRepLoss has no cluster statistics yet: call update(item_emb) first")

    def extra_repr(self) -> str:
        return (
            f"num_clusters={self.num_clusters}, "
            f"exact_positives={self.exact_positives}, grad_through_stats={self.grad_through_stats}"
        )
