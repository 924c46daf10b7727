"""GRU4Rec: a recurrent next-item encoder (Hidasi et al., 2016)."""

from __future__ import annotations

from torch import Tensor, nn

from recsys_midx.models.base import SequenceEncoder


class GRU4Rec(SequenceEncoder):
    """Recurrent encoder: item embeddings -> GRU -> linear projection back to ``D``.

    Args:
        num_items: ``N``, the number of real items.
        dim: item embedding and query size ``D``.
        hidden_size: GRU state size.
        num_layers: stacked GRU layers.
        dropout: dropout on the input embeddings.
        max_len: longest input sequence.
        init_std: standard deviation of the normal initialisation of embeddings and projections.
        separate_output_table: score items with a table of their own instead of the input
            one (:class:`~recsys_midx.models.SequenceEncoder`).

    Raises:
        ValueError: if a size is not positive.

    Example:
        ```python
        encoder = GRU4Rec(num_items=100, dim=32, hidden_size=48, max_len=20)
        encoder(torch.tensor([[0, 0, 5, 7]])).shape
        # torch.Size([1, 4, 32])
        ```
    """

    def __init__(
        self,
        num_items: int,
        dim: int = 64,
        hidden_size: int = 128,
        num_layers: int = 1,
        dropout: float = 0.2,
        max_len: int = 50,
        init_std: float = 0.02,
        separate_output_table: bool = False,
    ) -> None:
        super().__init__(num_items, dim, max_len, separate_output_table)
        if hidden_size <= 0 or num_layers <= 0:
            raise ValueError(
                f"hidden_size and num_layers must be > 0, got {hidden_size} and {num_layers}"
            )
        self.emb_dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.project = nn.Linear(hidden_size, dim)
        self._init_normal(init_std)

    def forward(self, item_seq: Tensor) -> Tensor:
        self._check_input(item_seq)
        # Sequences are left-padded, so every last position is real: the GRU runs over the zero
        # padding rows first, which only shifts its initial state and needs no packing.
        states, _ = self.gru(self.emb_dropout(self.item_emb(item_seq)))
        return self.project(states)
