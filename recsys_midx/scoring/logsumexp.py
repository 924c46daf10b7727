"""Normalisers over the whole catalog, computed in chunks of items so that no ``[Q, N]`` score
matrix is ever held: the plain dot product with a backward of its own, and the general form of
a head (transformed scores, several queries per context) through checkpointing."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.utils.checkpoint import checkpoint

from .mixtures import as_components
from .rows import catalog_chunks

#: A pointwise transform of scaled scores (a head's ``transform``).
Transform = Callable[[Tensor], Tensor]


def compute_dtype(query: Tensor, item_emb: Tensor) -> torch.dtype:
    """The dtype catalog scores are computed in: the inputs' common dtype, at least float32.

    Half precision loses too much in the ``exp``/``log`` of a softmax; float64 stays float64.

    Args:
        query: the queries.
        item_emb: the item table.

    Returns:
        The promoted dtype, never narrower than float32.

    Example:
        >>> compute_dtype(torch.ones(1, dtype=torch.bfloat16), torch.ones(1, dtype=torch.float16))
        torch.float32
    """
    return torch.promote_types(torch.promote_types(query.dtype, item_emb.dtype), torch.float32)


#: Scores per block on CPU. A block that outgrows the caches makes the elementwise passes over it
#: (max, exp, sum, the softmax weights of backward) memory-bound, and a fresh block of tens of MB
#: is mapped and page-faulted on every chunk, so a block holds a fixed number of scores, however
#: many queries share it, rather than a fixed number of items.
_CPU_BLOCK_SCORES = 1 << 21
#: The fewest items a CPU chunk holds however many queries there are, so that very large
#: batches still score items in matrix products rather than one row at a time.
_CPU_MIN_CHUNK_ITEMS = 256


#: The most scores the one-block path keeps for backward (256 MiB of float32): within it a catalog
#: that fits in one chunk is scored by one product whose softmax weights backward reuses.
_ONE_BLOCK_MAX_SCORES = 1 << 26


def items_per_chunk(chunk_size: int, scores_per_item: int, device: torch.device) -> int:
    """Items scored at once: ``chunk_size``, capped on CPU so a block holds about
    :data:`_CPU_BLOCK_SCORES` scores (``scores_per_item`` = queries times components). Accelerators
    take ``chunk_size`` as given: there larger blocks amortise kernel launches.

    Example:
        >>> items_per_chunk(8192, 128, torch.device("cuda"))
        8192
    """
    if device.type != "cpu":
        return chunk_size
    cache_sized = max(_CPU_MIN_CHUNK_ITEMS, _CPU_BLOCK_SCORES // max(1, scores_per_item))
    return max(1, min(chunk_size, cache_sized))


def _check_chunk_size(chunk_size: int) -> None:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def softmax_weights_(scores: Tensor) -> Tensor:
    """Turn ``scores`` into softmax weights over their last dimension, in place, and return the
    rows' logsumexp. A row of only ``-inf`` gets zero weights and a logsumexp of ``-inf``.

    Example:
        >>> scores = torch.tensor([[0.0, 0.0], [float("-inf"), float("-inf")]])
        >>> softmax_weights_(scores), scores
        (tensor([0.6931,   -inf]), tensor([[0.5000, 0.5000],
                [0.0000, 0.0000]]))
    """
    # Shift an all -inf row by 0, not by -inf (which would give NaN).
    row_max = scores.amax(dim=-1).nan_to_num_(neginf=0.0)
    total = scores.sub_(row_max[..., None]).exp_().sum(dim=-1)
    scores.div_(total.clamp(min=torch.finfo(total.dtype).tiny)[..., None])
    return total.log_().add_(row_max)


def _logsumexp_rows_(logits: Tensor) -> Tensor:
    """Row-wise logsumexp of ``[Q, C]`` logits, computed in place in ``logits`` to save memory;
    ``-inf`` for a row of only ``-inf`` (every item left out)."""
    row_max = logits.amax(dim=1).nan_to_num_(neginf=0.0)
    return logits.sub_(row_max[:, None]).exp_().sum(dim=1).log_().add_(row_max)


class ExcludedItems(NamedTuple):
    """Items some queries leave out of their normaliser, given for groups of queries.

    Attributes:
        items: ``[G, W]`` item ids of each group, any order, repeats and padding ``0`` allowed
            (id 0 is never in the sum).
        groups: ``[Q]`` the group of each query.
    """

    items: Tensor
    groups: Tensor

    def block(self, first: int, size: int) -> Tensor:
        """``[Q, size]`` true where item ``first + c`` is left out of query ``q``'s sum.

        Example:
            >>> excluded = ExcludedItems(torch.tensor([[2, 0], [4, 4]]), torch.tensor([1, 0, 1]))
            >>> excluded.block(1, 4).int().tolist()  # items 1..4
            [[0, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 1]]
        """
        local = self.items - first
        inside = (local >= 0) & (local < size)
        marks = torch.zeros(len(self.items), size + 1, dtype=torch.bool, device=local.device)
        # Items outside the block land on a spare last column, dropped.
        marks.scatter_(1, torch.where(inside, local, size), True)
        return marks[:, :size][self.groups]


def _block_scores(
    query: Tensor, first: int, items: Tensor, excluded: ExcludedItems | None
) -> Tensor:
    """``[Q, C]`` scores of the ``C`` items ``first, first + 1, ...`` (rows ``items``), ``-inf``
    where a query leaves the item out (``excluded``; ``None``: none)."""
    scores = query @ items.T
    if excluded is not None:
        scores.masked_fill_(excluded.block(first, len(items)), float("-inf"))
    return scores


class _ChunkedLogSumExp(torch.autograd.Function):
    """``lse[q] = log sum_{i=1..N} exp(query[q] . item_emb[i])`` without a ``[Q, N]`` tensor.

    Forward keeps a running logsumexp over item chunks; backward recomputes each chunk's logits and
    turns them into softmax weights ``exp(logits - lse)`` to accumulate the gradients, so peak
    memory is one ``[Q, chunk_size]`` block in both passes. A catalog of at most ``chunk_size``
    items whose ``[Q, N]`` scores stay within :data:`_ONE_BLOCK_MAX_SCORES` is one block: forward
    keeps its softmax weights and backward reuses them, one product fewer than recomputing (the
    memory bound is the same). Both passes compute in the inputs' dtype with autocast off:
    backward runs outside the caller's autocast region, so logits rounded to half precision in
    forward only would not match the recomputed ones, and ``exp(logits - lse)`` would overflow
    for large scores.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        query: Tensor,
        item_emb: Tensor,
        chunk_size: int,
        excluded: ExcludedItems | None,
    ) -> Tensor:
        num_items = item_emb.shape[0] - 1
        ctx.excluded = excluded
        with torch.autocast(query.device.type, enabled=False):
            if num_items <= chunk_size and query.shape[0] * num_items <= _ONE_BLOCK_MAX_SCORES:
                weights = _block_scores(query, 1, item_emb[1:], excluded)
                lse = softmax_weights_(weights)
                ctx.save_for_backward(query, item_emb, lse, weights)
                return lse
            chunk_size = items_per_chunk(chunk_size, query.shape[0], query.device)
            lse = query.new_full((query.shape[0],), float("-inf"))
            for first, items in catalog_chunks(item_emb, chunk_size):
                logits = _block_scores(query, first, items, excluded)
                lse = torch.logaddexp(lse, _logsumexp_rows_(logits))
        ctx.save_for_backward(query, item_emb, lse)
        ctx.chunk_size = chunk_size
        return lse

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, grad_lse: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None]:
        query, item_emb, lse, *kept = ctx.saved_tensors
        need_query, need_items = ctx.needs_input_grad[:2]
        # Row 0 (padding) is outside the normaliser, so its gradient stays zero.
        grad_items = torch.zeros_like(item_emb) if need_items else None
        with torch.autocast(query.device.type, enabled=False):
            if kept:  # the softmax weights of the one block forward scored
                # d loss / d logits scales their rows by grad_lse: applied to the products'
                # small operands rather than to the [Q, N] weights.
                weights = kept[0]
                if grad_items is not None:
                    grad_items[1:] = weights.T @ (grad_lse[:, None] * query)
                grad_query = grad_lse[:, None] * (weights @ item_emb[1:]) if need_query else None
                return grad_query, grad_items, None, None
            grad_query = torch.zeros_like(query) if need_query else None
            excluded = ctx.excluded
            if excluded is not None:  # a row of only left-out items: -inf - 0, not NaN
                lse = lse.nan_to_num(neginf=0.0)
            for start, items in catalog_chunks(item_emb, ctx.chunk_size):
                logits = _block_scores(query, start, items, excluded)
                # d lse / d logits = softmax; times the incoming gradient, d loss / d logits.
                grad_logits = logits.sub_(lse[:, None]).exp_().mul_(grad_lse[:, None])
                if grad_query is not None:
                    grad_query.addmm_(grad_logits, items)
                if grad_items is not None:
                    grad_items[start : start + items.shape[0]] = grad_logits.T @ query
        return grad_query, grad_items, None, None


