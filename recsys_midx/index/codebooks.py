"""Product and residual quantisation of an item table into codebooks (for MIDX and EDRep).

Both quantisers give every item ``B`` codes ``(k_1..k_B)`` from ``B`` codebooks of ``K`` codewords,
and a reconstruction ``c_i`` that is linear in the codewords, so a query's score against it splits
into ``B`` codeword scores: ``z.c_i = sum_b s_b(k_b)``.

* :class:`ProductCodebooks` (PQ) splits ``D`` into ``B`` equal slices and runs k-means on each;
  ``c_i`` concatenates one codeword per slice.
* :class:`ResidualCodebooks` (RQ) runs k-means on the items, then on what the first level leaves
  (the residual), and so on; ``c_i`` sums one codeword per level. Encoding is greedy (beam 1).

Codebooks are trained with faiss k-means (:mod:`recsys_midx.index.kmeans`) on a random subset
of at most ``max_points_per_centroid * K`` items (faiss's own default cap, which is what makes a
build fast), and a refit starts from the previous codewords with fewer iterations. Encoding runs
in torch, in chunks, on the device of the item table; codewords and codes are buffers on that
device.
"""

from __future__ import annotations

import abc
from typing import Any

import torch
from torch import Tensor

from recsys_midx.index.kmeans import kmeans
from recsys_midx.index.module import IndexModule
from recsys_midx.scoring import row_chunks

#: Rows encoded at once are capped so that the ``rows x (B*K)`` distance block stays ~16 MiB.
_ENCODE_BLOCK_ELEMENTS = 1 << 22

#: Rows whose residuals are held at once (RQ encoding) are capped so that a ``rows x D`` block of
#: residuals stays ~64 MiB, whatever the catalog.
_RESIDUAL_BLOCK_ELEMENTS = 1 << 24


