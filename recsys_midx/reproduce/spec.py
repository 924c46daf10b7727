"""A published table as a spec: the runs that make it and how the page shows them.

A spec is a small YAML file (``docs/results/tables/NAME.yaml``, the table's name the file's):

```yaml
title: The mission's command on ML-1M against the exact softmax
command: [dataset=ml-1m-sasrec, "dataset.path={data}/ml-1m-sasrec/ml-1m.txt"]
rows:
  - {name: midx, overrides: [sampler=midx]}
  - {name: exact softmax, overrides: [sampler=full], reference: true}
  - {name: uniform, overrides: [sampler=uniform], seeds: [0]}   # seeds: optional
seeds: [0, 1, 2]
threads: 2
max_time: "00:01:00:00"
device: cpu
metrics: [test/ndcg@10, test/hr@10]
validation: val/ndcg@10   # optional
ceiling: 0.4123           # optional
code: ["@midx", "@softmax", "@train", "@seqrec"]
checked: "1a2b3c4"   # optional
```

Every row trains ``python train.py COMMAND ROW_OVERRIDES seed=S threads=T`` once per seed;
``{data}`` stands for the folder of the benchmark data; a row with its own ``seeds`` runs those
instead (a frontier of one seed a row, say, with the best rows again at three). The reference
row is the one every other row's difference is measured against. ``validation`` names a metric
of each run's ``epochs.csv``: every run's curve of it against time is then collected too, and
the page shows how many minutes each row took to reach 90, 95 and 97% of the best value any run
reached, with a figure of the curves. ``ceiling``, the best value of the first metric any model
can reach (a synthetic catalog's, from its generator), adds each row's share of it. ``code``
lists the files (or groups of the results page's provenance test) whose changes could move the
numbers; ``checked``, a later commit up to which every change to that code was read and found to
leave the numbers as they are (the provenance marker's ``checked:``), lets a table stay current
across such a change without re-running it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recsys_midx.errors import ConfigError

#: The devices a spec may ask for.
DEVICES = ("cpu", "gpu")
#: A wall-time cap as Lightning's ``trainer.max_time`` takes it: ``DD:HH:MM:SS``.
_MAX_TIME = re.compile(r"^\d{2}:\d{2}:\d{2}:\d{2}$")
_FIELDS = (
    "title",
    "command",
    "rows",
    "seeds",
    "threads",
    "max_time",
    "device",
    "metrics",
    "validation",
    "ceiling",
    "code",
    "checked",
)
#: A commit as ``checked`` names it: 7 to 40 hex digits.
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_ROW_FIELDS = ("name", "overrides", "reference", "seeds")


@dataclass(frozen=True)
class Row:
    """One row of a table: a name, the overrides its runs add to the spec's command and, where
    it has its own, the seeds it runs with in place of the spec's."""

    name: str
    overrides: tuple[str, ...]
    reference: bool = False
    seeds: tuple[int, ...] | None = None

    @property
    def slug(self) -> str:
        """The row's name as a folder name."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")


@dataclass(frozen=True)
class TableSpec:
    """A published table: its runs, their seeds and budget, and what the page shows.

    Attributes:
        name: the table's name (its spec file's stem).
        title: what the table shows, in a sentence.
        command: the overrides every run starts with.
        rows: the table's rows, one of them the reference.
        seeds: the seeds each row runs with, unless it has its own (:attr:`Row.seeds`).
        threads: CPU threads of each run (``threads=``).
        max_time: the wall-time cap of each run (``trainer.max_time``), or ``None``.
        device: ``cpu`` or ``gpu``: the machine the numbers come from.
        metrics: the ``results.json`` metrics the table shows, the first the one compared.
        validation: the ``epochs.csv`` metric whose curves against time the page times and
            plots, or ``None``.
        code: the files and provenance groups the numbers depend on.
        ceiling: the first metric's best possible value, or ``None``.
        checked: the commit up to which changes to ``code`` were read and leave the numbers as
            they are, or ``None``.
    """

    name: str
    title: str
    command: tuple[str, ...]
    rows: tuple[Row, ...]
    seeds: tuple[int, ...]
    threads: int
    max_time: str | None
    device: str
    metrics: tuple[str, ...]
    code: tuple[str, ...]
    checked: str | None = None
    validation: str | None = None
    ceiling: float | None = None

    @property
    def reference(self) -> Row:
        """The row every other row is compared with."""
        return next(row for row in self.rows if row.reference)


def load_spec(path: str | Path) -> TableSpec:
    """Read and check a spec file.

    Args:
        path: the YAML file.

    Returns:
        The spec, named by the file's stem.

    Raises:
        ConfigError: one line naming the file and the first field that is missing or wrong.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such spec file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not YAML ({' '.join(str(error).split())})") from None
    return parse_spec(path.stem, raw, where=str(path))