def catalog_logsumexp(
    query: Tensor,
    item_emb: Tensor,
    chunk_size: int = 32768,
    excluded: ExcludedItems | None = None,
) -> Tensor:
    """``lse[q] = log sum_{i=1..N} exp(query[q] . item_emb[i])``, chunked over the items.

    The dot-product softmax's normaliser. Forward keeps a running logsumexp over chunks of
    ``chunk_size`` items (on CPU fewer where ``Q`` is large, so that a block of scores stays
    cache-sized); backward recomputes each chunk's scores, so memory is ``O(Q * chunk_size)``
    rather than ``O(Q * N)`` in both passes. A catalog of at most ``chunk_size`` items is scored
    in one product whose softmax weights backward reuses (up to :data:`_ONE_BLOCK_MAX_SCORES`
    scores). Both compute in :func:`compute_dtype` with autocast off, because half-precision
    scores would overflow the softmax weights of backward.

    With ``excluded``, each query's sum leaves out its group's items: their scores are masked
    inside each block of scores, in both passes, so leaving items out costs a mask per block
    rather than a second pass over them; a query whose items are all left out gets ``-inf`` and
    no gradient.

    Args:
        query: ``[Q, D]`` query vectors (already divided by any temperature).
        item_emb: ``[N+1, D]`` item table, row 0 padding (not in the sum).
        chunk_size: items scored at once.
        excluded: the items each query leaves out (``None``: none).

    Returns:
        ``[Q]`` normalisers in :func:`compute_dtype` of the inputs.

    Raises:
        ValueError: if ``chunk_size < 1``.

    Example:
        >>> query, item_emb = torch.randn(3, 4), torch.randn(11, 4)
        >>> lse = catalog_logsumexp(query, item_emb, chunk_size=4)
        >>> torch.allclose(lse, torch.logsumexp(query @ item_emb[1:].T, dim=1))
        True
        >>> left_out = ExcludedItems(torch.tensor([[1, 2]]), torch.zeros(3, dtype=torch.long))
        >>> lse = catalog_logsumexp(query, item_emb, chunk_size=4, excluded=left_out)
        >>> torch.allclose(lse, torch.logsumexp(query @ item_emb[3:].T, dim=1))
        True
    """
    _check_chunk_size(chunk_size)
    dtype = compute_dtype(query, item_emb)
    return _ChunkedLogSumExp.apply(query.to(dtype), item_emb.to(dtype), chunk_size, excluded)


