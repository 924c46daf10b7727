"""Every measured table on the results and benchmarks pages, and on their archive
(``docs/archive``), names the commit it was measured at and the code its numbers depend on, and
says so under the table when that code has changed since; the current pages stay short and hold
no stale table.

A table is a run of lines starting with ``|`` whose second line is a ``|---`` header separator.
Right before it each page carries a provenance marker (an HTML comment, which the site does not
show) and then the caption the reader sees, each its own paragraph::

    <!-- measured: 3bcc5bc; checked: 36e967b; code: @midx @softmax @seqrec @ml-100k
         recsys_midx/conf/protocol/recbole.yaml -->

    *Measured at 3bcc5bc (2026-11-24) on a 2-core x86_64 CPU, 24 GiB, torch 2.13.0+cpu.*

    | sampler | test NDCG@10 |
    |---|---|

Fields, separated by ``;``:

* ``measured``: the commits whose code made the table's numbers (the caption names each);
* ``checked`` (optional): a later commit up to which every change to the code below was read and
  found to leave the numbers as they are; the code is then compared from there;
* ``code``: the files and folders whose changes could change the numbers, as paths from the
  repository root or ``@group`` names of :data:`CODE_GROUPS`;
* ``stale`` (optional, last): why the numbers would now come out otherwise. The page then shows
  a paragraph starting with ``**Stale:**`` right under the table.

The code has changed when ``git diff -M <commit> HEAD`` lists a file under one of its paths for
the checked commit, or else for any measured one. A file moved without a change of content (a
100% rename) is not a change, so a module moved to another package keeps its tables current; a
file moved and edited is one. A path that names no file at HEAD nor at the commit is a mistake
in the marker. The checks that need the history skip where there is none (an unpacked sdist or
wheel, a shallow clone).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from recsys_midx.app.reproduce import PAGES as RENDERED_PAGES

ROOT = Path(__file__).resolve().parents[1]
#: The current pages, the docs pages ``recsys-midx-reproduce`` renders into, which hold only
#: current tables, and the archive of earlier ones, which keeps its tables' markers and stale notes.
CURRENT = tuple(page for page in RENDERED_PAGES if page.startswith("docs/"))
PAGES = (
    *CURRENT,
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "archive").glob("*.md")),
)

#: Paths that many tables share, by the name a marker gives them.
CODE_GROUPS: dict[str, tuple[str, ...]] = {
    # Samplers and their configs.
    "@full": (
        "recsys_midx/samplers/base.py",
        "recsys_midx/samplers/full.py",
        "recsys_midx/conf/sampler/full.yaml",
    ),
    "@uniform": (
        "recsys_midx/samplers/base.py",
        "recsys_midx/samplers/uniform.py",
        "recsys_midx/conf/sampler/uniform.yaml",
    ),
    "@popularity": (
        "recsys_midx/samplers/base.py",
        "recsys_midx/samplers/popularity.py",
        "recsys_midx/conf/sampler/popularity.yaml",
    ),
    "@midx": (
        "recsys_midx/samplers/base.py",
        "recsys_midx/samplers/midx.py",
        "recsys_midx/samplers/cell_draws.py",
        "recsys_midx/samplers/cell_layout.py",
        "recsys_midx/samplers/draws.py",
        "recsys_midx/samplers/last_stage.py",
        "recsys_midx/samplers/query_chunks.py",
        "recsys_midx/index",
        "recsys_midx/conf/sampler/midx.yaml",
        "recsys_midx/conf/sampler/midx_plain.yaml",
    ),
    "@exact-top": ("recsys_midx/samplers/exact_top.py",),
    # The softmax losses, exact and sampled.
    "@softmax": (
        "recsys_midx/losses/softmax.py",
        "recsys_midx/negatives",
        "recsys_midx/losses/sampled_softmax.py",
        "recsys_midx/losses/full_softmax.py",
        "recsys_midx/scoring",
        "recsys_midx/conf/loss/softmax.yaml",
    ),
    # What every `train.py` run goes through: the Lightning module's base, its callbacks, the
    # dot head and the root configs.
    "@train": (
        "recsys_midx/lit/base.py",
        "recsys_midx/lit/callbacks.py",
        "recsys_midx/lit/table_optimizers.py",
        "recsys_midx/heads/base.py",
        "recsys_midx/heads/dot.py",
        "recsys_midx/conf/config.yaml",
        "recsys_midx/conf/trainer/default.yaml",
        "recsys_midx/conf/callbacks/default.yaml",
        "recsys_midx/conf/head/dot.yaml",
    ),
    # Sequential recommendation: SASRec (its block in models/attention.py), its training samples,
    # split and metrics.
    "@seqrec": (
        "recsys_midx/models/base.py",
        "recsys_midx/models/sasrec.py",
        "recsys_midx/models/attention.py",
        "recsys_midx/lit/seqrec.py",
        "recsys_midx/metrics/ranking.py",
        "recsys_midx/data/datamodule.py",
        "recsys_midx/data/train_samples.py",
        "recsys_midx/data/resumable.py",
        "recsys_midx/data/splits.py",
        "recsys_midx/conf/task/seqrec.yaml",
        "recsys_midx/conf/model/sasrec.yaml",
        "recsys_midx/conf/split/leave_one_out.yaml",
    ),
    # Extreme classification: the MLP, its data, loss and metrics.
    "@xc": (
        "recsys_midx/models/xc_mlp.py",
        "recsys_midx/lit/xc.py",
        "recsys_midx/data/xc",
        "recsys_midx/metrics/xc.py",
        "recsys_midx/losses/multilabel.py",
        "recsys_midx/conf/task/xc.yaml",
        "recsys_midx/conf/model/xc_mlp.yaml",
        "recsys_midx/conf/dataset/xc-synthetic.yaml",
    ),
    # Datasets and protocols.
    "@ml-100k": (
        "recsys_midx/data/sources/movielens.py",
        "recsys_midx/data/preprocess.py",
        "recsys_midx/conf/dataset/ml-100k.yaml",
        "recsys_midx/conf/preprocess/sasrec.yaml",
    ),
    "@recbole": (
        "recsys_midx/conf/protocol/recbole.yaml",
        "recsys_midx/conf/preprocess/recbole.yaml",
    ),
    "@synthetic": (
        "recsys_midx/data/sources/synthetic.py",
        "recsys_midx/conf/dataset/synthetic.yaml",
        "recsys_midx/conf/demo",
    ),
    "@synthetic-100k": (
        "recsys_midx/data/sources/synthetic.py",
        "recsys_midx/conf/dataset/synthetic.yaml",
        "recsys_midx/conf/demo",
        "recsys_midx/conf/experiment/synthetic-100k.yaml",
    ),
    # The frontier sweeps run every sampler and time them to quality.
    "@frontier": (
        "recsys_midx/samplers",
        "recsys_midx/index",
        "recsys_midx/conf/sampler",
        "scripts/frontier.py",
        "recsys_midx/analysis/time_to_quality.py",
    ),
    # Benchmark scripts and what they build beside the samplers.
    "@bench-samplers": (
        "scripts/bench_samplers.py",
        "recsys_midx/samplers/diagnostics.py",
        "recsys_midx/analysis/timing.py",
    ),
    "@bench-training": (
        "scripts/bench_training.py",
        # The run is built as training builds it and stepped by the module's training_step.
        "recsys_midx/app/experiment.py",
        "recsys_midx/lit/base.py",
        "recsys_midx/lit/seqrec.py",
        "recsys_midx/conf/config.yaml",
        "recsys_midx/conf/task/seqrec.yaml",
        "recsys_midx/conf/model/sasrec.yaml",
        "recsys_midx/models/base.py",
        "recsys_midx/models/sasrec.py",
        "recsys_midx/models/attention.py",
        "recsys_midx/heads/base.py",
        "recsys_midx/heads/dot.py",
        "recsys_midx/data/sources/synthetic.py",
        "recsys_midx/data/train_samples.py",
        "recsys_midx/data/splits.py",
        "recsys_midx/analysis/timing.py",
    ),
}

_SEPARATOR = re.compile(r"^\|\s*:?-{3,}")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_FIELDS = ("measured", "checked", "code")


@dataclass
class Marker:
    """A parsed ``<!-- measured: ... -->`` comment."""

    measured: list[str]
    checked: str | None
    code: list[str]
    stale: str | None


@dataclass
class Table:
    """A table of a page with what surrounds it."""

    page: str
    line: int  # 1-based line of the header row
    marker: Marker | None
    problem: str | None  # why the marker could not be read
    caption: str
    note: str | None  # the paragraph under the table when it starts with **Stale:**

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse_marker(comment: str) -> Marker:
    """The fields of a marker comment (``<!--`` ... ``-->`` included).

    Raises:
        ValueError: on a comment that is not a well-formed marker.
    """
    body = comment.strip().removeprefix("<!--").removesuffix("-->").strip()
    stale = None
    head, sep, tail = body.partition("stale:")
    if sep:
        stale = " ".join(tail.split())
        if not stale:
            raise ValueError("`stale:` gives no reason")
    fields: dict[str, list[str]] = {}
    for part in head.split(";"):
        if not part.strip():
            continue
        key, colon, value = part.partition(":")
        key = key.strip()
        if not colon or key not in _FIELDS:
            raise ValueError(
                f"unknown field {part.strip()[:40]!r} (fields: measured, checked, code, stale)"
            )
        if key in fields:
            raise ValueError(f"`{key}:` given twice")
        fields[key] = value.split()
    measured, checked, code = (fields.get(key, []) for key in _FIELDS)
    if not measured or not code:
        raise ValueError("a marker needs `measured:` and `code:`")
    if len(checked) > 1:
        raise ValueError("`checked:` takes one commit")
    for commit in measured + checked:
        if not _COMMIT.match(commit):
            raise ValueError(f"{commit!r} is not a commit hash")
    for token in code:
        if token.startswith("@") and token not in CODE_GROUPS:
            raise ValueError(
                f"unknown code group {token} (see CODE_GROUPS in {Path(__file__).name})"
            )
    return Marker(measured, checked[0] if checked else None, code, stale)


def code_paths(marker: Marker) -> list[str]:
    """The marker's paths, groups expanded, each once."""
    paths: list[str] = []
    for token in marker.code:
        for path in CODE_GROUPS.get(token, (token,)):
            path = path.rstrip("/")
            if path not in paths:
                paths.append(path)
    return paths


