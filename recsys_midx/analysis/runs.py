"""Bottleneck spectra of trained runs: rebuild a run folder of ``train.py`` and measure it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .bottleneck import jacobian_spectrum, log_prob_matrix, numerical_rank, singular_values

if TYPE_CHECKING:
    # Only the type: loading a run needs Lightning and Hydra, measuring a loaded one does not.
    from recsys_midx.app.trained import LoadedRun


@dataclass
class BottleneckSpectra:
    """Spectra of one model.

    Attributes:
        label: the name the model goes by in reports.
        head: the head's class name.
        dim: ``D``, the size of the encoder's output.
        log_prob: singular values of the row-centred log-probability matrix (descending).
        jacobian: mean singular values of the head's Jacobian (descending, at most ``D``).
        log_prob_rank: numerical rank of the centred log-probability matrix.
    """

    label: str
    head: str
    dim: int
    log_prob: Tensor
    jacobian: Tensor
    log_prob_rank: int


@torch.no_grad()
def _validation_contexts(run: LoadedRun, num_contexts: int) -> Tensor:
    """Encoder outputs of the first ``num_contexts`` validation points."""
    contexts, count = [], 0
    for batch in run.datamodule.val_dataloader():
        contexts.append(run.module.encode(batch).float())
        count += contexts[-1].shape[0]
        if count >= num_contexts:
            break
    return torch.cat(contexts)[:num_contexts]


def bottleneck_spectra(
    run: LoadedRun,
    num_contexts: int = 256,
    num_items: int = 512,
    jacobian_contexts: int = 64,
    jacobian_items: int = 128,
    seed: int = 0,
    label: str | None = None,
) -> BottleneckSpectra:
    """Spectra of a rebuilt run on validation contexts and a uniform sample of items.

    Args:
        run: from :func:`load_run`.
        num_contexts: validation contexts in the log-probability matrix (fewer if the split is
            smaller).
        num_items: items sampled without replacement (at most the catalog).
        jacobian_contexts: contexts whose Jacobians are averaged (the first ones).
        jacobian_items: items (the first sampled ones) in each Jacobian; each costs a backward
            pass over the catalog.
        seed: seed of the item sample.
        label: the name in reports (default: the run's head and folder).

    Returns:
        The spectra.
    """
    head = run.module.head
    item_emb = run.module.encoder.item_table.detach().float()
    num_catalog = item_emb.shape[0] - 1
    generator = torch.Generator().manual_seed(seed)
    item_ids = torch.randperm(num_catalog, generator=generator)[: min(num_items, num_catalog)] + 1
    contexts = _validation_contexts(run, num_contexts)
    values = singular_values(log_prob_matrix(head, contexts, item_emb, item_ids))
    jacobian = jacobian_spectrum(
        head, contexts[:jacobian_contexts], item_emb, item_ids[:jacobian_items]
    )
    head_name = type(head).__name__
    return BottleneckSpectra(
        label=label or f"{head_name} ({run.checkpoint.parent.parent.name})",
        head=head_name,
        dim=contexts.shape[1],
        log_prob=values,
        jacobian=jacobian,
        log_prob_rank=numerical_rank(values),
    )
