"""The encoders' interfaces: the item tables every encoder owns, and a batch of item sequences
in, one query vector per position out."""

from __future__ import annotations

import abc
from typing import ClassVar

import torch
from torch import Tensor, nn

from recsys_midx.scoring import mark_sparse_rows


class ItemTables(nn.Module):
    """The item tables of an encoder: the rows that embed its input items and the rows that
    score the candidate items.

    A table has ``N + 1`` rows; row ``0`` is padding (kept at zero by ``padding_idx``). By
    default the same rows embed the input items and score the candidate items (a tied table);
    ``separate_output_table=True`` gives the scoring its own table (gSASRec's setting, an untied
    language model). The objective, the samplers and the evaluation read :attr:`item_table`, the
    scoring one.

    Args:
        num_items: ``N``, the number of real items (tokens of a vocabulary).
        dim: ``D``, the size of item embeddings and query vectors.
        separate_output_table: score items with a table of their own instead of the input one.

    Raises:
        ValueError: if a size is not positive.
    """

    def __init__(self, num_items: int, dim: int, separate_output_table: bool = False) -> None:
        super().__init__()
        for name, value in (("num_items", num_items), ("dim", dim)):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self.num_items = num_items
        self.dim = dim
        self.item_emb = nn.Embedding(num_items + 1, dim, padding_idx=0)
        self.output_emb = (
            nn.Embedding(num_items + 1, dim, padding_idx=0) if separate_output_table else None
        )

    @property
    def item_table(self) -> Tensor:
        """The table that scores items, ``[N+1, D]`` (row 0 is padding): the input table unless
        the encoder has a separate output table."""
        return (self.item_emb if self.output_emb is None else self.output_emb).weight

    def use_sparse_gradients(self) -> list[nn.Parameter]:
        """Give the item tables sparse gradients: only the rows a step reads, by the input lookup
        and by the losses (:func:`~recsys_midx.scoring.lookup_rows`).

        Every table is also marked ``sparse`` as an embedding module, which is how DDP tells
        which parameters' gradients to reduce as sparse tensors, the separate output table's
        included (the losses read it through :func:`~recsys_midx.scoring.lookup_rows`, not
        through the module).

        Returns:
            The tables whose gradients are now sparse, for a row-wise optimizer.
        """
        embeddings = [module for module in (self.item_emb, self.output_emb) if module is not None]
        for embedding in embeddings:
            embedding.sparse = True
            mark_sparse_rows(embedding.weight)
        return [embedding.weight for embedding in embeddings]


class SequenceEncoder(ItemTables, abc.ABC):
    """Base class of sequential encoders: item tables (:class:`ItemTables`) and one query vector
    per position of a left-padded sequence.

    Args:
        num_items: ``N``, the number of real items.
        dim: ``D``, the size of item embeddings and query vectors.
        max_len: the longest input sequence the encoder accepts (older items are cut off by the
            data module).
        separate_output_table: score items with a table of their own instead of the input one.

    Raises:
        ValueError: if any size is not positive.
    """

    #: Whether the encoder trains by the cloze objective (masked items, BERT4Rec) rather than by
    #: next-item prediction at every position; the training step reads it.
    masked_training: ClassVar[bool] = False

    def __init__(
        self, num_items: int, dim: int, max_len: int, separate_output_table: bool = False
    ) -> None:
        if max_len <= 0:
            raise ValueError(f"max_len must be > 0, got {max_len}")
        super().__init__(num_items, dim, separate_output_table)
        self.max_len = max_len

    @abc.abstractmethod
    def forward(self, item_seq: Tensor) -> Tensor:
        """Encode left-padded sequences.

        Args:
            item_seq: ``[B, L]`` item ids, ``0`` for padding on the left, ``L <= max_len``.

        Returns:
            ``[B, L, D]`` query vectors; position ``t`` summarises items ``0..t`` and predicts the
            item at ``t + 1``.
        """

    def encode_last(self, item_seq: Tensor) -> Tensor:
        """The query after the last input item, ``[B, D]``: ``self(item_seq)[:, -1]``, which an
        encoder may compute more cheaply (SASRec's last block computes that position only); a
        cloze encoder (BERT4Rec) asks for the next item at a mask appended to the history.

        Args:
            item_seq: ``[B, L]`` left-padded item ids.
        """
        return self(item_seq)[:, -1]

    def _check_input(self, item_seq: Tensor) -> None:
        if item_seq.dim() != 2:
            raise ValueError(f"item_seq must be [batch, length], got shape {tuple(item_seq.shape)}")
        if item_seq.shape[1] > self.max_len:
            raise ValueError(f"sequence length {item_seq.shape[1]} exceeds max_len={self.max_len}")

    @torch.no_grad()
    def _init_normal(self, std: float) -> None:
        """Small normal weights keep initial logits near zero; biases and norms stay default."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        self.item_emb.weight[0].zero_()
        if self.output_emb is not None:
            self.output_emb.weight[0].zero_()
