"""SASRec: causal self-attention over the item sequence (Kang & McAuley, 2018)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recsys_midx.models.base import SequenceEncoder


class _CausalSelfAttentionBlock(nn.Module):
    """Pre-norm transformer block: attention then a position-wise feed-forward network."""

    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(4 * dim, dim)
        )
        self.dropout = nn.Dropout(dropout)
        self.attn_dropout = dropout

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        batch, length, dim = x.shape
        q, k, v = (
            self.qkv(self.attn_norm(x))
            .view(batch, length, 3, self.num_heads, dim // self.num_heads)
            .permute(2, 0, 3, 1, 4)
        )
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=self.attn_dropout if self.training else 0.0
        )
        x = x + self.dropout(self.out(attended.transpose(1, 2).reshape(batch, length, dim)))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class SASRec(SequenceEncoder):
    """Self-attentive sequential recommender.

    Item embeddings (scaled by ``sqrt(D)``) plus learned absolute positions feed ``num_layers``
    pre-norm causal self-attention blocks; a final layer norm gives the query vectors.

    Args:
        num_items: ``N``, the number of real items.
        dim: embedding and hidden size ``D``.
        num_layers: number of attention blocks.
        num_heads: attention heads per block; must divide ``dim``.
        dropout: dropout on embeddings, attention weights and block outputs.
        max_len: longest input sequence.
        init_std: standard deviation of the normal weight initialisation.

    Raises:
        ValueError: if ``num_heads`` does not divide ``dim`` or a size is not positive.

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
        init_std: float = 0.02,
    ) -> None:
        super().__init__(num_items, dim, max_len)
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"num_heads={num_heads} must be positive and divide dim={dim}")
        self.pos_emb = nn.Embedding(max_len, dim)
        self.emb_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            _CausalSelfAttentionBlock(dim, num_heads, dropout) for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(dim)
        self._init_normal(init_std)

    def forward(self, item_seq: Tensor) -> Tensor:
        self._check_input(item_seq)
        length = item_seq.shape[1]
        positions = torch.arange(length, device=item_seq.device)
        x = self.item_emb(item_seq) * math.sqrt(self.dim) + self.pos_emb(positions)
        x = self.emb_dropout(x)
        allowed = self._attention_mask(item_seq)
        for block in self.blocks:
            x = block(x, allowed)
        return self.final_norm(x)

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
