"""Exact full-softmax cross-entropy over the catalog, with memory bounded by chunking over items:
the plain dot-product softmax, and the general form of a head (transformed scores, several
queries per context)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.utils.checkpoint import checkpoint


def compute_dtype(query: Tensor, item_emb: Tensor) -> torch.dtype:
    """The dtype losses compute in: the inputs' common dtype, at least float32, because half
    precision loses too much in the ``exp``/``log`` of a softmax (float64 stays float64)."""
    return torch.promote_types(torch.promote_types(query.dtype, item_emb.dtype), torch.float32)


_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


def gather_rows(item_emb: Tensor, ids: list[Tensor], dtype: torch.dtype) -> list[Tensor]:
    """Rows ``item_emb[ids_j]`` for each id tensor ``ids_j`` (shapes ``ids_j.shape + (D,)``), cast
    to ``dtype``, from one lookup of the table.

    Every lookup of the table gives backward a dense ``[N+1, D]`` gradient to fill and add, which
    at a million items costs more than the scores themselves; one lookup makes one. Only the
    gathered rows are cast, never the table.
    """
    rows = F.embedding(torch.cat([part.reshape(-1) for part in ids]), item_emb).to(dtype)
    chunks = rows.split([part.numel() for part in ids])
    return [chunk.view(*part.shape, item_emb.shape[1]) for chunk, part in zip(chunks, ids)]


def without_autocast(loss: Callable[_Params, _Result]) -> Callable[_Params, _Result]:
    """Run a loss function with autocast off on the device of its first argument (the query).

    The losses cast their inputs to :func:`compute_dtype`; inside an autocast region their
    products would still be lowered to half precision, which at large norms reorders scores and
    overflows the normaliser's backward.
    """

    @functools.wraps(loss)
    def wrapper(*args: _Params.args, **kwargs: _Params.kwargs) -> _Result:
        with torch.autocast(args[0].device.type, enabled=False):
            return loss(*args, **kwargs)

    return wrapper


def check_scoring_inputs(query: Tensor, item_emb: Tensor, targets: Tensor) -> None:
    """Check the inputs every softmax loss shares.

    Raises:
        ValueError: unless ``query`` is a floating ``[Q, D]`` tensor, ``item_emb`` a floating
            ``[N+1, D]`` tensor with ``N >= 1``, and ``targets`` an integer ``[Q]`` tensor of ids
            in ``1..N``.
    """
    if not (query.is_floating_point() and item_emb.is_floating_point()):
        raise ValueError(
            f"query and item_emb must be floating point, got {query.dtype} and {item_emb.dtype}"
        )
    if query.dim() != 2:
        raise ValueError(f"query must have shape [Q, D], got {tuple(query.shape)}")
    if item_emb.dim() != 2 or item_emb.shape[0] < 2 or item_emb.shape[1] != query.shape[1]:
        raise ValueError(
            f"item_emb must have shape [N+1, D] with N >= 1 and D = {query.shape[1]}, "
            f"got {tuple(item_emb.shape)}"
        )
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer ids, got {targets.dtype}")
    if tuple(targets.shape) != (query.shape[0],):
        raise ValueError(f"targets must have shape [{query.shape[0]}], got {tuple(targets.shape)}")
    num_items = item_emb.shape[0] - 1
    if targets.numel() and bool(((targets < 1) | (targets > num_items)).any()):
        raise ValueError(f"targets must lie in 1..{num_items} (0 is padding)")


def _item_chunks(num_items: int, chunk_size: int) -> range:
    """Start rows of the item chunks; the real items are rows ``1..N`` of the table."""
    return range(1, num_items + 1, chunk_size)


#: Scores per block on CPU. A block that outgrows the caches makes the elementwise passes over it
#: (max, exp, sum, the softmax weights of backward) memory-bound, and a fresh block of tens of MB
#: is mapped and page-faulted on every chunk, so a block holds a fixed number of scores, however
#: many queries share it, rather than a fixed number of items.
_CPU_BLOCK_SCORES = 1 << 21
#: The fewest items a CPU chunk holds however many queries there are, so that very large
#: batches still score items in matrix products rather than one row at a time.
_CPU_MIN_CHUNK_ITEMS = 256


def _items_per_chunk(chunk_size: int, scores_per_item: int, device: torch.device) -> int:
    """Items scored at once: ``chunk_size``, capped on CPU so a block holds about
    :data:`_CPU_BLOCK_SCORES` scores (``scores_per_item`` = queries times components). Accelerators
    take ``chunk_size`` as given: there larger blocks amortise kernel launches."""
    if device.type != "cpu":
        return chunk_size
    cache_sized = max(_CPU_MIN_CHUNK_ITEMS, _CPU_BLOCK_SCORES // max(1, scores_per_item))
    return max(1, min(chunk_size, cache_sized))


def _logsumexp_rows_(logits: Tensor) -> Tensor:
    """Row-wise logsumexp of ``[Q, C]`` logits, computed in place in ``logits`` to save memory."""
    row_max = logits.amax(dim=1)
    return logits.sub_(row_max[:, None]).exp_().sum(dim=1).log_().add_(row_max)


class _ChunkedLogSumExp(torch.autograd.Function):
    """``lse[q] = log sum_{i=1..N} exp(query[q] . item_emb[i])`` without a ``[Q, N]`` tensor.

    Forward keeps a running logsumexp over item chunks; backward recomputes each chunk's logits and
    turns them into softmax weights ``exp(logits - lse)`` to accumulate the gradients, so peak
    memory is one ``[Q, chunk_size]`` block in both passes. Both passes compute in the inputs'
    dtype with autocast off: backward runs outside the caller's autocast region, so logits
    rounded to half precision in forward only would not match the recomputed ones, and
    ``exp(logits - lse)`` would overflow for large scores.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, query: Tensor, item_emb: Tensor, chunk_size: int) -> Tensor:
        num_items = item_emb.shape[0] - 1
        chunk_size = _items_per_chunk(chunk_size, query.shape[0], query.device)
        lse = query.new_full((query.shape[0],), float("-inf"))
        with torch.autocast(query.device.type, enabled=False):
            for start in _item_chunks(num_items, chunk_size):
                logits = query @ item_emb[start : start + chunk_size].T
                lse = torch.logaddexp(lse, _logsumexp_rows_(logits))
        ctx.save_for_backward(query, item_emb, lse)
        ctx.chunk_size = chunk_size
        return lse

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_lse: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        query, item_emb, lse = ctx.saved_tensors
        need_query, need_items = ctx.needs_input_grad[:2]
        grad_query = torch.zeros_like(query) if need_query else None
        # Row 0 (padding) is outside the normaliser, so its gradient stays zero.
        grad_items = torch.zeros_like(item_emb) if need_items else None
        with torch.autocast(query.device.type, enabled=False):
            for start in _item_chunks(item_emb.shape[0] - 1, ctx.chunk_size):
                items = item_emb[start : start + ctx.chunk_size]
                # d lse / d logits = softmax; times the incoming gradient, d loss / d logits.
                grad_logits = (query @ items.T).sub_(lse[:, None]).exp_().mul_(grad_lse[:, None])
                if grad_query is not None:
                    grad_query.addmm_(grad_logits, items)
                if grad_items is not None:
                    grad_items[start : start + ctx.chunk_size] = grad_logits.T @ query
        return grad_query, grad_items, None


