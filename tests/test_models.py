"""Encoders: shapes, causality, padding invariance, interface errors."""

import pytest
import torch

from recsys_midx.losses import full_softmax_loss
from recsys_midx.models import BERT4Rec, GRU4Rec, SASRec

ENCODERS = {
    "sasrec": lambda: SASRec(
        num_items=50, dim=16, num_layers=2, num_heads=2, dropout=0.0, max_len=8
    ),
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


@pytest.mark.parametrize("encoder_class", [SASRec, GRU4Rec, BERT4Rec])
def test_a_separate_output_table_scores_items_and_trains_apart_from_the_input(encoder_class):
    torch.manual_seed(0)
    encoder = encoder_class(num_items=50, dim=16, max_len=8, separate_output_table=True)
    assert encoder.item_table is encoder.output_emb.weight
    assert encoder.item_table.shape == encoder.item_emb.weight.shape == (51, 16)
    assert torch.count_nonzero(encoder.item_table[0]) == 0
    assert not torch.equal(encoder.item_table, encoder.item_emb.weight)
    seq = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8]])
    query = encoder(seq)[:, -1]
    full_softmax_loss(query, encoder.item_table, torch.tensor([9])).sum().backward()
    # The output table's every row takes part in the softmax; the input table only through
    # the items the sequence holds.
    assert torch.count_nonzero(encoder.output_emb.weight.grad[1:].abs().sum(1)) == 50
    touched = torch.count_nonzero(encoder.item_emb.weight.grad.abs().sum(1))
    assert 0 < touched <= 6
    assert encoder.use_sparse_gradients() == [encoder.item_emb.weight, encoder.output_emb.weight]


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


RECBOLE_BLOCK = dict(
    norm="post", input_norm=True, scale_embeddings=False, position_origin="first", ffn_dropout=False
)
#: pmixer/SASRec.pytorch's block, SASRec+'s.
PMIXER_BLOCK = dict(
    residual="normed",
    ffn_dim=16,
    ffn_activation="relu",
    position_origin="first",
    attention_output_dropout=False,
)


@pytest.mark.parametrize(
    "options",
    [
        {},
        RECBOLE_BLOCK,
        PMIXER_BLOCK,
        dict(PMIXER_BLOCK, residual="normed_query", attention_output_dropout=True),
        dict(norm="post"),
        dict(position_origin="first", attention_dropout=0.5),
    ],
)
def test_sasrec_last_query_alone_equals_the_last_position_of_every_query(options) -> None:
    torch.manual_seed(0)
    model = SASRec(num_items=50, dim=16, num_heads=2, max_len=8, **options).eval()
    seq = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 9], [0] * 7 + [4]])
    torch.testing.assert_close(model.encode_last(seq), model(seq)[:, -1])


def test_gru4rec_last_query_is_its_last_position() -> None:
    torch.manual_seed(0)
    model = ENCODERS["gru4rec"]().eval()
    seq = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8]])
    torch.testing.assert_close(model.encode_last(seq), model(seq)[:, -1])


def test_sasrec_positions_from_the_first_item_ignore_the_amount_of_padding() -> None:
    torch.manual_seed(0)
    counted_from = {
        origin: SASRec(
            num_items=50, dim=16, num_heads=2, dropout=0.0, max_len=8, position_origin=origin
        ).eval()
        for origin in ("first", "last")
    }
    counted_from["last"].load_state_dict(counted_from["first"].state_dict())
    short, padded = torch.tensor([[0, 0, 0, 5, 6, 7]]), torch.tensor([[0, 0, 0, 0, 0, 5, 6, 7]])
    first = counted_from["first"]
    torch.testing.assert_close(first(short)[:, -3:], first(padded)[:, -3:])
    # Counted from the last item, positions move with the padding; so do the queries.
    last = counted_from["last"]
    assert not torch.allclose(last(short)[:, -3:], last(padded)[:, -3:])


