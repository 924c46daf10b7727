"""AdaptiveSoftmax (Baharav et al., NeurIPS 2024): top-k of ``softmax(A x)`` without all of ``A x``.

The logits ``mu_i = A_i . x / temperature`` are treated as the means of ``n`` bandit arms; pulling
an arm computes more coordinate products of its dot product (see
:mod:`recsys_midx.inference.coordinate_sampling` for the shared importance-weighted order and the
Horvitz-Thompson estimate ``mu_hat_i`` with its variance ``v_i``). The failure budget ``delta`` is
split in two halves, ``delta_1`` for identification and ``delta_2`` for the normaliser.

1. **Pilot.** Every arm gets the first ``m_0 = init_pulls`` coordinates of the order.
2. **Top-k identification** (successive elimination). With ``R`` the number of levels and
   ``w_i = sqrt(2 s v_i log(2 n R / delta_1))`` (``s = variance_scale``), an arm stays a candidate
   while ``mu_hat_i + w_i >= `` the ``k``-th largest ``mu_hat_j - w_j``; candidates move up one
   level (twice the coordinates) per round until exactly ``k`` remain or all are exact. A union
   bound over arms and levels makes every interval hold with probability ``>= 1 - delta_1``.
3. **Exact winners.** The ``k`` survivors are completed to every coordinate: their logits (and
   so their order) are exact, at a cost of at most ``k d`` products.
4. **Normaliser** (the paper's Algorithm 2). From lower confidence bounds
   ``l_i = mu_hat_i - sqrt(2 s v_i log(6 n / delta_2))``, ``alpha_i = exp(l_i)`` and
   ``gamma_i = exp(l_i / 2)``, every arm must reach the variance target

       V_i = min(V_0, sum(gamma) / (c gamma_i), sum(alpha) / (c' alpha_i)),
       V_0 = 1 / (17 log(6 n / delta_2)),
       c = 16 sqrt(2) log(6 n / delta_2) / eps * sum(gamma)^2 / sum(alpha),
       c' = 16 log(12 / delta_2) / eps^2,

   so arms carrying more of the mass are estimated more finely: the ``c'`` term bounds the
   first-order error ``sum_i alpha_i^2 v_i`` of ``S_hat`` by ``(eps sum(alpha))^2 / (16 log(12 /
   delta_2))``, the ``c`` term its second-order (Jensen) bias ``sum_i alpha_i v_i / 2``, and ``V_0``
   keeps each ``alpha_i`` within a constant factor of ``exp(mu_i)``. These targets use
   ``3 eps / 4``; the remaining ``eps / 4`` exempts *negligible* arms, the largest set whose upper
   bounds ``u_i = mu_hat_i + sqrt(2 s v_i log(6 n / delta_2))`` satisfy ``sum exp(u_i) <= eps / 4 *
   sum(alpha)``: ``exp(mu_i)`` and ``exp(mu_hat_i)`` both lie in ``[0, exp(u_i)]``, so whatever
   their estimates they move ``S_hat`` by at most ``eps / 4`` of ``S`` (without this rule ``V_0``
   alone would force every arm of a peaked softmax to be nearly exact). Arms above their target
   move up one level per round; targets are recomputed every round from the sharper estimates.
5. **Answer.** ``log S_hat = logsumexp(mu_hat)`` (exact logits for the winners) and
   ``p_hat_i = exp(mu_i - log S_hat)`` for the ``k`` winners. As the winners' logits are exact,
   ``|p_hat_i / p_i - 1| <= eps`` is the same as ``S / S_hat`` lying in ``[1 - eps, 1 + eps]``.

**What the guarantee assumes.** With probability ``>= 1 - delta`` the ids are the true top-``k``
(as a set, returned in exact order) and every probability is within a factor ``1 +- eps`` if each
estimate ``mu_hat_i`` is sub-Gaussian around ``mu_i`` with variance proxy ``s v_i`` at every level
(bounded coordinate products and enough coordinates per level make the Horvitz-Thompson sum close
to Gaussian; ``v_i`` is itself estimated from the sample, which under-covers when the first
coordinates miss a rare large product), and the top-``k`` logits are separated from the rest by a
gap (ties are broken arbitrarily, and the cost grows as ``1 / gap^2`` until the exact level).
``variance_scale < 1`` trusts the estimates more (fewer products, no guarantee); ``> 1`` is more
conservative. The sample cost is small when the softmax is peaked and ``x``'s mass is carried by
few coordinates; with a flat softmax over many arms the normaliser needs most arms nearly exact.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from recsys_midx.inference.coordinate_sampling import CoordinateSampler
from recsys_midx.inference.result import TopKResult
from recsys_midx.inference.validation import check_query

__all__ = ["AdaptiveSoftmax", "adaptive_softmax_topk"]


def _check_parameters(eps: float, delta: float, init_pulls: int, variance_scale: float) -> None:
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if isinstance(init_pulls, bool) or not isinstance(init_pulls, int) or init_pulls < 1:
        raise ValueError(f"init_pulls must be an integer >= 1, got {init_pulls!r}")
    if not (math.isfinite(variance_scale) and variance_scale > 0):
        raise ValueError(f"variance_scale must be finite and > 0, got {variance_scale}")


def _check_column_norms(column_norms: Tensor, d: int) -> None:
    if column_norms.shape != (d,) or bool((column_norms < 0).any()):
        raise ValueError(
            f"column_norms must be a non-negative tensor of shape [{d}], "
            f"got shape {tuple(column_norms.shape)}"
        )


def _identify_top_k(
    sampler: CoordinateSampler, k: int, delta: float, variance_scale: float
) -> Tensor:
    """Successive elimination (stage 2): the ``k`` arms whose intervals beat all others."""
    n = sampler.estimate.numel()
    log_term = math.log(2 * n * (sampler.top_level + 1) / delta)
    while True:
        width = torch.sqrt(2 * log_term * variance_scale * sampler.variance)
        lower, upper = sampler.estimate - width, sampler.estimate + width
        kth_lower = lower.topk(k).values[-1]
        candidates = torch.nonzero(upper >= kth_lower).squeeze(1)
        open_candidates = candidates[sampler.level[candidates] < sampler.top_level]
        if candidates.numel() <= k or open_candidates.numel() == 0:
            break
        sampler.advance(open_candidates)
    # Exactly k candidates, or exact ties: take the k largest estimates among them.
    return candidates[sampler.estimate[candidates].topk(k).indices]


def _estimate_normalizer(
    sampler: CoordinateSampler, eps: float, delta: float, variance_scale: float
) -> Tensor:
    """The paper's normaliser estimation (stage 4): ``log S_hat`` to multiplicative ``eps``."""
    n = sampler.estimate.numel()
    log_n_term = math.log(6 * n / delta)
    base_target = 1.0 / (17 * log_n_term)
    # A quarter of eps goes to the negligible arms, the rest to the paper's targets.
    eps_targets = 0.75 * eps
    log_c_alpha = math.log(16 * math.log(12 / delta) / eps_targets**2)
    while True:
        variance = variance_scale * sampler.variance
        width = torch.sqrt(2 * log_n_term * variance)
        log_alpha = sampler.estimate - width
        log_gamma = log_alpha / 2
        lse_alpha, lse_gamma = torch.logsumexp(log_alpha, 0), torch.logsumexp(log_gamma, 0)
        log_c_gamma = (
            math.log(16 * math.sqrt(2) * log_n_term / eps_targets) + 2 * lse_gamma - lse_alpha
        )
        target = torch.minimum(
            torch.exp(lse_gamma - log_c_gamma - log_gamma),
            torch.exp(lse_alpha - log_c_alpha - log_alpha),
        ).clamp_max(base_target)
        # Both exp(mu_i) and exp(mu_hat_i) lie in [0, exp(upper_i)], so arms whose upper bounds
        # add up to at most eps/4 of sum(alpha) <= S change S_hat by at most eps/4 of S,
        # whatever their estimates: they need no further coordinates.
        upper_sorted, by_upper = torch.sort(sampler.estimate + width)
        negligible = torch.empty_like(upper_sorted, dtype=torch.bool)
        negligible[by_upper] = torch.logcumsumexp(upper_sorted, 0) <= math.log(eps / 4) + lse_alpha
        behind = (variance > target) & ~negligible & (sampler.level < sampler.top_level)
        behind = torch.nonzero(behind).squeeze(1)
        if behind.numel() == 0:
            return torch.logsumexp(sampler.estimate, 0)
        sampler.advance(behind)


