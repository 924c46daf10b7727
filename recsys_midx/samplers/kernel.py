"""Kernel sampler: the quadratic-kernel proposal of Blanc & Rendle (2018).

"Adaptive Sampled Softmax with Kernel Based Sampling" proposes ``q(i | z) ∝ K(z, v_i)`` with the
quadratic kernel ``K(z, v) = alpha * (z.v)**2 + 1``, a non-negative stand-in for ``exp(z.v)``
whose normaliser has a closed form:

    Z(z) = sum_i K(z, v_i) = alpha * z^T S z + N,    S = sum_i v_i v_i^T,

so ``log q`` is exact and costs ``O(D**2)`` per query besides the item's own score. The kernel is
symmetric in the sign of the score: an item scored very negatively is as likely as one scored
very positively, the price of the closed form.

Sampling is exact and sublinear in ``N`` through a two-level scheme. Items ``1..N`` are split into
``ceil(N / B)`` blocks of ``B`` consecutive ids; block ``b`` has mass
``m_b(z) = alpha * z^T S_b z + n_b`` with ``S_b`` the second moment of its items. A draw picks a
block with probability ``m_b / sum m``, then an item inside it with probability
``K(z, v_i) / k_b(z)``, where ``k_b = sum_{j in b} K(z, v_j)`` is computed from the block's own
kernel values. In exact arithmetic ``m_b = k_b``; in floating point the two differ by rounding,
and the reported ``log q = log m_b - log sum m + log K(z, v_i) - log k_b`` is the probability of
the draw as actually made, normalised over the catalog. ``S_b`` is summed in float64 and stored
as a factor ``F_b`` with ``S_b = F_b F_b^T`` (from its eigendecomposition), so
``z^T S_b z = |F_b^T z|**2`` is a sum of non-negative terms free of cancellation. A query costs
``O(N / B * D**2)`` for the block masses and ``O(B * D)`` per draw; ``B`` defaults to about
``sqrt(N * D / M)``, which balances the two.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from recsys_midx.index import IndexModule
from recsys_midx.samplers.base import Sampler, check_item_table, full_precision
from recsys_midx.samplers.draws import inverse_cdf
from recsys_midx.scoring import row_chunks

#: Cap on the elements of a chunk's temporaries (block projections, gathered block items).
_CHUNK_ELEMENTS = 1 << 22


class KernelSampler(Sampler, IndexModule):
    """Quadratic-kernel sampler: ``q(i | z) ∝ alpha * (z.v_i)**2 + 1``, exact ``log q``.

    Call :meth:`update` with the item table before sampling, and again to refresh the proposal;
    the item table snapshot and the block factors are buffers, so they follow ``.to(device)``
    and ``state_dict``. The ``+ 1`` keeps every item drawable, so a positive always has a finite
    ``log q``.

    Args:
        num_items: ``N``; ids are ``1..N``.
        num_negatives: ``M`` drawn per query by the objective.
        alpha: weight of the squared score; larger values follow the score magnitude more
            closely, smaller ones flatten the proposal towards uniform.
        block_size: ``B``, items per block of the two-level draw; ``None`` picks about
            ``sqrt(N * D / M)`` at :meth:`update`. Any size gives the same distribution.

    Raises:
        ValueError: if ``alpha`` is not finite and positive, ``block_size < 1``, or on the
            conditions of :class:`Sampler`.

    Example:
        >>> sampler = KernelSampler(num_items=1000, num_negatives=10, alpha=10.0)
        >>> sampler.update(torch.randn(1001, 16))
        >>> ids, log_q = sampler.sample(torch.randn(4, 16), 10)
        >>> ids.shape, log_q.dtype
        (torch.Size([4, 10]), torch.float32)
    """

    minimums = {"block_size": 1}

    def __init__(
        self,
        num_items: int,
        num_negatives: int = 100,
        alpha: float = 100.0,
        block_size: int | None = None,
    ) -> None:
        super().__init__(num_items, num_negatives)
        self.check_settings(locals())  # every argument against the declared choices and minimums
        if not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha must be finite and > 0, got {alpha}")
        self.alpha = float(alpha)
        self.block_size = block_size
        #: ``[C, B, D]`` items in id order, padded with zero rows to ``C * B``.
        self.register_buffer("blocked_items", torch.empty(0, 0, 0))
        #: ``[C, D, D]`` factors ``F_b`` with ``S_b = F_b F_b^T``.
        self.register_buffer("block_factors", torch.empty(0, 0, 0))

    @property
    def num_blocks(self) -> int:
        """``C = ceil(N / B)`` blocks (0 before :meth:`update`)."""
        return self.blocked_items.shape[0]

    @torch.no_grad()
    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """Snapshot the item table and build the per-block second-moment factors.

        Args:
            item_emb: ``[N+1, D]`` item table (row 0, padding, is not used); buffers move to its
                device.
            item_counts: ignored.

        Raises:
            ValueError: if the table is not ``[N+1, D]`` or has NaN or infinite entries (see
                :func:`~recsys_midx.samplers.base.check_item_table`).
        """
        check_item_table(item_emb, self.num_items)
        items = item_emb[1:].detach().float()
        dim = items.shape[1]
        size = self.block_size or round(math.sqrt(self.num_items * dim / self.num_negatives))
        size = min(max(size, 1), self.num_items)
        num_blocks = -(-self.num_items // size)
        padded = items.new_zeros(num_blocks * size, dim)
        padded[: self.num_items] = items
        self.blocked_items = padded.view(num_blocks, size, dim)
        moments = self._block_moments()
        # Eigendecomposition of the small [D, D] matrices on the CPU. Rounding may leave tiny
        # negative eigenvalues of a PSD matrix: clamped.
        values, vectors = torch.linalg.eigh(moments.cpu())
        factors = vectors * values.clamp_min(0.0).sqrt()[:, None, :]
        # Contiguous: buffers are moved as byte views (see IndexModule).
        self.block_factors = factors.to(device=items.device, dtype=torch.float32).contiguous()

    def _draw(
        self, query: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        size = self.blocked_items.shape[1]
        ids = torch.empty(query.shape[0], num_samples, dtype=torch.long, device=query.device)
        log_q = torch.empty(query.shape[0], num_samples, device=query.device)
        for rows, z in self._chunks(query, num_samples):
            log_block_q = self._log_block_masses(z)
            blocks, _ = inverse_cdf(log_block_q.exp(), num_samples, generator)
            blocks.clamp_(max=self.num_blocks - 1)
            kernel = self._kernel_in_blocks(z, blocks)
            positions, block_kernel = inverse_cdf(kernel.clone(), 1, generator)
            positions.clamp_(max=size - 1)
            chosen = kernel.gather(2, positions).squeeze(2)
            ids[rows] = blocks * size + positions.squeeze(2) + 1
            log_q[rows] = (
                log_block_q.gather(1, blocks) + chosen.log() - block_kernel.squeeze(2).log()
            )
        return ids, log_q

    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        flat = ids.reshape(ids.shape[0], -1).long()
        size = self.blocked_items.shape[1]
        out = torch.empty(flat.shape, device=query.device)
        # Id 0 is looked up as item 1 and masked afterwards.
        items = (flat - 1).clamp_min(0)
        per_id = max(1, size * query.shape[1])
        columns = max(1, _CHUNK_ELEMENTS // per_id)
        for rows, z in self._chunks(query, min(flat.shape[1], columns)):
            log_block_q = self._log_block_masses(z)
            for start in range(0, flat.shape[1], columns):
                cols = slice(start, start + columns)
                blocks = items[rows, cols].div(size, rounding_mode="floor")
                positions = items[rows, cols].remainder(size)
                kernel = self._kernel_in_blocks(z, blocks)
                chosen = kernel.gather(2, positions[..., None]).squeeze(2)
                out[rows, cols] = log_block_q.gather(1, blocks) + chosen.log() - kernel.sum(2).log()
        return out.masked_fill_(flat == 0, -math.inf).view(ids.shape)

    def _catalog_log_prob(self, query: Tensor) -> Tensor:
        """From one score per item and query (``O(N * D)``) instead of a block's worth per id."""
        num_blocks, size, dim = self.blocked_items.shape
        out = torch.empty(query.shape[0], self.num_items, device=query.device)
        # Per query: N scores (padded to C * B) and the C * D block projections.
        rows_per_chunk = max(1, _CHUNK_ELEMENTS // (num_blocks * max(size, dim)))
        for rows, z in row_chunks(query, rows_per_chunk):
            scores = z @ self.blocked_items.view(-1, dim).T
            kernel = self._kernel(scores).view(z.shape[0], num_blocks, size)
            kernel[:, -1, self.num_items - (num_blocks - 1) * size :] = 0.0
            log_q = (
                self._log_block_masses(z)[:, :, None]
                + kernel.log()
                - kernel.sum(2, keepdim=True).log()
            )
            out[rows] = log_q.view(z.shape[0], -1)[:, : self.num_items]
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}, block_size={self.block_size}"

    def _kernel(self, scores: Tensor) -> Tensor:
        """``alpha * s**2 + 1`` of scores ``s``, a fresh tensor."""
        return scores.square().mul_(self.alpha).add_(1.0)

    def _block_moments(self) -> Tensor:
        """``[C, D, D]`` float64 second moments ``S_b`` of the blocks.

        Summed in float64, a few blocks at a time: a float32 sum rounds every entry by about
        ``eps * |v|**2``, which swamps ``z^T S_b z`` when the items are large and nearly
        orthogonal to the query, and the block masses would then no longer be the kernel's.
        """
        num_blocks, size, dim = self.blocked_items.shape
        moments = self.blocked_items.new_empty(num_blocks, dim, dim, dtype=torch.float64)
        step = max(1, _CHUNK_ELEMENTS // (size * dim))
        with full_precision(self.blocked_items.device):
            for start in range(0, num_blocks, step):
                blocks = self.blocked_items[start : start + step].double()
                moments[start : start + step] = blocks.transpose(1, 2) @ blocks
        return moments

    def _log_block_masses(self, z: Tensor) -> Tensor:
        """``[Qc, C]`` normalised log block masses ``log(m_b / sum m)``."""
        num_blocks, size, _ = self.blocked_items.shape
        counts = torch.full((num_blocks,), float(size), device=z.device)
        counts[-1] = self.num_items - (num_blocks - 1) * size
        projected = torch.einsum("qd,cdr->qcr", z, self.block_factors)
        masses = projected.square_().sum(2).mul_(self.alpha).add_(counts)
        total = masses.sum(1, keepdim=True)
        return masses.log_().sub_(total.log_())

    def _kernel_in_blocks(self, z: Tensor, blocks: Tensor) -> Tensor:
        """``[Qc, L, B]`` kernel values of the items of ``blocks`` ``[Qc, L]``, 0 at padding."""
        num_blocks, size, _ = self.blocked_items.shape
        scores = torch.einsum("qd,qlbd->qlb", z, self.blocked_items[blocks])
        kernel = self._kernel(scores)
        padding = (blocks[..., None] * size + torch.arange(size, device=z.device)) >= self.num_items
        return kernel.masked_fill_(padding, 0.0)

    def _check_ready(self) -> None:
        if self.num_blocks == 0:
            raise RuntimeError("KernelSampler has no index yet: call update(item_emb) first")

    def _query_dim(self) -> int:
        return self.blocked_items.shape[2]

    def _chunks(self, query: Tensor, draws: int) -> Iterator[tuple[slice, Tensor]]:
        """Row blocks of the queries, sized so that the block projections (``C * D`` per query)
        and the gathered block items (``draws * B * D`` per query) stay within the cap."""
        num_blocks, size, dim = self.blocked_items.shape
        per_query = max(num_blocks * dim, draws * size * dim)
        rows_per_chunk = max(1, _CHUNK_ELEMENTS // per_query)
        return row_chunks(query, rows_per_chunk)