def _paragraph_before(lines: list[str], index: int) -> tuple[int, int]:
    """``(first, last)`` lines of the paragraph that ends before ``index`` (blank lines between
    skipped); ``first > last`` when there is none."""
    last = index - 1
    while last >= 0 and not lines[last].strip():
        last -= 1
    first = last
    while first > 0 and lines[first - 1].strip():
        first -= 1
    return first, last


def page_tables(page: str, text: str) -> list[Table]:
    """Every table of a page, outside fenced code, with its marker, caption and note."""
    lines = text.splitlines()
    tables = []
    fenced = False
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif (
            not fenced
            and line.startswith("|")
            and index + 1 < len(lines)
            and _SEPARATOR.match(lines[index + 1])
        ):
            end = index + 1
            while end + 1 < len(lines) and lines[end + 1].startswith("|"):
                end += 1
            # A table right after another (a reproduced table's times) shares its marker.
            first, last = _paragraph_before(lines, index)
            if not (first <= last and lines[first].startswith("|")):
                tables.append(_table(page, lines, index, end))
            index = end
        index += 1
    return tables


def _table(page: str, lines: list[str], start: int, end: int) -> Table:
    caption_first, caption_last = _paragraph_before(lines, start)
    caption = " ".join(line.strip() for line in lines[caption_first : caption_last + 1])
    marker_first, marker_last = _paragraph_before(lines, caption_first)
    comment = "\n".join(lines[marker_first : marker_last + 1]).strip()
    marker, problem = None, None
    if caption.startswith("<!--"):
        problem = "no caption between the marker and the table"
    elif not (comment.startswith("<!--") and comment.endswith("-->")):
        problem = "no `<!-- measured: ... -->` marker before the caption"
    else:
        # Other comments may come before the marker in the same paragraph: read the last one.
        comment = comment[comment.rfind("<!--") :]
        if not comment.removeprefix("<!--").lstrip().startswith("measured:"):
            problem = "the comment before the caption is not a `measured:` marker"
        else:
            try:
                marker = parse_marker(comment)
            except ValueError as error:
                problem = str(error)
    after = end + 1
    while after < len(lines) and not lines[after].strip():
        after += 1
    note = None
    if after < len(lines) and lines[after].startswith("**Stale:**"):
        note_end = after
        while note_end + 1 < len(lines) and lines[note_end + 1].strip():
            note_end += 1
        note = " ".join(line.strip() for line in lines[after : note_end + 1])
    return Table(page, start + 1, marker, problem, caption, note)


