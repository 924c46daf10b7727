"""An LSTM language model whose state is carried from one stretch of a token stream to the next
(Zaremba et al., 2014), with AWD-LSTM's cheap regularisers (Merity et al., 2018): a tied output
table, variational dropout and embedding dropout."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from recsys_midx.models.base import ItemTables

#: The carried state: each layer's ``(h, c)``, each ``[1, B, H]``.
LSTMState = list[tuple[Tensor, Tensor]]


class LockedDropout(nn.Module):
    """Variational dropout: one mask per sequence, the same at every time step (Gal &
    Ghahramani, 2016), as AWD-LSTM applies between its layers.

    Args:
        p: the share of units dropped.

    Example:
        >>> drop = LockedDropout(0.5).train()
        >>> out = drop(torch.ones(2, 5, 3))
        >>> bool((out == out[:, :1]).all())  # each sequence keeps one mask over time
        True
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """``x`` ``[B, T, H]`` with a ``[B, 1, H]`` mask, scaled by ``1 / (1 - p)``."""
        if not self.training or self.p == 0.0:
            return x
        mask = x.new_empty(x.shape[0], 1, x.shape[2]).bernoulli_(1.0 - self.p)
        return x * mask / (1.0 - self.p)


class LSTMLanguageModel(ItemTables):
    """Token embeddings -> stacked LSTMs -> one query vector per position, scored against the
    item (token) table.

    Zaremba's small model is ``dim=200, num_layers=2`` without dropout, the medium one
    ``dim=650`` with ``dropout=0.5``. ``hidden_dim`` other than ``dim`` projects the last layer
    back to ``D`` so that the output table can stay tied to the input one.

    Args:
        num_items: ``V``, the vocabulary (token ids ``1..V``; ``0`` is never a token).
        dim: ``D``, the size of token embeddings and query vectors.
        hidden_dim: each LSTM layer's state size; ``None``: ``dim``.
        num_layers: stacked LSTM layers.
        dropout: variational dropout on the embeddings, between layers and on the output.
        embedding_dropout: the share of token types whose embedding is dropped in a batch
            (every occurrence of a dropped token reads zeros; the others are scaled up).
        init_range: embeddings start uniform in ``[-init_range, init_range]``.
        separate_output_table: score tokens with a table of their own (an untied model).

    Raises:
        ValueError: if a size is not positive or a dropout is outside ``[0, 1)``.

    Example:
        >>> model = LSTMLanguageModel(num_items=50, dim=8, num_layers=2)
        >>> queries, state = model(torch.tensor([[3, 4, 5], [6, 7, 8]]))
        >>> queries.shape, len(state)
        (torch.Size([2, 3, 8]), 2)
        >>> more, state = model(torch.tensor([[9], [10]]), model.detach_state(state))
    """

    def __init__(
        self,
        num_items: int,
        dim: int = 200,
        hidden_dim: int | None = None,
        num_layers: int = 2,
        dropout: float = 0.0,
        embedding_dropout: float = 0.0,
        init_range: float = 0.1,
        separate_output_table: bool = False,
    ) -> None:
        super().__init__(num_items, dim, separate_output_table)
        hidden_dim = dim if hidden_dim is None else hidden_dim
        if hidden_dim <= 0 or num_layers <= 0:
            raise ValueError(
                f"hidden_dim and num_layers must be > 0, got {hidden_dim} and {num_layers}"
            )
        if not 0.0 <= embedding_dropout < 1.0:
            raise ValueError(f"embedding_dropout must be in [0, 1), got {embedding_dropout}")
        self.embedding_dropout = embedding_dropout
        self.dropout = LockedDropout(dropout)
        # One module per layer: the variational dropout sits between them.
        self.layers = nn.ModuleList(
            nn.LSTM(dim if i == 0 else hidden_dim, hidden_dim, batch_first=True)
            for i in range(num_layers)
        )
        self.project = nn.Linear(hidden_dim, dim) if hidden_dim != dim else nn.Identity()
        with torch.no_grad():
            for table in (self.item_emb, self.output_emb):
                if table is not None:
                    table.weight.uniform_(-init_range, init_range)
                    table.weight[0].zero_()

    def forward(self, tokens: Tensor, state: LSTMState | None = None) -> tuple[Tensor, LSTMState]:
        """Encode a stretch of ``B`` streams, continuing from ``state``.

        Args:
            tokens: ``[B, T]`` token ids in ``1..V``.
            state: what the previous stretch returned (detach it first to truncate
                backpropagation there), or ``None`` to start from zeros.

        Returns:
            ``[B, T, D]`` queries (position ``t`` predicts the token at ``t + 1``) and the state
            after the last position.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, length], got shape {tuple(tokens.shape)}")
        x = self.dropout(self._embed(tokens))
        carried: LSTMState = []
        for index, layer in enumerate(self.layers):
            x, (h, c) = layer(x, None if state is None else state[index])
            carried.append((h, c))
            x = self.dropout(x)
        return self.project(x), carried

    @staticmethod
    def detach_state(state: LSTMState) -> LSTMState:
        """The same state cut from the graph that computed it: backpropagation through time
        stops at the start of the next stretch."""
        return [(h.detach(), c.detach()) for h, c in state]

    def _embed(self, tokens: Tensor) -> Tensor:
        rows = self.item_emb(tokens)
        if not self.training or self.embedding_dropout == 0.0:
            return rows
        # One draw per token type, looked up per occurrence: the table's gradient stays the rows
        # the batch reads (sparse-friendly), and a dropped token is dropped everywhere.
        keep = rows.new_empty(self.num_items + 1).bernoulli_(1.0 - self.embedding_dropout)
        return rows * (keep[tokens] / (1.0 - self.embedding_dropout))[..., None]
