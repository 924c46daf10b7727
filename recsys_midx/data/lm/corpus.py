"""Where a language-modelling corpus comes from, and its processed Parquet cache.

A source (:class:`TextCorpus` for token files such as Penn Treebank's and WikiText-2's,
:class:`~recsys_midx.data.lm.synthetic.SyntheticCorpus` for generated text) says what determines
its content and how to produce its vocabulary and its three token streams;
:meth:`CorpusSource.prepare` caches them in a processed folder
``<data_dir>/processed/<name>-<key>/`` keyed by the source's fingerprint and
:data:`SCHEMA_VERSION` (see :mod:`recsys_midx.data.cache`):

``train.parquet``, ``valid.parquet``, ``test.parquet``
    One row per token of the split's stream, in order: ``token`` (its id, ``1..V``).
``vocabulary.parquet``
    One row per id ``1..V`` in order: ``token`` (the text) and ``count`` (training occurrences).
``stats.json``
    ``vocabulary`` and each split's ``tokens``.
``settings.json``
    ``name``, ``schema_version`` and ``fingerprint``: what the folder's key was computed from.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recsys_midx.data.cache import (
    SETTINGS_FILE,
    STATS_FILE,
    cached_source,
    checked_contents,
    checked_name,
    write_json,
)
from recsys_midx.data.download import file_md5
from recsys_midx.data.errors import DataError, EmptyFileError, MissingFilesError, TextFormatError

#: Bump whenever the processed files change meaning or layout: old caches then stop matching.
SCHEMA_VERSION = 1

#: The three streams of a corpus, in the order they are used.
SPLITS = ("train", "valid", "test")

_VOCABULARY_FILE = "vocabulary.parquet"
_FILES = (*(f"{split}.parquet" for split in SPLITS), _VOCABULARY_FILE, STATS_FILE, SETTINGS_FILE)


@dataclass(frozen=True, eq=False)
class Corpus:
    """A processed corpus, loaded from its cache folder.

    Attributes:
        name: the source's name.
        directory: the processed folder.
        vocabulary: the text of ids ``1..V`` (``vocabulary[i - 1]`` is id ``i``).
        counts: ``[V+1]`` training occurrences of each id (entry 0 is 0: no token has id 0).
        streams: each split's token ids, in order (``int64``).
        stats: the content of ``stats.json``.
    """

    name: str
    directory: Path
    vocabulary: list[str]
    counts: np.ndarray
    streams: dict[str, np.ndarray]
    stats: dict[str, Any]

    @property
    def num_tokens(self) -> int:
        """``V``, the vocabulary's size."""
        return len(self.vocabulary)


@dataclass(frozen=True)
class BuiltCorpus:
    """What a source produces before it is cached: the vocabulary and the three id streams."""

    vocabulary: list[str]
    streams: dict[str, np.ndarray]