def parse_spec(name: str, raw: Any, where: str | None = None) -> TableSpec:
    """Check a spec's fields (see the module docstring) and build it.

    Raises:
        ConfigError: ``"WHERE: FIELD: what is wrong"`` for the first field that is.

    Example:
        >>> spec = parse_spec("tiny", {"command": ["debug=default"], "seeds": [0],
        ...     "rows": [{"name": "full", "overrides": ["sampler=full"], "reference": True}],
        ...     "metrics": ["test/ndcg@10"], "code": ["recsys_midx/losses"]})
        >>> spec.reference.name, spec.threads, spec.device
        ('full', 1, 'cpu')
        >>> parse_spec("tiny", {"rows": []})
        Traceback (most recent call last):
        ...
        recsys_midx.errors.ConfigError: tiny: command: missing
    """
    where = where or name

    def fail(field: str, problem: str) -> ConfigError:
        return ConfigError(f"{where}: {field}: {problem}")

    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a spec is a mapping of {', '.join(_FIELDS)}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise fail(unknown[0], f"unknown field (fields: {', '.join(_FIELDS)})")
    for field in ("command", "rows", "seeds", "metrics", "code"):
        if field not in raw:
            raise fail(field, "missing")
    command = _strings(raw["command"], "command", fail)
    seeds = _seeds(raw["seeds"], "seeds", fail)
    rows = _rows(raw["rows"], fail)
    threads = raw.get("threads", 1)
    if not _is_int(threads) or threads < 1:
        raise fail("threads", f"{threads!r}: give a positive integer")
    max_time = raw.get("max_time")
    if max_time is not None and not (isinstance(max_time, str) and _MAX_TIME.match(max_time)):
        raise fail("max_time", f"{max_time!r}: give DD:HH:MM:SS, e.g. 00:01:00:00")
    device = raw.get("device", "cpu")
    if device not in DEVICES:
        raise fail("device", f"{device!r}: choose one of {', '.join(DEVICES)}")
    metrics = _strings(raw["metrics"], "metrics", fail)
    if not all(metric.startswith(("val/", "test/")) for metric in metrics):
        raise fail("metrics", "name results.json metrics, e.g. test/ndcg@10")
    validation = raw.get("validation")
    if validation is not None and not (
        isinstance(validation, str) and validation.startswith("val/")
    ):
        raise fail("validation", f"{validation!r}: name a validation metric, e.g. val/ndcg@10")
    ceiling = raw.get("ceiling")
    if ceiling is not None and not (
        isinstance(ceiling, float | int) and not isinstance(ceiling, bool) and ceiling > 0
    ):
        raise fail("ceiling", f"{ceiling!r}: give the first metric's best value, e.g. 0.41")
    checked = raw.get("checked")
    if checked is not None and not (isinstance(checked, str) and _COMMIT.match(checked)):
        raise fail("checked", f"{checked!r}: give a commit, e.g. 45fcc1b")
    return TableSpec(
        name=name,
        title=str(raw.get("title", name)),
        command=command,
        rows=rows,
        seeds=seeds,
        threads=threads,
        max_time=max_time,
        device=device,
        metrics=metrics,
        code=_strings(raw["code"], "code", fail),
        checked=checked,
        validation=validation,
        ceiling=None if ceiling is None else float(ceiling),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seeds(value: Any, field: str, fail: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(_is_int(s) for s in value):
        raise fail(field, "give a non-empty list of integers")
    if len(set(value)) != len(value):
        raise fail(field, "a seed is listed twice")
    return tuple(value)


def _strings(value: Any, field: str, fail: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise fail(field, "give a non-empty list of strings")
    return tuple(value)


def _rows(raw: Any, fail: Any) -> tuple[Row, ...]:
    if not isinstance(raw, list) or not raw:
        raise fail("rows", "give a non-empty list of rows")
    rows = []
    for index, entry in enumerate(raw):
        field = f"rows[{index}]"
        if not isinstance(entry, dict):
            raise fail(field, "a row is a mapping of name, overrides, reference and seeds")
        unknown = sorted(set(entry) - set(_ROW_FIELDS))
        if unknown:
            raise fail(f"{field}.{unknown[0]}", f"unknown (fields: {', '.join(_ROW_FIELDS)})")
        if not isinstance(entry.get("name"), str) or not entry["name"].strip():
            raise fail(f"{field}.name", "give the row a name")
        overrides = entry.get("overrides", [])
        if not isinstance(overrides, list) or not all(isinstance(v, str) for v in overrides):
            raise fail(f"{field}.overrides", "give a list of command-line overrides")
        reference = entry.get("reference", False)
        if not isinstance(reference, bool):
            raise fail(f"{field}.reference", f"{reference!r}: true or false")
        seeds = _seeds(entry["seeds"], f"{field}.seeds", fail) if "seeds" in entry else None
        rows.append(Row(entry["name"], tuple(overrides), reference, seeds))
    if sum(row.reference for row in rows) != 1:
        raise fail("rows", "mark exactly one row with reference: true")
    slugs = [row.slug for row in rows]
    if len(set(slugs)) != len(slugs):
        raise fail("rows", "two rows have the same name")
    return tuple(rows)
