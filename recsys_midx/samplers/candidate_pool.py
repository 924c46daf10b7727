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
from recsys_midx.samplers.base import Sampler, check_item_table
from recsys_midx.samplers.uniform import random_int62
from recsys_midx.scoring import row_chunks

#: Cap on the elements of a chunk's gathered candidate vectors (``rows x L x D``).
_CHUNK_ELEMENTS = 1 << 22


class CandidatePoolSampler(Sampler, IndexModule):
    """Base of the samplers that pick their negatives from a uniform pool of ``L`` candidates.

    Subclasses implement :meth:`pick` (which candidates become the negatives, with their
    ``log q``) and :meth:`_log_prob`. The item table snapshot is a buffer, so it follows
    ``.to(device)`` and ``state_dict``; candidates are scored against the table of the last
    :meth:`update`, like every proposal rebuilt on the refresh schedule.

    Args:
        num_items: ``N``; ids are ``1..N``.
        num_negatives: ``M`` drawn per query by the objective.
        pool_size: ``L``, candidates drawn uniformly (with replacement) per query.

    Raises:
        ValueError: if ``pool_size < 1``, or on the conditions of :class:`Sampler`.
    """

    minimums = {"pool_size": 1}

    def __init__(self, num_items: int, num_negatives: int = 100, pool_size: int = 200) -> None:
        super().__init__(num_items, num_negatives)
        self.check_settings(locals())  # every argument against the declared choices and minimums
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

    def _draw(
        self, query: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        """A pool of ``L`` uniform candidates per query, of which :meth:`pick` keeps
        ``num_samples``."""
        ids = torch.empty(query.shape[0], num_samples, dtype=torch.long, device=query.device)
        log_q = torch.empty(query.shape[0], num_samples, device=query.device)
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

    def _check_ready(self) -> None:
        if self.items.numel() == 0:
            raise RuntimeError(
                f"{type(self).__name__} has no item table yet: call update(item_emb) first"
            )

    def _query_dim(self) -> int:
        return self.items.shape[1]

    def scores(self, query: Tensor, ids: Tensor) -> Tensor:
        """``[Qc, L]`` scores ``z.v_i`` of ``ids`` ``[Qc, L]`` in ``1..N`` (call within
        :func:`~recsys_midx.samplers.base.full_precision`, as the hooks run)."""
        return torch.einsum("qd,qld->ql", query, self.items[ids - 1])

    def chunks(self, query: Tensor, width: int) -> Iterator[tuple[slice, Tensor]]:
        """Row blocks of the queries, sized so that ``width`` gathered item vectors per query
        stay within the cap."""
        rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, width * self.items.shape[1]))
        return row_chunks(query, rows_per_chunk)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, pool_size={self.pool_size}"
