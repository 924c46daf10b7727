"""The small interfaces the parts of a run meet at: sampler, negatives strategy, objective,
refreshable index, data.

The Lightning modules and :mod:`recsys_midx.app.experiment` are typed against these protocols, not
against concrete classes, so any object with the right methods plugs in; the toolkit's own
implementations (:class:`~recsys_midx.samplers.Sampler`, :class:`~recsys_midx.negatives.PerQuery`,
:class:`~recsys_midx.losses.SoftmaxLoss`, :class:`~recsys_midx.data.datamodule.SeqRecDataModule`,
...) satisfy them. Item ids are ``1..N``;
id ``0`` is padding. An item table is a tensor ``[N+1, D]`` whose row 0 is padding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from recsys_midx.heads import Head, HeadOutput
    from recsys_midx.negatives import Negatives, QueryBatch, Scope


@runtime_checkable
class RefreshableIndex(Protocol):
    """Anything built from the live item table and rebuilt on a schedule.

    :class:`~recsys_midx.lit.callbacks.SamplerRefresh` calls :meth:`update` at the start of
    fitting and then every ``every_n_epochs`` epochs / ``every_n_steps`` steps, for the sampler
    and for an objective that declares ``refreshable = True`` (EDRep's cluster statistics).

    Example:
        >>> from recsys_midx.samplers import MIDXSampler
        >>> sampler = MIDXSampler(1000, num_negatives=10, num_codewords=8)
        >>> sampler.update(torch.randn(1001, 16))
        >>> isinstance(sampler, RefreshableIndex)
        True
    """

    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """(Re)build from the current item table and optional training counts.

        Must not use the global random generators (a refresh would then change the training
        draws that follow it); an index that depends on neither argument does nothing.

        Args:
            item_emb: ``[N+1, D]`` item table, detached, float32, row 0 padding.
            item_counts: ``[N+1]`` training frequency of each id (index 0 is padding), or
                ``None`` where the data gives none.
        """


@runtime_checkable
class NegativeSampler(RefreshableIndex, Protocol):
    """A proposal ``q(i | z)`` of negatives for scaled queries ``z``, with exact ``log q``.

    ``log q`` is the true normalised log-probability of the proposal, which the sampled softmax
    uses for the logQ correction. Samplers run on the device of their inputs, under
    ``torch.no_grad()``, in float32. :class:`~recsys_midx.samplers.Sampler` is the base class of
    the toolkit's samplers.

    Attributes:
        query_independent: ``True`` when ``q(i | z)`` does not depend on ``z``; a strategy that
            draws negatives for the whole batch from the mixture of its queries' proposals
            (``negatives=shared``) then scores ids under one query instead of all.
        prefers_exact_positives: ``True`` when the proposal follows the softmax closely enough
            that the loss should count the positive exactly (MIDX with exact top cells); a
            strategy not told how to count it follows this.
        num_items: ``N``.
        num_negatives: ``M``, negatives :meth:`sample` draws per query unless told otherwise.

    Example:
        >>> from recsys_midx.samplers import UniformSampler
        >>> sampler: NegativeSampler = UniformSampler(100, num_negatives=5)
        >>> sampler.observe_targets(torch.tensor([3, 7]))
        >>> ids, log_q = sampler.sample(torch.randn(2, 8))
        >>> ids.shape, torch.allclose(log_q.exp(), torch.full((2, 5), 0.01))
        (torch.Size([2, 5]), True)
    """

    query_independent: ClassVar[bool]
    prefers_exact_positives: bool
    num_items: int
    num_negatives: int

    def observe_targets(self, targets: Tensor) -> None:
        """See the positive ids ``[T]`` (in ``1..N``) of the batch about to be sampled for;
        proposals built from the batch (in-batch negatives) use them, the others ignore them."""

    def sample(
        self,
        query: Tensor,
        num_samples: int | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Draw ``num_samples`` ids per query, with replacement.

        Args:
            query: ``[Q, D]`` scaled queries.
            num_samples: ``M``; ``None``: :attr:`num_negatives`.
            generator: random generator for reproducible draws (``None``: the global one).

        Returns:
            ``ids`` ``[Q, M]`` (long, in ``1..N``) and their ``log q`` ``[Q, M]`` (float32).
        """
        ...

    def log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """Normalised ``log q(ids | query)`` for ``query`` ``[Q, D]`` and ``ids`` ``[Q, ...]``,
        float32, with the shape of ``ids``."""
        ...

    def catalog_log_prob(self, query: Tensor) -> Tensor:
        """``log q`` of every item ``1..N`` for each query: ``[Q, N]`` float32."""
        ...

    def sizing(self) -> dict[str, int]:
        """Sizes of the proposal (possibly derived from the catalog) that a run's results
        record; empty for a proposal without any."""
        ...


class NegativesStrategy(Protocol):
    """How a batch's negatives are drawn: the stage between the head and the loss.

    Called once per training batch with the batch's scaled queries, positives and windows and
    the sampler; returns the :class:`~recsys_midx.negatives.Negatives` the loss reads. Each of
    the package's strategies is one module of :mod:`recsys_midx.negatives` with one config in
    ``recsys_midx/conf/negatives``.

    Attributes:
        name: the strategy's name in messages, as the ``negatives`` config group spells it.
        scope: how the ids it returns relate to the queries
            (:data:`~recsys_midx.negatives.Scope`); a loss lists the scopes it scores.
        uses_sampler: whether it draws from the sampler; no sampler is built for one that does
            not (``negatives=none``, ``negatives=outside_window``).
        needs_windows: whether it reads the batch's training sequences (``task=seqrec`` only).

    Example:
        >>> from recsys_midx.negatives import PerQuery, QueryBatch
        >>> from recsys_midx.samplers import UniformSampler
        >>> strategy: NegativesStrategy = PerQuery()
        >>> drawn = strategy(QueryBatch(torch.randn(2, 8), torch.tensor([1, 2])),
        ...                  UniformSampler(100, 5))
        >>> drawn.ids.shape
        torch.Size([2, 5])
    """

    name: ClassVar[str]
    scope: ClassVar[Scope]
    uses_sampler: ClassVar[bool]
    needs_windows: bool

    def __call__(
        self, batch: QueryBatch, sampler: NegativeSampler | None, with_positive_log_q: bool = True
    ) -> Negatives:
        """The batch's negatives.

        Args:
            batch: the scaled queries, their positives and, for sequences, the windows.
            sampler: the proposal (``None`` where ``uses_sampler`` is false).
            with_positive_log_q: compute the positives' ``log q``; ``False`` for a loss that
                never corrects by it (:attr:`Objective.corrects_by_log_q`).

        Returns:
            The negatives, in the one form every loss reads.
        """
        ...

    def counts_positives_exactly(self, sampler: NegativeSampler | None) -> bool | None:
        """Whether a loss correcting by ``log q`` counts the positive exactly with ``sampler``;
        ``None`` where the strategy leaves no such choice."""
        ...


class Objective(Protocol):
    """A loss over the catalog for the output of a head, given the batch's negatives.

    A pure function of the head's :class:`~recsys_midx.heads.HeadOutput` (queries already
    divided by the head's temperature), the positives, the item table and the negatives the
    strategy drew (:class:`~recsys_midx.negatives.Negatives`): it never meets the sampler.
    Returns the scalar loss to minimise. An objective states at class level which heads it can
    use (``accepted_heads``), which scopes of negatives it scores (``scopes``: ``"catalog"`` is
    the exact softmax, or its own estimate of it), whether it corrects scores by ``log q``
    (``corrects_by_log_q``), whether the whole catalog means its exact softmax
    (``exact_on_catalog``), and whether it holds an index built from the item table
    (``refreshable``; it then also implements :class:`RefreshableIndex`); the Lightning module
    checks the first two when it is built.

    Attributes:
        name: the objective's name in messages, as the ``loss`` config group spells it.
        accepted_heads: head classes it can use; any other head is refused.
        scopes: the :data:`~recsys_midx.negatives.Scope` values of the negatives it scores.
        corrects_by_log_q: whether it corrects scores by the proposal's ``log q``, so that its
            negatives must carry the positives' ``log q``.
        exact_on_catalog: whether, given the whole catalog, it computes the exact softmax, which
            reads every row of the item table (``False`` for an objective that finds its own
            candidates or estimates the normaliser).
        refreshable: ``True`` when :meth:`RefreshableIndex.update` must run with the sampler's.

    Example:
        >>> from recsys_midx.heads import DotHead
        >>> from recsys_midx.losses import SoftmaxLoss
        >>> from recsys_midx.negatives import Negatives
        >>> objective: Objective = SoftmaxLoss()
        >>> item_emb = torch.randn(101, 8)
        >>> loss = objective(DotHead()(torch.randn(4, 8)), torch.tensor([1, 2, 3, 4]), item_emb,
        ...                  Negatives("catalog"))
        >>> loss.shape
        torch.Size([])
    """

    name: ClassVar[str]
    accepted_heads: ClassVar[tuple[type[Head], ...]]
    scopes: ClassVar[frozenset[Scope]]
    corrects_by_log_q: ClassVar[bool]
    exact_on_catalog: ClassVar[bool]
    refreshable: ClassVar[bool]

    def __call__(
        self, output: HeadOutput, targets: Tensor, item_emb: Tensor, negatives: Negatives
    ) -> Tensor:
        """Scalar loss of a batch.

        Args:
            output: the head's scaled queries (``[Q, D]`` or ``[Q, K, D]``), mixture prior
                (``[Q, K]`` or ``None``) and score transform (``None``: identity).
            targets: ``[Q]`` target ids, or ``[Q, P]`` positive ids padded with ``0``.
            item_emb: ``[N+1, D]`` item table, row 0 padding.
            negatives: the batch's negatives; ``"catalog"`` scope means the exact loss.

        Returns:
            Scalar (0-dim) loss, differentiable in the queries, the table and the head.
        """
        ...


class CatalogDataModule(Protocol):
    """The data of a run as the Lightning modules and :mod:`recsys_midx.app.experiment` use it.

    :class:`~recsys_midx.data.datamodule.SeqRecDataModule` (sequences) and
    :class:`~recsys_midx.data.xc.XCDataModule` (extreme classification) implement it; the
    properties are valid after ``setup("fit")``.

    Attributes:
        num_items: ``N``, the catalog (item or label) size.
        item_counts: ``[N+1]`` training frequency of each id (index 0, padding, is 0); samplers
            and objectives get it at every refresh.
        encoder_sizes: keyword arguments the encoder config is instantiated with (e.g.
            ``{"num_items": N}``, or ``{"num_features": F, "num_labels": N}``).
        stats: the dataset's statistics, written to ``results.json``.

    Example:
        >>> def sizes(data: CatalogDataModule) -> dict[str, int]:
        ...     return {"num_items": data.num_items, **data.encoder_sizes}
    """

    @property
    def num_items(self) -> int: ...

    @property
    def item_counts(self) -> Tensor: ...

    @property
    def encoder_sizes(self) -> dict[str, int]: ...

    @property
    def stats(self) -> dict[str, Any]: ...

    def prepare_data(self) -> None:
        """Download and process the dataset if needed (once, on one process)."""

    def setup(self, stage: str | None = None) -> None:
        """Load the splits for ``stage`` (``"fit"``, ``"test"``, ...)."""

    def val_dataloader(self) -> DataLoader:
        """Evaluation batches of the validation split (also the refresh diagnostics' queries)."""
        ...
