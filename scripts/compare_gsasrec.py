"""``model=gsasrec`` against gSASRec's own model: the same weights, the same sequences.

Builds the model of gSASRec's code (Petrov & Macdonald, RecSys 2023; asash/gSASRec-pytorch,
``gsasrec.py`` and ``transformer_decoder.py``) in its ML-1M setting (128 dims, 2 blocks, one
head, a separate output table) and this project's encoder as ``model=gsasrec`` configures it
under ``protocol=sasrec-plus``, copies the first's weights into the second (perturbed first, so
that biases and LayerNorm affines are not at their start), and compares, in float64 without
dropout: the query vectors' scores over the catalog at every real position, the cross-entropy
over the catalog and the gradient of every weight. Both pad on the left; theirs pads with the id
``N + 1`` and masks those positions, ours with ``0``; both count positions from the window's
first slot, so the same slots carry the same items and positions. Their item tables have rows
for ``0`` (unused) and ``N + 1`` (padding), ours a zero row ``0``: items ``1..N`` are compared.

Example:
    python scripts/compare_gsasrec.py --peer-src PATH/gSASRec-pytorch
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from compare_sasrec_plus import (
    LENGTHS,
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

#: gSASRec's ML-1M sizes (its ``config_ml1m.py``), given to ours on top of the protocol's.
GSASREC_ML1M = ["model=gsasrec", "model.dim=128", "model.num_layers=2"]


def peer_gsasrec(peer_src: Path, config: dict) -> nn.Module:
    """gSASRec's model from its ``gsasrec.py``."""
    sys.path.insert(0, str(peer_src))
    from gsasrec import GSASRec  # their module

    return GSASRec(
        NUM_ITEMS,
        sequence_length=config["max_len"],
        embedding_dim=config["dim"],
        num_heads=config["num_heads"],
        num_blocks=config["num_layers"],
        dropout_rate=0.0,
    )


def items_only(tensors: list[Tensor]) -> Tensor:
    """Their table ``[N + 2, D]`` as ours ``[N + 1, D]``: a zero padding row, then items."""
    (table,) = tensors
    return torch.cat([torch.zeros_like(table[:1]), table[1 : NUM_ITEMS + 1]])


def weight_pairs(theirs: nn.Module, ours: nn.Module) -> list[Pair]:
    """Every parameter of ours with the parameters of theirs it comes from."""
    pairs: list[Pair] = [
        ("item table", [theirs.item_embedding.weight], ours.item_emb.weight, items_only),
        ("output table", [theirs.output_embedding.weight], ours.output_emb.weight, items_only),
        ("positions", [theirs.position_embedding.weight], ours.pos_emb.weight, same),
    ]
    modules = [("final norm", theirs.seq_norm, ours.final_norm)]
    for index, block in enumerate(ours.blocks):
        their_block = theirs.transformer_blocks[index]
        attention = their_block.multihead_attention
        projections = (attention.query_proj, attention.key_proj, attention.val_proj)
        name = f"block {index} in-projection"
        pairs += [
            (name, [p.weight for p in projections], block.qkv.weight, fused),
            (f"{name} bias", [p.bias for p in projections], block.qkv.bias, fused),
        ]
        modules += [
            (f"block {index} attention norm", their_block.first_norm, block.attn_norm),
            (f"block {index} feed-forward norm", their_block.second_norm, block.ffn_norm),
            (f"block {index} feed-forward 1", their_block.dense1, block.ffn[0]),
            (f"block {index} feed-forward 2", their_block.dense2, block.ffn[-1]),
        ]
    return pairs + module_pairs(modules)


def main() -> None:
    args = parse_args("their checkout")
    overrides = [*GSASREC_ML1M, *args.overrides]
    ours, theirs = paired_models(
        overrides, args.seed, lambda sizes: peer_gsasrec(args.peer_src, sizes)
    )
    pairs = weight_pairs(theirs, ours)
    copy_weights(pairs, ours)

    length = ours.pos_emb.num_embeddings
    generator = torch.Generator().manual_seed(args.seed + 1)
    theirs_in = torch.full((len(LENGTHS), length), NUM_ITEMS + 1)
    ours_in = torch.zeros(len(LENGTHS), length, dtype=torch.long)
    labels = torch.zeros(len(LENGTHS), length, dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        sequence = torch.randint(1, NUM_ITEMS + 1, (n,), generator=generator)
        theirs_in[row, length - n + 1 :] = ours_in[row, length - n + 1 :] = sequence[:-1]
        labels[row, length - n + 1 :] = sequence[1:]
    real = labels > 0

    their_queries, _ = theirs(theirs_in)
    their_logits = their_queries @ theirs.output_embedding.weight[1 : NUM_ITEMS + 1].T
    our_logits = ours(ours_in) @ ours.item_table[1:].T
    their_loss = F.cross_entropy(their_logits[real], labels[real] - 1)
    our_loss = F.cross_entropy(our_logits[real], labels[real] - 1)
    their_loss.backward()
    our_loss.backward()
    logit_gap = float((their_logits - our_logits)[real].detach().abs().max())
    print_report(overrides, logit_gap, their_loss, our_loss, paired_gradients(pairs))


if __name__ == "__main__":
    main()