def full_softmax_loss(
    query: Tensor, item_emb: Tensor, targets: Tensor, chunk_size: int = 32768
) -> Tensor:
    """Per-query cross-entropy of the softmax over all items ``1..N``.

    ``loss[q] = logsumexp_{i=1..N}(query[q] . item_emb[i]) - query[q] . item_emb[targets[q]]``.
    Row ``0`` of ``item_emb`` (padding) is not part of the normaliser. The normaliser is computed
    ``chunk_size`` items at a time in forward and backward, so memory is ``O(Q * chunk_size)``
    rather than ``O(Q * N)``. Half-precision inputs are computed in float32.

    Args:
        query: ``[Q, D]`` query vectors (already divided by any temperature).
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        chunk_size: items scored at once (on CPU fewer where ``Q`` is large, so that a block of
            scores stays cache-sized); peak extra memory is about ``Q * chunk_size`` floats.

    Returns:
        ``[Q]`` losses (float32, or float64 for float64 inputs).

    Raises:
        ValueError: on malformed shapes, targets outside ``1..N``, or ``chunk_size < 1``.

    Example:
        >>> query, item_emb = torch.randn(4, 8), torch.randn(11, 8)
        >>> targets = torch.tensor([1, 5, 10, 3])
        >>> loss = full_softmax_loss(query, item_emb, targets, chunk_size=4)
        >>> reference = F.cross_entropy(query @ item_emb[1:].T, targets - 1, reduction="none")
        >>> torch.allclose(loss, reference, atol=1e-5)
        True
    """
    check_scoring_inputs(query, item_emb, targets)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    dtype = compute_dtype(query, item_emb)
    query, item_emb = query.to(dtype), item_emb.to(dtype)
    lse = _ChunkedLogSumExp.apply(query, item_emb, chunk_size)
    target_logits = (query * F.embedding(targets, item_emb)).sum(dim=1)
    return lse - target_logits


