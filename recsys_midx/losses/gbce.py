"""gBCE (Petrov & Macdonald, "gSASRec: Reducing Overconfidence in Sequential Recommendation
Trained with Negative Sampling", RecSys 2023): binary cross-entropy whose positive probability
is raised to a power ``beta`` that undoes the overconfidence negative sampling causes.
"""

from __future__ import annotations

from typing import ClassVar

from .bce import BCELoss


def gbce_beta(calibration: float, num_negatives: int, num_items: int) -> float:
    """``beta = alpha (t (1 - 1/alpha) + 1/alpha)`` with the sampling rate
    ``alpha = num_negatives / (num_items - 1)``.

    ``t = 0`` gives ``beta = 1`` (plain binary cross-entropy); ``t = 1`` gives ``beta = alpha``,
    the positive down-weighted by the sampling rate so that the sigmoid is calibrated to the
    softmax's probabilities.

    Args:
        calibration: ``t`` in ``[0, 1]``.
        num_negatives: negatives per positive.
        num_items: ``N``, the catalog size.

    Returns:
        ``beta``.

    Example:
        >>> round(gbce_beta(0.75, 256, 3417), 4)  # 1 - t (1 - alpha)
        0.3062
    """
    alpha = num_negatives / (num_items - 1)
    return alpha * (calibration * (1 - 1 / alpha) + 1 / alpha)


class GBCELoss(BCELoss):
    """Generalised binary cross-entropy: ``-log sigmoid(s(p))^beta - sum_j log(1 -
    sigmoid(s(n_j)))`` on the drawn negatives, with ``beta`` (:func:`gbce_beta`) from the
    calibration ``t`` and the sampling rate ``M / (N - 1)`` of ``M`` negatives per positive
    from ``N`` items (with ``negatives.exclude_window`` it keeps the catalog's rate).

    Args:
        calibration: ``t`` in ``[0, 1]``; gSASRec's default is 0.75.
        prior_offset: add ``log(beta / M)`` to every score (see :class:`BCELoss`).

    Raises:
        ValueError: if ``calibration`` is outside ``[0, 1]``.

    Example:
        >>> import torch
        >>> from recsys_midx.heads import DotHead
        >>> from recsys_midx.negatives import Negatives
        >>> output, targets = DotHead()(torch.randn(4, 8)), torch.tensor([1, 2, 3, 4])
        >>> negatives = Negatives("batch", torch.tensor([5, 9, 10]))  # shared by the batch
        >>> GBCELoss()(output, targets, torch.randn(11, 8), negatives).shape
        torch.Size([])
    """

    name: ClassVar[str] = "gbce"

    def __init__(self, calibration: float = 0.75, prior_offset: bool = True) -> None:
        super().__init__(prior_offset)
        if not 0.0 <= calibration <= 1.0:
            raise ValueError(f"calibration={calibration} must be in [0, 1]")
        self.calibration = float(calibration)

    def positive_weight(self, num_negatives: int, num_items: int) -> float:
        """``beta`` for ``num_negatives`` per positive from ``num_items``."""
        return gbce_beta(self.calibration, num_negatives, num_items)

    def extra_repr(self) -> str:
        return f"calibration={self.calibration}, {super().extra_repr()}"
