"""The transformer block of the attention encoders (SASRec, BERT4Rec): multi-head
self-attention under a given mask, then a position-wise feed-forward network.

The block itself is neither causal nor bidirectional: the encoder passes the boolean mask of
which keys each position may attend to (SASRec's is causal, BERT4Rec's lets every position see
every real item).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch.nn.functional as F
from torch import Tensor, nn

#: Where the LayerNorm of a block sits: before each sublayer (``pre``) or after each residual
#: sum (``post``, as in the original Transformer and RecBole's SASRec).
NormPlacement = Literal["pre", "post"]
#: What the sublayers add their outputs to, with ``norm="pre"`` for the last two: the block's
#: input (``input``, the standard residual); for the attention, the normalised input that also
#: gives the queries while keys and values come from the un-normalised input (``normed_query``:
#: ``Q = LN(x); x = Q + MHA(Q, x, x); x = x + FFN(LN(x))``); or that and, for the feed-forward,
#: its normalised input too (``normed``, the SASRec block of pmixer/SASRec.pytorch:
#: ``Q = LN(x); x = Q + MHA(Q, x, x); x = LN(x); x = x + FFN(x)``).
Residual = Literal["input", "normed_query", "normed"]
#: The values of :data:`Residual`.
RESIDUALS: tuple[str, ...] = get_args(Residual)
#: The feed-forward network's activation.
FFNActivation = Literal["gelu", "relu"]
ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU}


def checked_ffn_dim(dim: int, num_heads: int, ffn_dim: int | None) -> int:
    """Check an attention encoder's head count and resolve its feed-forward width.

    Args:
        dim: hidden size ``D``.
        num_heads: attention heads; must be positive and divide ``dim``.
        ffn_dim: the feed-forward hidden width; ``None``: ``4 * dim``.

    Returns:
        The feed-forward hidden width.

    Raises:
        ValueError: if ``num_heads`` does not divide ``dim`` or the width is not positive.

    Example:
        >>> checked_ffn_dim(64, 2, None)
        256
    """
    if num_heads <= 0 or dim % num_heads:
        raise ValueError(f"num_heads={num_heads} must be positive and divide dim={dim}")
    ffn_dim = 4 * dim if ffn_dim is None else int(ffn_dim)
    if ffn_dim <= 0:
        raise ValueError(f"ffn_dim={ffn_dim} must be positive")
    return ffn_dim


class SelfAttentionBlock(nn.Module):
    """Transformer block: self-attention over the positions a mask allows, then a position-wise
    feed-forward network, each sublayer with dropout, a residual sum and a LayerNorm.

    Args:
        dim: hidden size ``D``; ``num_heads`` must divide it (the encoder checks, with
            :func:`checked_ffn_dim`).
        num_heads: attention heads.
        dropout: dropout on the feed-forward output, (``attention_output_dropout``) the
            attention output and (``ffn_dropout``) the feed-forward hidden layer.
        attention_dropout: dropout on attention probabilities.
        norm: LayerNorm placement (see :data:`NormPlacement`).
        ffn_dropout: dropout on the feed-forward hidden layer.
        ffn_dim: the feed-forward hidden width.
        ffn_activation: ``"gelu"`` or ``"relu"`` (see :data:`FFNActivation`).
        residual: what the sublayer outputs are added to (see :data:`Residual`).
        attention_output_dropout: dropout on the attention output too (pmixer's block has none
            there).
        norm_eps: the LayerNorms' ``eps`` (pmixer's block: ``1e-8``).
        output_projection: a linear map on the concatenated heads before the residual sum, as
            ``torch.nn.MultiheadAttention`` has; without it the heads' output is added as it is,
            as in SASRec's and gSASRec's own code.

    Example:
        >>> import torch
        >>> block = SelfAttentionBlock(8, 2, 0.0, 0.0, "pre", True, 32, "gelu", "input", True)
        >>> allowed = torch.ones(1, 1, 3, 3, dtype=torch.bool)  # every position sees every one
        >>> block(torch.randn(1, 3, 8), allowed).shape
        torch.Size([1, 3, 8])
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        dropout: float,
        attention_dropout: float,
        norm: NormPlacement,
        ffn_dropout: bool,
        ffn_dim: int,
        ffn_activation: FFNActivation,
        residual: Residual,
        attention_output_dropout: bool,
        norm_eps: float = 1e-5,
        output_projection: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads, self.pre_norm = num_heads, norm == "pre"
        self.normed_query = residual in ("normed_query", "normed")
        self.normed_ffn_residual = residual == "normed"
        self.attn_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim) if output_projection else nn.Identity()
        self.ffn_norm = nn.LayerNorm(dim, eps=norm_eps)
        hidden_dropout = [nn.Dropout(dropout)] if ffn_dropout else []
        self.ffn = nn.Sequential(
            nn.Linear(dim, ffn_dim),
            ACTIVATIONS[ffn_activation](),
            *hidden_dropout,
            nn.Linear(ffn_dim, dim),
        )
        self.dropout = nn.Dropout(dropout)
        self.attn_output_dropout = (
            nn.Dropout(dropout) if attention_output_dropout else nn.Identity()
        )
        self.attn_dropout = attention_dropout

    def forward(self, x: Tensor, allowed: Tensor, last_only: bool = False) -> Tensor:
        """Positions ``x`` ``[B, L, D]`` -> ``[B, L, D]``, or ``[B, 1, D]`` for the last
        position only (``last_only``: keys and values still come from every position).

        Args:
            x: ``[B, L, D]`` the positions' hidden states.
            allowed: ``[B, 1, L, L]`` boolean, true where position ``i`` (row) may attend to
                position ``j`` (column); no row may be all false.
            last_only: compute the last position's output only.

        Returns:
            ``[B, L, D]``, or ``[B, 1, D]`` with ``last_only``.
        """
        batch, length, dim = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, -1, self.num_heads, dim // self.num_heads).transpose(1, 2)

        normed = self.attn_norm(x) if self.pre_norm else x
        if self.normed_query:
            # Queries from the normalised input, keys and values from the input itself; the
            # normalised input is what the attention output is added to.
            q = heads(F.linear(normed, self.qkv.weight[:dim], self.qkv.bias[:dim]))
            k, v = F.linear(x, self.qkv.weight[dim:], self.qkv.bias[dim:]).chunk(2, dim=-1)
            k, v, x = heads(k), heads(v), normed
            if last_only:
                q, allowed, x = q[:, :, -1:], allowed[:, :, -1:], x[:, -1:]
        elif last_only:
            # Split the fused projection: only the last position needs a query.
            q = heads(F.linear(normed[:, -1:], self.qkv.weight[:dim], self.qkv.bias[:dim]))
            k, v = F.linear(normed, self.qkv.weight[dim:], self.qkv.bias[dim:]).chunk(2, dim=-1)
            k, v, allowed, x = heads(k), heads(v), allowed[:, :, -1:], x[:, -1:]
        else:
            q, k, v = (
                self.qkv(normed)
                .view(batch, length, 3, self.num_heads, dim // self.num_heads)
                .permute(2, 0, 3, 1, 4)
            )
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=self.attn_dropout if self.training else 0.0
        )
        x = x + self.attn_output_dropout(self.out(attended.transpose(1, 2).reshape(batch, -1, dim)))
        if self.normed_ffn_residual:
            x = self.ffn_norm(x)
            return x + self.dropout(self.ffn(x))
        if self.pre_norm:
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.attn_norm(x)
        return self.ffn_norm(x + self.dropout(self.ffn(x)))
