"""Adaptive estimates of the logits ``(A x)_i / temperature`` from weighted samples of coordinates.

Every row ("arm") reads the coordinates of ``x`` in one shared random order: a weighted sample
without replacement drawn with the Gumbel-top-k trick, keys ``log w_j + G_j`` (``G_j`` standard
Gumbel) sorted in decreasing order, with weights ``w_j = |x_j| * c_j`` (``c_j`` the L2 norm of
column ``j`` of ``A`` when given, else 1; that ``w`` minimises the summed variance of the row
estimates for a single draw). An arm at *level* ``r`` has computed the products
``c_ij = A_ij x_j / temperature`` of the first ``m_r`` coordinates of that order, with
``m_0 = min(init_pulls, d')``, ``m_{r+1} = min(2 m_r, d')`` and ``d'`` the number of coordinates of
non-zero weight (the others contribute exactly 0). Its logit is estimated by Horvitz-Thompson
with rank conditioning (Cohen & Kaplan, bottom-k sketches), as in Baharav et al.'s reference
implementation: with ``tau`` the key of coordinate ``m_r + 1``, coordinate ``j`` is in the prefix
with probability ``pi_j = 1 - exp(-exp(log w_j - tau))`` given the other keys, so

    mu_hat_i = sum_{j in prefix} c_ij / pi_j              (unbiased),
    var_hat_i = sum_{j in prefix} c_ij^2 (1 - pi_j) / pi_j^2   (unbiased for its variance).

Coordinates almost certain to be drawn (``pi_j ~ 1``, the heavy ones) add almost no variance,
and at the last level (``m = d'``) every ``pi_j = 1``: the estimate is the exact logit, variance 0.

Products are computed once and cached per level block (memory: one float per product, at most
``n * d``), so the number of products counted is exactly the number of distinct ``A_ij x_j``
used; re-weighting the cached products when an arm moves up a level computes no new ones (it
costs one pass over them, which the count leaves out).
"""

from __future__ import annotations

import torch
from torch import Tensor