def all_tables() -> list[Table]:
    """The tables of every page there is (a package installed without its docs has none)."""
    return [
        table
        for page in PAGES
        if (ROOT / page).is_file()
        for table in page_tables(page, (ROOT / page).read_text(encoding="utf-8"))
    ]


TABLES = all_tables()


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )


def _require_history() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout (an installed package or an unpacked archive)")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone lacks the commits the tables were measured at")


def _names_files(revision: str, path: str) -> bool:
    return bool(_git("ls-tree", "-r", "--name-only", revision, "--", path).stdout.strip())


def changed_files(base: str, paths: list[str]) -> list[str]:
    """Files under ``paths`` whose content differs between ``base`` and HEAD.

    A file renamed without a change of content (status ``R100`` in ``git diff -M``) from under
    ``paths`` is not a change, wherever it went; a file renamed and edited, deleted, added or
    modified is.
    """
    quick = _git("diff", "--quiet", "-M", base, "HEAD", "--", *paths)
    if quick.returncode == 0:
        return []
    assert quick.returncode == 1, quick.stderr
    # Compared without a pathspec, so that renames out of the listed paths are found as such.
    listing = _git("diff", "-M", "--name-status", "-z", base, "HEAD")
    assert listing.returncode == 0, listing.stderr
    fields = listing.stdout.split("\0")

    def listed(path: str) -> bool:
        return any(path == prefix or path.startswith(prefix + "/") for prefix in paths)

    changed = []
    index = 0
    while index < len(fields) and fields[index]:
        status = fields[index]
        if status[0] in "RC":
            old, new = fields[index + 1], fields[index + 2]
            index += 3
            if status == "R100" and listed(old):
                continue
            if listed(old) or listed(new):
                changed.append(f"{old} -> {new}")
        else:
            path = fields[index + 1]
            index += 2
            if listed(path):
                changed.append(path)
    return changed


