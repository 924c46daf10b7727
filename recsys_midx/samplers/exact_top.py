"""The exact softmax over a query's top cells, mixed into a MIDX proposal.

A MIDX proposal scores item ``i`` by its codewords, ``z.c_i``, and misses ``z.v_i`` by the
residual term ``z.r_i``: the quantisation error times the query norm, several nats for a
confident model. The items that matter most, the hard negatives that carry the softmax's mass
besides the positive, lie in the cells whose codewords score highest. This component scores
those items exactly: with ``T_b(z)`` the ``t`` best codewords of codebook ``b`` (the inverted
multi-index's neighbourhood of the query), the top region is

    H(z) = {i : k_b(i) in T_b(z) for every b},

``t**B`` cells, and the proposal becomes the mixture

    q(i | z) = (1 - lam) * q_midx(i | z) + lam * [i in H(z)] * exp(z.v_i) / Z_H(z),
    Z_H(z) = sum_{i in H(z)} exp(z.v_i),

which is still a normalised distribution over all items with a ``log q`` known for any id: a
draw is from the exact head with probability ``lam`` and from the MIDX proposal otherwise
(``lam`` is 0 for a query whose top cells are all empty). Its cost per query is ``|H(z)| * D``
multiply-adds (no gradient), against ``N * D`` for the exact softmax; ``|H(z)|`` is about
``t**B * N / #cells`` on a diffuse catalog and more near dense regions.

The exact scores use a snapshot of the item table taken at the proposal's last rebuild, so a
draw and its ``log q`` agree between rebuilds. The snapshot is stored in cell order: a query's
top-cell items are then a few contiguous runs, scored in place by one sampled sparse product
(``torch.sparse.sampled_addmm``) rather than copied out row by row.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from recsys_midx.index import IndexModule
from recsys_midx.samplers.draws import draw_weighted, position_of_ids, prefix_sum


def top_codewords_for_budget(
    item_budget: int, num_items: int, num_codewords: int, num_codebooks: int
) -> int:
    """The largest ``t`` whose ``t**B`` top cells hold at most ``item_budget`` items on average,
    fewer on small catalogs.

    On average a cell holds ``N / K**B`` items, so ``t**B`` cells hold ``t**B * N / K**B``: the
    result is the largest ``t <= K`` with ``t**B * N / K**B <= min(item_budget, N / 2 -
    item_budget)``, and ``0`` (no exact head) when one cell alone holds more than that. The exact
    scoring per query then stays near the budget whatever the catalog: at ``K = 64``, ``B = 2``
    and a budget of 900, ``t`` is 6 for 100k items and 1 for 1M.

    The second bound is for small catalogs. A catalog of at most twice the budget gets no top
    cells: they would hold most items, and the mixture would cost about what the exact softmax
    costs without being exact. Above that the allowance grows from nothing and reaches the whole
    budget at ``4 * item_budget`` items, so the items scored per query grow steadily with ``N``
    (by one ``t`` at a time) and never exceed a quarter of the catalog.

    Args:
        item_budget: items scored exactly per query, on average (>= 0).
        num_items: ``N``.
        num_codewords: ``K``.
        num_codebooks: ``B``.

    Returns:
        ``t`` in ``0..K``.

    Raises:
        ValueError: if ``item_budget < 0``.

    Example:
        >>> top_codewords_for_budget(900, 100_000, 64, 2)
        6
        >>> top_codewords_for_budget(900, 1_900, 64, 2)
        10
    """
    if item_budget < 0:
        raise ValueError(f"the exact-top item budget must be >= 0, got {item_budget}")
    # Twice the allowance min(item_budget, N / 2 - item_budget), kept in integers.
    twice_allowance = min(2 * item_budget, num_items - 2 * item_budget)
    if twice_allowance <= 0:
        return 0
    capacity = twice_allowance * num_codewords**num_codebooks
    top = 0
    while top < num_codewords and 2 * (top + 1) ** num_codebooks * num_items <= capacity:
        top += 1
    return top


class TopCellsState(NamedTuple):
    """Per-chunk state of the top-cell head, its items laid out query by query."""

    #: ``[Qc, B, K]`` the rank of each codeword among its codebook's ``t`` best for the query,
    #: in ascending code order (-1 for the others).
    code_ranks: Tensor
    #: ``[Qc, 1]`` ``log lam`` (``-inf`` where the top cells are all empty).
    log_weight: Tensor
    #: ``[Qc, 1]`` ``log (1 - lam)`` (0 where the top cells are all empty).
    log_rest_weight: Tensor
    #: ``[Qc, 1]`` ``log Z_H`` (``-inf`` where the top cells are all empty).
    log_normaliser: Tensor
    #: ``[T]`` ids of every query's top-cell items, query after query.
    ids: Tensor
    #: ``[T]`` exact scores ``z.v`` of those items.
    exact: Tensor
    #: ``[Qc, t**B]`` start of each top cell in the cell order (0 for an empty cell).
    cell_starts: Tensor
    #: ``[Qc, t**B]`` start of each top cell's items in the flat layout.
    cell_offsets: Tensor
    #: ``[T]`` float64 inclusive cumsum of ``exp(z.v - max over the query's items)``.
    cum: Tensor
    #: ``[Qc + 1]`` ``cum`` before each query's items (last entry: the total).
    query_cum: Tensor
    #: ``[Qc + 1]`` start of each query's items in the flat layout.
    query_offsets: Tensor


class ExactTopCells(IndexModule):
    """Mixes the exact softmax over each query's top ``t**B`` cells into a MIDX proposal.

    See the module docstring for the proposal. The owner (a MIDX sampler) passes its cell
    layout to :meth:`rebuild` and :meth:`prepare`; the component keeps a snapshot of the item
    table in cell order and each id's position in it.

    Args:
        top_codewords: ``t``, codewords per codebook that span a query's top cells (>= 1).
        weight: ``lam``, the probability of a draw from the exact head, in ``(0, 1)``.

    Raises:
        ValueError: if ``top_codewords < 1`` or ``weight`` is not in ``(0, 1)``.
    """

    def __init__(self, top_codewords: int, weight: float) -> None:
        super().__init__()
        if top_codewords < 1:
            raise ValueError(f"top_codewords must be >= 1, got {top_codewords}")
        if not 0.0 < weight < 1.0:
            # lam = 1 would leave the items outside the top cells undrawable (log q = -inf).
            raise ValueError(f"the exact-top weight must be in (0, 1), got {weight}")
        self.top_codewords = int(top_codewords)
        self.weight = float(weight)
        #: ``[N, D]`` the item table at the last rebuild, row ``p`` holding item ``order[p]``.
        self.register_buffer("items_in_cell_order", torch.empty(0, 0))
        #: ``[N+1]`` the row of each id in ``items_in_cell_order`` (0 for the padding id).
        self.register_buffer("position_of_id", torch.empty(0, dtype=torch.long))

    def rebuild(self, item_emb: Tensor, order: Tensor) -> None:
        """Snapshot the item table ``[N+1, D]`` in the cell order ``order`` ``[N]`` (ids in cell
        order): a copy, since the live table keeps training."""
        self.items_in_cell_order = item_emb.detach().float().index_select(0, order)
        self.position_of_id = position_of_ids(order)

    def prepare(
        self,
        z: Tensor,
        scores: Tensor,
        num_codewords: int,
        cells_of_keys: Callable[[Tensor], tuple[Tensor, Tensor]],
        order: Tensor,
        offsets: Tensor,
    ) -> TopCellsState:
        """Find each query's top cells and score their items exactly.

        Args:
            z: ``[Qc, D]`` float32 queries.
            scores: ``[Qc, B*K]`` codeword scores of ``z``.
            num_codewords: ``K``.
            cells_of_keys: maps cell keys ``[Qc, C']`` (row-major in the ``K**B`` grid) to cell
                indices and whether each cell is in the table.
            order: ``[N]`` ids in cell order.
            offsets: ``[C+1]`` cell starts in ``order``.
        """
        rows = z.shape[0]
        top_codes = self._top_codes(scores, num_codewords)
        keys = top_codes[:, 0]
        for b in range(1, top_codes.shape[1]):
            keys = (keys.unsqueeze(2) * num_codewords + top_codes[:, b].unsqueeze(1)).flatten(1)
        cells, present = cells_of_keys(keys)
        starts = torch.where(present, offsets[cells], 0)
        counts = torch.where(present, offsets[cells + 1] - starts, 0)
        per_query = counts.sum(1)
        # The top codes ascend, so a query's keys ascend, and so do its non-empty cells' starts
        # in the cell order (sorted by key): its items' positions ascend, as the sparse layout
        # that scores them asks, with no sort.
        flat_counts = counts.flatten()
        total = int(flat_counts.sum())  # the one host sync: the layout's size
        positions = _segment_positions(starts.flatten(), flat_counts, total)
        cell_offsets = flat_counts.cumsum(0).sub_(flat_counts).view_as(counts)
        query_offsets = torch.cat([per_query.new_zeros(1), per_query.cumsum(0)])
        exact = _scores_at(z, self.items_in_cell_order, query_offsets, positions)
        ids = order[positions]
        query_of = torch.repeat_interleave(
            torch.arange(rows, device=z.device), per_query, output_size=total
        )
        peak = exact.new_full((rows,), -math.inf).scatter_reduce_(0, query_of, exact, "amax")
        cum = (exact - peak[query_of]).exp_().cumsum(0, dtype=torch.float64)
        # prefix_sum reads cum[0]: without any top-cell item in the chunk every sum is 0.
        query_cum = prefix_sum(cum, query_offsets) if cum.numel() else cum.new_zeros(rows + 1)
        log_normaliser = (query_cum.diff().log().float() + peak).unsqueeze(1)
        log_weight, log_rest = self._log_weights((per_query == 0).unsqueeze(1))
        code_ranks = torch.full(scores.shape, -1, dtype=torch.long, device=z.device)
        code_ranks = code_ranks.view(rows, -1, num_codewords).scatter_(
            2, top_codes, torch.arange(top_codes.shape[2], device=z.device).expand_as(top_codes)
        )
        return TopCellsState(
            code_ranks,
            log_weight,
            log_rest,
            log_normaliser,
            ids,
            exact,
            starts,
            cell_offsets,
            cum,
            query_cum,
            query_offsets,
        )

    def mix_draws(
        self, state: TopCellsState, ids: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        """Replace each of the MIDX draws ``ids`` ``[Qc, M]`` by a draw from the exact head with
        probability ``lam`` (never for a query whose top cells are empty)."""
        if state.ids.numel() == 0:
            return ids
        u = torch.rand(ids.shape, device=ids.device, generator=generator)
        from_head = u < state.log_weight.exp()
        query = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1).expand_as(ids)
        positions = draw_weighted(state.cum, state.query_cum, query, state.query_offsets, generator)
        # Empty-head queries never take a head draw; the clamp keeps their unused index valid.
        head_ids = state.ids[positions.clamp_(0, state.ids.numel() - 1)]
        return torch.where(from_head, head_ids, ids)

    def mix_log_prob(
        self, state: TopCellsState, ids: Tensor, codes: Tensor, log_q_rest: Tensor
    ) -> Tensor:
        """The mixture's ``log q`` of ``ids`` ``[Qc, L]`` (codes ``[Qc, L, B]``), given the MIDX
        proposal's ``log_q_rest`` ``[Qc, L]`` (``-inf`` for id 0).

        An id in its query's top cells takes the exact score :meth:`prepare` computed for it: its
        top cell (the rank of its code among each codebook's ``t`` best) gives its place in the
        flat layout, so no item row is read again.
        """
        top = min(self.top_codewords, state.code_ranks.shape[2])
        ranks = state.code_ranks.gather(2, codes.transpose(1, 2))  # [Qc, B, L]
        in_top = (ranks >= 0).all(1) & (ids > 0)
        cell = torch.zeros_like(ids)
        for rank in ranks.clamp_min_(0).unbind(1):
            cell = cell * top + rank
        start = state.cell_starts.gather(1, cell)
        flat = state.cell_offsets.gather(1, cell) + self.position_of_id[ids] - start
        if state.exact.numel():
            exact = state.exact[flat.masked_fill_(~in_top, 0)]
        else:  # no query of the chunk has a non-empty top cell: no id is in one
            exact = torch.zeros(ids.shape, device=ids.device)
        return _mix(
            in_top, exact, state.log_normaliser, state.log_weight, state.log_rest_weight, log_q_rest
        )

    def mix_catalog_log_prob(
        self,
        z: Tensor,
        scores: Tensor,
        codes: Tensor,
        num_codewords: int,
        log_q_rest: Tensor,
    ) -> Tensor:
        """The mixture's ``log q`` of every item ``1..N`` ``[Qc, N]``, given the MIDX proposal's.

        Needs no per-query layout: ``Z_H`` is summed from the catalog's scores, ``O(N * D)`` per
        query (for diagnostics).

        Args:
            z: ``[Qc, D]`` float32 queries.
            scores: ``[Qc, B*K]`` codeword scores of ``z``.
            codes: ``[N, B]`` codes of items ``1..N``.
            num_codewords: ``K``.
            log_q_rest: ``[Qc, N]`` the MIDX proposal's ``log q``.
        """
        top_codes = self._top_codes(scores, num_codewords)
        rows, num_books, _ = top_codes.shape
        is_top = torch.zeros(rows, num_books, num_codewords, dtype=torch.bool, device=z.device)
        is_top.scatter_(2, top_codes, True)
        in_top = is_top[:, 0].index_select(1, codes[:, 0])
        for b in range(1, num_books):
            in_top &= is_top[:, b].index_select(1, codes[:, b])
        exact = (z @ self.items_in_cell_order.T).index_select(1, self.position_of_id[1:])
        log_normaliser = exact.masked_fill(~in_top, -math.inf).logsumexp(1, keepdim=True)
        log_weight, log_rest = self._log_weights(~in_top.any(1, keepdim=True))
        return _mix(in_top, exact, log_normaliser, log_weight, log_rest, log_q_rest)

    def layout_elements(self, num_items: int, num_codewords: int, num_codebooks: int) -> int:
        """Elements per query that :meth:`prepare`'s layout holds at its peak, an upper estimate:
        32 per top-cell item (positions, ids, scores, running sums in int64 and float64) for
        the ``t**B * N / K**B`` items the top cells hold on average, which leaves room for top
        cells holding about twice as many."""
        top_cells = min(self.top_codewords, num_codewords) ** num_codebooks
        return 32 * (top_cells * num_items // num_codewords**num_codebooks)

    def extra_repr(self) -> str:
        return f"top_codewords={self.top_codewords}, weight={self.weight}"

    def _top_codes(self, scores: Tensor, num_codewords: int) -> Tensor:
        """``[Qc, B, t]`` each codebook's ``t`` best codewords for the queries' ``scores``, in
        ascending code order (so the top cells' keys ascend)."""
        per_book = scores.view(scores.shape[0], -1, num_codewords)
        top = per_book.topk(min(self.top_codewords, num_codewords), dim=2, sorted=False).indices
        return top.sort(dim=2).values

    def _log_weights(self, empty: Tensor) -> tuple[Tensor, Tensor]:
        """``log lam`` and ``log (1 - lam)`` ``[Qc, 1]``; ``-inf`` and 0 where ``empty``."""
        log_weight = torch.full(empty.shape, math.log(self.weight), device=empty.device)
        log_rest = torch.full(empty.shape, math.log1p(-self.weight), device=empty.device)
        return log_weight.masked_fill_(empty, -math.inf), log_rest.masked_fill_(empty, 0.0)


def _mix(
    in_top: Tensor,
    exact: Tensor,
    log_normaliser: Tensor,
    log_weight: Tensor,
    log_rest_weight: Tensor,
    log_q_rest: Tensor,
) -> Tensor:
    """``log((1 - lam) q_rest + lam [in top] exp(exact) / Z_H)``, all in logs."""
    head = torch.where(in_top, exact - log_normaliser, -math.inf)
    return torch.logaddexp(log_q_rest + log_rest_weight, head + log_weight)


def _scores_at(z: Tensor, items: Tensor, query_offsets: Tensor, positions: Tensor) -> Tensor:
    """The scores ``z_q . items[p]`` ``[T]`` of each query ``q`` at its ``positions``
    ``query_offsets[q]:query_offsets[q + 1]`` (ascending within a query).

    A sampled dense-dense product over the sparse pattern of the positions: it reads each item
    row in place, where gathering the rows and repeating the query copies both.
    """
    with warnings.catch_warnings():
        # torch warns once per process that sparse CSR tensors are a beta feature and, in some
        # versions (2.11), that invariant checks are off even when check_invariants says so.
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        pattern = torch.sparse_csr_tensor(
            query_offsets,
            positions,
            z.new_zeros(positions.shape),
            size=(z.shape[0], items.shape[0]),
            check_invariants=False,  # valid by construction; checking would cost a pass
        )
        return torch.sparse.sampled_addmm(pattern, z, items.T, beta=0.0).values()


def _segment_positions(starts: Tensor, counts: Tensor, total: int) -> Tensor:
    """``cat([arange(s, s + c) for s, c in zip(starts, counts)])`` without a Python loop, for
    ``total = counts.sum()``: the ``j``-th entry of a segment that begins at ``first`` in the
    output is ``start + j - first``."""
    first = torch.cumsum(counts, 0).sub_(counts)
    shift = torch.repeat_interleave(starts - first, counts, output_size=total)
    return shift.add_(torch.arange(total, device=counts.device))
