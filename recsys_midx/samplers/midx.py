"""MIDX samplers: adaptive sampled softmax through an inverted multi-index.

The item table is quantised into ``B`` codebooks of ``K`` codewords (PQ or RQ, see
:mod:`recsys_midx.index.codebooks`), so item ``i`` falls in the cell ``(k_1..k_B)`` of its
codes and ``z.c_i = sum_b s_b(k_b)``. The proposal is

    q(i | z) = exp(z.c_i) * w_i(z) / Z(z),    Z(z) = sum_cells exp(sum_b s_b(k_b)) * W_cell(z),

with ``W_cell = sum_{i in cell} w_i`` and a last-stage weight ``w_i``:

* ``"uniform"``: ``w_i = 1`` (the MIDX sampler);
* ``"popularity"``: ``w_i = (count_i + pop_smoothing) ** pop_alpha`` from the counts given to
  ``update``, the weight of :class:`~recsys_midx.samplers.popularity.PopularitySampler`. The
  default smoothing 1 keeps never-seen items drawable, so every positive has a finite ``log q``;
  ``pop_alpha = 0`` is the uniform stage, 0.75 (default) the word2vec flattening;
* ``"residual"``: ``w_i = exp(z.r_i)`` with the residual ``r_i = v_i - c_i``, so ``q`` is exactly
  ``softmax(z.v)``; a correctness reference whose cost is ``O(N*D)`` per query again.

A draw first picks a cell, then an item inside it in proportion to ``w_i``. ``log q`` is computed
from the same cell masses, so it is the normalised log-probability of the proposal, for drawn ids
and for any other id. A cell is drawn from the per-query table of cell masses (any ``B``, any
stage), or, when the masses factorise (``B = 2`` and a query-independent ``W``), in two stages:
``k_1`` from its marginal, then ``k_2 | k_1`` (:mod:`recsys_midx.samplers.cell_draws`). The
items, grouped by cell, are laid out by :mod:`recsys_midx.samplers.cell_layout`; the last stages
live in :mod:`recsys_midx.samplers.last_stage`.

Optionally (``exact_top_codewords = t > 0``) the proposal mixes in the exact softmax over the
items of each query's top ``t**B`` cells (:mod:`recsys_midx.samplers.exact_top`): a draw comes
from there with probability ``exact_top_weight``, and ``log q`` is the mixture's.

Queries are processed in chunks to bound memory, sized by the device unless the user sets them
(:mod:`recsys_midx.samplers.query_chunks`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from recsys_midx.index import QUANTIZERS, IndexModule, make_codebooks
from recsys_midx.samplers.base import Sampler, check_item_table, full_precision
from recsys_midx.samplers.cell_draws import (
    CodePairGrid,
    cell_score_table,
    code_pair_grid,
    draw_cells_from_table,
    draw_cells_in_two_stages,
    factorised_masses,
    summed_codeword_scores,
    two_stages_are_cheaper,
)
from recsys_midx.samplers.cell_layout import build_cell_layout, cells_of_keys
from recsys_midx.samplers.exact_top import (
    ExactTopCells,
    TopCellsState,
    top_codewords_for_budget,
)
from recsys_midx.samplers.last_stage import LastStage, PopularityStage, ResidualStage, UniformStage
from recsys_midx.samplers.query_chunks import query_chunk_rows
from recsys_midx.scoring import row_chunks

log = logging.getLogger(__name__)

#: The last stages by ``last_stage`` name, each built from ``pop_alpha`` and ``pop_smoothing``.
LAST_STAGES: dict[str, Callable[[float, float], LastStage]] = {
    "uniform": lambda alpha, smoothing: UniformStage(),
    "popularity": PopularityStage,
    "residual": lambda alpha, smoothing: ResidualStage(),
}
#: The ways of drawing cells (``cell_draw``).
CELL_DRAWS = ("auto", "table", "two_stage")


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
        last_stage: ``"uniform"``, ``"popularity"`` or ``"residual"`` (see the module docstring).
        pop_alpha: exponent of the popularity weight ``(count + pop_smoothing) ** pop_alpha``.
        pop_smoothing: added to every count, so items never seen stay drawable.
        kmeans_iters: k-means iterations of the first build.
        warm_start_iters: k-means iterations of a refresh (warm-started).
        seed: seed of the codebook training (the draws use the ``generator`` of :meth:`sample`).
        cell_draw: how cells are drawn (see the module docstring): ``"table"`` always from the
            per-query cell table; ``"two_stage"`` as ``k_1`` then ``k_2 | k_1`` whenever the cell
            masses factorise (two codebooks, uniform or popularity stage), else from the table;
            ``"auto"`` (default) in two stages only when that is cheaper (see
            :mod:`recsys_midx.samplers.cell_draws`). The draws follow the same distribution
            either way.
        exact_top_codewords: ``t``; when positive, the exact softmax over the items whose codes
            are among each codebook's ``t`` best codewords for the query is mixed into the
            proposal (see :mod:`recsys_midx.samplers.exact_top`). It costs a snapshot of the
            item table in the state and ``|top cells| * D`` multiply-adds per query. ``None``
            (default): sized from ``exact_top_items`` and the catalog
            (:func:`~recsys_midx.samplers.exact_top.top_codewords_for_budget`), none for
            catalogs of at most ``2 * exact_top_items`` items; ``0``: none.
        exact_top_items: with ``exact_top_codewords=None``, the items to score exactly per query
            on average; ``t`` is the largest that keeps ``t**B * N / K**B`` within it, and
            within ``N / 2 - exact_top_items`` on small catalogs.
        exact_top_weight: the probability of a draw from those top cells, in ``(0, 1)``.
        query_chunk_size: queries processed at once. Temporaries grow linearly with it (a
            chunk's cell tables, top-cell layout and draws), besides the ``12 * Q * M`` bytes
            of output; the residual stage further caps ``rows x N``. ``None`` (default): sized by
            the device (:func:`~recsys_midx.samplers.query_chunks.query_chunk_rows`): 1,024 on
            a CPU, on CUDA as many as fit a share of the device's memory.

    Raises:
        ValueError: for a setting outside :attr:`choices` or below :attr:`minimums`, ``K > N``,
            ``K**B`` beyond 2**62 (cell keys are int64), a non-finite ``pop_alpha``, a negative
            ``pop_smoothing``, or an ``exact_top_weight`` outside ``(0, 1)``.

    Example:
        >>> sampler = MIDXSampler(num_items=1000, num_negatives=10, num_codewords=16)
        >>> sampler.update(torch.randn(1001, 32))
        >>> ids, log_q = sampler.sample(torch.randn(4, 32), 10)
        >>> ids.shape, log_q.dtype
        (torch.Size([4, 10]), torch.float32)
    """

    choices = {
        "quantizer": tuple(QUANTIZERS),
        "last_stage": tuple(LAST_STAGES),
        "cell_draw": CELL_DRAWS,
    }
    minimums = {
        # One codeword puts every item in one cell: the uniform sampler.
        "num_codewords": 2,
        "num_codebooks": 1,
        "query_chunk_size": 1,
        "exact_top_codewords": 0,
        "exact_top_items": 0,
    }

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
        exact_top_codewords: int | None = None,
        exact_top_weight: float = 0.5,
        exact_top_items: int = 900,
        query_chunk_size: int | None = None,
    ) -> None:
        super().__init__(num_items, num_negatives)
        self.check_settings(locals())  # every argument against the declared choices and minimums
        if num_codewords > num_items:
            raise ValueError(
                f"num_codewords={num_codewords} exceeds the number of items {num_items}: "
                f"k-means cannot place more codewords than there are items"
            )
        if num_codebooks * math.log2(max(num_codewords, 2)) > 62:
            raise ValueError(
                f"num_codewords**num_codebooks = {num_codewords}**{num_codebooks} cells do not "
                f"fit int64 cell keys"
            )
        self.cell_draw = cell_draw
        self.last_stage = last_stage
        self.query_chunk_size = None if query_chunk_size is None else int(query_chunk_size)
        self.codebooks = make_codebooks(
            quantizer,
            num_codewords=num_codewords,
            num_codebooks=num_codebooks,
            kmeans_iters=kmeans_iters,
            warm_start_iters=warm_start_iters,
            seed=seed,
        )
        self.stage: LastStage = LAST_STAGES[last_stage](pop_alpha, pop_smoothing)
        if exact_top_codewords is None:
            exact_top_codewords = top_codewords_for_budget(
                exact_top_items, num_items, num_codewords, num_codebooks
            )
            log.info(
                "MIDX exact top cells sized from %d items per query: exact_top_codewords=%d "
                "(%d**%d of %d**%d cells, %d items)",
                exact_top_items,
                exact_top_codewords,
                exact_top_codewords,
                num_codebooks,
                num_codewords,
                num_codebooks,
                num_items,
            )
        #: ``t`` as used (sized or given); 0 without exact top cells.
        self.exact_top_codewords = int(exact_top_codewords)
        self.exact_top = (
            ExactTopCells(exact_top_codewords, exact_top_weight) if exact_top_codewords else None
        )
        # Counting the positive exactly is what lets the top cells cut the gradient's error
        # (docs/guides/samplers.md); objectives left to choose follow this.
        self.prefers_exact_positives = self.exact_top is not None
        #: ids in cell order (items of cell c are ``order[offsets[c]:offsets[c+1]]``).
        self.register_buffer("order", torch.empty(0, dtype=torch.long))
        self.register_buffer("cell_offsets", torch.empty(0, dtype=torch.long))
        #: ``[C, B]`` codes of the cells in the table (all ``K**B`` cells when dense).
        self.register_buffer("cell_codes", torch.empty(0, num_codebooks, dtype=torch.long))

    @classmethod
    def settings_for(cls, num_items: int) -> dict[str, Any]:
        """The base's, and ``num_codewords`` below the default when the default's cells
        outnumber the items: the largest power of two ``K`` with ``K**B <= N`` (``B`` the
        default codebooks).

        Example:
            >>> MIDXSampler.settings_for(80)
            {'num_negatives': 20, 'num_codewords': 8}
        """
        settings = super().settings_for(num_items)
        defaults = cls.defaults()
        codewords = cls.minimums["num_codewords"]
        while (2 * codewords) ** defaults["num_codebooks"] <= num_items:
            codewords *= 2
        if codewords < defaults["num_codewords"]:
            settings["num_codewords"] = codewords
        return settings

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
        self.order, self.cell_offsets, self.cell_codes = build_cell_layout(
            codes, self.codebooks.num_codewords
        )
        self.stage.rebuild(self.order, self.cell_offsets, item_emb, item_counts, self.codebooks)
        if self.exact_top is not None:
            self.exact_top.rebuild(item_emb, self.order)

    def _draw(
        self, query: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        ids = torch.empty(query.shape[0], num_samples, dtype=torch.long, device=query.device)
        log_q = torch.empty(query.shape[0], num_samples, device=query.device)
        grid = self._two_stage_grid(num_samples)
        for rows, z in self._chunks(query, self._chunk_elements(num_samples, grid is not None)):
            scores = self.codebooks.scores(z)
            drawn = None
            if grid is not None:
                drawn = draw_cells_in_two_stages(scores, grid, num_samples, generator)
            if drawn is None:
                state, log_z, cells = self._draw_cells_from_table(z, scores, num_samples, generator)
            else:
                state, (log_z, cells) = None, drawn
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
                log_q[rows] = self.exact_top.mix_log_prob(top, chunk_ids, codes, log_q_rest)
            ids[rows] = chunk_ids
        return ids, log_q

    def _log_prob(self, query: Tensor, ids: Tensor) -> Tensor:
        flat = ids.reshape(ids.shape[0], -1).long()
        out = torch.empty(flat.shape, device=query.device)
        grid = self._two_stage_grid(0)
        for rows, z in self._chunks(query, self._chunk_elements(flat.shape[1], grid is not None)):
            scores, state, log_z = self._log_normaliser(z, grid)
            chunk_ids = flat[rows]
            # id 0 has no codes; any row will do, since _log_q masks it.
            codes = self.codebooks.codes[(chunk_ids - 1).clamp_min(0)]
            log_q = self._log_q(scores, state, log_z, chunk_ids, codes)
            if self.exact_top is not None:
                top = self._prepare_exact_top(z, scores)
                log_q = self.exact_top.mix_log_prob(top, chunk_ids, codes, log_q)
            out[rows] = log_q
        return out.view(ids.shape)

    def _catalog_log_prob(self, query: Tensor) -> Tensor:
        """Each codebook's scores are looked up by the items' codes with one ``index_select``
        shared by all queries instead of a per-query gather of ``[Q, N, B]`` codes, which it
        never builds (memory ``Q * N``)."""
        ids = torch.arange(1, self.num_items + 1, device=query.device)
        out = torch.empty(query.shape[0], self.num_items, device=query.device)
        grid = self._two_stage_grid(0)
        # A row of the catalog per query, and about as many temporaries beside it.
        per_query = self._chunk_elements(0, grid is not None) + 8 * self.num_items
        for rows, z in self._chunks(query, per_query):
            scores, state, log_z = self._log_normaliser(z, grid)
            log_q = summed_codeword_scores(
                scores, self.codebooks.codes, self.codebooks.num_codewords
            )
            log_q += self.stage.item_log_weight(state, ids.expand(z.shape[0], -1))
            log_q.sub_(log_z)
            if self.exact_top is not None:
                log_q = self.exact_top.mix_catalog_log_prob(
                    z, scores, self.codebooks.codes, self.codebooks.num_codewords, log_q
                )
            out[rows] = log_q
        return out

    def sizing(self) -> dict[str, int]:
        """The proposal's size: codewords, codebooks and exact-top codewords ``t`` as used."""
        return {
            "num_codewords": self.codebooks.num_codewords,
            "num_codebooks": self.codebooks.num_codebooks,
            "exact_top_codewords": self.exact_top_codewords,
        }

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, last_stage={self.last_stage!r}, "
            f"cell_draw={self.cell_draw!r}, exact_top_codewords={self.exact_top_codewords}, "
            f"query_chunk_size={self.query_chunk_size}"
        )

    def _check_ready(self) -> None:
        if self.cell_offsets.numel() == 0:
            raise RuntimeError("MIDXSampler has no index yet: call update(item_emb) first")

    def _query_dim(self) -> int:
        return self.codebooks.dim

    def _chunks(self, query: Tensor, elements_per_query: int) -> Iterator[tuple[slice, Tensor]]:
        """Row blocks of the queries, sized to bound the per-chunk tables of
        ``elements_per_query`` elements a query (:meth:`_chunk_elements`)."""
        size = self.query_chunk_size
        if size is None:
            size = query_chunk_rows(elements_per_query, query.device)
        if self.stage.chunk_elements is not None:
            size = min(size, max(1, self.stage.chunk_elements // self.num_items))
        return row_chunks(query, size)

    def _chunk_elements(self, ids_per_query: int, two_stage: bool) -> int:
        """Elements a chunk's tables hold per query at their peak, for ``ids_per_query`` ids
        drawn or probed a query; an upper estimate, which sizes the chunks on a GPU: per id
        about 16 (codes, scores, uniforms) plus, drawn in two stages, a row of ``K``
        conditional weights; else the cell table's ``#cells`` masses and running sums; and the
        exact top cells' layout (:meth:`ExactTopCells.layout_elements`)."""
        num_codewords = self.codebooks.num_codewords
        per_id = num_codewords + 16 if two_stage else 16
        table = 0 if two_stage else 4 * self.num_cells
        top = 0
        if self.exact_top is not None:
            top = self.exact_top.layout_elements(
                self.num_items, num_codewords, self.codebooks.num_codebooks
            )
        return max(1, ids_per_query * per_id + table + top)

    def _draws_in_two_stages(self, num_samples: int) -> bool:
        """Whether ``num_samples`` draws per query (0: only the normaliser) go in two stages.

        They can when the cell masses factor as ``e_1(k_1) * e_2(k_2) * W[k_1, k_2]`` with a
        query-independent ``W`` (two codebooks, uniform or popularity stage); ``"auto"`` takes
        them when :func:`~recsys_midx.samplers.cell_draws.two_stages_are_cheaper`.
        """
        if (
            self.cell_draw == "table"
            or self.codebooks.num_codebooks != 2
            or self.stage.query_dependent
        ):
            return False
        return self.cell_draw == "two_stage" or two_stages_are_cheaper(
            self.codebooks.num_codewords, num_samples, self.num_cells
        )

    def _two_stage_grid(self, num_samples: int) -> CodePairGrid | None:
        """The code-pair grid if ``num_samples`` draws per query (0: only the normaliser) go in
        two stages, else ``None`` (the cell table)."""
        return self._code_pair_grid() if self._draws_in_two_stages(num_samples) else None

    def _code_pair_grid(self) -> CodePairGrid:
        """The cell weights as a ``[K, K]`` matrix over code pairs, and the cell of each pair."""
        weights = self.stage.cell_log_weight(None).exp()
        return code_pair_grid(weights, self.cell_codes, self.codebooks.num_codewords, self.is_dense)

    def _draw_cells_from_table(
        self, z: Tensor, scores: Tensor, num_samples: int, generator: torch.Generator | None
    ) -> tuple[Any, Tensor, Tensor]:
        """Stage state, ``log Z`` ``[Qc, 1]`` and cells ``[Qc, M]`` drawn from the per-query cell
        table of queries ``z`` with codeword scores ``scores``."""
        state, table = self._cell_table(z, scores)
        return state, *draw_cells_from_table(table, num_samples, generator)

    def _log_normaliser(self, z: Tensor, grid: CodePairGrid | None) -> tuple[Tensor, Any, Tensor]:
        """Scores, stage state and ``log Z`` ``[Qc, 1]``, from the factorised masses when the
        code-pair grid is given (and the masses do not underflow), else from the cell table."""
        scores = self.codebooks.scores(z)
        factorised = None if grid is None else factorised_masses(scores, grid)
        if factorised is not None:
            masses, _, shift = factorised
            return scores, None, shift + masses.sum(1, keepdim=True).log()
        state, table = self._cell_table(z, scores)
        return scores, state, table.logsumexp(1, keepdim=True)

    def _cell_table(self, z: Tensor, scores: Tensor) -> tuple[Any, Tensor]:
        """Stage state and the log cell masses ``[Qc, C]`` of queries ``z`` with codeword scores
        ``scores``: ``sum_b s_b(k_b) + log W_cell``, unnormalised log-probabilities."""
        table = cell_score_table(
            scores, self.cell_codes, self.codebooks.num_codewords, self.is_dense
        )
        state = self.stage.prepare(z, self.cell_offsets)
        return state, table.add_(self.stage.cell_log_weight(state))

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
        """Table index of each cell key and whether the cell is in the table."""
        return cells_of_keys(keys, self.cell_codes, self.codebooks.num_codewords, self.is_dense)
