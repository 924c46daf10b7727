"""SASRec: causal self-attention over the item sequence (Kang & McAuley, 2018)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from recsys_midx.models.attention import (
    ACTIVATIONS,
    RESIDUALS,
    FFNActivation,
    NormPlacement,
    Residual,
    SelfAttentionBlock,
    checked_ffn_dim,
)
from recsys_midx.models.base import SequenceEncoder

#: Which item gets position 0: the last input item (``last``: a query's own position is always
#: the same) or the first real item of the sequence (``first``: positions count its history).
PositionOrigin = Literal["last", "first"]
#: How the attention in-projection (queries, keys and values) starts: like every other weight
#: (``normal``: normal with ``init_std``, or PyTorch's default where that is ``None``), or
#: Xavier-uniform over the fused ``[3D, D]`` matrix (``xavier``), as
#: ``torch.nn.MultiheadAttention`` starts it, which pmixer/SASRec.pytorch's block and the SASRec+
#: code keep.
AttentionInit = Literal["normal", "xavier"]


class SASRec(SequenceEncoder):
    """Self-attentive sequential recommender.

    Item embeddings (scaled by ``sqrt(D)`` unless ``scale_embeddings=False``) plus learned
    absolute positions feed ``num_layers`` causal self-attention blocks. With ``norm="pre"`` a
    final layer norm gives the query vectors; with ``norm="post"`` every block ends with one.
    The defaults are this project's block; ``norm="post", input_norm=True,
    scale_embeddings=False, position_origin="first", ffn_dropout=False`` is RecBole's.

    Args:
        num_items: ``N``, the number of real items.
        dim: embedding and hidden size ``D``.
        num_layers: number of attention blocks.
        num_heads: attention heads per block; must divide ``dim``.
        dropout: dropout on embeddings, feed-forward outputs, (``attention_output_dropout``)
            attention outputs and (``ffn_dropout``) the feed-forward network's hidden layer.
        max_len: longest input sequence.
        init_std: standard deviation of the normal weight initialisation; ``None`` keeps
            PyTorch's default start instead (embeddings N(0, 1), linear weights and biases
            uniform within ``1/sqrt(fan_in)``), as gSASRec's code does.
        attention_dropout: dropout on attention probabilities (``None``: ``dropout``).
        norm: LayerNorm placement, ``"pre"`` or ``"post"`` (see :data:`NormPlacement`).
        input_norm: a LayerNorm on the summed item and position embeddings.
        scale_embeddings: multiply item embeddings by ``sqrt(D)``.
        position_origin: ``"last"`` or ``"first"`` (see :data:`PositionOrigin`).
        ffn_dropout: dropout on the feed-forward hidden layer.
        ffn_dim: the feed-forward hidden width (``None``: ``4 * dim``).
        ffn_activation: ``"gelu"`` or ``"relu"`` (see :data:`FFNActivation`).
        residual: ``"input"``, ``"normed_query"`` or ``"normed"`` (see :data:`Residual`; the
            last two need ``norm="pre"``). ``norm="pre", residual="normed", ffn_dim=dim,
            ffn_activation="relu", position_origin="first", attention_output_dropout=False,
            norm_eps=1e-8`` is pmixer/SASRec.pytorch's block.
        separate_output_table: score items with a table of their own instead of the input
            one (:class:`~recsys_midx.models.SequenceEncoder`).
        attention_init: ``"normal"`` or ``"xavier"`` (see :data:`AttentionInit`).
        attention_output_dropout: dropout on each block's attention output too.
        norm_eps: every LayerNorm's ``eps`` (pmixer's block: ``1e-8``).
        attention_output_projection: each block's linear map on the attention output
            (:class:`~recsys_midx.models.attention.SelfAttentionBlock`); gSASRec's block has
            none.

    Raises:
        ValueError: if ``num_heads`` does not divide ``dim``, a size is not positive, or
            ``norm`` / ``position_origin`` / ``ffn_activation`` / ``residual`` /
            ``attention_init`` is not one of its values, or ``residual="normed_query"`` or
            ``"normed"`` comes with ``norm="post"``.

    Example:
        >>> encoder = SASRec(num_items=100, dim=32, num_heads=2, max_len=20)
        >>> encoder(torch.tensor([[0, 0, 5, 7]])).shape
        torch.Size([1, 4, 32])
    """

    def __init__(
        self,
        num_items: int,
        dim: int = 64,
        num_layers: int = 2,
        num_heads: int = 2,
        dropout: float = 0.2,
        max_len: int = 50,
        init_std: float | None = 0.02,
        attention_dropout: float | None = None,
        norm: NormPlacement = "pre",
        input_norm: bool = False,
        scale_embeddings: bool = True,
        position_origin: PositionOrigin = "last",
        ffn_dropout: bool = True,
        ffn_dim: int | None = None,
        ffn_activation: FFNActivation = "gelu",
        residual: Residual = "input",
        separate_output_table: bool = False,
        attention_init: AttentionInit = "normal",
        attention_output_dropout: bool = True,
        norm_eps: float = 1e-5,
        attention_output_projection: bool = True,
    ) -> None:
        super().__init__(num_items, dim, max_len, separate_output_table)
        ffn_dim = checked_ffn_dim(dim, num_heads, ffn_dim)
        if norm not in ("pre", "post"):
            raise ValueError(f"norm={norm!r} must be 'pre' or 'post'")
        if position_origin not in ("last", "first"):
            raise ValueError(f"position_origin={position_origin!r} must be 'last' or 'first'")
        if ffn_activation not in ACTIVATIONS:
            raise ValueError(f"ffn_activation={ffn_activation!r} must be 'gelu' or 'relu'")
        if residual not in RESIDUALS:
            raise ValueError(f"residual={residual!r} must be 'input', 'normed_query' or 'normed'")
        if residual != "input" and norm != "pre":
            raise ValueError(f"residual={residual!r} needs norm='pre'")
        if attention_init not in ("normal", "xavier"):
            raise ValueError(f"attention_init={attention_init!r} must be 'normal' or 'xavier'")
        self.pos_emb = nn.Embedding(max_len, dim)
        self.input_norm = nn.LayerNorm(dim, eps=norm_eps) if input_norm else nn.Identity()
        self.emb_dropout = nn.Dropout(dropout)
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        self.blocks = nn.ModuleList(
            SelfAttentionBlock(
                dim,
                num_heads,
                dropout,
                attention_dropout,
                norm,
                ffn_dropout,
                ffn_dim,
                ffn_activation,
                residual,
                attention_output_dropout,
                norm_eps,
                attention_output_projection,
            )
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(dim, eps=norm_eps) if norm == "pre" else nn.Identity()
        self.embedding_scale = math.sqrt(dim) if scale_embeddings else 1.0
        self.position_origin = position_origin
        if init_std is not None:
            self._init_normal(init_std)
        if attention_init == "xavier":
            for block in self.blocks:
                nn.init.xavier_uniform_(block.qkv.weight)

    def forward(self, item_seq: Tensor) -> Tensor:
        return self._encode(item_seq, last_only=False)

    def encode_last(self, item_seq: Tensor) -> Tensor:
        """The query after the last item, ``[B, D]``: the last block computes that position only."""
        return self._encode(item_seq, last_only=True)[:, -1]

    def _encode(self, item_seq: Tensor, last_only: bool) -> Tensor:
        self._check_input(item_seq)
        x = self.item_emb(item_seq) * self.embedding_scale + self.pos_emb(self._positions(item_seq))
        x = self.emb_dropout(self.input_norm(x))
        allowed = self._attention_mask(item_seq)
        for index, block in enumerate(self.blocks):
            x = block(x, allowed, last_only=last_only and index == len(self.blocks) - 1)
        return self.final_norm(x)

    def _positions(self, item_seq: Tensor) -> Tensor:
        """Position ids, ``[L]`` (origin ``last``) or ``[B, L]`` (origin ``first``; padding: 0)."""
        positions = torch.arange(item_seq.shape[1], device=item_seq.device)
        if self.position_origin == "last":
            return positions
        padding = (item_seq == 0).sum(dim=1, keepdim=True)  # sequences are left-padded
        return (positions - padding).clamp(min=0)

    @staticmethod
    def _attention_mask(item_seq: Tensor) -> Tensor:
        """``[B, 1, L, L]`` boolean mask: causal, no padded keys, but always the position itself.

        Keeping the diagonal means a padded position never has an empty row (which would give NaN
        attention); real positions still never attend to padding.
        """
        length = item_seq.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=item_seq.device).tril()
        real_key = (item_seq != 0)[:, None, None, :]
        diagonal = torch.eye(length, dtype=torch.bool, device=item_seq.device)
        return (causal & real_key) | diagonal
