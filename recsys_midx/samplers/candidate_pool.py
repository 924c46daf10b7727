"""The common part of the samplers that score a uniform pool of candidates per query.

Sampling-importance-resampling (:class:`~recsys_midx.samplers.sir.SIRSampler`) and dynamic
negative sampling (:class:`~recsys_midx.samplers.dns.DNSSampler`) both draw ``L`` candidates per
query uniformly from ``1..N``, score them against a snapshot of the item table taken at
:meth:`~CandidatePoolSampler.update`, and pick their negatives among them. Neither has a
closed-form ``log q`` for its draws, so both report a documented approximation.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import torch
from torch import Tensor

from recsys_midx.index import IndexModule
from recsys_midx.samplers.base import (
    Sampler,
    check_item_table,
    check_num_samples,
    checked_index_query,
    full_precision,
)
from recsys_midx.samplers.uniform import random_int62

#: Cap on the elements of a chunk's gathered candidate vectors (``rows x L x D``).
_CHUNK_ELEMENTS = 1 << 22


class CandidatePoolSampler(Sampler, IndexModule):
    """Base of the samplers that pick their negatives from a uniform pool of ``L`` candidates.

    Subclasses implement :meth:`pick` (which candidates become the negatives, with their
    ``log q``) and :meth:`log_prob`. The item table snapshot is a buffer, so it follows
    ``.to(device)`` and ``state_dict``; candidates are scored against the table of the last
    :meth:`update`, like every proposal rebuilt on the refresh schedule.

    Args:
        num_items: ``N``; ids are ``1..N``.
        num_negatives: ``M`` drawn per query by the objective.
        pool_size: ``L``, candidates drawn uniformly (with replacement) per query.

    Raises:
        ValueError: if ``pool_size < 1``, or on the conditions of :class:`Sampler`.
    """

    def __init__(self, num_items: int, num_negatives: int = 100, pool_size: int = 200) -> None:
        super().__init__(num_items, num_negatives)
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        self.pool_size = int(pool_size)
        #: ``[N, D]`` snapshot of the item table (row ``i - 1`` is item ``i``).
        self.register_buffer("items", torch.empty(0, 0))

    @torch.no_grad()
    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """Snapshot the item table the candidates are scored against.

        Args:
            item_emb: ``[N+1, D]`` item table (row 0, padding, is not kept); the snapshot moves
                to its device.
            item_counts: ignored.

        Raises:
            ValueError: if the table is not ``[N+1, D]`` or has NaN or infinite entries (see
                :func:`~recsys_midx.samplers.base.check_item_table`).
        """
        check_item_table(item_emb, self.num_items)
        self.items = item_emb[1:].detach().float().clone()

    @torch.no_grad()
    def sample(
        self, query: Tensor, num_samples: int, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Draw a pool of ``L`` uniform candidates per query and pick ``num_samples`` of them.

        Args:
            query: ``[Q, D]`` scaled queries, any float dtype (scored in float32).
            num_samples: ``M``.
            generator: random generator for reproducible draws (``None``: the global one).

        Returns:
            ``ids`` ``[Q, M]`` long in ``1..N`` and their approximate ``log_q`` ``[Q, M]``
            float32 (see the subclass).

        Raises:
            RuntimeError: before the first :meth:`update`.
            ValueError: if ``query`` is not ``[Q, D]`` floating point, has NaN or infinite
                entries, or ``num_samples`` is not a valid count for the subclass.
        """
        check_num_samples(num_samples)
        self.check_draws_fit_pool(num_samples)
        query = self.checked_query(query)
        ids = torch.empty(query.shape[0], num_samples, dtype=torch.long, device=query.device)
        log_q = torch.empty(query.shape[0], num_samples, device=query.device)
        with full_precision(query.device):
            for rows, z in self.chunks(query, self.pool_size):
                words = random_int62((z.shape[0], self.pool_size), z.device, generator)
                candidates = words.remainder_(self.num_items).add_(1)
                scores = self.scores(z, candidates)
                ids[rows], log_q[rows] = self.pick(z, candidates, scores, num_samples, generator)
        return ids, log_q

    @abc.abstractmethod
    def pick(
        self,
        query: Tensor,
        candidates: Tensor,
        scores: Tensor,
        num_samples: int,
        generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        """The negatives among a chunk's candidates and their ``log q``.

        Args:
            query: ``[Qc, D]`` float32 queries.
            candidates: ``[Qc, L]`` candidate ids in ``1..N``.
            scores: ``[Qc, L]`` their scores ``z.v``.
            num_samples: ``M``.
            generator: random generator, or ``None`` for the global one.

        Returns:
            ``ids`` ``[Qc, M]`` and ``log_q`` ``[Qc, M]`` float32.
        """

    def check_draws_fit_pool(self, num_samples: int) -> None:
        """Raise ``ValueError`` if this sampler cannot pick ``num_samples`` from its pool; the
        default accepts any positive count."""

    def checked_query(self, query: Tensor) -> Tensor:
        """``query`` as float32 ``[Q, D]``, after checking the snapshot exists and ``D`` fits
        (see :func:`~recsys_midx.samplers.base.checked_index_query`).

        Raises:
            RuntimeError: before the first :meth:`update`.
            ValueError: if ``query`` is not ``[Q, D]`` floating point or not finite.
        """
        return checked_index_query(
            query,
            self.items.shape[1],
            self.items.numel() > 0,
            f"{type(self).__name__} has no item table yet",
        )

    def scores(self, query: Tensor, ids: Tensor) -> Tensor:
        """``[Qc, L]`` scores ``z.v_i`` of ``ids`` ``[Qc, L]`` in ``1..N`` (call within
        :func:`~recsys_midx.samplers.base.full_precision`)."""
        return torch.einsum("qd,qld->ql", query, self.items[ids - 1])

    def chunks(self, query: Tensor, width: int) -> Iterator[tuple[slice, Tensor]]:
        """Row blocks of the queries, sized so that ``width`` gathered item vectors per query
        stay within the cap."""
        rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, width * self.items.shape[1]))
        for start in range(0, query.shape[0], rows_per_chunk):
            rows = slice(start, start + rows_per_chunk)
            yield rows, query[rows]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, pool_size={self.pool_size}"