def nearest_codeword(x: Tensor, codewords: Tensor) -> Tensor:
    """Index of the nearest (L2) codeword for each row, computed in row blocks.

    Args:
        x: ``[n, d]`` float32 vectors.
        codewords: ``[K, d]`` float32 codewords on the device of ``x``.

    Returns:
        ``[n]`` long indices in ``0..K-1``.

    Example:
        >>> nearest_codeword(torch.tensor([[0.9, 0.0]]), torch.eye(2)).tolist()
        [0]
    """
    sq_norms = codewords.square().sum(1)
    rows = max(1, _ENCODE_BLOCK_ELEMENTS // codewords.shape[0])
    out = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
    for part, block in row_chunks(x, rows):
        # ||x||^2 is the same for every codeword, so it does not change the argmin.
        dist = torch.addmm(sq_norms, block, codewords.T, alpha=-2.0)
        out[part] = dist.argmin(1)
    return out


class Codebooks(IndexModule, abc.ABC):
    """``B`` codebooks of ``K`` codewords fitted to an item table, and the items' codes.

    Buffers: ``codewords`` ``[B, K, d_b]`` (``d_b = D/B`` for PQ, ``D`` for RQ), ``codes``
    ``[n, B]`` (long) of the last fitted table, and ``num_fits`` (how many fits so far, which also
    seeds each fit so a resumed run refits identically).

    Args:
        num_codewords: ``K``, codewords per codebook.
        num_codebooks: ``B``, number of codebooks (PQ subspaces or RQ levels).
        kmeans_iters: k-means iterations of the first fit.
        warm_start_iters: k-means iterations of a refit, which starts from the previous codewords.
        max_points_per_centroid: the training subset holds at most this many items per codeword.
        seed: base seed of the training subset and of faiss k-means.

    Raises:
        ValueError: if a size is not positive or ``warm_start_iters`` is negative.
    """

    def __init__(
        self,
        num_codewords: int = 64,
        num_codebooks: int = 2,
        kmeans_iters: int = 20,
        warm_start_iters: int = 5,
        max_points_per_centroid: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for name, value in (
            ("num_codewords", num_codewords),
            ("num_codebooks", num_codebooks),
            ("kmeans_iters", kmeans_iters),
            ("max_points_per_centroid", max_points_per_centroid),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if warm_start_iters < 0:
            raise ValueError(f"warm_start_iters must be >= 0, got {warm_start_iters}")
        self.num_codewords = int(num_codewords)
        self.num_codebooks = int(num_codebooks)
        self.kmeans_iters = int(kmeans_iters)
        self.warm_start_iters = int(warm_start_iters)
        self.max_points_per_centroid = int(max_points_per_centroid)
        self.seed = int(seed)
        self.register_buffer("codewords", torch.empty(0, self.num_codewords, 0))
        self.register_buffer("codes", torch.empty(0, self.num_codebooks, dtype=torch.long))
        self.register_buffer("num_fits", torch.zeros((), dtype=torch.long))

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` has run (or a fitted state was loaded)."""
        return self.codewords.shape[0] == self.num_codebooks

    @property
    def dim(self) -> int:
        """``D``, the dimension of the vectors the codebooks were fitted to (0 before a fit)."""
        return self.codeword_matrix().shape[1] if self.is_fitted else 0

    @torch.no_grad()
    def fit(self, x: Tensor) -> Tensor:
        """Train the codebooks on ``x`` (warm-starting from the current ones) and encode ``x``.

        Args:
            x: ``[n, D]`` vectors (no padding row); any float dtype, any device.

        Returns:
            ``codes`` ``[n, B]`` (long), also kept in the ``codes`` buffer.

        Raises:
            ValueError: if ``x`` is not 2-D, has fewer rows than ``K``, or (PQ) ``D`` is not a
                multiple of ``B``.
        """
        if x.dim() != 2:
            raise ValueError(f"expected a 2-D table [n, D], got shape {tuple(x.shape)}")
        n, dim = x.shape
        if n < self.num_codewords:
            raise ValueError(
                f"cannot fit {self.num_codewords} codewords to {n} vectors; "
                f"use num_codewords <= {n}"
            )
        self._check_dim(dim)
        x = x.detach().float().contiguous()
        warm = self.is_fitted and self.dim == dim
        fit_seed = self.seed + int(self.num_fits)
        self.codewords = self._train(
            self._training_subset(x, fit_seed),
            self.codewords if warm else None,
            self.warm_start_iters if warm else self.kmeans_iters,
            fit_seed,
        )
        self.codes = self.encode(x)
        self.num_fits = self.num_fits.to(x.device) + 1
        return self.codes

    @torch.no_grad()
    def encode(self, x: Tensor) -> Tensor:
        """Codes ``[n, B]`` (long) of vectors ``x`` ``[n, D]`` under the current codebooks."""
        return self._encode(x.detach().float())

    def codeword_matrix(self) -> Tensor:
        """All codewords as full-dimension vectors, ``[B*K, D]``; row ``b*K + k`` is ``c^b_k``.

        ``z.c_i`` is then ``sum_b (z @ matrix.T)[b*K + k_b]`` for PQ and RQ alike.
        """
        return self._codeword_matrix()

    def scores(self, query: Tensor) -> Tensor:
        """Codeword scores ``s_b(k)`` of float32 queries ``[Q, D]``, flat ``[Q, B*K]``."""
        return query @ self.codeword_matrix().T

    def reconstruct(self, codes: Tensor) -> Tensor:
        """Reconstructions ``c`` ``[n, D]`` of codes ``[n, B]``."""
        offsets = torch.arange(self.num_codebooks, device=codes.device) * self.num_codewords
        return self.codeword_matrix()[codes + offsets].sum(1)

    def extra_repr(self) -> str:
        return (
            f"num_codewords={self.num_codewords}, num_codebooks={self.num_codebooks}, "
            f"kmeans_iters={self.kmeans_iters}, warm_start_iters={self.warm_start_iters}"
        )

    def _training_subset(self, x: Tensor, seed: int) -> Tensor:
        """At most ``max_points_per_centroid * K`` random rows, the cap faiss k-means applies.

        Subsampling here (rather than inside faiss) lets every RQ level train on residuals of the
        same small subset instead of residuals of the whole table.
        """
        limit = self.max_points_per_centroid * self.num_codewords
        if x.shape[0] <= limit:
            return x
        generator = torch.Generator().manual_seed(seed)
        rows = torch.randperm(x.shape[0], generator=generator)[:limit]
        return x[rows.to(x.device)]

    def _kmeans(self, x: Tensor, init: Tensor | None, niter: int, seed: int) -> Tensor:
        """:func:`~recsys_midx.index.kmeans.kmeans` of ``x`` ``[n, d]`` into this codebook's ``K``
        codewords, starting from ``init``."""
        return kmeans(
            x,
            self.num_codewords,
            init=init,
            niter=niter,
            seed=seed,
            max_points_per_centroid=self.max_points_per_centroid,
        )

    def _check_dim(self, dim: int) -> None:
        """Raise ValueError if vectors of dimension ``dim`` cannot be quantised."""

    @abc.abstractmethod
    def _train(self, x: Tensor, init: Tensor | None, niter: int, seed: int) -> Tensor:
        """Codewords ``[B, K, d_b]`` trained on ``x``, starting from ``init`` if given."""

    @abc.abstractmethod
    def _encode(self, x: Tensor) -> Tensor:
        """Codes ``[n, B]`` of float32 ``x`` under the current codewords."""

    @abc.abstractmethod
    def _codeword_matrix(self) -> Tensor:
        """See :meth:`codeword_matrix`."""


class ProductCodebooks(Codebooks):
    """Product quantisation: ``B`` equal slices of ``D``, one k-means codebook per slice.

    ``D`` must be a multiple of ``B``. Uneven slices would work mathematically, but they are not
    what faiss's ``ProductQuantizer`` accepts either, and silently padding the table with zero
    dimensions would change what the codewords mean; use ``ResidualCodebooks`` (no constraint on
    ``D``) or pick ``B`` dividing ``D``.

    Example:
        >>> books = ProductCodebooks(num_codewords=4, num_codebooks=2)
        >>> codes = books.fit(torch.randn(100, 8))
        >>> tuple(books.codewords.shape), tuple(codes.shape)
        ((2, 4, 4), (100, 2))
    """

    def _check_dim(self, dim: int) -> None:
        if dim % self.num_codebooks:
            raise ValueError(
                f"product quantisation splits D={dim} into num_codebooks={self.num_codebooks} "
                f"equal subspaces, so D must be a multiple of it; choose num_codebooks dividing "
                f"{dim} or use residual quantisation"
            )

    def _train(self, x: Tensor, init: Tensor | None, niter: int, seed: int) -> Tensor:
        slices = x.chunk(self.num_codebooks, dim=1)
        return torch.stack(
            [
                self._kmeans(part, None if init is None else init[b], niter, seed + b)
                for b, part in enumerate(slices)
            ]
        )

    def _encode(self, x: Tensor) -> Tensor:
        slices = x.chunk(self.num_codebooks, dim=1)
        return torch.stack(
            [nearest_codeword(part, codewords) for part, codewords in zip(slices, self.codewords)],
            dim=1,
        )

    def _codeword_matrix(self) -> Tensor:
        return torch.block_diag(*self.codewords.unbind(0))


class ResidualCodebooks(Codebooks):
    """Residual quantisation: level ``b`` quantises what levels ``< b`` leave; greedy encoding.

    Greedy (beam 1) encoding matches faiss ``ResidualQuantizer`` with ``max_beam_size = 1``.

    Example:
        >>> books = ResidualCodebooks(num_codewords=4, num_codebooks=2)
        >>> codes = books.fit(torch.randn(100, 6))
        >>> tuple(books.codewords.shape), tuple(codes.shape)
        ((2, 4, 6), (100, 2))
    """

    def _train(self, x: Tensor, init: Tensor | None, niter: int, seed: int) -> Tensor:
        residual = x
        levels = []
        for b in range(self.num_codebooks):
            codewords = self._kmeans(residual, None if init is None else init[b], niter, seed + b)
            levels.append(codewords)
            if b + 1 < self.num_codebooks:
                residual = residual - codewords[nearest_codeword(residual, codewords)]
        return torch.stack(levels)

    def _encode(self, x: Tensor) -> Tensor:
        out = torch.empty(x.shape[0], self.num_codebooks, dtype=torch.long, device=x.device)
        # Residuals are formed block by block: whole-table ones would be a copy of the table per
        # level. Each row's codes depend on that row alone, so the blocks change no code.
        rows = max(1, _RESIDUAL_BLOCK_ELEMENTS // x.shape[1])
        for part, residual in row_chunks(x, rows):
            block_codes = out[part]
            for b, codewords in enumerate(self.codewords):
                block_codes[:, b] = nearest_codeword(residual, codewords)
                if b + 1 < self.num_codebooks:
                    residual = residual - codewords[block_codes[:, b]]
        return out

    def _codeword_matrix(self) -> Tensor:
        return self.codewords.reshape(-1, self.codewords.shape[-1])


#: The codebooks by ``quantizer`` name.
QUANTIZERS: dict[str, type[Codebooks]] = {"pq": ProductCodebooks, "rq": ResidualCodebooks}


def make_codebooks(quantizer: str, **kwargs: Any) -> Codebooks:
    """Build ``ProductCodebooks`` (``"pq"``) or ``ResidualCodebooks`` (``"rq"``).

    Args:
        quantizer: ``"pq"`` or ``"rq"``.
        **kwargs: passed to the :class:`Codebooks` constructor.

    Returns:
        The (unfitted) codebooks.

    Raises:
        ValueError: for an unknown ``quantizer``.

    Example:
        >>> type(make_codebooks("rq", num_codewords=8)).__name__
        'ResidualCodebooks'
    """
    if quantizer not in QUANTIZERS:
        raise ValueError(f"quantizer must be one of {sorted(QUANTIZERS)}, got {quantizer!r}")
    return QUANTIZERS[quantizer](**kwargs)
