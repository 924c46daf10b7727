"""MIDX samplers: adaptive sampled softmax through an inverted multi-index.

The item table is quantised into ``B`` codebooks of ``K`` codewords (PQ or RQ, see
:mod:`recsys_midx.samplers.codebooks`), so item ``i`` falls in the cell ``(k_1..k_B)`` of its
codes and ``z.c_i = sum_b s_b(k_b)``. The proposal is

    q(i | z) = exp(z.c_i) * w_i(z) / Z(z),    Z(z) = sum_cells exp(sum_b s_b(k_b)) * W_cell(z),

with ``W_cell = sum_{i in cell} w_i`` and a last-stage weight ``w_i``:

* ``"uniform"``: ``w_i = 1`` (the MIDX sampler);
* ``"popularity"``: ``w_i = (count_i + pop_smoothing) ** pop_alpha`` from the counts given to
  ``update``, the weight of :class:`~recsys_midx.samplers.popularity.PopularitySampler`. The
  default smoothing 1 keeps never-seen items drawable, so every positive has a finite ``log q``;
  ``pop_alpha = 0`` is the uniform stage, 0.75 (default) the word2vec flattening;
* ``"exact"``: ``w_i = exp(z.r_i)`` with the residual ``r_i = v_i - c_i``, so ``q`` is exactly
  ``softmax(z.v)``; a correctness reference whose cost is ``O(N*D)`` per query again.

A draw first picks a cell, then an item inside it in proportion to ``w_i``. ``log q`` is computed
from the same cell masses, so it is the normalised log-probability of the proposal, for drawn ids
and for any other id. A cell is drawn in one of two ways:

* **From the cell table** (any ``B``, any stage): the per-query log masses of all cells, one exp,
  one cumsum and one ``torch.searchsorted`` per query: ``O(#cells)`` per query. When at least a
  third of the ``K**B`` cells are non-empty (``B = 2`` with ``N`` much larger than ``K**2``) the
  table is the dense grid, built as an outer sum of the per-codebook scores (a broadcast add,
  measured 3x cheaper per cell than a gather), with ``log W = -inf`` for empty cells; otherwise
  (``B >= 3``, small ``N``) it lists only the non-empty cells and gathers their scores.
* **In two stages** (``B = 2``, query-independent ``W``: the uniform and popularity stages):
  laid out by code pair, the mass of a cell factors as ``e_1(k_1) * e_2(k_2) * W[k_1, k_2]``
  with ``e_b = exp(s_b)`` (``W = 0`` for empty cells), so the marginal of ``k_1`` is
  ``e_1 * (W @ e_2)``, one ``[Q, K] x [K, K]`` matrix product with no exp per cell, and
  ``k_2 | k_1`` is drawn from ``e_2 * W[k_1]``, ``K`` work per draw: ``O(M*K)`` per query besides
  the product, against ``O(#cells)`` exps, cumsums and searches for the table. So cells finer
  than the items (``K**2 > N``) cost no scan of the non-empty cells. ``cell_draw="auto"`` picks
  the cheaper way: two stages when ``K**2 / 256 + 2*M*K <= #cells`` (costs in units of the
  table's work per cell; about ``2 * M <= K`` on the dense grid). Measured on one CPU thread with
  ``N = 1e5`` Gaussian items (D = 32, nearly every cell non-empty up to ``K = 256``),
  ``Q = 5120``, ``M = 32``: 2.1x faster than the table at ``K = 64``, 5.7x at ``K = 128``, 11x at
  ``K = 256``, 7x at ``K = 512`` (83k non-empty cells), 4x at ``K = 1024``; at ``M = 100,
  K = 64`` the table is faster, and so it is on clustered tables whose few non-empty cells make
  a short sparse table (which ``#cells`` accounts for). The normaliser of
  :meth:`MIDXSampler.log_prob` comes from the same product, whatever ``M`` (at ``K = 256``:
  0.03 s against 3 s).
  Each codebook's scores are shifted by their maximum before the exp; should the masses of a
  query chunk still underflow (scores hundreds apart), that chunk falls back to the table.

Optionally (``exact_top_codewords = t > 0``) the proposal mixes in the exact softmax over the
items of each query's top ``t**B`` cells (:mod:`recsys_midx.samplers.exact_top`): a draw comes
from there with probability ``exact_top_weight``, and ``log q`` is the mixture's.

Queries are processed in chunks to bound memory.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from recsys_midx.samplers.base import (
    Sampler,
    check_ids,
    check_item_table,
    check_num_samples,
    check_query,
    full_precision,
)
from recsys_midx.samplers.codebooks import Codebooks, IndexModule, make_codebooks
from recsys_midx.samplers.exact_top import ExactTopCells, TopCellsState
from recsys_midx.samplers.draws import draw_weighted, inverse_cdf, position_of_ids, prefix_sum
from recsys_midx.samplers.popularity import popularity_weights

#: The dense ``K**B`` table is used when at least this fraction of its cells is non-empty.
_DENSE_MIN_FILL = 1.0 / 3.0

#: Cap on ``query rows x items`` per chunk of the exact stage (its per-query tables are ``[N]``).
_EXACT_CHUNK_ELEMENTS = 1 << 22


class _CodePairGrid(NamedTuple):
    """The cells of two codebooks laid out by code pair ``(k_1, k_2)``."""

    #: ``[K, K]`` cell weights ``W`` (0 for empty cells).
    weights: Tensor
    #: ``[K*K]`` cell index of each pair ``k_1 * K + k_2``, or ``None`` for the dense grid, whose
    #: cells are the pairs themselves.
    cells: Tensor | None


class _LastStage(IndexModule, abc.ABC):
    """The within-cell weights ``w_i`` of a MIDX proposal and how to draw from them.

    ``offsets`` ``[C+1]`` are the start positions of the cells in cell order (the order of the
    sampler's ``order`` buffer); positions index that order, ids index the item table.
    """

    #: Largest ``query rows x items`` block the stage needs per chunk, or ``None`` if none.
    chunk_elements: ClassVar[int | None] = None
    #: Whether the weights depend on the query (the cell weights are then ``[Q, C]``).
    query_dependent: ClassVar[bool] = False

    @abc.abstractmethod
    def rebuild(
        self,
        order: Tensor,
        offsets: Tensor,
        item_emb: Tensor,
        item_counts: Tensor | None,
        codebooks: Codebooks,
    ) -> None:
        """Rebuild from the cell layout (``order`` ``[N]``: ids in cell order), the item table
        ``[N+1, D]``, optional counts ``[N+1]`` and the fitted codebooks."""

    def prepare(self, query: Tensor, offsets: Tensor) -> Any:
        """Per-chunk state shared by the other methods (none for query-independent weights)."""
        return None

    @abc.abstractmethod
    def cell_log_weight(self, state: Any) -> Tensor:
        """``log W_cell``, ``[C]`` (query independent) or ``[Q, C]``; ``-inf`` for empty cells."""

    @abc.abstractmethod
    def draw(
        self, state: Any, cells: Tensor, offsets: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        """Positions ``[Q, M]`` drawn inside ``cells`` ``[Q, M]`` in proportion to ``w_i``."""

    @abc.abstractmethod
    def item_log_weight(self, state: Any, ids: Tensor) -> Tensor:
        """``log w_i`` of ``ids`` ``[Q, L]`` (ids ``>= 1``), broadcastable to ``[Q, L]``."""


class _UniformStage(_LastStage):
    """``w_i = 1``: a cell weighs its item count; the draw is ``offset + floor(u * count)``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("log_cell_weights", torch.empty(0))

    def rebuild(
        self,
        order: Tensor,
        offsets: Tensor,
        item_emb: Tensor,
        item_counts: Tensor | None,
        codebooks: Codebooks,
    ) -> None:
        self.log_cell_weights = offsets.diff().float().log()

    def cell_log_weight(self, state: None) -> Tensor:
        return self.log_cell_weights

    def draw(
        self, state: None, cells: Tensor, offsets: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        start = offsets[cells]
        count = offsets[cells + 1] - start
        # float64: 53 random bits keep floor(u * count) uniform for any realistic cell size.
        u = torch.rand(cells.shape, dtype=torch.float64, device=cells.device, generator=generator)
        return start + (u * count).long().clamp_max_(count - 1)

    def item_log_weight(self, state: None, ids: Tensor) -> Tensor:
        return torch.zeros((), device=ids.device)


class _PopularityStage(_LastStage):
    """``w_i = (count_i + smoothing) ** alpha``, drawn by a search in global cumulative weights.

    The counts are kept, so ``update(item_emb)`` without counts reuses the last ones.
    """

    def __init__(self, alpha: float, smoothing: float) -> None:
        super().__init__()
        if not math.isfinite(alpha):
            raise ValueError(f"pop_alpha must be finite, got {alpha}")
        if not (math.isfinite(smoothing) and smoothing >= 0):
            raise ValueError(f"pop_smoothing must be finite and >= 0, got {smoothing}")
        self.alpha = float(alpha)
        self.smoothing = float(smoothing)
        self.register_buffer("counts", torch.empty(0, dtype=torch.float64))
        self.register_buffer("log_weights", torch.empty(0))
        # float64: a running sum over millions of items must still resolve a single weight.
        self.register_buffer("cum_weights", torch.empty(0, dtype=torch.float64))
        self.register_buffer("cell_cum_weights", torch.empty(0, dtype=torch.float64))
        self.register_buffer("log_cell_weights", torch.empty(0))

    def rebuild(
        self,
        order: Tensor,
        offsets: Tensor,
        item_emb: Tensor,
        item_counts: Tensor | None,
        codebooks: Codebooks,
    ) -> None:
        if item_counts is None and self.counts.numel() == 0:
            raise ValueError("the popularity last stage needs item_counts on its first update")
        counts = self.counts if item_counts is None else item_counts.detach().to(item_emb.device)
        weights = popularity_weights(counts, item_emb.shape[0] - 1, self.alpha, self.smoothing)
        self.counts = counts.to(torch.float64)
        self.log_weights = weights.log().float()
        self.cum_weights = weights[order].cumsum(0)
        self.cell_cum_weights = prefix_sum(self.cum_weights, offsets)
        self.log_cell_weights = self.cell_cum_weights.diff().log().float()

    def cell_log_weight(self, state: None) -> Tensor:
        return self.log_cell_weights

    def draw(
        self, state: None, cells: Tensor, offsets: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        return draw_weighted(self.cum_weights, self.cell_cum_weights, cells, offsets, generator)

    def item_log_weight(self, state: None, ids: Tensor) -> Tensor:
        return self.log_weights[ids]

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, smoothing={self.smoothing}"


class _ExactState(NamedTuple):
    """Per-chunk tables of the exact stage, all over positions in cell order."""

    #: ``[Q, N]`` float64 inclusive cumsum of ``exp(z.r - max_{cell} z.r)``.
    cum: Tensor
    #: ``[Q, C+1]`` that cumsum before each cell start (last entry: the total).
    cell_cum: Tensor
    #: ``[Q, C]`` ``log W_cell = log sum_{i in cell} exp(z.r_i)``.
    log_cell_weights: Tensor
    #: ``[Q, N]`` residual scores ``z.r``.
    residual_scores: Tensor


class _ExactStage(_LastStage):
    """``w_i = exp(z.r_i)``, ``r_i = v_i - c_i``: the proposal is the softmax itself.

    Per query chunk it scores all residuals and shifts them by their per-cell maximum, so every
    non-empty cell sums to at least 1 and a float64 cumsum resolves every cell's mass, however
    small against the others.
    """

    chunk_elements = _EXACT_CHUNK_ELEMENTS
    query_dependent = True

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("residuals", torch.empty(0, 0))
        self.register_buffer("positions", torch.empty(0, dtype=torch.long))
        self.register_buffer("cell_of_position", torch.empty(0, dtype=torch.long))

    def rebuild(
        self,
        order: Tensor,
        offsets: Tensor,
        item_emb: Tensor,
        item_counts: Tensor | None,
        codebooks: Codebooks,
    ) -> None:
        items = item_emb[order].float()
        self.residuals = items - codebooks.reconstruct(codebooks.codes[order - 1])
        self.positions = position_of_ids(order)
        cells = torch.arange(offsets.numel() - 1, device=order.device)
        self.cell_of_position = cells.repeat_interleave(offsets.diff())

    def prepare(self, query: Tensor, offsets: Tensor) -> _ExactState:
        scores = query @ self.residuals.T
        rows, num_cells = query.shape[0], offsets.numel() - 1
        cell_index = self.cell_of_position.expand(rows, -1)
        cell_max = scores.new_full((rows, num_cells), -math.inf).scatter_reduce_(
            1, cell_index, scores, "amax"
        )
        shifted = (scores - cell_max.gather(1, cell_index)).exp_()
        cum = shifted.cumsum(1, dtype=torch.float64)
        cell_cum = prefix_sum(cum, offsets.expand(rows, -1))
        log_cell_weights = cell_cum.diff(dim=1).log().float() + cell_max
        return _ExactState(cum, cell_cum, log_cell_weights, scores)

    def cell_log_weight(self, state: _ExactState) -> Tensor:
        return state.log_cell_weights

    def draw(
        self, state: _ExactState, cells: Tensor, offsets: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        return draw_weighted(state.cum, state.cell_cum, cells, offsets, generator)

    def item_log_weight(self, state: _ExactState, ids: Tensor) -> Tensor:
        return state.residual_scores.gather(1, self.positions[ids])


class MIDXSampler(Sampler, IndexModule):
    """Inverted multi-index sampler: ``q(i|z) ∝ exp(z.c_i) * w_i(z)`` over codebook cells.

    Call :meth:`update` with the item table (and, for ``last_stage="popularity"``, item counts)
    before sampling, and again whenever the table has moved enough to refresh the proposal; a
    refresh warm-starts k-means from the previous codewords. All state (codewords, codes, cell
    index, weights) is in buffers, so ``state_dict``/``load_state_dict`` restore the proposal
    exactly, also into a sampler that was never updated.

    Args:
        num_items: ``N``; ids are ``1..N``.
        num_negatives: ``M`` drawn per query by the objective.
        num_codewords: ``K`` codewords per codebook; at most ``N``.
        num_codebooks: ``B`` codebooks (PQ subspaces or RQ levels).
        quantizer: ``"pq"`` (product; ``D`` must be a multiple of ``B``) or ``"rq"`` (residual).
        last_stage: ``"uniform"``, ``"popularity"`` or ``"exact"`` (see the module docstring).
        pop_alpha: exponent of the popularity weight ``(count + pop_smoothing) ** pop_alpha``.
        pop_smoothing: added to every count, so items never seen stay drawable.
        kmeans_iters: k-means iterations of the first build.
        warm_start_iters: k-means iterations of a refresh (warm-started).
        seed: seed of the codebook training (the draws use the ``generator`` of :meth:`sample`).
        cell_draw: how cells are drawn (see the module docstring): ``"table"`` always from the
            per-query cell table; ``"two_stage"`` as ``k_1`` then ``k_2 | k_1`` whenever the cell
            masses factorise (two codebooks, uniform or popularity stage), else from the table;
            ``"auto"`` (default) in two stages only when that is cheaper (see the module
            docstring). The draws follow the same distribution either way.
        exact_top_codewords: ``t``; when positive, the exact softmax over the items whose codes
            are among each codebook's ``t`` best codewords for the query is mixed into the
            proposal (see :mod:`recsys_midx.samplers.exact_top`). It costs a snapshot of the
            item table in the state and ``|top cells| * D`` multiply-adds per query.
        exact_top_weight: the probability of a draw from those top cells, in ``(0, 1)``.
        query_chunk_size: queries processed at once. Temporaries stay below roughly
            ``query_chunk_size * (8 * #cells + 250 * M)`` bytes (measured), besides the
            ``12 * Q * M`` bytes of output; the exact stage further caps ``rows x N``.

    Raises:
        ValueError: for an unknown ``quantizer``, ``last_stage`` or ``cell_draw``, ``K > N``, a
            size below 1, ``K**B`` beyond 2**62 (cell keys are int64), a non-finite
            ``pop_alpha``, a negative ``pop_smoothing`` or ``exact_top_codewords``, or an
            ``exact_top_weight`` outside ``(0, 1)``.

    Example:
        >>> sampler = MIDXSampler(num_items=1000, num_negatives=10, num_codewords=16)
        >>> sampler.update(torch.randn(1001, 32))
        >>> ids, log_q = sampler.sample(torch.randn(4, 32), 10)
        >>> ids.shape, log_q.dtype
        (torch.Size([4, 10]), torch.float32)
    """

    def __init__(
        self,
        num_items: int,
        num_negatives: int = 100,
        num_codewords: int = 64,
        num_codebooks: int = 2,
        quantizer: str = "pq",
        last_stage: str = "uniform",
        pop_alpha: float = 0.75,
        pop_smoothing: float = 1.0,
        kmeans_iters: int = 20,
        warm_start_iters: int = 5,
        seed: int = 0,
        cell_draw: str = "auto",
        exact_top_codewords: int = 0,
        exact_top_weight: float = 0.5,
        query_chunk_size: int = 1024,
    ) -> None:
        super().__init__(num_items, num_negatives)
        if num_codewords > num_items:
            raise ValueError(
                f"num_codewords={num_codewords} exceeds the number of items {num_items}: "
                f"k-means cannot place more codewords than there are items"
            )
        if num_codewords < 1 or num_codebooks < 1 or query_chunk_size < 1:
            raise ValueError(
                "num_codewords, num_codebooks and query_chunk_size must be >= 1, got "
                f"{num_codewords}, {num_codebooks}, {query_chunk_size}"
            )
        if num_codebooks * math.log2(max(num_codewords, 2)) > 62:
            raise ValueError(
                f"num_codewords**num_codebooks = {num_codewords}**{num_codebooks} cells do not "
                f"fit int64 cell keys"
            )
        stages: dict[str, Callable[[], _LastStage]] = {
            "uniform": _UniformStage,
            "popularity": lambda: _PopularityStage(pop_alpha, pop_smoothing),
            "exact": _ExactStage,
        }
        if cell_draw not in ("auto", "table", "two_stage"):
            raise ValueError(
                f"cell_draw must be 'auto', 'table' or 'two_stage', got {cell_draw!r}"
            )
        self.cell_draw = cell_draw
        if last_stage not in stages:
            raise ValueError(f"last_stage must be one of {sorted(stages)}, got {last_stage!r}")
        self.last_stage = last_stage
        self.query_chunk_size = int(query_chunk_size)
        self.codebooks = make_codebooks(
            quantizer,
            num_codewords=num_codewords,
            num_codebooks=num_codebooks,
            kmeans_iters=kmeans_iters,
            warm_start_iters=warm_start_iters,
            seed=seed,
        )
        self.stage: _LastStage = stages[last_stage]()
        if exact_top_codewords < 0:
            raise ValueError(f"exact_top_codewords must be >= 0, got {exact_top_codewords}")
        self.exact_top = (
            ExactTopCells(exact_top_codewords, exact_top_weight) if exact_top_codewords else None
        )
        #: ids in cell order (items of cell c are ``order[offsets[c]:offsets[c+1]]``).
        self.register_buffer("order", torch.empty(0, dtype=torch.long))
        self.register_buffer("cell_offsets", torch.empty(0, dtype=torch.long))
        #: ``[C, B]`` codes of the cells in the table (all ``K**B`` cells when dense).
        self.register_buffer("cell_codes", torch.empty(0, num_codebooks, dtype=torch.long))

    @property
    def num_cells(self) -> int:
        """Cells in the per-query table: ``K**B`` (dense) or the non-empty ones (sparse)."""
        return self.cell_codes.shape[0]

    @property
    def is_dense(self) -> bool:
        """Whether the cell table is the dense ``K**B`` grid (empty cells included)."""
        return self.num_cells == self.codebooks.num_codewords**self.codebooks.num_codebooks

    @torch.no_grad()
    def update(self, item_emb: Tensor, item_counts: Tensor | None = None) -> None:
        """Rebuild codebooks and cell index from the item table (row 0 is padding).

        Args:
            item_emb: ``[N+1, D]`` item table; buffers move to its device.
            item_counts: ``[N+1]`` interaction counts, used by the popularity stage (which keeps
                the last ones given); ignored by the other stages.

        Raises:
            ValueError: if the table is not ``[N+1, D]``, has NaN or infinite entries (see
                :func:`~recsys_midx.samplers.base.check_item_table`), ``D`` does not suit the
                quantiser, or the popularity stage has never been given counts.
        """
        check_item_table(item_emb, self.num_items)
        item_emb = item_emb.detach()
        with full_precision(item_emb.device):
            codes = self.codebooks.fit(item_emb[1:])
        keys = self._cell_keys(codes)
        positions = torch.argsort(keys, stable=True)
        sorted_keys = keys[positions]
        present, counts = torch.unique_consecutive(sorted_keys, return_counts=True)
        grid = self.codebooks.num_codewords**self.codebooks.num_codebooks
        if present.numel() >= _DENSE_MIN_FILL * grid:
            present = torch.arange(grid, device=keys.device)
            counts = torch.bincount(keys, minlength=grid)
        offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        self.order = positions + 1
        self.cell_offsets = offsets
        self.cell_codes = self._decode_keys(present)
        self.stage.rebuild(self.order, offsets, item_emb, item_counts, self.codebooks)
        if self.exact_top is not None:
            self.exact_top.rebuild(item_emb, self.order)

    @torch.no_grad()
    def sample(
        self, query: Tensor, num_samples: int, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Draw ``num_samples`` ids per query (with replacement) from the proposal.

        Args:
            query: ``[Q, D]`` scaled queries, any float dtype (computed in float32).
            num_samples: ``M``.
            generator: random generator for reproducible draws (``None``: the global one).

        Returns:
            ``ids`` ``[Q, M]`` long in ``1..N`` and their normalised ``log_q`` ``[Q, M]`` float32.

        Raises:
            RuntimeError: before the first :meth:`update`.
            ValueError: if ``query`` is not ``[Q, D]`` floating point or ``num_samples < 1``.

        Example:
            >>> sampler = MIDXSampler(num_items=500, num_negatives=5, num_codewords=8)
            >>> sampler.update(torch.randn(501, 16))
            >>> g = torch.Generator().manual_seed(0)
            >>> ids, log_q = sampler.sample(torch.randn(3, 16), 5, generator=g)
            >>> bool((ids >= 1).all())
            True
        """
        check_num_samples(num_samples)
        query = self._checked_query(query)
        ids = torch.empty(query.shape[0], num_samples, dtype=torch.long, device=query.device)
        log_q = torch.empty(query.shape[0], num_samples, device=query.device)
        with full_precision(query.device):
            grid = self._two_stage_grid(num_samples)
            for rows, z in self._chunks(query):
                drawn = None
                if grid is not None:
                    drawn = self._draw_cells_in_two_stages(z, grid, num_samples, generator)
                if drawn is None:
                    drawn = self._draw_cells_from_table(z, num_samples, generator)
                scores, state, log_z, cells = drawn
                positions = self.stage.draw(state, cells, self.cell_offsets, generator)
                chunk_ids = self.order[positions.clamp_(0, self.num_items - 1)]
                if self.exact_top is None:
                    # The drawn items' codes are their cells' codes: a lookup in the small table.
                    codes = self.cell_codes[cells]
                    log_q[rows] = self._log_q(scores, state, log_z, chunk_ids, codes)
                else:
                    top = self._prepare_exact_top(z, scores)
                    chunk_ids = self.exact_top.mix_draws(top, chunk_ids, generator)
                    codes = self.codebooks.codes[chunk_ids - 1]
                    log_q_rest = self._log_q(scores, state, log_z, chunk_ids, codes)
                    log_q[rows] = self.exact_top.mix_log_prob(top, z, chunk_ids, codes, log_q_rest)
                ids[rows] = chunk_ids
        return ids, log_q

    @torch.no_grad()
    def log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        """Normalised ``log q(ids | query)``; ``-inf`` for the padding id 0.

        Args:
            query: ``[Q, D]`` scaled queries.
            ids: ``[Q, ...]`` long ids in ``0..N``.

        Returns:
            float32 tensor with the shape of ``ids``.

        Raises:
            RuntimeError: before the first :meth:`update`.
            ValueError: on a malformed ``query``, or ``ids`` that are not integers ``[Q, ...]``
                in ``0..N`` on the query's device.
        """
        query = self._checked_query(query)
        check_ids(query, ids, self.num_items)
        flat = ids.reshape(ids.shape[0], -1).long()
        out = torch.empty(flat.shape, device=query.device)
        with full_precision(query.device):
            grid = self._two_stage_grid(0)
            for rows, z in self._chunks(query):
                scores, state, log_z = self._log_normaliser(z, grid)
                chunk_ids = flat[rows]
                # id 0 has no codes; any row will do, since _log_q masks it.
                codes = self.codebooks.codes[(chunk_ids - 1).clamp_min(0)]
                log_q = self._log_q(scores, state, log_z, chunk_ids, codes)
                if self.exact_top is not None:
                    top = self._prepare_exact_top(z, scores)
                    log_q = self.exact_top.mix_log_prob(top, z, chunk_ids, codes, log_q)
                out[rows] = log_q
        return out.view(ids.shape)

    @torch.no_grad()
    def catalog_log_prob(self, query: Tensor) -> Tensor:
        """Normalised ``log q`` of every item ``1..N``, ``[Q, N]`` float32 (memory ``Q*N``).

        Equal to :meth:`log_prob` of all ids, but each codebook's scores are looked up by the
        items' codes with one ``index_select`` shared by all queries instead of a per-query
        gather of ``[Q, N, B]`` codes (measured 5-12x faster at ``N = 1e5``).

        Raises:
            RuntimeError: before the first :meth:`update`.
            ValueError: on a malformed ``query``.
        """
        query = self._checked_query(query)
        ids = torch.arange(1, self.num_items + 1, device=query.device)
        out = torch.empty(query.shape[0], self.num_items, device=query.device)
        with full_precision(query.device):
            grid = self._two_stage_grid(0)
            for rows, z in self._chunks(query):
                scores, state, log_z = self._log_normaliser(z, grid)
                log_q = self._summed_codeword_scores(scores, self.codebooks.codes)
                log_q += self.stage.item_log_weight(state, ids.expand(z.shape[0], -1))
                log_q.sub_(log_z)
                if self.exact_top is not None:
                    log_q = self.exact_top.mix_catalog_log_prob(
                        z, scores, self.codebooks.codes, self.codebooks.num_codewords, log_q
                    )
                out[rows] = log_q
        return out

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, last_stage={self.last_stage!r}, "
            f"cell_draw={self.cell_draw!r}, query_chunk_size={self.query_chunk_size}"
        )

    def _checked_query(self, query: Tensor) -> Tensor:
        """``query`` as float32 ``[Q, D]``, after checking the index exists and ``D`` fits."""
        if self.cell_offsets.numel() == 0:
            raise RuntimeError("MIDXSampler has no index yet: call update(item_emb) first")
        check_query(query)
        if query.shape[1] != self.codebooks.dim:
            raise ValueError(
                f"query must be [Q, {self.codebooks.dim}], got shape {tuple(query.shape)}"
            )
        return query.detach().float()

    def _chunks(self, query: Tensor) -> Iterator[tuple[slice, Tensor]]:
        """Row blocks of the queries, sized to bound the per-chunk tables."""
        size = self.query_chunk_size
        if self.stage.chunk_elements is not None:
            size = min(size, max(1, self.stage.chunk_elements // self.num_items))
        for start in range(0, query.shape[0], size):
            rows = slice(start, start + size)
            yield rows, query[rows]

    def _draws_in_two_stages(self, num_samples: int) -> bool:
        """Whether ``num_samples`` draws per query (0: only the normaliser) go in two stages.

        They can when the cell masses factor as ``e_1(k_1) * e_2(k_2) * W[k_1, k_2]`` with a
        query-independent ``W`` (two codebooks, uniform or popularity stage). ``"auto"`` takes
        them when their cost, in units of the table's work per cell (an exp, a cumsum and a
        search: 7-10 ns on one CPU thread), is below the table's ``#cells``: ``K**2 / 256`` for
        the matrix product (~0.03 ns per multiply-add) plus ``2*M*K`` for the conditionals
        (measured 5-11 ns per element). For the dense grid that is about ``2 * M <= K``.
        """
        if (
            self.cell_draw == "table"
            or self.codebooks.num_codebooks != 2
            or self.stage.query_dependent
        ):
            return False
        k = self.codebooks.num_codewords
        return self.cell_draw == "two_stage" or k * k // 256 + 2 * num_samples * k <= self.num_cells

    def _two_stage_grid(self, num_samples: int) -> _CodePairGrid | None:
        """The code-pair grid if ``num_samples`` draws per query (0: only the normaliser) go in
        two stages, else ``None`` (the cell table)."""
        return self._code_pair_grid() if self._draws_in_two_stages(num_samples) else None

    def _code_pair_grid(self) -> _CodePairGrid:
        """The cell weights as a ``[K, K]`` matrix over code pairs, and the cell of each pair."""
        k = self.codebooks.num_codewords
        weights = self.stage.cell_log_weight(None).exp()
        if self.is_dense:
            return _CodePairGrid(weights.view(k, k), None)
        keys = self._cell_keys(self.cell_codes)
        grid = weights.new_zeros(k * k).index_put_((keys,), weights)
        # Pairs of empty cells have zero weight and are never drawn; 0 is only a placeholder.
        cells = torch.zeros(k * k, dtype=torch.long, device=keys.device)
        cells[keys] = torch.arange(keys.numel(), device=keys.device)
        return _CodePairGrid(grid.view(k, k), cells)

    def _factorised_masses(
        self, z: Tensor, grid: _CodePairGrid
    ) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """Codeword scores ``[Qc, 2K]``, ``k_1`` masses ``[Qc, K]``, ``e_2`` ``[Qc, K]`` and the
        log shift ``[Qc, 1]`` of the masses; ``None`` if a query's masses underflow to zero.

        The masses are ``e_1(k_1) * sum_{k_2} W[k_1, k_2] e_2(k_2)`` with ``e_b = exp(s_b - max
        s_b)``; the log normaliser is ``shift + log(sum of the masses)``.
        """
        k = self.codebooks.num_codewords
        scores = self.codebooks.scores(z)
        per_book = scores.view(z.shape[0], 2, k)
        peak = per_book.amax(2, keepdim=True)
        e_1, e_2 = per_book.sub(peak).exp_().unbind(1)
        masses = (e_2 @ grid.weights.T).mul_(e_1)
        if not bool((masses.sum(1) > 0).all()):
            return None
        return scores, masses, e_2, peak.sum(1)

    def _draw_cells_in_two_stages(
        self, z: Tensor, grid: _CodePairGrid, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, None, Tensor, Tensor] | None:
        """Scores, stage state, ``log Z`` ``[Qc, 1]`` and cells ``[Qc, M]`` drawn as ``k_1`` from
        its marginal then ``k_2 | k_1``; ``None`` if the masses underflow (see the module doc)."""
        factorised = self._factorised_masses(z, grid)
        if factorised is None:
            return None
        scores, masses, e_2, shift = factorised
        k_1, total = inverse_cdf(masses, num_samples, generator)
        conditional = grid.weights[k_1].mul_(e_2.unsqueeze(1))
        k_2, _ = inverse_cdf(conditional, 1, generator)
        pairs = k_1 * self.codebooks.num_codewords + k_2.squeeze(2)
        cells = pairs if grid.cells is None else grid.cells[pairs]
        return scores, None, shift + total.log(), cells

    def _draw_cells_from_table(
        self, z: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Any, Tensor, Tensor]:
        """Scores, stage state, ``log Z`` ``[Qc, 1]`` and cells ``[Qc, M]`` drawn from the
        per-query cell table."""
        scores, state, table = self._cell_table(z)
        peak = table.amax(1, keepdim=True)
        cells, total = inverse_cdf(table.sub_(peak).exp_(), num_samples, generator)
        return scores, state, peak + total.log(), cells

    def _log_normaliser(
        self, z: Tensor, grid: _CodePairGrid | None
    ) -> tuple[Tensor, Any, Tensor]:
        """Scores, stage state and ``log Z`` ``[Qc, 1]``, from the factorised masses when the
        code-pair grid is given (and the masses do not underflow), else from the cell table."""
        factorised = None if grid is None else self._factorised_masses(z, grid)
        if factorised is not None:
            scores, masses, _, shift = factorised
            return scores, None, shift + masses.sum(1, keepdim=True).log()
        scores, state, table = self._cell_table(z)
        return scores, state, table.logsumexp(1, keepdim=True)

    def _cell_table(self, z: Tensor) -> tuple[Tensor, Any, Tensor]:
        """Codeword scores ``[Qc, B*K]``, stage state, and the log cell masses ``[Qc, C]``.

        The cell masses ``sum_b s_b(k_b) + log W_cell`` are unnormalised log-probabilities.
        """
        scores = self.codebooks.scores(z)
        num_books, k = self.codebooks.num_codebooks, self.codebooks.num_codewords
        per_book = scores.view(z.shape[0], num_books, k)
        if self.is_dense:
            # A copy even for B = 1: callers update the table in place.
            table = per_book[:, 0].clone() if num_books == 1 else per_book[:, 0]
            for b in range(1, num_books):
                table = (table.unsqueeze(2) + per_book[:, b].unsqueeze(1)).flatten(1)
        else:
            table = self._summed_codeword_scores(scores, self.cell_codes)
        state = self.stage.prepare(z, self.cell_offsets)
        return scores, state, table.add_(self.stage.cell_log_weight(state))

    def _summed_codeword_scores(self, scores: Tensor, codes: Tensor) -> Tensor:
        """``sum_b s_b(codes[c, b])`` ``[Qc, C]`` for codeword scores ``[Qc, B*K]`` and code rows
        ``[C, B]`` shared by all queries (cells or items): one ``index_select`` per codebook."""
        num_books, k = self.codebooks.num_codebooks, self.codebooks.num_codewords
        per_book = scores.view(scores.shape[0], num_books, k)
        total = per_book[:, 0].index_select(1, codes[:, 0])
        for b in range(1, num_books):
            total += per_book[:, b].index_select(1, codes[:, b])
        return total

    def _log_q(
        self, scores: Tensor, state: Any, log_z: Tensor, ids: Tensor, codes: Tensor
    ) -> Tensor:
        """``z.c_i + log w_i - log Z`` for ``ids`` ``[Qc, L]`` with codes ``[Qc, L, B]``;
        ``-inf`` where ``ids == 0``."""
        num_books, k = self.codebooks.num_codebooks, self.codebooks.num_codewords
        flat_codes = codes + torch.arange(num_books, device=ids.device) * k
        codeword_scores = scores.gather(1, flat_codes.flatten(1)).view(codes.shape).sum(2)
        log_q = codeword_scores + self.stage.item_log_weight(state, ids) - log_z
        return log_q.masked_fill_(ids == 0, -math.inf)

    def _prepare_exact_top(self, z: Tensor, scores: Tensor) -> TopCellsState:
        """The exact-top state of a query chunk (requires ``exact_top``)."""
        assert self.exact_top is not None
        return self.exact_top.prepare(
            z,
            scores,
            self.codebooks.num_codewords,
            self._cells_of_keys,
            self.order,
            self.cell_offsets,
        )

    def _cells_of_keys(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """Table index of each cell key and whether the cell is in the table (a sparse table
        holds only the non-empty cells, in key order)."""
        if self.is_dense:
            return keys, torch.ones_like(keys, dtype=torch.bool)
        table_keys = self._cell_keys(self.cell_codes)
        cells = torch.searchsorted(table_keys, keys).clamp_max_(table_keys.numel() - 1)
        return cells, table_keys[cells] == keys

    def _radix(self, device: torch.device) -> Tensor:
        """``[K**(B-1), ..., K, 1]``: the place values of the mixed-radix cell keys."""
        powers = torch.arange(self.codebooks.num_codebooks - 1, -1, -1, device=device)
        return self.codebooks.num_codewords**powers

    def _cell_keys(self, codes: Tensor) -> Tensor:
        """Cell key ``sum_b k_b * K**(B-1-b)`` of each code row ``[n, B]``: the row-major index
        into the dense ``K**B`` grid."""
        return (codes * self._radix(codes.device)).sum(1)

    def _decode_keys(self, keys: Tensor) -> Tensor:
        """Codes ``[C, B]`` of cell keys ``[C]``, the inverse of :meth:`_cell_keys`."""
        place_values = torch.div(keys.unsqueeze(1), self._radix(keys.device), rounding_mode="floor")
        return place_values % self.codebooks.num_codewords