class CorpusSource(abc.ABC):
    """Where the text of a language-modelling corpus comes from.

    Subclasses say what determines their content (:meth:`fingerprint`) and how to produce the
    vocabulary and the streams (:meth:`build`); :meth:`prepare` caches them as Parquet.

    Args:
        name: the corpus's name; it labels the processed folder, so it must be a plain file name
            (letters, digits, ``.``, ``_``, ``-``).

    Raises:
        ValueError: if the name is not a plain file name.
    """

    def __init__(self, name: str) -> None:
        self.name = checked_name(name)

    @abc.abstractmethod
    def fingerprint(self, data_dir: Path) -> dict[str, Any]:
        """Everything that determines the corpus (generator settings, file names and sizes).

        Args:
            data_dir: the data root.

        Returns:
            A JSON-compatible dict; the processed folder is keyed by it.
        """

    @abc.abstractmethod
    def build(self, data_dir: Path) -> BuiltCorpus:
        """Produce the vocabulary and the streams.

        Args:
            data_dir: the data root.

        Raises:
            DataError: the text cannot be found or read.
        """

    def prepare(self, data_dir: str | Path) -> Corpus:
        """Load the processed corpus, building and caching it first if needed.

        Args:
            data_dir: the data root (processed folders go to ``data_dir/processed``).

        Returns:
            The corpus.

        Raises:
            DataError: see :meth:`build`; a cache folder written by another schema version.

        Example:
            >>> from recsys_midx.data.lm import SyntheticCorpus
            >>> SyntheticCorpus(train_tokens=2000, valid_tokens=200, test_tokens=200).prepare(
            ...     "/tmp/data").num_tokens
            1000
        """
        data_dir = Path(data_dir).expanduser()
        return cached_source(
            data_dir,
            self.name,
            SCHEMA_VERSION,
            self.fingerprint(data_dir),
            lambda: self.build(data_dir),
            _write_corpus,
            load_corpus,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _write_corpus(directory: Path, built: BuiltCorpus) -> None:
    for split in SPLITS:
        table = pa.table({"token": pa.array(built.streams[split], pa.int32())})
        pq.write_table(table, directory / f"{split}.parquet")
    counts = np.bincount(built.streams["train"], minlength=len(built.vocabulary) + 1)
    vocabulary = pa.table(
        {"token": pa.array(built.vocabulary, pa.string()), "count": pa.array(counts[1:])}
    )
    pq.write_table(vocabulary, directory / _VOCABULARY_FILE)
    stats = {
        "vocabulary": len(built.vocabulary),
        **{f"{split}_tokens": len(built.streams[split]) for split in SPLITS},
        "train_tokens_seen": int((counts[1:] > 0).sum()),
    }
    write_json(directory / STATS_FILE, stats, sort_keys=False)


def load_corpus(directory: Path) -> Corpus:
    """Read a processed folder written by :meth:`CorpusSource.prepare`.

    Args:
        directory: the processed folder.

    Returns:
        The corpus it holds.

    Raises:
        MissingFilesError: a file of the folder is missing.
        DataError: the folder was written with another :data:`SCHEMA_VERSION`.
    """
    directory = Path(directory)
    settings, stats = checked_contents(directory, _FILES, SCHEMA_VERSION)
    vocabulary = pq.read_table(directory / _VOCABULARY_FILE)
    counts = np.concatenate([[0], vocabulary.column("count").to_numpy()]).astype(np.int64)
    streams = {
        split: pq.read_table(directory / f"{split}.parquet").column("token").to_numpy()
        for split in SPLITS
    }
    return Corpus(
        settings["name"],
        directory,
        vocabulary.column("token").to_pylist(),
        counts,
        {split: stream.astype(np.int64) for split, stream in streams.items()},
        stats,
    )


class TextCorpus(CorpusSource):
    """A corpus of three tokenised text files: train, valid and test.

    Each line is split on whitespace and ends with ``eos`` (an empty line is ``eos`` alone), as
    the word-level language-modelling literature reads Penn Treebank and WikiText. The
    vocabulary is the training file's tokens, most frequent first (ties in order of first
    appearance); a validation or test token outside it is an error, since these corpora map
    rare words to ``<unk>`` before they are published. The files are read from ``path``; with
    ``md5`` given, each must have the published checksum.

    Args:
        name: the corpus's name, e.g. ``ptb``.
        path: the folder holding the three files.
        files: the file of each split, ``{"train": ..., "valid": ..., "test": ...}``.
        eos: the token that ends every line.
        md5: the published md5 of each split's file; ``None``: read any version.

    Raises:
        ValueError: if ``files`` (or ``md5``) does not name exactly the three splits.

    Example:
        ```python
        source = TextCorpus("ptb", "~/data/ptb", {"train": "ptb.train.txt",
                                                  "valid": "ptb.valid.txt",
                                                  "test": "ptb.test.txt"})
        corpus = source.prepare("datasets")  # corpus.num_tokens == 10000
        ```
    """

    def __init__(
        self,
        name: str,
        path: str | Path,
        files: Mapping[str, str],
        eos: str = "<eos>",
        md5: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(name)
        self.path = Path(path).expanduser()
        self.files = _per_split(files, "files")
        self.eos = eos
        self.md5 = None if md5 is None else _per_split(md5, "md5")

    def _paths(self) -> dict[str, Path]:
        paths = {split: self.path / self.files[split] for split in SPLITS}
        missing = [self.files[split] for split in SPLITS if not paths[split].is_file()]
        if missing:
            raise MissingFilesError(
                self.path, missing, "Set dataset.path to the folder that holds the corpus."
            )
        return paths

    def fingerprint(self, data_dir: Path) -> dict[str, Any]:
        paths = self._paths()
        return {
            "eos": self.eos,
            **{
                split: {"file": self.files[split], "bytes": paths[split].stat().st_size}
                for split in SPLITS
            },
        }

    def build(self, data_dir: Path) -> BuiltCorpus:
        paths = self._paths()
        for split, path in paths.items():
            if path.stat().st_size == 0:
                raise EmptyFileError(path)
            if self.md5 is not None and (actual := file_md5(path)) != self.md5[split]:
                raise DataError(
                    f"{path}: md5 {actual} is not the published file's {self.md5[split]}; set "
                    "dataset.md5=null to read another version"
                )
        train_lines = self._lines(paths["train"])
        counts = Counter(token for line in train_lines for token in line)
        # Counter keeps first-appearance order and sorted() is stable: ties stay in that order.
        vocabulary = sorted(counts, key=counts.__getitem__, reverse=True)
        ids = {token: index + 1 for index, token in enumerate(vocabulary)}
        streams = {"train": self._ids(train_lines, ids, paths["train"])}
        for split in SPLITS[1:]:
            streams[split] = self._ids(self._lines(paths[split]), ids, paths[split])
        return BuiltCorpus(vocabulary, streams)

    def _lines(self, path: Path) -> list[list[str]]:
        with path.open(encoding="utf-8") as handle:
            lines = [[*line.split(), self.eos] for line in handle]
        if all(len(line) == 1 for line in lines):
            raise TextFormatError(path, None, f"holds no tokens besides {self.eos!r}")
        return lines

    def _ids(self, lines: list[list[str]], ids: Mapping[str, int], path: Path) -> np.ndarray:
        stream = np.fromiter(
            (ids.get(token, 0) for line in lines for token in line),
            dtype=np.int64,
            count=sum(len(line) for line in lines),
        )
        if (unknown := np.flatnonzero(stream == 0)).size:
            line, token = _locate(lines, int(unknown[0]))
            raise TextFormatError(
                path,
                line,
                f"token {token!r} is not in the vocabulary of {self.files['train']} "
                f"({unknown.size:,} such tokens in the file); map rare words to one token, "
                "e.g. <unk>, as the published corpora do",
            )
        return stream

    def __repr__(self) -> str:
        return f"TextCorpus(name={self.name!r}, path={str(self.path)!r})"


def _per_split(mapping: Mapping[str, str], setting: str) -> dict[str, str]:
    values = {str(split): str(value) for split, value in dict(mapping).items()}
    if sorted(values) != sorted(SPLITS):
        raise ValueError(
            f"dataset.{setting} must name {', '.join(SPLITS)} and nothing else, got {values}"
        )
    return values


def _locate(lines: Sequence[list[str]], position: int) -> tuple[int, str]:
    """The 1-based line and the text of the token at ``position`` of the stream."""
    for number, line in enumerate(lines, start=1):
        if position < len(line):
            return number, line[position]
        position -= len(line)
    raise IndexError(position)
