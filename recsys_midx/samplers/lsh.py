"""LSH sampler: SimHash buckets of the item table, the query's bucket as the proposal.

Signed random projections (SimHash, Charikar 2002) hash a vector ``x`` to the ``b`` bits
``sign(P_t x)`` in each of ``T`` tables; vectors at a small angle share a bucket more often, so
the items in the query's bucket lean towards high ``z.v``. A draw

1. with probability ``uniform_mix`` (``eps``) is uniform over the catalog;
2. otherwise picks a table ``t`` uniformly and, if the query's bucket in it is non-empty, an item
   uniformly inside that bucket, or else an item uniformly from the catalog.

So the proposal has a closed form:

    q(i | z) = eps / N + (1 - eps) / T * sum_t [ 1{i in bucket_t(z)} / |bucket_t(z)|
                                                  if bucket_t(z) is non-empty else 1 / N ]

and ``log q`` is exact, for drawn ids and any other id, at ``O(T)`` per id. Without the uniform
component an item outside all the query's buckets would have ``q = 0``: a positive there gets
``log q = -inf`` and the logQ-corrected logit ``+inf``, which makes the sampled softmax NaN. The
mixture gives every item ``q >= eps / N``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from recsys_midx.index import IndexModule
from recsys_midx.samplers.base import Sampler, check_item_table, full_precision
from recsys_midx.samplers.uniform import RANDOM_RANGE, random_int62

#: Largest ``num_bits``: each table keeps ``2**num_bits + 1`` bucket offsets.
MAX_BITS = 24


class LSHSampler(Sampler, IndexModule):
    """SimHash sampler: a uniform draw from the query's bucket in a random table, exact ``log q``.

    Call :meth:`update` with the item table before sampling, and again to re-hash the items; the
    projections depend only on ``seed`` and the dimension, so a refresh moves items between
    buckets but keeps the hash functions. All state is in buffers, so it follows
    ``.to(device)`` and ``state_dict``.

    Args:
        num_items: ``N``; ids are ``1..N``.
        num_negatives: ``M`` drawn per query by the objective.
        num_tables: ``T`` hash tables; more tables smooth the proposal over more buckets.
        num_bits: ``b`` bits per table (``2**b`` buckets); more bits make smaller buckets of
            closer items, and more empty ones.
        uniform_mix: ``eps``, the probability of a uniform draw over the catalog, in ``(0, 1]``;
            it keeps every item's ``q`` positive (see the module docstring).
        seed: seed of the random projections (the draws use the ``generator`` of
            :meth:`sample`).

    Raises:
        ValueError: if ``num_tables < 1``, ``num_bits`` is not in ``1..24``, ``uniform_mix`` is
            not in ``(0, 1]``, or on the conditions of :class:`Sampler`.

    Example:
        >>> sampler = LSHSampler(num_items=1000, num_negatives=10, num_tables=4, num_bits=6)
        >>> sampler.update(torch.randn(1001, 16))
        >>> ids, log_q = sampler.sample(torch.randn(4, 16), 10)
        >>> ids.shape, log_q.dtype
        (torch.Size([4, 10]), torch.float32)
    """

    minimums = {"num_tables": 1}

    def __init__(
        self,
        num_items: int,
        num_negatives: int = 100,
        num_tables: int = 8,
        num_bits: int = 8,
        uniform_mix: float = 0.1,
        seed: int = 0,
    ) -> None:
        super().__init__(num_items, num_negatives)
        self.check_settings(locals())  # every argument against the declared choices and minimums
        if not 1 <= num_bits <= MAX_BITS:
            raise ValueError(f"num_bits must be in 1..{MAX_BITS}, got {num_bits}")
        if not 0 < uniform_mix <= 1:
            raise ValueError(f"uniform_mix must be in (0, 1], got {uniform_mix}")
        self.num_tables = int(num_tables)
        self.num_bits = int(num_bits)
        self.uniform_mix = float(uniform_mix)
        self.seed = int(seed)
        # A draw is uniform when a random 62-bit word falls below this threshold: probability
        # uniform_mix to within 2**-62, with no float rounding of the comparison.
        self._mix_threshold = round(self.uniform_mix * RANDOM_RANGE)
        #: ``[T, b, D]`` projections.
        self.register_buffer("projections", torch.empty(0, 0, 0))
        #: ``[T, N+1]`` bucket of each id in each table; -1 for the padding id.
        self.register_buffer("item_keys", torch.empty(0, 0, dtype=torch.long))
        #: ``[T, N]`` ids sorted by bucket, per table.
        self.register_buffer("order", torch.empty(0, 0, dtype=torch.long))
        #: ``[T, 2**b + 1]`` start of each bucket in ``order``, per table.
        self.register_buffer("offsets", torch.empty(0, 0, dtype=torch.long))

    @torch.no_grad()
    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """Hash the item table into the buckets of every table.

        Args:
            item_emb: ``[N+1, D]`` item table (row 0, padding, is not hashed); buffers move to
                its device.
            item_counts: ignored.

        Raises:
            ValueError: if the table is not ``[N+1, D]`` or has NaN or infinite entries (see
                :func:`~recsys_midx.samplers.base.check_item_table`).
        """
        check_item_table(item_emb, self.num_items)
        items = item_emb[1:].detach().float()
        device = items.device
        # Drawn on the CPU from the seed alone, so every refresh (and device) hashes alike.
        generator = torch.Generator().manual_seed(self.seed)
        shape = (self.num_tables, self.num_bits, items.shape[1])
        self.projections = torch.randn(shape, generator=generator).to(device)
        keys = self._keys(items)  # [N, T]
        self.item_keys = torch.cat([keys.new_full((1, self.num_tables), -1), keys]).T.contiguous()
        self.order = keys.T.argsort(dim=1, stable=True).add_(1).contiguous()
        counts = torch.zeros(self.num_tables, 1 << self.num_bits, dtype=torch.long, device=device)
        counts.scatter_add_(1, keys.T, torch.ones_like(keys.T))
        self.offsets = torch.nn.functional.pad(counts.cumsum(1), (1, 0))

    def _draw(
        self, query: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        keys, starts, sizes = self._query_buckets(query)
        shape = (query.shape[0], num_samples)
        tables = random_int62(shape, query.device, generator).remainder_(self.num_tables)
        uniform = random_int62(shape, query.device, generator) < self._mix_threshold
        words = random_int62(shape, query.device, generator)
        size = sizes.gather(1, tables)
        in_bucket = ~uniform & (size > 0)
        # The position in the chosen bucket (where one is drawn from), flattened over tables.
        at = starts.gather(1, tables) + words.remainder(size.clamp_min(1))
        at.clamp_(max=self.num_items - 1).add_(tables * self.num_items)
        bucket_ids = self.order.view(-1)[at]
        ids = torch.where(in_bucket, bucket_ids, words.remainder(self.num_items).add_(1))
        return ids, self._log_q(keys, ids, sizes)

    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        flat = ids.reshape(ids.shape[0], -1).long()
        keys, _, sizes = self._query_buckets(query)
        return self._log_q(keys, flat, sizes).view(ids.shape)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_tables={self.num_tables}, num_bits={self.num_bits}, "
            f"uniform_mix={self.uniform_mix}"
        )

    def _keys(self, vectors: Tensor) -> Tensor:
        """``[R, T]`` bucket of each row of ``vectors`` ``[R, D]`` in each table."""
        with full_precision(vectors.device):
            bits = torch.einsum("rd,tbd->rtb", vectors, self.projections) > 0
        weights = 1 << torch.arange(self.num_bits, device=vectors.device)
        return (bits.long() * weights).sum(2)

    def _query_buckets(self, query: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Bucket of each query in each table, its start in ``order`` and its size, ``[Q, T]``
        each."""
        keys = self._keys(query)
        starts = self.offsets.gather(1, keys.T)
        sizes = self.offsets.gather(1, keys.T + 1) - starts
        return keys, starts.T, sizes.T

    def _log_q(self, query_keys: Tensor, ids: Tensor, sizes: Tensor) -> Tensor:
        """``log q`` of ``ids`` ``[Q, L]`` for queries in buckets ``query_keys`` ``[Q, T]`` of
        sizes ``sizes`` ``[Q, T]``; ``-inf`` for id 0."""
        eps, num_items = self.uniform_mix, self.num_items
        # The tables whose bucket is empty fall back to 1/N for every id.
        empty = (sizes == 0).sum(1, keepdim=True).float()
        q = (empty * ((1.0 - eps) / (self.num_tables * num_items))).add_(eps / num_items)
        q = q.expand(ids.shape).clone()
        weight = (1.0 - eps) / self.num_tables
        for table in range(self.num_tables):
            member = self.item_keys[table][ids] == query_keys[:, table : table + 1]
            share = weight / sizes[:, table : table + 1].clamp_min(1).float()
            q.add_(member * share)
        return q.log_().masked_fill_(ids == 0, -math.inf)

    def _check_ready(self) -> None:
        if self.order.numel() == 0:
            raise RuntimeError("LSHSampler has no tables yet: call update(item_emb) first")

    def _query_dim(self) -> int:
        return self.projections.shape[2]