def identity(scores: Tensor) -> Tensor:
    """The identity transform: a head without one. :func:`head_logsumexp` recognises it and
    takes the dot product's path, whose backward is its own."""
    return scores


def _chunk_logsumexp(queries: Tensor, items: Tensor, transform: Transform) -> Tensor:
    """``[Q, K]`` logsumexp over ``items`` ``[C, D]`` of the transformed scores."""
    # The compute dtype even under autocast: a transform such as PLIF bins the scores, and
    # half-precision scores of large magnitude would land in the wrong bins.
    with torch.autocast(queries.device.type, enabled=False):
        return torch.logsumexp(transform(queries @ items.T), dim=-1)


def head_logsumexp(
    queries: Tensor, item_emb: Tensor, transform: Transform, chunk_size: int = 32768
) -> Tensor:
    """``lse[q, k] = log sum_{i=1..N} exp(f(queries[q, k] . item_emb[i]))``, chunked over items.

    Each chunk of ``chunk_size // K`` items (on CPU fewer where ``Q * K`` is large, as in
    :func:`catalog_logsumexp`) is scored, transformed and reduced to ``[Q, K]``. For the
    :func:`identity` (a mixture of plain softmaxes) it is :func:`catalog_logsumexp` of the
    ``Q * K`` queries, ``chunk_size`` items at a time, whose backward recomputes no forward.
    Under autograd each chunk is checkpointed (:func:`torch.utils.checkpoint.checkpoint`): its
    ``[Q, K, C]`` scores are freed after forward and recomputed one chunk at a time in backward,
    so memory stays ``O(Q * chunk_size)`` in both passes while gradients reach the queries, the
    table and any parameters of ``transform`` (a PLIF head's slopes).

    Args:
        queries: ``[Q, K, D]`` scaled component queries (``[Q, D]`` means ``K = 1``).
        item_emb: ``[N+1, D]`` item table, row 0 padding (not in the sum); moved chunk by chunk
            to the device of ``queries``.
        transform: the head's pointwise transform ``f``; :func:`identity` for none.
        chunk_size: bounds the ``Q * K * C`` scores alive at once (``Q * K * chunk_size`` for
            the identity).

    Returns:
        ``[Q, K]`` (``[Q, 1]`` for ``[Q, D]`` queries), at least float32.

    Raises:
        ValueError: if ``chunk_size < 1``.

    Example:
        >>> queries, item_emb = torch.randn(3, 2, 4), torch.randn(11, 4)
        >>> lse = head_logsumexp(queries, item_emb, torch.tanh, chunk_size=4)
        >>> torch.allclose(lse, torch.logsumexp(torch.tanh(queries @ item_emb[1:].T), -1))
        True
    """
    _check_chunk_size(chunk_size)
    dtype = compute_dtype(queries, item_emb)
    queries = as_components(queries).to(dtype)
    if transform is identity and item_emb.device == queries.device:
        # A mixture's components are plain softmaxes: their Q * K queries share one normaliser,
        # whose backward needs no recomputed forward.
        flat = catalog_logsumexp(queries.flatten(0, 1), item_emb, chunk_size)
        return flat.view(queries.shape[:2])
    step = items_per_chunk(
        max(1, chunk_size // queries.shape[1]), queries.shape[0] * queries.shape[1], queries.device
    )
    parts = []
    for _, items in catalog_chunks(item_emb, step):
        items = items.to(device=queries.device, dtype=dtype)
        if torch.is_grad_enabled():
            parts.append(
                checkpoint(
                    _chunk_logsumexp,
                    queries,
                    items,
                    transform,
                    use_reentrant=False,
                    preserve_rng_state=False,
                )
            )
        else:
            parts.append(_chunk_logsumexp(queries, items, transform))
    return torch.logsumexp(torch.stack(parts, dim=-1), dim=-1)
