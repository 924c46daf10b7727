"""Language-modelling data: token files in the published layout, the generated corpus, and the
stretches truncated backpropagation reads, on generated text only."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from recsys_midx.data.errors import DataError, EmptyFileError, MissingFilesError, TextFormatError
from recsys_midx.data.lm import (
    LMDataModule,
    StreamStretches,
    SyntheticCorpus,
    TextCorpus,
    batchify,
    load_corpus,
)
from recsys_midx.errors import ConfigError

FILES = {"train": "train.txt", "valid": "valid.txt", "test": "test.txt"}
TEXTS = {
    "train": " the cat sat \n the dog sat on the mat \n\n a cat \n",
    "valid": " the dog sat \n",
    "test": " a mat \n",
}


def _write(folder: Path, texts: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in texts.items():
        (folder / FILES[split]).write_text(text)
    return folder


def test_lines_end_with_eos_and_the_vocabulary_is_the_training_files_by_frequency(tmp_path):
    folder = _write(tmp_path / "corpus", TEXTS)
    corpus = TextCorpus("toy", folder, FILES).prepare(tmp_path / "data")
    # <eos> x4 (every line, the empty one too), the x3, cat x2 and sat x2 in order of first
    # appearance, then the tokens seen once.
    assert corpus.vocabulary == ["<eos>", "the", "cat", "sat", "dog", "on", "mat", "a"]
    words = ["<pad>", *corpus.vocabulary]
    assert [words[i] for i in corpus.streams["valid"]] == ["the", "dog", "sat", "<eos>"]
    assert [words[i] for i in corpus.streams["test"]] == ["a", "mat", "<eos>"]
    assert len(corpus.streams["train"]) == 3 + 6 + 0 + 2 + 4
    assert corpus.counts.tolist() == [0, 4, 3, 2, 2, 1, 1, 1, 1]
    assert corpus.stats["valid_tokens"] == 4 and corpus.stats["vocabulary"] == 8
    # What is cached reads back the same.
    again = load_corpus(corpus.directory)
    assert again.vocabulary == corpus.vocabulary
    for split, stream in corpus.streams.items():
        assert np.array_equal(again.streams[split], stream)


def test_a_token_outside_the_vocabulary_is_named_with_its_line(tmp_path):
    folder = _write(tmp_path / "corpus", {**TEXTS, "test": " a mat \n the bird sat \n"})
    with pytest.raises(TextFormatError, match=r"test\.txt, line 2: token 'bird' is not in") as e:
        TextCorpus("toy", folder, FILES).prepare(tmp_path / "data")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "data" / "processed").exists() or not any(
        (tmp_path / "data" / "processed").iterdir()
    )


def test_empty_files_missing_files_and_other_versions_are_refused(tmp_path):
    folder = _write(tmp_path / "corpus", {**TEXTS, "valid": ""})
    with pytest.raises(EmptyFileError, match="valid.txt is empty"):
        TextCorpus("toy", folder, FILES).prepare(tmp_path / "data")
    _write(folder, {**TEXTS, "valid": "\n\n"})
    with pytest.raises(TextFormatError, match="holds no tokens besides '<eos>'"):
        TextCorpus("toy", folder, FILES).prepare(tmp_path / "data")
    with pytest.raises(MissingFilesError, match="set dataset.path|Set dataset.path"):
        TextCorpus("toy", tmp_path / "nowhere", FILES).prepare(tmp_path / "data")
    _write(folder, TEXTS)
    md5 = {split: hashlib.md5(text.encode()).hexdigest() for split, text in TEXTS.items()}
    assert TextCorpus("toy", folder, FILES, md5=md5).prepare(tmp_path / "d1").num_tokens == 8
    with pytest.raises(DataError, match=r"not the published file's .* dataset\.md5=null"):
        TextCorpus("toy", folder, FILES, md5={**md5, "test": "0" * 32}).prepare(tmp_path / "d2")
    with pytest.raises(ValueError, match="dataset.files must name train, valid, test"):
        TextCorpus("toy", folder, {"train": "train.txt", "test": "test.txt"})


def test_the_synthetic_corpus_is_seeded_and_follows_a_zipf_law(tmp_path):
    source = SyntheticCorpus(vocabulary=500, num_phrases=400, train_tokens=50_000)
    first, second = source.build(tmp_path), source.build(tmp_path)
    for split in ("train", "valid", "test"):
        assert np.array_equal(first.streams[split], second.streams[split])
    other = SyntheticCorpus(vocabulary=500, num_phrases=400, train_tokens=50_000, seed=1)
    assert not np.array_equal(other.build(tmp_path).streams["train"], first.streams["train"])
    counts = np.sort(np.bincount(first.streams["train"], minlength=501)[1:])[::-1]
    # A long tail: the 10 most frequent tokens hold a large share, and a slope near -1 in
    # log-log over the head of the ranking.
    assert counts[:10].sum() > 0.2 * counts.sum()
    ranks = np.arange(1, 51)
    slope = np.polyfit(np.log(ranks), np.log(counts[:50]), 1)[0]
    assert -1.6 < slope < -0.6
    assert len(first.streams["train"]) == 50_000 and first.streams["train"].min() >= 1


def test_stretches_cover_every_target_once_and_continue_each_column(tmp_path):
    stream = torch.arange(1, 104)  # 103 tokens, 4 columns of 25 (3 dropped)
    columns = batchify(stream, 4)
    assert columns.shape == (4, 25) and columns[1, 0] == 26
    stretches = StreamStretches(columns, bptt=7)
    batches = [stretches[i] for i in range(len(stretches))]
    assert [b["inputs"].shape[1] for b in batches] == [7, 7, 7, 3]
    inputs = torch.cat([b["inputs"] for b in batches], dim=1)
    targets = torch.cat([b["targets"] for b in batches], dim=1)
    assert torch.equal(inputs, columns[:, :-1]) and torch.equal(targets, columns[:, 1:])
    with pytest.raises(IndexError):
        stretches[len(stretches)]


def test_the_data_module_serves_in_order_and_names_a_stretch_too_long(tmp_path):
    source = SyntheticCorpus(
        vocabulary=50, num_phrases=20, train_tokens=2000, valid_tokens=300, test_tokens=300
    )
    module = LMDataModule(source, tmp_path, batch_size=4, eval_batch_size=2, bptt=10)
    module.prepare_data()
    module.setup("fit")
    assert module.num_items == 50 and module.encoder_sizes == {"num_items": 50}
    assert module.item_counts.shape == (51,) and module.item_counts[0] == 0
    first, second = list(module.train_dataloader())[:2]
    assert first["inputs"].shape == (4, 10)
    assert torch.equal(first["targets"][:, -1], second["inputs"][:, 0])
    assert module.stats["items"] == 50 and module.stats["train_tokens"] == 2000
    too_long = LMDataModule(source, tmp_path, batch_size=4, eval_batch_size=2, bptt=150)
    with pytest.raises(
        ConfigError,
        match=r"^task\.datamodule\.bptt=150 is not shorter than the "
        r"valid stream's 2 columns of 150 tokens",
    ):
        too_long.setup("fit")
    with pytest.raises(ConfigError, match=r"task\.datamodule\.batch_size=0"):
        LMDataModule(source, tmp_path, batch_size=0)
