"""``model=sasrec-plus`` against SASRec+'s own SASRec: the same weights, the same sequences.

Builds the SASRec of "Turning Dross Into Gold Loss" (Klenitskiy & Vasilev, RecSys 2023) from a
checkout of its code (antklen/sasrec-bert4rec-recsys23, ``src/models.py``) and this project's
encoder as ``protocol=sasrec-plus`` configures it, copies the first's weights into the second
(perturbed first, so that biases and LayerNorm affines are not at their start), and compares, in
float64 without dropout: the logits at every real position, the cross-entropy over the catalog
and the gradient of every weight. Their inputs are right-padded with positions from the first
item; ours are left-padded with positions counted from the first real item, so the same
positions carry the same items. Their softmax keeps the padding row as a class (a zero row, logit
0); the comparison scores ours over the same ``N + 1`` rows.

Example:
    python scripts/compare_sasrec_plus.py --peer-src PATH/sasrec-bert4rec-recsys23/src
    python scripts/compare_sasrec_plus.py --peer-src PATH/src model.norm_eps=1e-5
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
NUM_ITEMS = 3_416  # ML-1M's catalog as SASRec published it
LENGTHS = (201, 201, 150, 37, 2, 120, 201, 80)  # windows of max_len + 1 items and shorter ones


def peer_sasrec(peer_src: Path, config: dict) -> nn.Module:
    """SASRec+'s SASRec from its ``models.py``; its ``transformers`` import (for its other
    models) is stubbed when the package is missing."""
    sys.path.insert(0, str(peer_src))
    try:
        import transformers  # noqa: F401
    except ImportError:
        stub = types.ModuleType("transformers")
        for name in ("BertConfig", "BertModel", "GPT2Config", "GPT2Model"):
            setattr(stub, name, None)
        sys.modules["transformers"] = stub
    from models import SASRec  # their module

    return SASRec(
        item_num=NUM_ITEMS,
        maxlen=config["max_len"],
        hidden_units=config["dim"],
        num_blocks=config["num_layers"],
        num_heads=config["num_heads"],
        dropout_rate=0.0,
    )


def our_sasrec(overrides: list[str]) -> nn.Module:
    """The encoder ``protocol=sasrec-plus`` configures, with ``overrides``, dropout off."""
    with initialize_config_dir(config_dir=str(ROOT / "recsys_midx" / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "dataset=ml-1m-sasrec",
                "dataset.path=unused",
                "protocol=sasrec-plus",
                "model.dropout=0.0",
                *overrides,
            ],
        )
    return instantiate(cfg.model, num_items=NUM_ITEMS)


#: ``(name, their parameters, our parameter, how theirs make ours)``: ``combine`` maps their
#: tensors (weights or gradients) to one tensor, which is then reshaped to ours.
Pair = tuple[str, list[Tensor], Tensor, Callable[[list[Tensor]], Tensor]]


def same(tensors: list[Tensor]) -> Tensor:
    """One parameter of theirs as it is (reshaped to ours afterwards)."""
    (tensor,) = tensors
    return tensor


def fused(tensors: list[Tensor]) -> Tensor:
    """Their separate query, key and value projections (or gradients) as our fused one."""
    return torch.cat(tensors)


def module_pairs(modules: list[tuple[str, nn.Module, nn.Module]]) -> list[Pair]:
    """A pair for each parameter of our module in ``(name, their module, our module)``, taken
    from their module's parameter of the same name (``weight``, ``bias``)."""
    return [
        (name if part == "weight" else f"{name} bias", [theirs.get_parameter(part)], mine, same)
        for name, theirs, ours in modules
        for part, mine in ours.named_parameters()
    ]


def weight_pairs(theirs: nn.Module, ours: nn.Module) -> list[Pair]:
    """Every parameter of ours with theirs: the fused in-projection, the output projection, the
    1x1 convolutions as linear maps (their weights have a trailing kernel dimension of 1), the
    LayerNorms and both embedding tables."""
    pairs: list[Pair] = [
        ("item table", [theirs.item_emb.weight], ours.item_emb.weight, same),
        ("positions", [theirs.pos_emb.weight], ours.pos_emb.weight, same),
    ]
    modules = [("final norm", theirs.last_layernorm, ours.final_norm)]
    for index, block in enumerate(ours.blocks):
        attention, ffn = theirs.attention_layers[index], theirs.forward_layers[index]
        pairs += [
            (f"block {index} in-projection", [attention.in_proj_weight], block.qkv.weight, same),
            (f"block {index} in-projection bias", [attention.in_proj_bias], block.qkv.bias, same),
        ]
        modules += [
            (f"block {index} out-projection", attention.out_proj, block.out),
            (f"block {index} attention norm", theirs.attention_layernorms[index], block.attn_norm),
            (f"block {index} feed-forward norm", theirs.forward_layernorms[index], block.ffn_norm),
            (f"block {index} feed-forward 1", ffn.conv1, block.ffn[0]),
            (f"block {index} feed-forward 2", ffn.conv2, block.ffn[-1]),
        ]
    return pairs + module_pairs(modules)


