"""The sampler protocol shared by every negative sampler.

A sampler proposes negative item ids for a batch of (already temperature-scaled) query vectors and
reports the exact, normalised log-probability ``log q`` of each id, which the sampled-softmax loss
uses for the logQ correction. Item ids are ``1..N``; id ``0`` is padding and is never drawn.
"""

from __future__ import annotations

import abc
import contextlib
import math
from typing import ClassVar

import torch
from torch import Tensor


class Sampler(torch.nn.Module, abc.ABC):
    """Base class of all samplers.

    Subclasses implement :meth:`sample` and :meth:`log_prob`, and override :meth:`update` when the
    proposal depends on the item table or on item counts. Samplers are plain torch modules: their
    state (codebooks, weights) lives in buffers, so it follows ``.to(device)`` and ``state_dict``.

    Args:
        num_items: ``N``, the number of real items; valid ids are ``1..N``.
        num_negatives: ``M``, how many negatives the objective draws per query with this sampler.

    Raises:
        ValueError: if ``num_items < 1`` or ``num_negatives`` is not in ``1..N-1``.
    """

    #: True for the sampler that stands for "no sampling": the objective computes the exact
    #: full-softmax cross-entropy instead of drawing negatives.
    exhaustive: ClassVar[bool] = False
    #: True when ``q(i | z)`` does not depend on the query ``z`` (uniform, popularity, in-batch):
    #: a mixture of the proposals of several queries is then the proposal itself, so objectives
    #: that pool the queries of a batch score ids under any one query instead of all of them.
    query_independent: ClassVar[bool] = False

    #: True when the proposal follows the softmax closely enough that the objective should count
    #: the positive exactly rather than logQ-correct it (an objective told neither follows this).
    prefers_exact_positives: bool = False

    def __init__(self, num_items: int, num_negatives: int = 100) -> None:
        super().__init__()
        if num_items < 1:
            raise ValueError(f"num_items must be >= 1, got {num_items}")
        if not self.exhaustive and not 0 < num_negatives < num_items:
            raise ValueError(
                f"num_negatives must be in 1..{num_items - 1} for a catalog of {num_items} items, "
                f"got {num_negatives}"
            )
        self.num_items = int(num_items)
        self.num_negatives = int(num_negatives)

    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """(Re)build the proposal from the item table ``[N+1, D]`` and optional counts ``[N+1]``.

        The default does nothing: proposals that depend on neither need no state.
        """

    def observe_targets(self, targets: Tensor) -> None:
        """See the positive ids of the batch about to be sampled for (``[Q]``, in ``1..N``).

        The objective calls this before :meth:`sample`. The default ignores it; proposals built
        from the batch itself (in-batch negatives) override it.
        """

    @abc.abstractmethod
    def sample(
        self, query: Tensor, num_samples: int, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Draw ``num_samples`` ids per query, with replacement.

        Args:
            query: ``[Q, D]`` scaled query vectors.
            num_samples: ``M``, ids drawn per query.
            generator: optional random generator on the device of ``query``, for reproducible
                draws (the global generator otherwise).

        Returns:
            ``ids`` ``[Q, M]`` (long, in ``1..N``) and ``log_q`` ``[Q, M]`` (float32, normalised).
        """

    @abc.abstractmethod
    def log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """Normalised ``log q(ids | query)`` with the shape of ``ids`` (``[Q, ...]``), float32."""

    def catalog_log_prob(self, query: Tensor) -> Tensor:
        """``log q`` of every item ``1..N`` for each query: ``[Q, N]`` float32.

        The default asks :meth:`log_prob` for all ids; a sampler with a cheaper way to score the
        whole catalog overrides it (the proposal diagnostics call it at every refresh).
        """
        ids = torch.arange(1, self.num_items + 1, device=query.device)
        return self.log_prob(query, ids.expand(query.shape[0], -1))

    def sizing(self) -> dict[str, int]:
        """Sizes of the proposal worth recording with a run's results (the default: none)."""
        return {}

    def extra_repr(self) -> str:
        return f"num_items={self.num_items}, num_negatives={self.num_negatives}"


def full_precision(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """A context without autocast on ``device``, for sampler arithmetic.

    Inside a bf16/fp16 autocast region (mixed-precision training) matrix products run in half
    precision even on float32 inputs; a proposal scored that way is no longer normalised (its
    ``log q`` is off by whole nats at large query and item norms), which biases the logQ
    correction. Samplers therefore compute their scores in float32 within this context.

    Args:
        device: the device the computation runs on.

    Returns:
        The context manager.
    """
    return torch.autocast(device.type, enabled=False)


# Input checks shared by the samplers, so that every sampler reports malformed input alike.


def check_query(query: Tensor) -> None:
    """Raise ``ValueError`` unless ``query`` is a ``[Q, D]`` floating-point tensor."""
    if query.dim() != 2:
        raise ValueError(f"query must have shape [Q, D], got {tuple(query.shape)}")
    if not query.is_floating_point():
        raise ValueError(f"query must be floating point, got {query.dtype}")


def check_finite_query(query: Tensor) -> None:
    """Raise ``ValueError`` naming the rows of ``query`` with NaN or infinite entries.

    One reduction when the query is finite; the rows are only looked for on failure.

    Example:
        >>> check_finite_query(torch.tensor([[0.0], [float("nan")]]))
        Traceback (most recent call last):
        ...
        ValueError: query rows [1] are not finite (NaN or infinite entries)
    """
    if bool(query.isfinite().all()):
        return
    rows = (~query.isfinite()).any(1).nonzero().flatten().tolist()
    shown = ", ".join(map(str, rows[:10])) + (f", ... ({len(rows)} rows)" if len(rows) > 10 else "")
    raise ValueError(f"query rows [{shown}] are not finite (NaN or infinite entries)")


def checked_index_query(query: Tensor, dim: int, built: bool, missing: str) -> Tensor:
    """``query`` detached as float32 ``[Q, D]`` for a sampler built from the item table, after
    checking that it is built, that ``D`` fits and that the entries are finite (a NaN score
    would otherwise index past the sampler's tables).

    Args:
        query: the query given to ``sample`` or ``log_prob``.
        dim: ``D`` of the item table the sampler was built from.
        built: whether :meth:`Sampler.update` has run.
        missing: the error when it has not, e.g. ``"MIDXSampler has no index yet"``.

    Raises:
        RuntimeError: ``missing``, with the call that fixes it, if not ``built``.
        ValueError: if ``query`` is not ``[Q, dim]`` floating point or has NaN or infinite
            entries.

    Example:
        >>> checked_index_query(torch.ones(2, 3, dtype=torch.float64), 3, True, "").dtype
        torch.float32
    """
    if not built:
        raise RuntimeError(f"{missing}: call update(item_emb) first")
    check_query(query)
    if query.shape[1] != dim:
        raise ValueError(f"query must be [Q, {dim}], got shape {tuple(query.shape)}")
    query = query.detach().float()
    check_finite_query(query)
    return query


def check_num_samples(num_samples: int) -> None:
    """Raise ``ValueError`` unless ``num_samples`` is a positive integer."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")


#: Largest item norm a sampler builds from: k-means squares distances of up to twice it in
#: float32, and faiss aborts the whole process on the resulting inf/NaN assignments.
MAX_ITEM_NORM = math.sqrt(torch.finfo(torch.float32).max) / 2


def check_item_table(item_emb: Tensor, num_items: int) -> None:
    """Check an item table given to :meth:`Sampler.update` by a sampler built from its values.

    A table with NaN or infinite entries, or norms beyond :data:`MAX_ITEM_NORM` (about 9e18),
    comes from a diverged model; a proposal built from it would give NaN probabilities (or
    crash faiss), so the build is refused instead.

    Raises:
        ValueError: unless ``item_emb`` is a ``[N+1, D]`` tensor (``N = num_items``) whose real
            rows ``1..N`` are finite with norms below :data:`MAX_ITEM_NORM` (row 0, padding, is
            not used).
    """
    if item_emb.dim() != 2 or item_emb.shape[0] != num_items + 1:
        raise ValueError(
            f"item_emb must be [N+1, D] = [{num_items + 1}, D], got {tuple(item_emb.shape)}"
        )
    norms = torch.linalg.vector_norm(item_emb[1:].float(), dim=1)
    bad_rows = ~(norms < MAX_ITEM_NORM)  # NaN compares false: caught too
    if bool(bad_rows.any()):
        first = int(bad_rows.nonzero()[0, 0]) + 1
        raise ValueError(
            f"item_emb has {int(bad_rows.sum())} item rows with NaN or infinite values or norms "
            f"above {MAX_ITEM_NORM:.1e} (first: item {first}, norm {float(norms[first - 1]):.3g}); "
            "the model has diverged, so no proposal is built from it"
        )


def check_ids(query: Tensor, ids: Tensor, num_items: int) -> None:
    """Check ids passed to :meth:`Sampler.log_prob`.

    Id ``0`` (padding) is accepted, since it has a well-defined probability of zero; anything
    outside ``0..N`` is an error.

    Raises:
        ValueError: if ``ids`` is not an integer tensor ``[Q, ...]`` on the device of ``query``
            with values in ``0..num_items``.
    """
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor, got {ids.dtype}")
    if ids.dim() < 1 or ids.shape[0] != query.shape[0]:
        raise ValueError(
            f"ids must have shape [Q, ...] with Q={query.shape[0]} (from query), "
            f"got {tuple(ids.shape)}"
        )
    if ids.device != query.device:
        raise ValueError(f"ids are on {ids.device} but query is on {query.device}")
    if ids.numel() and bool(((ids < 0) | (ids > num_items)).any()):
        raise ValueError(f"ids must lie in 0..{num_items}")
