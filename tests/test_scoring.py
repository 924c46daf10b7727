"""Catalog scoring: the chunked normalisers and their chunk sizes, and the documented examples.

The losses built on these functions are tested against dense references in test_losses.py,
test_heads.py and test_multilabel_loss.py; the metrics in test_metrics.py and test_xc_metrics.py.
"""

from __future__ import annotations

import doctest

import pytest
import torch

from recsys_midx.scoring import (
    ExcludedItems,
    catalog_logsumexp,
    head_logsumexp,
    head_model,
    identity,
    logsumexp,
    mixtures,
)
from recsys_midx.scoring.logsumexp import _CPU_BLOCK_SCORES, _CPU_MIN_CHUNK_ITEMS, items_per_chunk


def test_cpu_chunks_stay_cache_sized_and_accelerators_take_chunk_size_as_given():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert items_per_chunk(8192, 6400, cpu) == _CPU_BLOCK_SCORES // 6400
    assert items_per_chunk(8192, 128, cpu) == 8192  # small batches keep the whole chunk
    assert items_per_chunk(4, 6400, cpu) == 4  # never more than asked for
    assert items_per_chunk(8192, 10**7, cpu) == _CPU_MIN_CHUNK_ITEMS
    assert items_per_chunk(8192, 6400, cuda) == 8192


def test_catalog_logsumexp_gradcheck_leaves_padding_out():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 4, generator=generator, dtype=torch.float64).requires_grad_()
    item_emb = torch.randn(12, 4, generator=generator, dtype=torch.float64).requires_grad_()
    torch.autograd.gradcheck(lambda q, v: catalog_logsumexp(q, v, chunk_size=5), (query, item_emb))
    catalog_logsumexp(query, item_emb, chunk_size=5).sum().backward()
    assert torch.equal(item_emb.grad[0], torch.zeros(4))


def test_catalog_logsumexp_one_block_matches_the_chunks():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 4, generator=generator, dtype=torch.float64).requires_grad_()
    item_emb = torch.randn(12, 4, generator=generator, dtype=torch.float64).requires_grad_()
    # chunk_size >= N: one product, its softmax weights kept for backward.
    torch.autograd.gradcheck(lambda q, v: catalog_logsumexp(q, v, chunk_size=11), (query, item_emb))
    grad_lse = torch.randn(3, generator=generator, dtype=torch.float64)
    gradients = []
    for chunk_size in (11, 4):
        lse = catalog_logsumexp(query, item_emb, chunk_size=chunk_size)
        gradients.append((lse, *torch.autograd.grad(lse, (query, item_emb), grad_lse)))
    for one_block, chunked in zip(*gradients):
        torch.testing.assert_close(one_block, chunked)
    assert torch.equal(gradients[0][2][0], torch.zeros(4))  # padding row outside the normaliser


def test_catalog_logsumexp_computes_half_precision_in_float32():
    query, item_emb = torch.randn(2, 4).bfloat16(), torch.randn(9, 4).bfloat16()
    lse = catalog_logsumexp(query, item_emb, chunk_size=3)
    assert lse.dtype == torch.float32
    reference = torch.logsumexp(query.float() @ item_emb[1:].float().T, dim=1)
    torch.testing.assert_close(lse, reference)


@pytest.mark.parametrize("chunk_size", [5, 64], ids=["chunks", "one-block"])
def test_head_logsumexp_of_the_identity_is_the_generic_path(chunk_size: int) -> None:
    # The identity takes the dot product's normaliser (its own backward); any other transform
    # the checkpointed one. Both must give the same values and gradients.
    generator = torch.Generator().manual_seed(8)
    queries = torch.randn(4, 3, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    table = torch.randn(13, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    fast = head_logsumexp(queries, table, identity, chunk_size)
    generic = head_logsumexp(queries, table, lambda scores: scores * 1.0, chunk_size)
    torch.testing.assert_close(fast, generic)
    upstream = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    for got, want in zip(
        torch.autograd.grad(fast, (queries, table), upstream),
        torch.autograd.grad(generic, (queries, table), upstream),
    ):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("normaliser", [catalog_logsumexp, head_logsumexp])
def test_normalisers_reject_empty_chunks(normaliser):
    query, item_emb = torch.randn(2, 4), torch.randn(9, 4)
    args = (query, item_emb) if normaliser is catalog_logsumexp else (query, item_emb, torch.tanh)
    with pytest.raises(ValueError, match="chunk_size"):
        normaliser(*args, chunk_size=0)


@pytest.mark.parametrize("module", [logsumexp, mixtures, head_model], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("chunk_size", [3, 64], ids=["chunks", "one-block"])
def test_left_out_items_leave_the_normaliser_and_its_gradient(chunk_size: int) -> None:
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(4, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    table = torch.randn(11, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    # Two groups: the first leaves out 2, 5 (twice) and padding; the second every item.
    excluded = ExcludedItems(
        torch.tensor([[2, 5, 5, 0] + [0] * 6, list(range(1, 11))]), torch.tensor([0, 1, 0, 0])
    )
    lse = catalog_logsumexp(query, table, chunk_size, excluded)
    kept = [i for i in range(1, 11) if i not in (2, 5)]
    reference = torch.logsumexp(query[[0, 2, 3]] @ table[kept].T, dim=1)
    torch.testing.assert_close(lse[[0, 2, 3]], reference)
    assert lse[1] == float("-inf")
    grads = torch.autograd.grad(lse[[0, 2, 3]].sum(), (query, table))
    expected = torch.autograd.grad(reference.sum(), (query, table))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(
        lambda q, t: catalog_logsumexp(q, t, chunk_size, excluded)[[0, 2, 3]], (query, table)
    )
