"""An MLP encoder for extreme classification: sparse features -> query vector; owns the labels."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from recsys_midx.scoring import mark_sparse_rows


class XCEncoder(nn.Module):
    """Sparse feature vectors in, one query vector per point out; owns the label table.

    The first layer is a sparse linear map: an ``EmbeddingBag`` (``mode="sum"``) weighted by the
    feature values, plus a bias, so a point costs its non-zeros, not ``F``. Further layers are
    ``ReLU -> Dropout -> Linear``, the last one projecting to ``dim``. The label table
    ``[L+1, D]`` (row 0 padding) scores the labels; samplers, losses and metrics read it through
    :attr:`item_table`, as they read a sequence encoder's item table.

    Args:
        num_features: ``F``; feature ids are ``0..F-1``.
        num_labels: ``L``; label ids are ``1..L``.
        dim: ``D``, the size of query vectors and label embeddings.
        hidden: widths of the hidden layers, the first being the ``EmbeddingBag``'s (an int is
            one hidden layer).
        dropout: dropout before each dense layer.
        init_std: standard deviation of the normal initialisation of the feature and label
            embeddings (small: the softmax starts near uniform).

    Raises:
        ValueError: if a size is not positive or ``dropout`` is not in ``[0, 1)``.

    Example:
        >>> encoder = XCEncoder(num_features=1000, num_labels=50, dim=16, hidden=[32])
        >>> query = encoder(torch.tensor([3, 7, 999]), torch.tensor([0, 2, 3]),
        ...                 torch.tensor([0.5, 1.0, 2.0]))
        >>> query.shape, encoder.item_table.shape
        (torch.Size([2, 16]), torch.Size([51, 16]))
    """

    def __init__(
        self,
        num_features: int,
        num_labels: int,
        dim: int = 64,
        hidden: int | Sequence[int] = (256,),
        dropout: float = 0.0,
        init_std: float = 0.1,
    ) -> None:
        super().__init__()
        widths = [hidden] if isinstance(hidden, int) else [int(width) for width in hidden]
        for name, value in (
            ("num_features", num_features),
            ("num_labels", num_labels),
            ("dim", dim),
            *(("hidden", width) for width in widths),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if not widths:
            raise ValueError("hidden must name at least one layer width")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.num_features = num_features
        self.num_labels = num_labels
        self.dim = dim
        self.feature_emb = nn.EmbeddingBag(
            num_features, widths[0], mode="sum", include_last_offset=True
        )
        self.feature_bias = nn.Parameter(torch.zeros(widths[0]))
        layers: list[nn.Module] = []
        for width_in, width_out in zip(widths, [*widths[1:], dim]):
            layers += [nn.ReLU(), nn.Dropout(dropout), nn.Linear(width_in, width_out)]
        self.mlp = nn.Sequential(*layers)
        self.label_emb = nn.Embedding(num_labels + 1, dim, padding_idx=0)
        with torch.no_grad():
            nn.init.normal_(self.feature_emb.weight, std=init_std)
            nn.init.normal_(self.label_emb.weight, std=init_std)
            self.label_emb.weight[0].zero_()

    @property
    def item_table(self) -> Tensor:
        """The label table ``[L+1, D]`` (row 0 is padding)."""
        return self.label_emb.weight

    def use_sparse_gradients(self) -> list[nn.Parameter]:
        """Give the label and feature tables sparse gradients: only the rows a step reads (the
        batch's features; its positives and negatives, by :func:`~recsys_midx.scoring.lookup_rows`).

        Both are marked ``sparse`` as embedding modules, which is how DDP tells which
        parameters' gradients to reduce as sparse tensors (the losses read the label table
        through :func:`~recsys_midx.scoring.lookup_rows`, not through its module).

        Returns:
            The tables whose gradients are now sparse, for a row-wise optimizer.
        """
        self.feature_emb.sparse = True
        self.label_emb.sparse = True
        mark_sparse_rows(self.label_emb.weight)
        return [self.label_emb.weight, self.feature_emb.weight]

    def forward(self, indices: Tensor, offsets: Tensor, weights: Tensor) -> Tensor:
        """Encode a batch of sparse feature vectors.

        Args:
            indices: ``[nnz]`` feature ids in ``0..F-1``.
            offsets: ``[B+1]`` bag starts; bag ``b`` is ``indices[offsets[b]:offsets[b+1]]``.
            weights: ``[nnz]`` feature values.

        Returns:
            ``[B, D]`` query vectors.

        Raises:
            ValueError: if ``offsets`` is not 1-D or ``weights`` does not match ``indices``.
        """
        if offsets.dim() != 1 or weights.shape != indices.shape:
            raise ValueError(
                f"expected offsets [B+1] and weights shaped like indices {tuple(indices.shape)}, "
                f"got {tuple(offsets.shape)} and {tuple(weights.shape)}"
            )
        weights = weights.to(self.feature_emb.weight.dtype)
        bags = self.feature_emb(indices, offsets, per_sample_weights=weights)
        return self.mlp(bags + self.feature_bias)