@pytest.mark.parametrize("options", [{}, RECBOLE_BLOCK, dict(PMIXER_BLOCK, norm_eps=1e-8)])
def test_sasrec_norm_eps_is_every_layernorms(options) -> None:
    model = SASRec(num_items=50, dim=16, num_heads=2, max_len=8, **options)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 1  # two per block, then the final or the input one
    assert {m.eps for m in norms} == {options.get("norm_eps", 1e-5)}


def test_sasrec_block_options_change_the_parameters_they_name() -> None:
    default = SASRec(num_items=50, dim=16, num_heads=2, max_len=8)
    recbole = SASRec(num_items=50, dim=16, num_heads=2, max_len=8, **RECBOLE_BLOCK)
    names = set(dict(recbole.named_parameters())) ^ set(dict(default.named_parameters()))
    # RecBole's block: an input LayerNorm, no final one (post-norm blocks end with theirs).
    assert names == {
        "input_norm.weight",
        "input_norm.bias",
        "final_norm.weight",
        "final_norm.bias",
    } | {f"blocks.{b}.ffn.{i}.{p}" for b in (0, 1) for i in (2, 3) for p in ("weight", "bias")}
    assert recbole.embedding_scale == 1.0 and default.embedding_scale == 4.0


def _pmixer_style_block_by_hand(block, x: torch.Tensor, normed_ffn_residual: bool) -> torch.Tensor:
    """One head: ``Q = LN(x); h = Q + MHA(Q, x, x)``, then ``LN(h) + FFN(LN(h))`` (pmixer's
    block) or ``h + FFN(LN(h))``; the FFN 16 -> 16 with ReLU."""
    allowed = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    normed = block.attn_norm(x)
    w, b = block.qkv.weight.split(16), block.qkv.bias.split(16)
    q, k, v = normed @ w[0].T + b[0], x @ w[1].T + b[1], x @ w[2].T + b[2]
    scores = (q @ k.transpose(1, 2) / 4.0).masked_fill(~allowed, float("-inf"))
    h = normed + block.out(scores.softmax(-1) @ v)
    ffn_input = block.ffn_norm(h)
    residual = ffn_input if normed_ffn_residual else h
    hidden = torch.relu(ffn_input @ block.ffn[0].weight.T + block.ffn[0].bias)
    return residual + hidden @ block.ffn[-1].weight.T + block.ffn[-1].bias


@pytest.mark.parametrize("residual", ["normed_query", "normed"])
def test_sasrec_normed_residuals_add_to_the_normalised_inputs(residual: str) -> None:
    torch.manual_seed(0)
    options = dict(PMIXER_BLOCK, residual=residual)
    model = SASRec(num_items=50, dim=16, num_heads=1, max_len=8, num_layers=1, **options)
    model.eval()
    block, x = model.blocks[0], torch.randn(2, 5, 16)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    expected = _pmixer_style_block_by_hand(block, x, normed_ffn_residual=residual == "normed")
    torch.testing.assert_close(block(x, allowed[None, None]), expected)


@pytest.mark.parametrize("attention_output_dropout", [False, True])
def test_sasrec_attention_output_dropout_is_the_only_dropout_it_switches(
    attention_output_dropout: bool,
) -> None:
    torch.manual_seed(0)
    options = dict(PMIXER_BLOCK, attention_output_dropout=attention_output_dropout)
    model = SASRec(
        num_items=50,
        dim=16,
        num_heads=1,
        max_len=8,
        num_layers=1,
        dropout=0.5,
        attention_dropout=0.0,
        **dict(options, ffn_dropout=False),
    )
    block, x = model.blocks[0], torch.randn(2, 5, 16)
    # The feed-forward's output is zero, so its dropout has nothing to drop: training and
    # evaluation agree exactly when the attention output is not dropped either.
    torch.nn.init.zeros_(block.ffn[-1].weight)
    torch.nn.init.zeros_(block.ffn[-1].bias)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    agree = torch.allclose(block.train()(x, allowed), block.eval()(x, allowed))
    assert agree is not attention_output_dropout


