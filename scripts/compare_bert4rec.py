"""``model=bert4rec`` against SASRec+'s own BERT4Rec: the same weights, the same masked windows.

Builds the BERT4Rec of "Turning Dross Into Gold Loss" (Klenitskiy & Vasilev, RecSys 2023) from a
checkout of its code (antklen/sasrec-bert4rec-recsys23, ``src/models.py``: a Hugging Face
``BertModel`` fed by its own item table, scored by the same table) in its ML-1M setting and this
project's encoder as ``protocol=sasrec-plus model=bert4rec model.output_transform=false
model.norm_eps=1e-12`` configures it, copies the first's weights into the second (perturbed first,
so that biases and LayerNorm affines are not at their start), and compares, in float64 without
dropout: the logits at every position of windows with a fifth of their items masked, the
cross-entropy at the masked positions and the gradient of every weight.

Their table has a row for padding (``0``), one for the mask (``1``) and the items after them; ours
has the padding row, the items, and the mask as a vector of its own, which the comparison scores
in their order, so both softmaxes run over the same ``N + 2`` classes as their training does.
Their ``BertModel`` adds a token-type vector to every position; it is zeroed here, since ours
folds it into the positions. The windows are full (``max_len`` items): theirs count positions from
the window's first item and ours from its last, which differ only for shorter windows.

Needs ``transformers`` importable (SASRec+ pins 4.26; 4.46 computes the same).

Example:
    python scripts/compare_bert4rec.py --peer-src PATH/sasrec-bert4rec-recsys23/src
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from compare_sasrec_plus import (
    NUM_ITEMS,
    Pair,
    copy_weights,
    fused,
    module_pairs,
    paired_gradients,
    paired_models,
    parse_args,
    print_report,
    same,
)
from torch import Tensor, nn

#: SASRec+'s BERT4Rec as ``model=bert4rec`` gives it (their ``configs/BERT4Rec.yaml``).
PAPER_BERT4REC = ["model=bert4rec", "model.output_transform=false", "model.norm_eps=1e-12"]
BATCH = 6
MASK_PROBABILITY = 0.2  # their mlm_probability


def peer_bert4rec(peer_src: Path, sizes: dict) -> nn.Module:
    """SASRec+'s BERT4Rec from its ``models.py`` with ``sizes`` and no dropout; its table has
    ``N + 2`` rows (padding, mask, items)."""
    sys.path.insert(0, str(peer_src))
    from models import BERT4Rec  # their module

    bert_config = {
        "vocab_size": 2,
        "max_position_embeddings": sizes["max_len"],
        "hidden_size": sizes["dim"],
        "num_hidden_layers": sizes["num_layers"],
        "num_attention_heads": sizes["num_heads"],
        "intermediate_size": 4 * sizes["dim"],
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    return BERT4Rec(vocab_size=NUM_ITEMS + 2, bert_config=bert_config)


def without_mask_row(tensors: list[Tensor]) -> Tensor:
    """Their table (or its gradient) as ours: the padding row, then the items."""
    (table,) = tensors
    return torch.cat([table[:1], table[2:]])


def mask_row(tensors: list[Tensor]) -> Tensor:
    """Their mask row (or its gradient), our mask vector."""
    (table,) = tensors
    return table[1]


def weight_pairs(theirs: nn.Module, ours: nn.Module) -> list[Pair]:
    """Every parameter of ours with theirs: the table without and with its mask row, the
    positions, the embedding LayerNorm and each block's maps and LayerNorms (their pooler and
    token types have no counterpart and take no part)."""
    table, bert = theirs.embed_layer.weight, theirs.transformer_model
    embeddings = bert.embeddings
    pairs: list[Pair] = [
        ("item table", [table], ours.item_emb.weight, without_mask_row),
        ("mask vector", [table], ours.mask_emb, mask_row),
        ("positions", [embeddings.position_embeddings.weight], ours.pos_emb.weight, same),
    ]
    modules = [("embedding norm", embeddings.LayerNorm, ours.input_norm)]
    for index, block in enumerate(ours.blocks):
        layer = bert.encoder.layer[index]
        attention = layer.attention.self
        maps = [attention.query, attention.key, attention.value]
        pairs += [
            (f"block {index} in-projection", [m.weight for m in maps], block.qkv.weight, fused),
            (f"block {index} in-projection bias", [m.bias for m in maps], block.qkv.bias, fused),
        ]
        modules += [
            (f"block {index} out-projection", layer.attention.output.dense, block.out),
            (f"block {index} attention norm", layer.attention.output.LayerNorm, block.attn_norm),
            (f"block {index} feed-forward 1", layer.intermediate.dense, block.ffn[0]),
            (f"block {index} feed-forward 2", layer.output.dense, block.ffn[-1]),
            (f"block {index} feed-forward norm", layer.output.LayerNorm, block.ffn_norm),
        ]
    return pairs + module_pairs(modules)


def main() -> None:
    args = parse_args("their src/ folder (with transformers importable)")
    overrides = [*PAPER_BERT4REC, *args.overrides]
    ours, theirs = paired_models(
        overrides, args.seed, lambda sizes: peer_bert4rec(args.peer_src, sizes)
    )
    with torch.no_grad():
        theirs.embed_layer.weight[0].zero_()
        theirs.transformer_model.embeddings.token_type_embeddings.weight.zero_()
    pairs = weight_pairs(theirs, ours)
    copy_weights(pairs, ours)

    length = ours.pos_emb.num_embeddings
    generator = torch.Generator().manual_seed(args.seed + 1)
    items = torch.randint(1, NUM_ITEMS + 1, (BATCH, length), generator=generator)
    masked = torch.rand(BATCH, length, generator=generator) < MASK_PROBABILITY

    their_inputs = (items + 1).masked_fill(masked, 1)  # items from 2, the mask is 1
    their_labels = (items + 1).masked_fill(~masked, -100)
    their_logits = theirs(their_inputs, torch.ones(BATCH, length))
    their_loss = F.cross_entropy(their_logits.flatten(0, 1), their_labels.flatten())
    their_loss.backward()

    queries = ours(items.masked_fill(masked, ours.MASK))
    table = ours.item_emb.weight
    classes = torch.cat([table[:1], ours.mask_emb[None], table[1:]])  # their row order
    our_logits = queries @ classes.T
    our_loss = F.cross_entropy(our_logits[masked], items[masked] + 1)
    our_loss.backward()
    logit_gap = float((their_logits - our_logits).detach().abs().max())
    print_report(overrides, logit_gap, their_loss, our_loss, paired_gradients(pairs))


if __name__ == "__main__":
    main()
