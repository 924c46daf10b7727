"""The sampler protocol shared by every negative sampler.

A sampler proposes negative item ids for a batch of (already temperature-scaled) query vectors and
reports the exact, normalised log-probability ``log q`` of each id, which the sampled-softmax loss
uses for the logQ correction. Item ids are ``1..N``; id ``0`` is padding and is never drawn.

Each sampler also declares what the rest of the package needs to know about it: the valid values
of its enumerated settings and the lowest of its sizes
(which the constructor and the pre-flight checks both enforce), and the sizes that suit a small
catalog. Its constructor's defaults are the defaults: ``recsys_midx/conf/sampler/*.yaml`` repeat
them, and a test checks that they agree.
"""

from __future__ import annotations

import abc
import contextlib
import inspect
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor


class Sampler(torch.nn.Module, abc.ABC):
    """Base class of all samplers.

    The public :meth:`sample`, :meth:`log_prob` and :meth:`catalog_log_prob` hold what every
    sampler shares: they check the input (shape, the proposal built, its dimension and device,
    finite values for a query-dependent proposal), detach the query as float32 and run the
    sampler's hook without gradients and without autocast. A subclass implements the hooks
    :meth:`_draw` and :meth:`_log_prob`, :meth:`_catalog_log_prob` when it has a faster way than
    :meth:`_log_prob` of every id, :meth:`_check_ready` and :meth:`_query_dim` when it is built
    from the item table, and overrides :meth:`update` when the proposal depends on the item table
    or on item counts. Samplers are plain torch modules: their state (codebooks, weights) lives
    in buffers, so it follows ``.to(device)`` and ``state_dict``.

    A subclass declares, where it has them, its :attr:`choices` and :attr:`minimums`; its
    constructor checks its arguments against them with :meth:`check_settings`.

    Args:
        num_items: ``N``, the number of real items; valid ids are ``1..N``.
        num_negatives: ``M``, how many negatives :meth:`sample` draws per query unless told
            otherwise.

    Raises:
        ValueError: if ``num_items < 1`` or ``num_negatives`` is not in ``1..N-1``.
    """

    #: True when ``q(i | z)`` does not depend on the query ``z`` (uniform, popularity, in-batch):
    #: a mixture of the proposals of several queries is then the proposal itself, so objectives
    #: that pool the queries of a batch score ids under any one query instead of all of them.
    #: Such a sampler does not read the query's values, so it accepts non-finite ones.
    query_independent: ClassVar[bool] = False

    #: True when the proposal follows the softmax closely enough that the loss should count the
    #: positive exactly rather than logQ-correct it (a strategy told neither follows this).
    prefers_exact_positives: bool = False

    #: The valid values of the sampler's enumerated settings, by constructor argument.
    choices: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: The lowest valid value of the sampler's integer settings whatever the catalog, by
    #: constructor argument (``None``, where a setting takes it, is not checked).
    minimums: ClassVar[Mapping[str, int]] = {}

    def __init__(self, num_items: int, num_negatives: int = 100) -> None:
        super().__init__()
        if num_items < 1:
            raise ValueError(f"num_items must be >= 1, got {num_items}")
        if not 0 < num_negatives < num_items:
            raise ValueError(
                f"num_negatives must be in 1..{num_items - 1} for a catalog of {num_items} items, "
                f"got {num_negatives}"
            )
        self.num_items = int(num_items)
        self.num_negatives = int(num_negatives)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The constructor's default of each setting that has one.

        Example:
            >>> from recsys_midx.samplers import PopularitySampler
            >>> PopularitySampler.defaults()
            {'num_negatives': 100, 'alpha': 0.75, 'smoothing': 1.0}
        """
        parameters = inspect.signature(cls.__init__).parameters.values()
        return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}

    @classmethod
    def check_settings(cls, settings: Mapping[str, Any]) -> None:
        """Check the settings of :attr:`choices` and :attr:`minimums` found in ``settings``.

        Args:
            settings: setting names to values, e.g. a sampler config or a constructor's
                ``locals()``; the names not declared are ignored.

        Raises:
            ValueError: ``"NAME=VALUE: ..."`` for the first declared setting outside its
                choices or below its minimum.

        Example:
            >>> from recsys_midx.samplers import MIDXSampler
            >>> MIDXSampler.check_settings({"quantizer": "opq"})
            Traceback (most recent call last):
            ...
            ValueError: quantizer=opq: choose one of pq, rq
        """
        for name, choices in cls.choices.items():
            value = settings.get(name)
            if value is not None and value not in choices:
                raise ValueError(f"{name}={value}: choose one of {', '.join(choices)}")
        for name, lowest in cls.minimums.items():
            value = settings.get(name)
            if value is not None and value < lowest:
                raise ValueError(f"{name}={value}: it must be >= {lowest}")

    @classmethod
    def settings_for(cls, num_items: int) -> dict[str, Any]:
        """Settings that replace defaults too large for a catalog of ``num_items`` items.

        The base draws a quarter of the catalog when the default number of negatives is not
        below it. Samplers with sizes of their own add
        them.

        Args:
            num_items: ``N``.

        Returns:
            Constructor arguments (empty when the defaults fit).

        Example:
            >>> from recsys_midx.samplers import UniformSampler
            >>> UniformSampler.settings_for(80), UniformSampler.settings_for(10_000)
            ({'num_negatives': 20}, {})
        """
        negatives = cls.defaults()["num_negatives"]
        if negatives < num_items:
            return {}
        return {"num_negatives": max(1, num_items // 4)}

    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """(Re)build the proposal from the item table ``[N+1, D]`` and optional counts ``[N+1]``.

        The default does nothing: proposals that depend on neither need no state.
        """

    def observe_targets(self, targets: Tensor) -> None:
        """See the positive ids of the batch about to be sampled for (``[Q]``, in ``1..N``).

        The objective calls this before :meth:`sample`. The default ignores it; proposals built
        from the batch itself (in-batch negatives) override it.
        """

    @torch.no_grad()
    def sample(
        self,
        query: Tensor,
        num_samples: int | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Draw ``num_samples`` ids per query, with replacement.

        Args:
            query: ``[Q, D]`` scaled query vectors, any float dtype (used in float32).
            num_samples: ``M``, ids drawn per query; ``None``: :attr:`num_negatives`.
            generator: optional random generator on the device of ``query``, for reproducible
                draws (the global generator otherwise).

        Returns:
            ``ids`` ``[Q, M]`` (long, in ``1..N``) and ``log_q`` ``[Q, M]`` (float32, normalised).

        Raises:
            RuntimeError: if the proposal is not built yet (see :meth:`update`).
            ValueError: if ``query`` is not ``[Q, D]`` floating point on the sampler's device,
                has NaN or infinite entries (a query-dependent proposal; the message names the
                rows), or ``num_samples`` is not a count this sampler can draw.

        Example:
            >>> from recsys_midx.samplers import UniformSampler
            >>> ids, log_q = UniformSampler(1000, num_negatives=20).sample(torch.randn(8, 16))
            >>> ids.shape, bool((log_q == -math.log(1000)).all())
            (torch.Size([8, 20]), True)
        """
        if num_samples is None:
            num_samples = self.num_negatives
        check_num_samples(num_samples)
        self._check_num_samples(num_samples)
        query = self._checked_query(query)
        with full_precision(query.device):
            return self._draw(query, num_samples, generator)

    @torch.no_grad()
    def log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """Normalised ``log q(ids | query)``; ``-inf`` for the padding id ``0``.

        Args:
            query: ``[Q, D]`` scaled queries.
            ids: ``[Q, ...]`` integer ids in ``0..N`` on the device of ``query``.

        Returns:
            float32 tensor with the shape of ``ids``.

        Raises:
            RuntimeError: if the proposal is not built yet.
            ValueError: on a malformed ``query`` (as :meth:`sample`) or malformed ``ids`` (see
                :func:`check_ids`).
        """
        query = self._checked_query(query)
        check_ids(query, ids, self.num_items)
        with full_precision(query.device):
            return self._log_prob(query, ids)

    @torch.no_grad()
    def catalog_log_prob(self, query: Tensor) -> Tensor:
        """``log q`` of every item ``1..N`` for each query: ``[Q, N]`` float32.

        The proposal diagnostics call it at every refresh.

        Raises:
            RuntimeError: if the proposal is not built yet.
            ValueError: on a malformed ``query`` (as :meth:`sample`).
        """
        query = self._checked_query(query)
        with full_precision(query.device):
            return self._catalog_log_prob(query)

    @abc.abstractmethod
    def _draw(
        self, query: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        """The draws of :meth:`sample` for a checked float32 ``query`` and a valid count.

        Returns:
            ``ids`` ``[Q, num_samples]`` (long, in ``1..N``) and their ``log_q`` (float32).
        """

    @abc.abstractmethod
    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """:meth:`log_prob` of checked ``ids`` ``[Q, ...]`` for a checked float32 ``query``."""

    def _catalog_log_prob(self, query: Tensor) -> Tensor:
        """:meth:`catalog_log_prob` of a checked float32 ``query``; the default asks
        :meth:`_log_prob` for every id."""
        ids = torch.arange(1, self.num_items + 1, device=query.device)
        return self._log_prob(query, ids.expand(query.shape[0], -1))

    def _check_ready(self) -> None:
        """Raise ``RuntimeError`` naming the call that builds the proposal if it is not built;
        the default has nothing to build."""

    def _query_dim(self) -> int | None:
        """``D`` a query must have (the built item table's), or ``None`` for any."""
        return None

    def _check_num_samples(self, num_samples: int) -> None:
        """Raise ``ValueError`` if this sampler cannot draw ``num_samples`` (a positive int)
        per query; the default accepts any."""

    def _checked_query(self, query: Tensor) -> Tensor:
        """``query`` detached as float32 ``[Q, D]``, after the checks of :meth:`sample`.

        A query-dependent proposal refuses non-finite values: a NaN score would otherwise
        index past its tables.
        """
        self._check_ready()
        check_query(query)
        dim = self._query_dim()
        if dim is not None and query.shape[1] != dim:
            raise ValueError(f"query must be [Q, {dim}], got shape {tuple(query.shape)}")
        state = next(self.buffers(), None)
        if state is not None and state.device != query.device:
            raise ValueError(
                f"query is on {query.device} but the sampler is on {state.device}; "
                "move the sampler with .to(device)"
            )
        query = query.detach().float()
        if not self.query_independent:
            check_finite_query(query)
        return query

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