def test_sasrec_default_block_options_keep_the_default_block() -> None:
    torch.manual_seed(0)
    default = SASRec(num_items=50, dim=16, num_heads=2, max_len=8)
    torch.manual_seed(0)
    named = SASRec(num_items=50, dim=16, num_heads=2, max_len=8, ffn_dim=64, ffn_activation="gelu")
    seq = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8]])
    assert torch.equal(default.eval()(seq), named.eval()(seq))
    assert isinstance(default.blocks[0].ffn[1], torch.nn.GELU)


@pytest.mark.parametrize("residual", ["normed_query", "normed"])
def test_sasrec_normed_residuals_need_pre_norm(residual: str) -> None:
    with pytest.raises(ValueError, match=f"residual='{residual}' needs norm='pre'"):
        SASRec(num_items=10, dim=16, num_heads=2, norm="post", residual=residual)


def test_sasrec_xavier_attention_init_redraws_the_in_projection_only() -> None:
    torch.manual_seed(0)
    normal = SASRec(num_items=50, dim=16, num_heads=1, max_len=8)
    torch.manual_seed(0)
    xavier = SASRec(num_items=50, dim=16, num_heads=1, max_len=8, attention_init="xavier")
    xavier_params = dict(xavier.named_parameters())
    for name, param in normal.named_parameters():
        if name.endswith("qkv.weight"):
            # torch.nn.MultiheadAttention's start: uniform within sqrt(6 / (D + 3D)).
            weight, bound = xavier_params[name], (6 / (16 + 48)) ** 0.5
            assert weight.abs().max() <= bound and weight.std() > 0.5 * bound
        else:
            assert torch.equal(param, xavier_params[name]), name


def test_sasrec_without_output_projection_adds_the_heads_output_as_it_is() -> None:
    torch.manual_seed(0)
    options = dict(PMIXER_BLOCK, num_items=50, dim=16, num_heads=1, max_len=8, dropout=0.0)
    bare = SASRec(**options, attention_output_projection=False).eval()
    assert not [name for name in dict(bare.named_parameters()) if ".out." in name]
    projected = SASRec(**options).eval()
    seq = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 9]])
    projected.load_state_dict(bare.state_dict(), strict=False)
    assert not torch.allclose(projected(seq), bare(seq))  # a drawn projection changes the output
    with torch.no_grad():
        for block in projected.blocks:
            block.out.weight.copy_(torch.eye(16))
            block.out.bias.zero_()
    torch.testing.assert_close(projected(seq), bare(seq))  # an identity one does not


def test_sasrec_without_init_std_keeps_pytorchs_default_start() -> None:
    torch.manual_seed(0)
    model = SASRec(num_items=4000, dim=64, num_heads=1, max_len=200, init_std=None)
    rows = model.item_emb.weight[1:]
    assert abs(float(rows.std()) - 1.0) < 0.02 and abs(float(model.pos_emb.weight.std()) - 1) < 0.02
    assert torch.count_nonzero(model.item_emb.weight[0]) == 0  # padding stays zero
    for layer in (model.blocks[0].qkv, model.blocks[0].ffn[0], model.blocks[0].out):
        bound = layer.in_features**-0.5  # uniform within 1/sqrt(fan_in), biases too
        for weight in (layer.weight, layer.bias):
            assert weight.abs().max() <= bound and weight.std() > 0.5 * bound / 3**0.5
    small = SASRec(num_items=4000, dim=64, num_heads=1, max_len=200)
    assert abs(float(small.item_emb.weight[1:].std()) - 0.02) < 0.001
    assert torch.count_nonzero(small.blocks[0].qkv.bias) == 0


@pytest.mark.parametrize(
    "setting", ["norm", "position_origin", "ffn_activation", "residual", "attention_init"]
)
def test_sasrec_refuses_an_unknown_block_choice(setting: str) -> None:
    with pytest.raises(ValueError, match=setting):
        SASRec(num_items=10, dim=16, num_heads=2, **{setting: "middle"})