# --- heads: transformed scores and several queries per context -------------------------------

#: A pointwise transform of scaled scores (a head's ``transform``).
Transform = Callable[[Tensor], Tensor]


def as_components(queries: Tensor) -> Tensor:
    """``[Q, K, D]`` view of a head's queries: a single ``[Q, D]`` query is one component."""
    return queries.unsqueeze(1) if queries.dim() == 2 else queries


def mixture_log_prob(log_p: Tensor, log_prior: Tensor | None) -> Tensor:
    """``logsumexp_k(log_prior_k + log_p_k)`` over the last dimension (``K``).

    Args:
        log_p: ``[..., K]`` component log-probabilities.
        log_prior: ``[..., K]`` normalised mixture log-weights, or ``None`` when ``K = 1``.

    Returns:
        ``[...]`` log-probabilities of the mixture.
    """
    if log_prior is None:
        return log_p.squeeze(-1)
    return torch.logsumexp(log_p + log_prior.to(log_p.dtype), dim=-1)


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

    Each chunk of ``chunk_size // K`` items (on CPU fewer where ``Q * K`` is large, see
    :func:`full_softmax_loss`) is scored, transformed and reduced to ``[Q, K]``.
    Under autograd each chunk is checkpointed (:func:`torch.utils.checkpoint.checkpoint`): its
    ``[Q, K, C]`` scores are freed after forward and recomputed one chunk at a time in backward,
    so memory stays ``O(Q * chunk_size)`` in both passes while gradients reach the queries, the
    table and any parameters of ``transform`` (a PLIF head's slopes).

    Args:
        queries: ``[Q, K, D]`` scaled component queries (``[Q, D]`` means ``K = 1``).
        item_emb: ``[N+1, D]`` item table, row 0 padding (not in the sum); moved chunk by chunk
            to the device of ``queries``.
        transform: the head's pointwise transform ``f``.
        chunk_size: bounds the ``Q * K * C`` scores alive at once.

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
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    dtype = compute_dtype(queries, item_emb)
    queries = as_components(queries).to(dtype)
    step = _items_per_chunk(
        max(1, chunk_size // queries.shape[1]), queries.shape[0] * queries.shape[1], queries.device
    )
    parts = []
    for start in _item_chunks(item_emb.shape[0] - 1, step):
        items = item_emb[start : start + step].to(device=queries.device, dtype=dtype)
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk_logsumexp, queries, items, transform,
                                    use_reentrant=False, preserve_rng_state=False))
        else:
            parts.append(_chunk_logsumexp(queries, items, transform))
    return torch.logsumexp(torch.stack(parts, dim=-1), dim=-1)


def head_full_softmax_loss(
    queries: Tensor,
    log_prior: Tensor | None,
    item_emb: Tensor,
    targets: Tensor,
    transform: Transform,
    chunk_size: int = 32768,
) -> Tensor:
    """Per-query exact cross-entropy of a head's model over all items ``1..N``.

    ``loss[q] = -logsumexp_k(log_prior[q, k] + f(s_k(t)) - log sum_i exp f(s_k(i)))`` with
    ``s_k(i) = queries[q, k] . item_emb[i]`` and ``t = targets[q]``; the normalisers come from
    :func:`head_logsumexp` (memory ``O(Q * chunk_size)``, forward and backward).

    Args:
        queries: ``[Q, D]`` or ``[Q, K, D]`` scaled queries from the head.
        log_prior: ``[Q, K]`` mixture log-weights, ``None`` for one query per context.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        targets: ``[Q]`` target ids in ``1..N``.
        transform: the head's pointwise transform ``f`` (identity for none).
        chunk_size: items (times components) scored at once.

    Returns:
        ``[Q]`` losses (at least float32).

    Raises:
        ValueError: on malformed shapes, targets outside ``1..N`` or ``chunk_size < 1``.

    Example:
        With one query and the identity it is the plain cross-entropy:

        >>> query, item_emb = torch.randn(4, 8), torch.randn(11, 8)
        >>> targets = torch.tensor([1, 5, 10, 3])
        >>> loss = head_full_softmax_loss(query, None, item_emb, targets, lambda s: s)
        >>> torch.allclose(loss, full_softmax_loss(query, item_emb, targets), atol=1e-5)
        True
    """
    components = as_components(queries)
    check_scoring_inputs(components[:, 0], item_emb, targets)
    lse = head_logsumexp(components, item_emb, transform, chunk_size)
    target_emb = F.embedding(targets, item_emb).to(lse.dtype)
    target_scores = transform((components.to(lse.dtype) * target_emb[:, None]).sum(dim=-1))
    return -mixture_log_prob(target_scores - lse, log_prior)
