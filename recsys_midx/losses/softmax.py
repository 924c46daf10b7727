"""The softmax objectives: exact or sampled, chosen by the sampler they are given.

:class:`CatalogSoftmax` holds what every such objective shares: reading the output head's
:class:`~recsys_midx.heads.HeadOutput` (scaled queries, mixture prior, score transform), the
choice between the exact loss (exhaustive samplers) and the sampled one, and which draw of
negatives (:mod:`~recsys_midx.losses.negatives`) a batch gets.
:class:`SoftmaxLoss` (one target per query) and
:class:`~recsys_midx.losses.multilabel.MultiLabelSoftmaxLoss` (several positives per query) only
name the functions (:class:`LossFunctions`) computing the exact and the sampled losses: for the
plain dot product and for a head that transforms the scores or has several queries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

from ..heads import Head, HeadOutput
from ..samplers import Sampler
from ..scoring import Transform
from .full_softmax import full_softmax_loss, head_full_softmax_loss
from .negatives import Negatives, draw_mixture_negatives, draw_negatives, draw_shared_negatives
from .sampled_softmax import head_sampled_softmax_loss, sampled_softmax_loss
from .window_exclusion import batch_sequences, full_softmax_loss_outside_windows, window_hits


class LossFunctions(NamedTuple):
    """The four per-positive loss functions of an objective (each returns one loss per positive).

    The sampled functions take negatives ``neg_ids`` ``[Q, M]`` per query or ``[M]`` shared by
    the batch, with ``neg_log_q`` shaped alike.

    Attributes:
        exact: ``(query, item_emb, targets, chunk_size)``, plain dot-product exact loss.
        sampled: ``(query, item_emb, targets, neg_ids, neg_log_q, pos_log_q)``, and the
            keyword ``excluded`` (a ``[Q, M]`` mask) for an objective with ``exclude_window``.
        head_exact: ``(queries, log_prior, item_emb, targets, transform, chunk_size)``.
        head_sampled: ``(queries, log_prior, item_emb, targets, neg_ids, neg_log_q, pos_log_q,
            transform)``, and ``excluded`` as for ``sampled``.
    """

    exact: Callable[..., Tensor]
    sampled: Callable[..., Tensor]
    head_exact: Callable[..., Tensor]
    head_sampled: Callable[..., Tensor]


def _identity(scores: Tensor) -> Tensor:
    return scores


class CatalogSoftmax(torch.nn.Module):
    """Base of the softmax objectives over the catalog, for the scaled queries of an output head
    (scores ``s(z, v) = z . v`` with ``z = query / temperature``, deformed by the head).

    :meth:`forward` takes the head's :class:`~recsys_midx.heads.HeadOutput` (one query or ``K``
    component queries and a prior, already divided by the head's temperature), computes the
    exact loss when the sampler is exhaustive, and otherwise draws negatives for the scaled
    queries (:func:`draw_negatives`; :func:`draw_mixture_negatives` for several queries;
    :func:`draw_shared_negatives` with ``shared_negatives``) and computes the sampled loss.
    The head's pointwise transform applies to the scaled scores, before the logQ correction.
    With a single query and no transform
    (:class:`~recsys_midx.heads.DotHead`, :class:`~recsys_midx.heads.MoEHead`) the plain
    :meth:`exact_loss` / :meth:`sampled_loss` run; otherwise :meth:`head_exact_loss` /
    :meth:`head_sampled_loss`. Every head is accepted (``accepted_heads``).
    Only the :class:`~recsys_midx.protocols.NegativeSampler` protocol is used. A subclass says
    how the targets are read by naming its :class:`LossFunctions` (``functions``).

    Args:
        chunk_size: items scored at once by the exact loss (memory about ``Q * chunk_size``
            floats).
        exact_positives: how a sampled loss counts the positive in its normaliser. ``False``:
            like a negative, ``o_p = s_p - log q(p)`` (the usual logQ correction). ``True``:
            exactly, ``o_p = s_p`` with ``o_j = s_j - log(M q_j)`` for the negatives (see
            :func:`exact_positive_log_q`). Both estimate the same normaliser, but the first
            weighs the positive by ``1 / (M q(p))``: where the model puts much of its mass on
            the positive and the proposal does not (``q(p) << p(p)``, as for a sampler that
            reproduces a peaked softmax only coarsely), the positive dominates the estimate and
            its gradient ``-(1 - p(p))`` shrinks towards 0. Counted exactly, it does not depend
            on ``q(p)``. ``None``: as the sampler prefers (``sampler.prefers_exact_positives``;
            ``True`` only for MIDX with exact top cells).
        shared_negatives: draw one set of ``M = sampler.num_negatives`` negatives for the whole
            batch from the mixture of its queries' proposals (:func:`draw_shared_negatives`)
            instead of ``M`` per query, and score them for all queries with one matrix product.
            Ignored by exhaustive samplers, whose loss is exact.
        exclude_window: leave each query's training-sequence items other than its target out
            of its normaliser (:mod:`~recsys_midx.losses.window_exclusion`): the loss is then
            called with the batch's ``windows`` and query ``positions`` (``per_sequence``). The
            exact loss with it takes only the plain dot product (no transform, one query).

    Raises:
        ValueError: if ``chunk_size < 1``.
    """

    functions: ClassVar[LossFunctions]
    #: The objective's name in messages, as the ``loss`` config group spells it.
    name: ClassVar[str]
    #: Every head: the exact and sampled losses cover transforms and mixtures.
    accepted_heads: ClassVar[tuple[type[Head], ...]] = (Head,)
    #: Built from the item table? No: nothing to refresh.
    refreshable: ClassVar[bool] = False
    #: Called with the batch's training sequences (set per instance by ``exclude_window``).
    per_sequence: bool = False

    def __init__(
        self,
        chunk_size: int = 32768,
        exact_positives: bool | None = None,
        shared_negatives: bool = False,
        exclude_window: bool = False,
    ) -> None:
        super().__init__()
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)
        self.exact_positives = None if exact_positives is None else bool(exact_positives)
        self.shared_negatives = bool(shared_negatives)
        self.exclude_window = self.per_sequence = bool(exclude_window)

    def forward(
        self,
        output: HeadOutput,
        targets: Tensor,
        item_emb: Tensor,
        sampler: Sampler,
        *,
        windows: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Scalar loss of a batch.

        Args:
            output: the head's output for the batch's queries (scaled ``[Q, D]`` or
                ``[Q, K, D]`` queries, prior, transform).
            targets: the positive ids of each query, as the subclass expects them (``[Q]``
                target ids, or ``[Q, P]`` positives padded with ``0``).
            item_emb: ``[N+1, D]`` item table, row 0 padding.
            sampler: the proposal; exhaustive samplers select the exact loss.
            windows: ``[B, W]`` the batch's training sequences (``exclude_window`` only).
            positions: ``[B, L]`` boolean mask of their query positions, row-major as the
                queries (``exclude_window`` only).

        Returns:
            Scalar loss.

        Raises:
            ValueError: with ``exclude_window``, when the sequences are not given, or for the
                exact loss of a head with a transform or several queries.
        """
        z, log_prior, transform = output
        plain = z.dim() == 2 and transform is None
        transform = _identity if transform is None else transform
        sequences = batch_sequences(self.name, windows, positions) if self.exclude_window else None
        if sampler.exhaustive:
            if sequences is not None:
                if not plain:
                    raise ValueError(
                        f"loss={self.name} loss.exclude_window=true with sampler=full takes "
                        "only the plain dot product (head=dot)"
                    )
                return full_softmax_loss_outside_windows(
                    z, item_emb, targets, sequences, self.chunk_size
                ).mean()
            if plain:
                return self.exact_loss(z, targets, item_emb)
            return self.head_exact_loss(z, log_prior, targets, item_emb, transform)
        if self.shared_negatives:
            draw = draw_shared_negatives
        else:
            draw = draw_negatives if z.dim() == 2 else draw_mixture_negatives
        negatives = draw(sampler, z, targets, self.counts_positives_exactly(sampler))
        excluded = None if sequences is None else window_hits(negatives.ids, sequences)
        if plain:
            return self.sampled_loss(z, targets, item_emb, negatives, excluded)
        return self.head_sampled_loss(
            z, log_prior, targets, item_emb, negatives, transform, excluded
        )

    def counts_positives_exactly(self, sampler: Sampler) -> bool:
        """Whether a sampled loss with ``sampler`` counts the positive exactly: as set, or as
        the sampler prefers when ``exact_positives`` is ``None``."""
        if self.exact_positives is None:
            return bool(sampler.prefers_exact_positives)
        return self.exact_positives

    def exact_loss(self, query: Tensor, targets: Tensor, item_emb: Tensor) -> Tensor:
        """Mean exact cross-entropy of the plain dot-product softmax for scaled queries."""
        return self.functions.exact(query, item_emb, targets, self.chunk_size).mean()

    def sampled_loss(
        self,
        query: Tensor,
        targets: Tensor,
        item_emb: Tensor,
        negatives: Negatives,
        excluded: Tensor | None = None,
    ) -> Tensor:
        """Mean logQ-corrected sampled cross-entropy for scaled queries and drawn negatives,
        the ``[Q, M]`` ``excluded`` ones (``exclude_window``) left out."""
        args = (query, item_emb, targets, negatives.ids, negatives.log_q, negatives.positive_log_q)
        if excluded is None:
            return self.functions.sampled(*args).mean()
        return self.functions.sampled(*args, excluded=excluded).mean()

    def head_exact_loss(
        self,
        queries: Tensor,
        log_prior: Tensor | None,
        targets: Tensor,
        item_emb: Tensor,
        transform: Transform,
    ) -> Tensor:
        """Mean exact cross-entropy of the head's model for scaled queries ``[Q, D]`` or
        ``[Q, K, D]`` and the head's score ``transform``."""
        return self.functions.head_exact(
            queries, log_prior, item_emb, targets, transform, self.chunk_size
        ).mean()

    def head_sampled_loss(
        self,
        queries: Tensor,
        log_prior: Tensor | None,
        targets: Tensor,
        item_emb: Tensor,
        negatives: Negatives,
        transform: Transform,
        excluded: Tensor | None = None,
    ) -> Tensor:
        """Mean sampled cross-entropy of the head's model for scaled queries, drawn negatives
        and the head's score ``transform``, the ``[Q, M]`` ``excluded`` negatives left out."""
        args = (
            queries,
            log_prior,
            item_emb,
            targets,
            negatives.ids,
            negatives.log_q,
            negatives.positive_log_q,
            transform,
        )
        if excluded is None:
            return self.functions.head_sampled(*args).mean()
        return self.functions.head_sampled(*args, excluded=excluded).mean()

    def extra_repr(self) -> str:
        return (
            f"chunk_size={self.chunk_size}, exact_positives={self.exact_positives}, "
            f"shared_negatives={self.shared_negatives}, exclude_window={self.exclude_window}"
        )