@torch.no_grad()
def adaptive_softmax_topk(
    A: Tensor,
    x: Tensor,
    k: int = 1,
    eps: float = 0.3,
    delta: float = 0.1,
    *,
    temperature: float = 1.0,
    column_norms: Tensor | None = None,
    init_pulls: int = 32,
    variance_scale: float = 1.0,
    generator: torch.Generator | None = None,
) -> TopKResult:
    """Top-``k`` classes of ``softmax(A x / temperature)`` by adaptive sampling of coordinates.

    See the module docstring for the stages, constants and assumptions. Runs on ``A``'s device;
    the loop is over bandit rounds (at most ``log2(d / init_pulls) + 1`` levels per arm), every
    round is vectorised over arms and coordinates.

    Args:
        A: ``[n, d]`` floating matrix of class vectors.
        x: ``[d]`` query (cast to ``A``'s dtype and device).
        k: number of classes returned, ``1 <= k <= n``.
        eps: multiplicative error allowed on each returned probability, in ``(0, 1)``.
        delta: failure probability, in ``(0, 1)``.
        temperature: divides the logits; finite and positive.
        column_norms: optional ``[d]`` L2 norms of ``A``'s columns, used in the importance
            weights ``|x_j| * column_norms[j]`` (compute once per matrix, e.g. with
            :class:`AdaptiveSoftmax`); ``None`` weights coordinates by ``|x_j|`` alone.
        init_pulls: coordinates per arm in the pilot; ``>= d`` computes everything exactly.
        variance_scale: multiplies every variance estimate (1: the stated constants).
        generator: random generator on ``A``'s device.

    Returns:
        A :class:`TopKResult`; ``multiplications`` counts the distinct products computed
        (``n * d`` when every arm ends exact and ``x`` has no zero coordinate).

    Raises:
        ValueError: on bad shapes or parameters (the message names the value).

    Example:
        >>> A = torch.randn(5000, 256) / 16; x = 16 * A[42] + 0.1 * torch.randn(256)
        >>> result = adaptive_softmax_topk(A, x, k=1, eps=0.3, delta=0.1)
        >>> result.ids.tolist(), result.multiplications < 5000 * 256
        ([42], True)
    """
    x = check_query(A, x, k, temperature)
    _check_parameters(eps, delta, init_pulls, variance_scale)
    if column_norms is not None:
        _check_column_norms(column_norms, A.shape[1])
    sampler = CoordinateSampler(A, x, 1.0 / temperature, init_pulls, column_norms, generator)
    sampler.pull(torch.arange(A.shape[0], device=A.device), 0)
    ids = _identify_top_k(sampler, k, delta / 2, variance_scale)
    sampler.pull(ids, sampler.top_level)
    log_normalizer = _estimate_normalizer(sampler, eps, delta / 2, variance_scale)
    logits, order = sampler.estimate[ids].sort(descending=True)
    return TopKResult(
        ids=ids[order],
        probs=torch.exp(logits - log_normalizer),
        logits=logits,
        log_normalizer=log_normalizer,
        multiplications=sampler.multiplications,
    )


