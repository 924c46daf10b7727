"""Encoders: shapes, causality, padding invariance, interface errors."""

import pytest
import torch

from recsys_midx.models import GRU4Rec, SASRec

ENCODERS = {
    "sasrec": lambda: SASRec(num_items=50, dim=16, num_layers=2, num_heads=2, dropout=0.0, max_len=8),
    "gru4rec": lambda: GRU4Rec(num_items=50, dim=16, hidden_size=24, dropout=0.0, max_len=8),
}


@pytest.fixture(params=sorted(ENCODERS))
def encoder(request):
    torch.manual_seed(0)
    return ENCODERS[request.param]().eval()


def test_output_shape_and_shared_table(encoder):
    seq = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 9]])
    out = encoder(seq)
    assert out.shape == (2, 8, 16)
    assert torch.isfinite(out).all()
    assert encoder.item_table.shape == (51, 16)
    assert encoder.item_table is encoder.item_emb.weight
    assert torch.count_nonzero(encoder.item_table[0]) == 0


def test_causal_future_items_do_not_change_past_queries(encoder):
    seq = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8]])
    changed = seq.clone()
    changed[0, 5:] = torch.tensor([40, 41, 42])
    a, b = encoder(seq), encoder(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_sasrec_padding_items_are_never_attended():
    torch.manual_seed(0)
    model = SASRec(num_items=50, dim=16, num_heads=2, dropout=0.0, max_len=8).eval()
    seq = torch.tensor([[0, 0, 0, 0, 5, 6, 7, 8]])
    # Padding rows can only leak through attention; a padding row with a huge embedding would
    # change the real positions if they attended to it.
    reference = model(seq)[:, 4:]
    with torch.no_grad():
        model.item_emb.weight[0].fill_(100.0)
    torch.testing.assert_close(model(seq)[:, 4:], reference)


def test_sequence_longer_than_max_len_is_an_error(encoder):
    with pytest.raises(ValueError, match="max_len"):
        encoder(torch.ones(1, 9, dtype=torch.long))


def test_heads_must_divide_dim():
    with pytest.raises(ValueError, match="num_heads"):
        SASRec(num_items=10, dim=10, num_heads=3)
