"""BERT4Rec: a bidirectional transformer over the item sequence, trained to fill in masked items
(Sun et al., CIKM 2019)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from recsys_midx.models.attention import SelfAttentionBlock, checked_ffn_dim
from recsys_midx.models.base import SequenceEncoder


class BERT4Rec(SequenceEncoder):
    """Bidirectional self-attention encoder trained by the cloze (masked item) objective.

    A training sequence has some of its items replaced by the mask id :attr:`MASK`
    (:meth:`cloze`); the encoder sees the whole sequence in both directions and its output at a
    masked position is the query for the item hidden there. The next item after a history is
    asked for the same way: :meth:`encode_last` appends a mask after the history and returns
    the output at that position, which evaluation, ``recommend`` and ``export`` use.

    Item embeddings (unscaled, as in BERT) plus learned positions go through a LayerNorm and
    dropout, then ``num_layers`` post-norm blocks (GELU feed-forward) in which every position
    attends to every real item, never to padding. A dense layer, GELU and LayerNorm turn a
    block output into the query (BERT's masked-item transform; the paper writes the dense layer
    and GELU), scored against the item table by the configured head. The LayerNorm keeps
    the queries at the scale SASRec's final LayerNorm gives its own: without it, the small
    initial weights give small queries and the training starts slower. The paper's per-item
    output bias has no counterpart, since every head scores ``s(z, v)`` from the query and the
    item vector alone. With ``output_transform=False`` the last block's output is the query
    itself (already normalised by the block's last LayerNorm), as a Hugging Face ``BertModel``
    scored by the tied table gives it (SASRec+'s BERT4Rec).

    The mask token is a learned vector of its own, not a row of the item table: the table is
    what the samplers, the MIDX index and the evaluation score, so it keeps its ``N + 1`` rows
    and no sampler can ever draw the mask as a negative. The mask id ``-1`` is swapped for the
    mask vector before the table lookup, which never sees it. Positions count back from the
    end (the last position of any sequence has id ``max_len - 1``), so the appended mask of
    :meth:`encode_last` always sits at the position the training windows end at.

    Args:
        num_items: ``N``, the number of real items.
        dim: embedding and hidden size ``D``.
        num_layers: number of attention blocks (the paper's ``L``, 2 for ML-1M).
        num_heads: attention heads per block; must divide ``dim``.
        dropout: dropout on embeddings and block outputs.
        max_len: longest input sequence.
        mask_prob: probability that :meth:`cloze` masks each item (the paper's ``rho``, 0.2
            for ML-1M).
        init_std: standard deviation of the normal weight initialisation.
        attention_dropout: dropout on attention probabilities (``None``: ``dropout``).
        ffn_dim: the feed-forward hidden width (``None``: ``4 * dim``).
        separate_output_table: score items with a table of their own instead of the input
            one (:class:`~recsys_midx.models.SequenceEncoder`).
        output_transform: put the masked-item transform (dense layer, GELU, LayerNorm) between
            the last block and the scores; ``False``: score the last block's output.
        norm_eps: every LayerNorm's ``eps`` (BERT's own: ``1e-12``).

    Raises:
        ValueError: if a size is not positive, ``num_heads`` does not divide ``dim`` or
            ``mask_prob`` is not in ``(0, 1]``.

    Example:
        >>> encoder = BERT4Rec(num_items=100, dim=32, num_heads=2, max_len=20)
        >>> masked, targets = encoder.cloze(torch.tensor([[0, 0, 5, 7]]))
        >>> encoder(masked).shape, encoder.encode_last(torch.tensor([[0, 0, 5, 7]])).shape
        (torch.Size([1, 4, 32]), torch.Size([1, 32]))
    """

    #: The model's name in messages, as the ``model`` config group spells it.
    name: ClassVar[str] = "bert4rec"
    #: The id that marks a masked position in :meth:`forward`'s input (never a table row).
    MASK: ClassVar[int] = -1
    #: Trained by the cloze objective: the training step masks sequences with :meth:`cloze`.
    masked_training: ClassVar[bool] = True

    def __init__(
        self,
        num_items: int,
        dim: int = 64,
        num_layers: int = 2,
        num_heads: int = 2,
        dropout: float = 0.1,
        max_len: int = 50,
        mask_prob: float = 0.2,
        init_std: float = 0.02,
        attention_dropout: float | None = None,
        ffn_dim: int | None = None,
        separate_output_table: bool = False,
        output_transform: bool = True,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__(num_items, dim, max_len, separate_output_table)
        if num_layers <= 0:
            raise ValueError(f"num_layers must be > 0, got {num_layers}")
        ffn_dim = checked_ffn_dim(dim, num_heads, ffn_dim)
        if not 0.0 < mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in (0, 1], got {mask_prob}")
        self.mask_prob = mask_prob
        self.mask_emb = nn.Parameter(torch.empty(dim))
        self.pos_emb = nn.Embedding(max_len, dim)
        self.input_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.emb_dropout = nn.Dropout(dropout)
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        # BERT's block: LayerNorm after each residual sum, GELU, dropout on sublayer outputs.
        self.blocks = nn.ModuleList(
            SelfAttentionBlock(
                dim,
                num_heads,
                dropout,
                attention_dropout,
                norm="post",
                ffn_dropout=False,
                ffn_dim=ffn_dim,
                ffn_activation="gelu",
                residual="input",
                attention_output_dropout=True,
                norm_eps=norm_eps,
            )
            for _ in range(num_layers)
        )
        self.project = (
            nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim, eps=norm_eps))
            if output_transform
            else nn.Identity()
        )
        self._init_normal(init_std)
        with torch.no_grad():
            nn.init.normal_(self.mask_emb, std=init_std)

    def forward(self, item_seq: Tensor) -> Tensor:
        """Encode left-padded, possibly masked sequences in both directions.

        Args:
            item_seq: ``[B, L]`` item ids, ``0`` for padding on the left, :attr:`MASK` where
                an item is hidden, ``L <= max_len``.

        Returns:
            ``[B, L, D]`` query vectors; position ``t`` is the query for the item at ``t``
            (meaningful where that item is masked), computed from every real position.
        """
        return self._encode(item_seq, last_only=False)

    def encode_last(self, item_seq: Tensor) -> Tensor:
        """The query for the item after a history, ``[B, D]``: the oldest position is dropped,
        a mask appended, and the output at the mask returned (the last block computes that
        position only).

        Args:
            item_seq: ``[B, L]`` left-padded item ids (no mask), ``L <= max_len``; with
                ``L = max_len`` the query sees the last ``max_len - 1`` items, as a training
                window's last position does.

        Returns:
            ``[B, D]`` next-item queries.
        """
        self._check_input(item_seq)
        mask = torch.full_like(item_seq[:, :1], self.MASK)
        return self._encode(torch.cat([item_seq[:, 1:], mask], dim=1), last_only=True)[:, -1]

    def cloze(
        self, sequence: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Mask each real item with probability ``mask_prob``: the cloze task of a batch.

        A row with items but no draw gets its last item masked, so every non-empty sequence
        trains at least one query; that position is also where :meth:`encode_last` asks for
        the next item. Padding is never masked.

        Args:
            sequence: ``[B, L]`` item ids, ``0`` for padding.
            generator: random generator on ``sequence``'s device (``None``: torch's global
                one, whose state the checkpoints save, so seeded and resumed runs draw the
                same masks).

        Returns:
            ``(masked, targets)``, both ``[B, L]``: ``sequence`` with :attr:`MASK` at the
            masked positions, and the original items there with ``0`` elsewhere.

        Example:
            >>> encoder = BERT4Rec(num_items=9, dim=4, num_heads=1, max_len=4, mask_prob=1.0)
            >>> masked, targets = encoder.cloze(torch.tensor([[0, 3, 4, 5]]))
            >>> masked.tolist(), targets.tolist()
            ([[0, -1, -1, -1]], [[0, 3, 4, 5]])
        """
        real = sequence > 0
        draws = torch.rand(sequence.shape, device=sequence.device, generator=generator)
        masked = (draws < self.mask_prob) & real
        unmasked_rows = real.any(dim=1) & ~masked.any(dim=1)
        # The last real position of each row (the last one for left-padded rows).
        last = sequence.shape[1] - 1 - real.flip(1).to(torch.int8).argmax(dim=1)
        masked[unmasked_rows, last[unmasked_rows]] = True
        return sequence.masked_fill(masked, self.MASK), sequence.masked_fill(~masked, 0)

    def _encode(self, item_seq: Tensor, last_only: bool) -> Tensor:
        self._check_input(item_seq)
        is_mask = item_seq == self.MASK
        # The masked positions read the padding row (zero, no gradient) and take the mask vector
        # instead: the table lookup never sees the mask id.
        items = self.item_emb(item_seq.masked_fill(is_mask, 0))
        x = torch.where(is_mask[..., None], self.mask_emb.to(items.dtype), items)
        length = item_seq.shape[1]
        positions = torch.arange(self.max_len - length, self.max_len, device=item_seq.device)
        x = self.emb_dropout(self.input_norm(x + self.pos_emb(positions)))
        allowed = self._attention_mask(item_seq)
        for index, block in enumerate(self.blocks):
            x = block(x, allowed, last_only=last_only and index == len(self.blocks) - 1)
        return self.project(x)

    @staticmethod
    def _attention_mask(item_seq: Tensor) -> Tensor:
        """``[B, 1, L, L]`` boolean mask: every real (or masked) key, never padding, but always
        the position itself, so that a padded position's row is never empty (NaN attention)."""
        length = item_seq.shape[1]
        real_key = (item_seq != 0)[:, None, None, :]
        diagonal = torch.eye(length, dtype=torch.bool, device=item_seq.device)
        return real_key | diagonal