class CoordinateSampler:
    """Per-row logit estimates that sharpen level by level on a shared weighted coordinate order.

    Args:
        A: ``[n, d]`` floating matrix.
        x: ``[d]`` query in ``A``'s dtype and device.
        scale: multiplies every product (``1 / temperature``).
        init_pulls: coordinates every row gets at level 0 (``>= d`` makes level 0 exact).
        column_norms: optional ``[d]`` non-negative column weights ``c_j``.
        generator: random generator on ``A``'s device (``None``: torch's default one).

    Attributes:
        estimate: ``[n]`` current logit estimates (0 for rows never pulled).
        variance: ``[n]`` estimated variance of ``estimate`` (``inf`` for rows never pulled).
        level: ``[n]`` long, each row's level (``-1``: never pulled).
        top_level: index of the exact level (``m = d'``).
        multiplications: distinct products ``A_ij x_j`` computed so far.

    Example:
        >>> A = torch.randn(100, 64); x = torch.randn(64)
        >>> s = CoordinateSampler(A, x, 1.0, init_pulls=8)
        >>> s.pull(torch.arange(100), s.top_level)
        >>> torch.allclose(s.estimate, A @ x, atol=1e-4)
        True
    """

    def __init__(
        self,
        A: Tensor,
        x: Tensor,
        scale: float,
        init_pulls: int,
        column_norms: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        n, d = A.shape
        self.A = A
        weights = x.abs() if column_norms is None else x.abs() * column_norms.to(A)
        log_w = weights.log()  # -inf where the weight is 0: such coordinates sort last
        uniform = torch.rand(d, generator=generator, device=A.device, dtype=A.dtype)
        gumbel = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(A.dtype).tiny)))
        keys = log_w + gumbel
        order = torch.argsort(keys, descending=True)
        num_nonzero = int((weights > 0).sum())
        self.columns = order[:num_nonzero]
        self.x_scaled = x[self.columns] * scale
        self.bounds = [min(init_pulls, num_nonzero)]
        while self.bounds[-1] < num_nonzero:
            self.bounds.append(min(2 * self.bounds[-1], num_nonzero))
        self.top_level = len(self.bounds) - 1
        sorted_log_w, sorted_keys = log_w[self.columns], keys[order]
        # Per level, the Horvitz-Thompson weights of its prefix: 1/pi and (1 - pi)/pi^2.
        self._inv_pi: list[Tensor] = []
        self._var_weight: list[Tensor] = []
        for m in self.bounds:
            if m < num_nonzero:
                pi = -torch.expm1(-torch.exp(sorted_log_w[:m] - sorted_keys[m]))
            else:
                pi = torch.ones(m, dtype=A.dtype, device=A.device)
            self._inv_pi.append(1.0 / pi)
            self._var_weight.append((1.0 - pi) / pi**2)
        # Cached products: block r holds columns [bounds[r-1], bounds[r]) of the rows that reached
        # level r; _block_pos[r][i] is row i's position in block r (-1 when absent).
        levels = range(len(self.bounds))
        self._blocks: list[Tensor] = [A.new_zeros(0, self._width(r)) for r in levels]
        self._block_pos = [torch.full((n,), -1, dtype=torch.long, device=A.device) for _ in levels]
        self.level = torch.full((n,), -1, dtype=torch.long, device=A.device)
        self.estimate = A.new_zeros(n)
        self.variance = torch.full((n,), float("inf"), dtype=A.dtype, device=A.device)
        self.multiplications = 0

    def _start(self, r: int) -> int:
        return 0 if r == 0 else self.bounds[r - 1]

    def _width(self, r: int) -> int:
        return self.bounds[r] - self._start(r)

    def _gather(self, rows: Tensor, cols: Tensor) -> Tensor:
        """``A[rows][:, cols]`` without copying whole rows of ``A``."""
        # Selecting the columns first streams over every row but is a fast contiguous copy;
        # a flat gather touches only the needed entries at a few times the cost per entry.
        if 3 * rows.numel() > self.A.shape[0]:
            return self.A.index_select(1, cols).index_select(0, rows)
        return torch.take(self.A, rows[:, None] * self.A.shape[1] + cols[None, :])

    def pull(self, rows: Tensor, target: int) -> None:
        """Raise ``rows`` to level ``target`` (rows already there or above are left alone).

        Args:
            rows: ``[R]`` long row indices (distinct).
            target: level in ``0..top_level``.
        """
        rows = rows[self.level[rows] < target]
        if rows.numel() == 0:
            return
        for r in range(target + 1):
            missing = rows[self.level[rows] < r]
            if missing.numel() == 0:
                continue
            span = slice(self._start(r), self.bounds[r])
            products = self._gather(missing, self.columns[span]) * self.x_scaled[span]
            self.multiplications += products.numel()
            cached = self._blocks[r].shape[0]
            self._block_pos[r][missing] = torch.arange(
                cached, cached + missing.numel(), device=rows.device
            )
            self._blocks[r] = torch.cat([self._blocks[r], products])
        self.level[rows] = target
        # Re-weight every cached product of these rows with the target level's probabilities.
        estimate = self.estimate.new_zeros(rows.numel())
        variance = self.estimate.new_zeros(rows.numel())
        inv_pi, var_weight = self._inv_pi[target], self._var_weight[target]
        for r in range(target + 1):
            block = self._blocks[r][self._block_pos[r][rows]]
            span = slice(self._start(r), self.bounds[r])
            estimate += block @ inv_pi[span]
            variance += block.square() @ var_weight[span]
        self.estimate[rows] = estimate
        self.variance[rows] = variance

    def advance(self, rows: Tensor) -> None:
        """Raise each of ``rows`` by one level (rows at the exact level stay there).

        Args:
            rows: ``[R]`` long row indices (distinct), at any levels.
        """
        levels = self.level[rows]
        for current in torch.unique(levels).tolist():
            if current < self.top_level:
                self.pull(rows[levels == current], current + 1)
