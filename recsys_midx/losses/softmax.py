"""The softmax objectives: exact, or sampled on the negatives a strategy drew.

:class:`CatalogSoftmax` holds what every such objective shares: reading the output head's
:class:`~recsys_midx.heads.HeadOutput` (scaled queries, mixture prior, score transform) and
choosing, by the scope of the :class:`~recsys_midx.negatives.Negatives` it is given, between the
exact loss over the catalog and the sampled one with the logQ correction.
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
from ..negatives import SCOPES, Negatives, Scope
from ..protocols import Objective
from ..scoring import Transform, identity
from .full_softmax import full_softmax_loss, head_full_softmax_loss
from .sampled_softmax import head_sampled_softmax_loss, sampled_softmax_loss
from .window_exclusion import full_softmax_loss_outside_windows
from .window_softmax import window_softmax_loss


class LossFunctions(NamedTuple):
    """The per-positive loss functions of an objective (each returns one loss per positive).

    The sampled functions take negatives ``neg_ids`` ``[Q, M]`` per query or ``[M]`` shared by
    the batch, with ``neg_log_q`` shaped alike.

    Attributes:
        exact: ``(query, item_emb, targets, chunk_size)``, plain dot-product exact loss.
        sampled: ``(query, item_emb, targets, neg_ids, neg_log_q, pos_log_q)``, and the
            keyword ``excluded`` (a ``[Q, M]`` mask of drawn ids in the query's window).
        head_exact: ``(queries, log_prior, item_emb, targets, transform, chunk_size)``.
        head_sampled: ``(queries, log_prior, item_emb, targets, neg_ids, neg_log_q, pos_log_q,
            transform)``, and ``excluded`` as for ``sampled``.
        exact_outside_windows: ``(query, item_emb, targets, sequences, chunk_size)``, the plain
            exact loss less each query's window; ``None`` where the targets have no windows.
        per_sequence: ``(query, item_emb, targets, positions, neg_ids, valid, log_weights)``,
            the plain loss on each sequence's own negatives; ``None`` where there are none.
    """

    exact: Callable[..., Tensor]
    sampled: Callable[..., Tensor]
    head_exact: Callable[..., Tensor]
    head_sampled: Callable[..., Tensor]
    exact_outside_windows: Callable[..., Tensor] | None = None
    per_sequence: Callable[..., Tensor] | None = None


class CatalogSoftmax(torch.nn.Module):
    """Base of the softmax objectives over the catalog, for the scaled queries of an output head
    (scores ``s(z, v) = z . v`` with ``z = query / temperature``, deformed by the head).

    :meth:`forward` takes the head's :class:`~recsys_midx.heads.HeadOutput` (one query or ``K``
    component queries and a prior, already divided by the head's temperature) and the batch's
    :class:`~recsys_midx.negatives.Negatives`, and by their scope computes the exact loss over
    the catalog (``"catalog"``; less each query's window when the negatives carry the batch's
    sequences), the logQ-corrected sampled loss on negatives per query or shared by the batch,
    or the loss on each sequence's own weighted negatives (``"sequence"``). The head's
    pointwise transform applies to the scaled scores, before the logQ correction. With a single
    query and no transform (:class:`~recsys_midx.heads.DotHead`,
    :class:`~recsys_midx.heads.MoEHead`) the plain functions run; otherwise the head's. Every
    head is accepted (``accepted_heads``); the window's exact loss and the per-sequence one
    take only the plain dot product. A subclass says how the targets are read by naming its
    :class:`LossFunctions` (``functions``); the scopes it scores follow from them.

    Args:
        chunk_size: items scored at once by the exact loss (memory about ``Q * chunk_size``
            floats).

    Raises:
        ValueError: if ``chunk_size < 1``.
    """

    functions: ClassVar[LossFunctions]
    #: The objective's name in messages, as the ``loss`` config group spells it.
    name: ClassVar[str]
    #: Every head: the exact and sampled losses cover transforms and mixtures.
    accepted_heads: ClassVar[tuple[type[Head], ...]] = (Head,)
    #: The scopes of negatives it scores (a subclass without per-sequence losses drops one).
    scopes: ClassVar[frozenset[Scope]] = frozenset({"catalog", "query", "batch", "sequence"})
    #: Sampled scores are corrected by the proposal's log q.
    corrects_by_log_q: ClassVar[bool] = True
    #: Given the whole catalog, the exact softmax.
    exact_on_catalog: ClassVar[bool] = True
    #: Built from the item table? No: nothing to refresh.
    refreshable: ClassVar[bool] = False

    def __init__(self, chunk_size: int = 32768) -> None:
        super().__init__()
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)

    def forward(
        self, output: HeadOutput, targets: Tensor, item_emb: Tensor, negatives: Negatives
    ) -> Tensor:
        """Scalar loss of a batch.

        Args:
            output: the head's output for the batch's queries (scaled ``[Q, D]`` or
                ``[Q, K, D]`` queries, prior, transform).
            targets: the positive ids of each query, as the subclass expects them (``[Q]``
                target ids, or ``[Q, P]`` positives padded with ``0``).
            item_emb: ``[N+1, D]`` item table, row 0 padding.
            negatives: the batch's negatives; the ``"catalog"`` scope selects the exact loss.

        Returns:
            Scalar loss.

        Raises:
            ValueError: for negatives of a scope it does not score, or a head with a transform
                or several queries with the window's exact loss or per-sequence negatives.
        """
        check_scope(self, negatives, windows=self.functions.exact_outside_windows is not None)
        z, log_prior, transform = output
        plain = z.dim() == 2 and transform is None
        transform = identity if transform is None else transform
        if negatives.scope == "catalog":
            if negatives.sequences is not None:
                _check_plain(plain, "the exact softmax outside each window")
                return self.functions.exact_outside_windows(
                    z, item_emb, targets, negatives.sequences, self.chunk_size
                ).mean()
            if plain:
                return self.exact_loss(z, targets, item_emb)
            return self.head_exact_loss(z, log_prior, targets, item_emb, transform)
        if negatives.scope == "sequence":
            _check_plain(plain, "negatives drawn per sequence")
            return self.sequence_loss(z, targets, item_emb, negatives)
        if plain:
            return self.sampled_loss(z, targets, item_emb, negatives)
        return self.head_sampled_loss(z, log_prior, targets, item_emb, negatives, transform)

    def exact_loss(self, query: Tensor, targets: Tensor, item_emb: Tensor) -> Tensor:
        """Mean exact cross-entropy of the plain dot-product softmax for scaled queries."""
        return self.functions.exact(query, item_emb, targets, self.chunk_size).mean()

    def sampled_loss(
        self, query: Tensor, targets: Tensor, item_emb: Tensor, negatives: Negatives
    ) -> Tensor:
        """Mean logQ-corrected sampled cross-entropy for scaled queries and drawn negatives,
        the ``excluded`` ones (drawn ids in the query's window) left out."""
        args = (query, item_emb, targets, negatives.ids, negatives.log_q, negatives.positive_log_q)
        if negatives.excluded is None:
            return self.functions.sampled(*args).mean()
        return self.functions.sampled(*args, excluded=negatives.excluded).mean()

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
    ) -> Tensor:
        """Mean sampled cross-entropy of the head's model for scaled queries, drawn negatives
        and the head's score ``transform``, the ``excluded`` negatives left out."""
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
        if negatives.excluded is None:
            return self.functions.head_sampled(*args).mean()
        return self.functions.head_sampled(*args, excluded=negatives.excluded).mean()

    def sequence_loss(
        self, query: Tensor, targets: Tensor, item_emb: Tensor, negatives: Negatives
    ) -> Tensor:
        """Mean cross-entropy of each target against its sequence's weighted negatives, the
        positive counted exactly, the ``excluded`` columns left out."""
        valid = None if negatives.excluded is None else ~negatives.excluded
        return self.functions.per_sequence(
            query,
            item_emb,
            targets,
            negatives.sequences.positions,
            negatives.ids,
            valid,
            negatives.log_weights,
        ).mean()

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}"