@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.where)
def test_every_table_names_its_commit_and_code(table):
    assert table.marker is not None, (
        f"{table.where}: {table.problem}. Put `<!-- measured: COMMIT; code: PATHS -->` and a "
        f"caption `*Measured at COMMIT (DATE) on MACHINE.*` right before the table "
        f"(docs/contributing.md, 'Measured tables')."
    )
    assert table.caption.startswith("*Measured at "), (
        f"{table.where}: the caption right before the table starts with `*Measured at `, "
        f"not {table.caption[:60]!r}"
    )
    missing = [commit for commit in table.marker.measured if commit not in table.caption]
    assert not missing, f"{table.where}: the caption does not name {', '.join(missing)}"
    if table.marker.stale:
        assert table.note, (
            f"{table.where}: the marker says `stale: {table.marker.stale}`; the page shows a "
            f"`**Stale:** ...` paragraph right under the table"
        )
    else:
        assert table.note is None, (
            f"{table.where}: a `**Stale:**` note under the table needs `stale: <why>` in its marker"
        )


@pytest.mark.parametrize("page", CURRENT)
def test_the_current_pages_are_short_and_hold_no_stale_table(page):
    if not (ROOT / page).is_file():
        pytest.skip("the documentation pages are not in this copy")
    lines = (ROOT / page).read_text().splitlines()
    assert len(lines) <= 400, (
        f"{page} has {len(lines)} lines: move what is not current to docs/archive"
    )
    stale = [
        table.where
        for table in TABLES
        if table.page == page and table.marker and table.marker.stale
    ]
    assert not stale, f"stale tables on {page}: re-run them (recsys-midx-reproduce) or archive them"


def test_the_pages_have_tables_and_groups_are_used():
    if not all((ROOT / page).is_file() for page in PAGES):
        pytest.skip("the documentation pages are not in this copy")
    assert len({table.page for table in TABLES}) == len(PAGES)
    used = {token for table in TABLES if table.marker for token in table.marker.code}
    assert set(CODE_GROUPS) <= used, f"unused code groups: {sorted(set(CODE_GROUPS) - used)}"