def parse_args(peer_help: str) -> argparse.Namespace:
    """``--peer-src`` (their code, ``peer_help``), ``--seed`` and config overrides for ours."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.splitlines()[0])
    parser.add_argument("--peer-src", type=Path, required=True, help=peer_help)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="config overrides for ours")
    return parser.parse_args()


def paired_models(
    overrides: list[str], seed: int, build_peer: Callable[[dict], nn.Module]
) -> tuple[nn.Module, nn.Module]:
    """Ours as ``overrides`` configure it and theirs from ``build_peer(sizes)`` with the same
    sizes (``max_len``, ``dim``, ``num_layers``, ``num_heads``), both in float64 in training
    mode; their weights are perturbed from their start so that no bias or affine is trivial."""
    torch.manual_seed(seed)
    ours = our_sasrec(overrides).double().train()
    sizes = {
        "max_len": ours.pos_emb.num_embeddings,
        "dim": ours.item_emb.embedding_dim,
        "num_layers": len(ours.blocks),
        "num_heads": ours.blocks[0].num_heads,
    }
    theirs = build_peer(sizes).double().train()
    with torch.no_grad():
        for weight in theirs.parameters():
            weight.add_(0.05 * torch.randn_like(weight))
    return ours, theirs


def copy_weights(pairs: list[Pair], ours: nn.Module) -> None:
    """Give ours their weights, after checking that every parameter of ours is paired."""
    mapped = {id(our_weight) for _, _, our_weight, _ in pairs}
    assert mapped == {id(weight) for weight in ours.parameters()}, "a parameter left unpaired"
    with torch.no_grad():
        for _, their_weights, our_weight, combine in pairs:
            our_weight.copy_(combine(their_weights).reshape(our_weight.shape))


def paired_gradients(pairs: list[Pair]) -> list[tuple[str, Tensor, Tensor]]:
    """``(name, their gradient as ours, our gradient)`` after both backward passes."""
    return [
        (name, combine([w.grad for w in theirs]).reshape(ours.grad.shape), ours.grad)
        for name, theirs, ours, combine in pairs
    ]


def main() -> None:
    args = parse_args("their src/ folder")
    ours, theirs = paired_models(
        args.overrides, args.seed, lambda sizes: peer_sasrec(args.peer_src, sizes)
    )
    with torch.no_grad():
        theirs.item_emb.weight[0].zero_()
    pairs = weight_pairs(theirs, ours)
    copy_weights(pairs, ours)

    length = ours.pos_emb.num_embeddings
    generator = torch.Generator().manual_seed(args.seed + 1)
    sequences = [torch.randint(1, NUM_ITEMS + 1, (n,), generator=generator) for n in LENGTHS]
    right = torch.zeros(len(LENGTHS), length, dtype=torch.long)
    right_labels = torch.full((len(LENGTHS), length), -100)
    left = torch.zeros(len(LENGTHS), length, dtype=torch.long)
    left_labels = torch.zeros(len(LENGTHS), length, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        inputs, labels = sequence[:-1], sequence[1:]
        right[row, : len(inputs)], right_labels[row, : len(labels)] = inputs, labels
        left[row, length - len(inputs) :], left_labels[row, length - len(labels) :] = inputs, labels

    their_logits = theirs(right, None)
    their_loss = F.cross_entropy(their_logits.flatten(0, 1), right_labels.flatten())
    their_loss.backward()
    our_logits = ours(left) @ ours.item_emb.weight.T
    real = left_labels > 0
    our_loss = F.cross_entropy(our_logits[real], left_labels[real])
    our_loss.backward()
    logit_gap = max(
        float((their_logits[row, : n - 1] - our_logits[row, length - n + 1 :]).detach().abs().max())
        for row, n in enumerate(LENGTHS)
    )
    print_report(args.overrides, logit_gap, their_loss, our_loss, paired_gradients(pairs))


def print_report(
    overrides: list[str],
    logit_gap: float,
    their_loss: Tensor,
    our_loss: Tensor,
    gradients: list[tuple[str, Tensor, Tensor]],
) -> None:
    """The comparison as a Markdown table: the largest logit difference, both losses and each
    weight's relative gradient difference (``gradients``: ``(name, theirs, ours)``, ours' shape)."""
    print(f"torch {torch.__version__}, float64, overrides: {' '.join(overrides) or 'none'}\n")
    print("| compared | theirs | ours | largest difference |")
    print("|---|---:|---:|---:|")
    print(f"| logits at the real positions | | | {logit_gap:.1e} |")
    print(
        f"| cross-entropy | {their_loss.item():.12f} | {our_loss.item():.12f} "
        f"| {abs(their_loss.item() - our_loss.item()):.1e} |"
    )
    for name, their_grad, our_grad in gradients:
        gap = float((their_grad - our_grad).norm() / their_grad.norm())
        print(f"| gradient of the {name} (relative) | | | {gap:.1e} |")


if __name__ == "__main__":
    main()
