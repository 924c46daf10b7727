"""Softmax-bottleneck diagnostics: singular-value spectra of a model's log-probabilities.

For contexts ``h_1..h_C`` and items ``i_1..i_m``, the log-probability matrix
``A[c, j] = log p(i_j | h_c)`` of a dot-product softmax is ``H W^T - lse(H) 1^T``: its rank is
at most ``D + 1`` whatever ``C`` and ``m`` are (Yang et al., 2018), the softmax bottleneck.
Centring each row (subtracting its mean over the sampled items) removes the normaliser's rank-one
part, so the centred matrix of a dot-product softmax has at most ``D`` non-zero singular values.
Heads that deform the scores non-linearly (sigsoftmax, PLIF) or mix softmaxes (MoS) are not
bound by it; :func:`singular_values` shows how much of the spectrum they actually use.

Orhan (2018) looks at the conditioning of a layer through the singular values of its Jacobian:
:func:`jacobian_spectrum` averages, over contexts, the singular values of
``d log p(i_1..i_m | h) / d h`` (``[m, D]``, at most ``D`` of them), the map from the encoder's
output through the head to the log-probabilities. Near-zero values are directions of the
context that the head cannot turn into changes of the distribution.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from ..heads import Head
from ..scoring import log_probs

#: Items scored at once for the catalog normalisers.
_CHUNK_SIZE = 32768


def log_prob_matrix(head: Head, contexts: Tensor, item_emb: Tensor, item_ids: Tensor) -> Tensor:
    """``A[c, j] = log p(item_ids[j] | contexts[c])``, normalised over the whole catalog.

    Args:
        head: the model's output head, which (with its temperature) defines ``p``.
        contexts: ``[C, D]`` encoder outputs.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        item_ids: ``[m]`` item ids in ``1..N``.

    Returns:
        ``[C, m]`` float64 log-probabilities, computed in float64 throughout (on a float64 copy of
        ``head``), so that round-off does not pass for rank.

    Example:
        >>> from recsys_midx.heads import DotHead
        >>> matrix = log_prob_matrix(DotHead(), torch.randn(5, 3), torch.randn(21, 3),
        ...                          torch.arange(1, 21))
        >>> matrix.shape
        torch.Size([5, 20])
    """
    exact = copy.deepcopy(head).double()
    with torch.no_grad():
        return log_probs(exact, contexts.double(), item_emb.double(), item_ids, _CHUNK_SIZE)


def singular_values(matrix: Tensor, center: bool = True) -> Tensor:
    """Singular values (descending, float64) of ``matrix``, its rows centred if ``center``.

    Args:
        matrix: ``[C, m]`` matrix, such as :func:`log_prob_matrix`.
        center: subtract each row's mean first (removes the per-context normaliser).

    Returns:
        ``[min(C, m)]`` singular values.

    Raises:
        ValueError: if ``matrix`` is not 2-D or holds non-finite values.

    Example:
        >>> singular_values(torch.ones(3, 4), center=True).abs().max() < 1e-12
        tensor(True)
    """
    if matrix.dim() != 2:
        raise ValueError(f"matrix must be 2-D, got shape {tuple(matrix.shape)}")
    matrix = matrix.double()
    if not bool(matrix.isfinite().all()):
        raise ValueError("matrix holds non-finite values (probabilities of exactly 0?)")
    if center:
        matrix = matrix - matrix.mean(dim=1, keepdim=True)
    return torch.linalg.svdvals(matrix)


def numerical_rank(values: Tensor, rtol: float = 1e-9) -> int:
    """Number of singular values above ``rtol`` times the largest (0 for an all-zero matrix).

    Args:
        values: singular values, as :func:`singular_values` returns.
        rtol: relative threshold; float64 round-off of a log-probability matrix sits near
            ``1e-15`` relative to its largest singular value.

    Returns:
        The numerical rank.

    Example:
        >>> numerical_rank(torch.tensor([2.0, 1.0, 1e-14]))
        2
    """
    if values.numel() == 0 or float(values.max()) == 0.0:
        return 0
    return int((values > rtol * values.max()).sum())


def jacobian_spectrum(head: Head, contexts: Tensor, item_emb: Tensor, item_ids: Tensor) -> Tensor:
    """Mean over contexts of the singular values of ``d log p(item_ids | h) / d h``.

    ``log p`` of a context depends on that context only, so one backward pass per item gives
    that item's row of every context's Jacobian: ``m`` passes in all, each over the catalog in
    chunks.

    Args:
        head: the model's output head, which (with its temperature) defines ``p``.
        contexts: ``[C, D]`` encoder outputs.
        item_emb: ``[N+1, D]`` item table, row 0 padding.
        item_ids: ``[m]`` item ids in ``1..N``.

    Returns:
        ``[min(m, D)]`` float64 mean singular values, descending.

    Example:
        >>> from recsys_midx.heads import DotHead
        >>> values = jacobian_spectrum(DotHead(), torch.randn(4, 3), torch.randn(11, 3),
        ...                            torch.arange(1, 9))
        >>> values.shape
        torch.Size([3])
    """
    contexts = contexts.detach().clone().requires_grad_(True)
    item_emb = item_emb.detach()
    log_p = log_probs(head, contexts, item_emb, item_ids, _CHUNK_SIZE)  # [C, m]
    rows = []
    for j in range(log_p.shape[1]):
        (grad,) = torch.autograd.grad(log_p[:, j].sum(), contexts, retain_graph=True)
        rows.append(grad.double())
    jacobians = torch.stack(rows, dim=1)  # [C, m, D]
    return torch.linalg.svdvals(jacobians).mean(dim=0)