@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.where)
def test_marker_commits_and_paths_exist(table):
    _require_history()
    marker = table.marker
    assert marker is not None, f"{table.where}: {table.problem}"
    commits = marker.measured + ([marker.checked] if marker.checked else [])
    for commit in commits:
        assert _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").returncode == 0, (
            f"{table.where}: {commit} is not a commit of this repository"
        )
        assert _git("merge-base", "--is-ancestor", commit, "HEAD").returncode == 0, (
            f"{table.where}: {commit} is not in the history of HEAD"
        )
    if marker.checked:
        for commit in marker.measured:
            assert _git("merge-base", "--is-ancestor", commit, marker.checked).returncode == 0, (
                f"{table.where}: checked {marker.checked} does not follow measured {commit}"
            )
    for path in code_paths(marker):
        assert _names_files("HEAD", path) or any(_names_files(c, path) for c in commits), (
            f"{table.where}: {path} names no file at HEAD nor at {', '.join(commits)}"
        )


@pytest.mark.parametrize("table", TABLES, ids=lambda table: table.where)
def test_table_code_unchanged_or_marked_stale(table):
    _require_history()
    marker = table.marker
    assert marker is not None, f"{table.where}: {table.problem}"
    if marker.stale:
        return
    paths = code_paths(marker)
    for base in [marker.checked] if marker.checked else marker.measured:
        changed = changed_files(base, paths)
        assert not changed, (
            f"{table.where}: code its numbers depend on changed since {base}: "
            f"{', '.join(changed)}. Re-run the table (new numbers, `measured:` and caption); or, "
            f"if no change can move its numbers (comments, docs, a branch it does not take), set "
            f"`checked: <HEAD's commit>`; or add `stale: <why>` to the marker and a `**Stale:**` "
            f"note under the table (docs/contributing.md, 'Measured tables')."
        )


def _commit_all(repo: Path, message: str) -> str:
    def run(*args: str) -> str:
        return subprocess.run(
            [
                "git",
                "-C",
                str(repo),
                "-c",
                "user.name=test",
                "-c",
                "user.email=test@example.com",
                "-c",
                "commit.gpgsign=false",
                *args,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    run("add", "-A")
    run("commit", "-q", "--allow-empty", "-m", message)
    return run("rev-parse", "HEAD")


def test_changed_files_takes_moves_without_edits_as_unchanged(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(40))
    (package / "moved.py").write_text(body)
    (package / "edited.py").write_text(body.replace("x +", "x -"))
    (package / "kept.py").write_text("VALUE = 1\n")
    base = _commit_all(tmp_path, "base")
    (package / "sub").mkdir()
    (package / "moved.py").rename(package / "sub" / "moved.py")
    (package / "edited.py").rename(package / "sub" / "edited.py")
    (package / "sub" / "edited.py").write_text(body.replace("x +", "x -") + "Y = 2\n")
    _commit_all(tmp_path, "move")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)

    assert changed_files(base, ["pkg/moved.py"]) == []
    assert changed_files(base, ["pkg/kept.py"]) == []
    assert changed_files(base, ["pkg/edited.py"]) == ["pkg/edited.py -> pkg/sub/edited.py"]
    # A folder: the pure move inside it is no change, the edited file is one.
    assert changed_files(base, ["pkg"]) == ["pkg/edited.py -> pkg/sub/edited.py"]
    # A file moved in from elsewhere adds code to the listed folder.
    assert sorted(changed_files(base, ["pkg/sub"])) == [
        "pkg/edited.py -> pkg/sub/edited.py",
        "pkg/moved.py -> pkg/sub/moved.py",
    ]


def test_parse_marker_reads_its_fields_and_refuses_mistakes():
    marker = parse_marker(
        "<!-- measured: abc1234 def5678; checked: 0123abc; code: @midx "
        "scripts/x.py; stale: one; two -->"
    )
    assert marker == Marker(
        ["abc1234", "def5678"], "0123abc", ["@midx", "scripts/x.py"], "one; two"
    )
    assert "recsys_midx/samplers/midx.py" in code_paths(marker)
    for comment in (
        "<!-- measured: abc1234 -->",
        "<!-- measured: nothex; code: a -->",
        "<!-- measured: abc1234; code: @nogroup -->",
        "<!-- measured: abc1234; code: a; when: now -->",
        "<!-- measured: abc1234; code: a; stale: -->",
    ):
        with pytest.raises(ValueError):
            parse_marker(comment)