def check_scope(objective: Objective, negatives: Negatives, windows: bool = True) -> None:
    """Refuse negatives of a scope the objective does not score (its ``scopes``), and, unless
    it leaves windows out of the exact normaliser (``windows``), the catalog less each window.

    Raises:
        ValueError: naming the objective and what it takes.
    """
    if negatives.scope not in objective.scopes:
        taken = ", ".join(scope for scope in SCOPES if scope in objective.scopes)
        raise ValueError(
            f"loss={objective.name} does not score negatives of scope {negatives.scope}: it "
            f"takes {taken}"
        )
    if not windows and negatives.scope == "catalog" and negatives.sequences is not None:
        raise ValueError(
            f"loss={objective.name} does not leave each window out of its normaliser: drop "
            "negatives.exclude_window"
        )


def _check_plain(plain: bool, what: str) -> None:
    if not plain:
        raise ValueError(f"{what} takes only the plain dot product (head=dot or head=moe)")


class SoftmaxLoss(CatalogSoftmax):
    """Softmax cross-entropy over the catalog, one target per query, for the scaled queries
    ``z`` of an output head (scores ``s(z, v) = z . v``, deformed by the head).

    Given the whole catalog (``Negatives("catalog")``, what ``negatives=none`` and
    ``sampler=full`` give) it computes the exact cross-entropy over items ``1..N``, or with the
    batch's sequences the exact cross-entropy over the target and the items outside its window
    (:func:`full_softmax_loss_outside_windows`); given drawn negatives, the logQ-corrected
    sampled softmax (:func:`sampled_softmax_loss`), or for negatives drawn per sequence the
    softmax over each target and its sequence's weighted negatives
    (:func:`window_softmax_loss`).

    Args:
        chunk_size: items scored at once by the exact loss (memory about ``Q * chunk_size``
            floats).

    Raises:
        ValueError: if ``chunk_size < 1``; on malformed inputs when called (see
            :func:`full_softmax_loss` and :func:`sampled_softmax_loss`).

    Example:
        >>> import math
        >>> from recsys_midx.heads import DotHead
        >>> head, loss_fn = DotHead(temperature=0.5), SoftmaxLoss()
        >>> query = torch.randn(4, 8, requires_grad=True)
        >>> item_emb = torch.randn(101, 8, requires_grad=True)
        >>> targets = torch.tensor([1, 5, 9, 100])
        >>> exact = loss_fn(head(query), targets, item_emb, Negatives("catalog"))
        >>> ids = torch.randint(1, 101, (4, 10))  # 10 uniform draws per query: log q = -log 100
        >>> log_q = torch.full((4, 10), -math.log(100))
        >>> negatives = Negatives("query", ids, log_q, torch.full((4,), -math.log(100)))
        >>> loss_fn(head(query), targets, item_emb, negatives).backward()
    """

    name = "softmax"
    functions = LossFunctions(
        exact=full_softmax_loss,
        sampled=sampled_softmax_loss,
        head_exact=head_full_softmax_loss,
        head_sampled=head_sampled_softmax_loss,
        exact_outside_windows=full_softmax_loss_outside_windows,
        per_sequence=window_softmax_loss,
    )