class AdaptiveSoftmax:
    """AdaptiveSoftmax bound to one matrix: the column norms are computed once for all queries.

    Args:
        A: ``[n, d]`` floating matrix of class vectors (kept by reference).
        eps: multiplicative error allowed on each returned probability, in ``(0, 1)``.
        delta: failure probability, in ``(0, 1)``.
        temperature: divides the logits; finite and positive.
        init_pulls: coordinates per arm in the pilot.
        variance_scale: multiplies every variance estimate (1: the stated constants).
        importance_sampling: weight coordinates by ``|x_j| * ||A[:, j]||`` (else by ``|x_j|``).

    Raises:
        ValueError: on bad parameters.

    Example:
        >>> head = AdaptiveSoftmax(torch.randn(5000, 256) / 16)
        >>> result = head.topk(8 * head.A[42], k=1)
        >>> result.ids.item()
        42
    """

    def __init__(
        self,
        A: Tensor,
        eps: float = 0.3,
        delta: float = 0.1,
        *,
        temperature: float = 1.0,
        init_pulls: int = 32,
        variance_scale: float = 1.0,
        importance_sampling: bool = True,
    ) -> None:
        check_query(A, A.new_zeros(A.shape[1]), 1, temperature)
        _check_parameters(eps, delta, init_pulls, variance_scale)
        self.A = A
        self.eps, self.delta, self.temperature = eps, delta, temperature
        self.init_pulls, self.variance_scale = init_pulls, variance_scale
        # A one-off O(n d) pass over the matrix, amortised over every query it answers.
        self.column_norms = torch.linalg.vector_norm(A, dim=0) if importance_sampling else None

    def topk(self, x: Tensor, k: int = 1, generator: torch.Generator | None = None) -> TopKResult:
        """The adaptive top-``k`` of ``softmax(A x / temperature)`` (:func:`adaptive_softmax_topk`).

        Args:
            x: ``[d]`` query.
            k: number of classes returned.
            generator: random generator on ``A``'s device.

        Returns:
            A :class:`TopKResult`.
        """
        return adaptive_softmax_topk(
            self.A,
            x,
            k,
            self.eps,
            self.delta,
            temperature=self.temperature,
            column_norms=self.column_norms,
            init_pulls=self.init_pulls,
            variance_scale=self.variance_scale,
            generator=generator,
        )
