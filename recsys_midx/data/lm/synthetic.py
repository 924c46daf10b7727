"""A generated corpus with a Zipf vocabulary and phrases a language model can learn: the offline
default of ``task=lm`` and the corpus of its tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from recsys_midx.data.lm.corpus import SPLITS, BuiltCorpus, CorpusSource


class SyntheticCorpus(CorpusSource):
    """Text made of phrases: a fixed set of short token sequences, each drawn with a Zipf weight
    and written whole, one after another.

    The phrases' tokens are drawn from a Zipf distribution over the vocabulary, so token
    frequencies follow the long tail of natural text; inside a phrase the next token follows
    from the ones before it, so a model that learns the phrases predicts most tokens far better
    than their unigram frequencies do, while the first token of each phrase stays a draw from
    the phrase weights. The three splits are independent draws of phrases from one generator.

    Args:
        name: the corpus's name.
        vocabulary: ``V``; tokens are named ``w1 .. wV`` (id ``i`` is ``wi``).
        num_phrases: distinct phrases.
        min_phrase_length: the fewest tokens of a phrase (at least 1).
        max_phrase_length: the most tokens of a phrase.
        train_tokens: tokens of the training stream.
        valid_tokens: tokens of the validation stream.
        test_tokens: tokens of the test stream.
        token_exponent: Zipf exponent of the tokens inside phrases.
        phrase_exponent: Zipf exponent of the phrase weights.
        seed: seed of the generator.

    Raises:
        ValueError: if a size is not positive or the phrase lengths are out of order.

    Example:
        >>> corpus = SyntheticCorpus(vocabulary=50, num_phrases=20, train_tokens=500,
        ...                          valid_tokens=50, test_tokens=50).build(Path("."))
        >>> len(corpus.vocabulary), len(corpus.streams["train"])
        (50, 500)
    """

    def __init__(
        self,
        name: str = "lm-synthetic",
        vocabulary: int = 1000,
        num_phrases: int = 300,
        min_phrase_length: int = 2,
        max_phrase_length: int = 6,
        train_tokens: int = 100_000,
        valid_tokens: int = 10_000,
        test_tokens: int = 10_000,
        token_exponent: float = 1.0,
        phrase_exponent: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(name)
        sizes = {
            "vocabulary": vocabulary,
            "num_phrases": num_phrases,
            "min_phrase_length": min_phrase_length,
            "train_tokens": train_tokens,
            "valid_tokens": valid_tokens,
            "test_tokens": test_tokens,
        }
        for setting, value in sizes.items():
            if value < 1:
                raise ValueError(f"dataset.{setting} must be >= 1, got {value}")
        if max_phrase_length < min_phrase_length:
            raise ValueError(
                f"dataset.max_phrase_length={max_phrase_length} is below "
                f"dataset.min_phrase_length={min_phrase_length}"
            )
        self.settings: dict[str, Any] = {
            **sizes,
            "max_phrase_length": max_phrase_length,
            "token_exponent": float(token_exponent),
            "phrase_exponent": float(phrase_exponent),
            "seed": int(seed),
        }

    def fingerprint(self, data_dir: Path) -> dict[str, Any]:
        return dict(self.settings)

    def build(self, data_dir: Path) -> BuiltCorpus:
        s = self.settings
        rng = np.random.default_rng(s["seed"])
        lengths = rng.integers(s["min_phrase_length"], s["max_phrase_length"] + 1, s["num_phrases"])
        tokens = _zipf(s["vocabulary"], s["token_exponent"])
        # Phrase p holds tokens starts[p] .. starts[p] + lengths[p] - 1 of one flat array.
        flat = rng.choice(s["vocabulary"], size=int(lengths.sum()), p=tokens) + 1
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        weights = _zipf(s["num_phrases"], s["phrase_exponent"])
        streams = {}
        for split in SPLITS:
            wanted = s[f"{split}_tokens"]
            # Enough phrases for the shortest ones; the stream is cut to length below.
            phrases = rng.choice(
                s["num_phrases"], size=-(-wanted // s["min_phrase_length"]), p=weights
            )
            offsets = np.arange(int(lengths[phrases].sum())) - np.repeat(
                np.cumsum(lengths[phrases]) - lengths[phrases], lengths[phrases]
            )
            stream = flat[np.repeat(starts[phrases], lengths[phrases]) + offsets]
            streams[split] = stream[:wanted].astype(np.int64)
        return BuiltCorpus([f"w{i}" for i in range(1, s["vocabulary"] + 1)], streams)


def _zipf(size: int, exponent: float) -> np.ndarray:
    """Probabilities proportional to ``rank ** -exponent`` over ranks ``1..size``."""
    weights = np.arange(1, size + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()