class SoftmaxLoss(CatalogSoftmax):
    """Softmax cross-entropy over the catalog, one target per query, for the scaled queries
    ``z`` of an output head (scores ``s(z, v) = z . v``, deformed by the head).

    With an exhaustive sampler (:class:`~recsys_midx.samplers.FullSampler`) it computes the exact
    cross-entropy over items ``1..N``; with any other sampler it draws ``sampler.num_negatives``
    negatives per query and computes the logQ-corrected sampled softmax. The sampler gets the same
    scaled query ``z`` that defines the scores, so a query-dependent proposal approximates the very
    softmax being trained.

    Args:
        chunk_size: items scored at once by the exact loss (memory about ``Q * chunk_size``
            floats).
        exact_positives: count each positive exactly in the sampled normaliser instead of
            logQ-correcting it like a negative; ``None``: as the sampler prefers (see
            :class:`CatalogSoftmax`).
        shared_negatives: draw one set of negatives for the whole batch instead of one per
            query (see :class:`CatalogSoftmax`).
        exclude_window: leave each query's training-sequence items other than its target out
            of its normaliser (see :class:`CatalogSoftmax`).

    Raises:
        ValueError: if ``chunk_size < 1``; on malformed inputs when called (see
            :func:`full_softmax_loss` and :func:`sampled_softmax_loss`).

    Example:
        >>> from recsys_midx.heads import DotHead
        >>> from recsys_midx.samplers import UniformSampler
        >>> head, loss_fn = DotHead(temperature=0.5), SoftmaxLoss()
        >>> query = torch.randn(4, 8, requires_grad=True)
        >>> item_emb = torch.randn(101, 8, requires_grad=True)
        >>> loss = loss_fn(head(query), torch.tensor([1, 5, 9, 100]), item_emb,
        ...                UniformSampler(100, 10))
        >>> loss.backward()
    """

    name = "softmax"
    functions = LossFunctions(
        exact=full_softmax_loss,
        sampled=sampled_softmax_loss,
        head_exact=head_full_softmax_loss,
        head_sampled=head_sampled_softmax_loss,
    )
