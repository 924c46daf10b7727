"""Tests of downloads, archive extraction, the MovieLens source and the processed cache.

Everything is offline: archives are built by the tests from made-up rows and served by a local
HTTP server. The server and archive helpers (``FileServer``, ``server``, ``zip_bytes``,
``tar_bytes``, ``publish``, ``tree``) are shared with the ``test_sources_*`` modules.
"""

from __future__ import annotations

import functools
import http.server
import io
import logging
import pickle
import re
import stat
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

import recsys_midx.data.pipeline as pipeline_module
from recsys_midx.data import (
    ChecksumError,
    CorruptArchiveError,
    DataError,
    DownloadError,
    EmptyDatasetError,
    MissingFilesError,
    MovieLens,
    UnsafeArchiveError,
)
from recsys_midx.data.download import (
    download,
    extract_archive,
    extract_tar,
    extract_zip,
    file_md5,
)
from recsys_midx.data.pipeline import cache_directory

#: Served with a Content-Length larger than the body, as a dropped connection looks.
SHORT_PATH = "/short.bin"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != SHORT_PATH:
            super().do_GET()
            return
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"x" * 10)
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Keep request logs out of the test output."""


class FileServer:
    """A local HTTP server publishing the files of ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        handler = functools.partial(_QuietHandler, directory=str(root))
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self._running = True

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/{name}"

    def stop(self) -> None:
        if self._running:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()
            self._running = False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FileServer]:
    root = tmp_path / "served"
    root.mkdir()
    served = FileServer(root)
    yield served
    served.stop()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    """A zip archive holding ``files`` (name -> content)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in files.items():
            zf.writestr(name, content)
    return buffer.getvalue()


# Users 1..8 rate items 1..6 (the 5-core), user 9 rates two items and item 99 has one rating:
# both fall out of a 5-core. Each user's rows are written newest first.
RATINGS = [
    (user, item, (user + item) % 5 + 1, 978_300_000 + 1000 * user - 10 * item)
    for user in range(1, 9)
    for item in range(1, 7)
] + [(9, 1, 4, 978_400_000), (9, 2, 3, 978_400_010), (1, 99, 5, 978_300_500)]


def _ml1m_zip() -> bytes:
    """An archive in the ml-1m layout, with made-up rows."""
    ratings = "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in RATINGS)
    movies = "1::Café au lait (1994)::Comedy\n2::Straße (1999)::Drama\n99::Ño (2000)::Drama\n"
    users = "".join(f"{u}::F::25::10::12345\n" for u in range(1, 10))
    return zip_bytes(
        {
            "ml-1m/ratings.dat": ratings.encode(),
            "ml-1m/movies.dat": movies.encode("latin-1"),
            "ml-1m/users.dat": users.encode(),
        }
    )


def publish(server: FileServer, name: str, content: bytes) -> tuple[str, str]:
    """Serve ``content`` as ``name``; returns its url and md5."""
    path = server.root / name
    path.write_bytes(content)
    return server.url(name), file_md5(path)


def tar_bytes(files: dict[str, bytes], mode: str = "w:gz") -> bytes:
    """A tar archive (gzipped by default) holding ``files`` (name -> content)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tf:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tf.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def tree(folder: Path) -> list[str]:
    """Every path under ``folder``, relative and sorted (empty if it does not exist)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def test_movielens_downloads_checks_extracts_and_prepares(
    server: FileServer, tmp_path: Path
) -> None:
    url, md5 = publish(server, "ml-1m.zip", _ml1m_zip())
    data_dir = tmp_path / "data"
    ds = MovieLens("ml-1m-mini", "ml-1m", url=url, md5=md5).prepare(data_dir)

    assert (ds.num_users, ds.num_items, len(ds.interactions)) == (8, 6, 48)
    assert ds.name == "ml-1m-mini"
    assert re.fullmatch(r"ml-1m-mini-[0-9a-f]{12}", ds.directory.name)
    assert ds.directory.parent == data_dir / "processed"
    assert tree(ds.directory) == [
        "interactions.parquet",
        "item_map.parquet",
        "settings.json",
        "stats.json",
        "user_map.parquet",
    ]
    assert tree(data_dir / "raw") == [
        "ml-1m",
        "ml-1m.zip",
        "ml-1m/ml-1m",
        "ml-1m/ml-1m/movies.dat",
        "ml-1m/ml-1m/ratings.dat",
        "ml-1m/ml-1m/users.dat",
    ]
    # Extraction copies bytes: the latin-1 titles are intact.
    titles = (data_dir / "raw/ml-1m/ml-1m/movies.dat").read_text(encoding="latin-1")
    assert "Café au lait" in titles

    first_user = ds.interactions[ds.interactions["user_id"] == 1]
    assert first_user["timestamp"].is_monotonic_increasing
    assert first_user["item_id"].tolist() == [6, 5, 4, 3, 2, 1]  # newest first in the file
    assert first_user["rating"].tolist() == [3.0, 2.0, 1.0, 5.0, 4.0, 3.0]
    item_map = pd.read_parquet(ds.directory / "item_map.parquet")
    assert item_map["raw_id"].tolist() == ["1", "2", "3", "4", "5", "6"]
    assert ds.stats["rows_after_step"]["input"] == len(RATINGS)


def test_second_prepare_reuses_the_cache_offline(
    server: FileServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, md5 = publish(server, "ml-1m.zip", _ml1m_zip())
    data_dir = tmp_path / "data"
    first = MovieLens("ml-1m", "ml-1m", url=url, md5=md5).prepare(data_dir)
    server.stop()
    with caplog.at_level(logging.INFO, logger="recsys_midx.data"):
        second = MovieLens("ml-1m", "ml-1m", url=url, md5=md5).prepare(data_dir)
    assert second.directory == first.directory
    pd.testing.assert_frame_equal(second.interactions, first.interactions)
    assert any("Reusing processed dataset" in r.getMessage() for r in caplog.records)


def test_wrong_md5_raises_and_leaves_nothing(server: FileServer, tmp_path: Path) -> None:
    url, md5 = publish(server, "ml-1m.zip", _ml1m_zip())
    data_dir = tmp_path / "data"
    wrong = "0" * 32
    with pytest.raises(ChecksumError) as info:
        MovieLens("ml-1m", "ml-1m", url=url, md5=wrong).prepare(data_dir)
    message = str(info.value)
    assert url in message and wrong in message and md5 in message
    assert (info.value.expected, info.value.actual) == (wrong, md5)
    assert tree(data_dir / "raw") == []
    assert tree(data_dir / "processed") == []


def test_download_reuses_a_verified_file_and_replaces_a_stale_one(
    server: FileServer, tmp_path: Path
) -> None:
    url, md5 = publish(server, "blob.bin", b"fresh content")
    dest = tmp_path / "raw" / "blob.bin"
    dest.parent.mkdir()
    dest.write_bytes(b"stale content")
    assert download(url, dest, md5, progress=False) == dest
    assert dest.read_bytes() == b"fresh content"
    server.stop()
    assert download(url, dest, md5.upper(), progress=False).read_bytes() == b"fresh content"
    assert tree(dest.parent) == ["blob.bin"]


def test_download_reports_http_errors(server: FileServer, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    with pytest.raises(DownloadError, match="404") as info:
        download(server.url("absent.zip"), raw / "absent.zip", None, progress=False)
    assert info.value.url == server.url("absent.zip")
    assert tree(raw) == []


def test_download_detects_a_short_body(server: FileServer, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    with pytest.raises(DownloadError, match="short.bin"):
        download(server.url(SHORT_PATH.lstrip("/")), raw / "short.bin", None, progress=False)
    assert tree(raw) == []


def _symlink_entry() -> zipfile.ZipInfo:
    info = zipfile.ZipInfo("data/link")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("../evil.txt", "'..' component"),
        ("data/../../evil.txt", "'..' component"),
        ("/tmp/evil.txt", "absolute path"),
        ("C:/evil.txt", "absolute path"),
        (_symlink_entry(), "symbolic link"),
    ],
)
def test_unsafe_archives_are_refused(
    tmp_path: Path, entry: str | zipfile.ZipInfo, reason: str
) -> None:
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("data/fine.txt", "ok")
        zf.writestr(entry, "/etc/passwd")
    dest = tmp_path / "out" / "bad"
    with pytest.raises(UnsafeArchiveError, match=reason) as info:
        extract_zip(archive, dest)
    name = entry.filename if isinstance(entry, zipfile.ZipInfo) else entry
    assert info.value.member == name and repr(name) in str(info.value)
    assert tree(tmp_path) == ["bad.zip"]


def test_unsafe_archive_is_refused_by_the_source(server: FileServer, tmp_path: Path) -> None:
    url, md5 = publish(
        server,
        "ml-1m.zip",
        zip_bytes(
            {
                "ml-1m/ratings.dat": b"1::1::5::1\n",
                "../evil": b"x",
            }
        ),
    )
    with pytest.raises(UnsafeArchiveError, match="'../evil'"):
        MovieLens("ml-1m", "ml-1m", url=url, md5=md5).prepare(tmp_path / "data")
    assert not (tmp_path / "data" / "raw" / "ml-1m").exists()
    assert not (tmp_path / "data" / "evil").exists()


def test_truncated_archive_is_a_clear_error(tmp_path: Path) -> None:
    content = _ml1m_zip()
    archive = tmp_path / "cut.zip"
    archive.write_bytes(content[: len(content) // 2])
    with pytest.raises(CorruptArchiveError, match="cut.zip is not a readable zip archive"):
        extract_zip(archive, tmp_path / "cut")
    assert tree(tmp_path) == ["cut.zip"]


def test_corrupt_member_is_a_clear_error(tmp_path: Path) -> None:
    content = bytearray(zip_bytes({"data/a.txt": b"hello world " * 100}))
    content[60] ^= 0xFF  # inside the compressed data of the only member
    archive = tmp_path / "bad.zip"
    archive.write_bytes(bytes(content))
    with pytest.raises(CorruptArchiveError, match="bad.zip"):
        extract_zip(archive, tmp_path / "bad")
    assert tree(tmp_path) == ["bad.zip"]


def _tar_entry(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (_tar_entry("../evil.txt", tarfile.REGTYPE), "'..' component"),
        (_tar_entry("data/../../evil.txt", tarfile.REGTYPE), "'..' component"),
        (_tar_entry("/tmp/evil.txt", tarfile.REGTYPE), "absolute path"),
        (_tar_entry("data/link", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link"),
        (_tar_entry("data/hard", tarfile.LNKTYPE, "data/fine.txt"), "hard link"),
        (_tar_entry("data/dev", tarfile.CHRTYPE), "device"),
        (_tar_entry("data/fifo", tarfile.FIFOTYPE), "FIFO"),
    ],
)
def test_unsafe_tar_archives_are_refused(
    tmp_path: Path, entry: tarfile.TarInfo, reason: str
) -> None:
    archive = tmp_path / "bad.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        fine = tarfile.TarInfo("data/fine.txt")
        fine.size = 2
        tf.addfile(fine, io.BytesIO(b"ok"))
        if entry.isreg():
            entry.size = 4
            tf.addfile(entry, io.BytesIO(b"evil"))
        else:
            tf.addfile(entry)
    dest = tmp_path / "out" / "bad"
    with pytest.raises(UnsafeArchiveError, match=reason) as info:
        extract_tar(archive, dest)
    assert info.value.member == entry.name and repr(entry.name) in str(info.value)
    # Nothing is left: neither the folder nor the entry extracted before the bad one.
    assert tree(tmp_path / "out") == []


def test_tar_archives_are_extracted_atomically_and_reused(tmp_path: Path) -> None:
    archive = tmp_path / "data.tgz"
    archive.write_bytes(tar_bytes({"top/a.txt": b"alpha", "top/sub/b.txt": b"beta"}))
    dest = extract_archive(archive, tmp_path / "out")
    assert tree(dest) == ["top", "top/a.txt", "top/sub", "top/sub/b.txt"]
    assert (dest / "top/sub/b.txt").read_bytes() == b"beta"
    archive.unlink()  # an extracted folder is complete, so it is reused without the archive
    assert extract_archive(archive, tmp_path / "out") == dest


@pytest.mark.parametrize("mode", ["w:gz", "w"])
def test_truncated_tar_is_a_clear_error(tmp_path: Path, mode: str) -> None:
    content = tar_bytes({f"top/{i}.txt": bytes(range(256)) * 40 for i in range(5)}, mode)
    archive = tmp_path / ("cut.tar.gz" if mode == "w:gz" else "cut.tar")
    archive.write_bytes(content[: len(content) // 2])
    with pytest.raises(CorruptArchiveError, match="is not a readable tar archive"):
        extract_tar(archive, tmp_path / "cut")
    assert tree(tmp_path) == [archive.name]


def test_archive_kind_comes_from_the_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"not a \.zip or \.tar"):
        extract_archive(tmp_path / "data.rar", tmp_path / "out")


def test_truncated_download_without_md5_is_removed(server: FileServer, tmp_path: Path) -> None:
    content = _ml1m_zip()
    url, _ = publish(server, "ml-1m.zip", content[: len(content) // 2])
    data_dir = tmp_path / "data"
    with pytest.raises(CorruptArchiveError):
        MovieLens("ml-1m", "ml-1m", url=url, md5=None).prepare(data_dir)
    # The bad archive is gone, so the next run downloads it again instead of reusing it.
    assert tree(data_dir / "raw") == []
    assert tree(data_dir / "processed") == []


def _write_ml100k(folder: Path) -> None:
    """An extracted ml-100k folder with made-up rows: 6 users x 5 items, plus a stray rating."""
    folder.mkdir(parents=True)
    rows = [
        (u, i, (u * i) % 5 + 1, 880_000_000 + 100 * u + i) for u in range(1, 7) for i in range(1, 6)
    ] + [(7, 1, 3, 880_000_000)]
    (folder / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows))
    (folder / "u.item").write_bytes("1|Café (1995)|01-Jan-1995||http://x|0\n".encode("latin-1"))


def test_raw_dir_reads_an_extracted_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ml-100k"
    _write_ml100k(folder)
    data_dir = tmp_path / "data"
    source = MovieLens(
        "ml-100k",
        "ml-100k",
        url=None,
        md5=None,
        raw_dir=str(folder),
        preprocess={"user_core": 2, "item_core": 2},
    )
    ds = source.prepare(data_dir)
    assert (ds.num_users, ds.num_items, len(ds.interactions)) == (6, 5, 30)
    assert not (data_dir / "raw").exists()
    stat = (folder / "u.data").stat()
    assert source.fingerprint() == {
        "source": "movielens",
        "variant": "ml-100k",
        "raw_dir": str(folder.resolve()),
        "files": [[stat.st_size, stat.st_mtime_ns]],
    }


def test_raw_dir_without_the_ratings_file_names_what_is_missing(tmp_path: Path) -> None:
    folder = tmp_path / "ml-100k"
    _write_ml100k(folder)
    (folder / "u.data").unlink()
    source = MovieLens("ml-100k", "ml-100k", url=None, md5=None, raw_dir=str(folder))
    with pytest.raises(MissingFilesError) as info:
        source.prepare(tmp_path / "data")
    assert info.value.folder == folder and info.value.missing == ("u.data",)
    assert str(folder) in str(info.value) and "'u.data'" in str(info.value)


def test_csv_variants_are_read(tmp_path: Path) -> None:
    folder = tmp_path / "ml-20m"
    folder.mkdir()
    rows = [(u, i, 3.5, 1_100_000_000 + u * 10 + i) for u in range(1, 4) for i in (10, 20)]
    (folder / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n" + "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in rows)
    )
    source = MovieLens(
        "ml-20m",
        "ml-20m",
        url=None,
        md5=None,
        raw_dir=str(folder),
        preprocess={"user_core": 0, "item_core": 0},
    )
    raw = source.load_raw(tmp_path)
    assert raw[["user", "item", "rating", "timestamp"]].values.tolist() == [list(r) for r in rows]


def test_malformed_ratings_name_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "ml-1m"
    folder.mkdir()
    (folder / "ratings.dat").write_text("1::2::oops::4\n")
    source = MovieLens("ml-1m", "ml-1m", url=None, md5=None, raw_dir=str(folder))
    with pytest.raises(DataError, match="ratings.dat"):
        source.prepare(tmp_path / "data")


def test_interrupted_write_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ml-100k"
    _write_ml100k(folder)
    source = MovieLens(
        "ml-100k",
        "ml-100k",
        url=None,
        md5=None,
        raw_dir=str(folder),
        preprocess={"user_core": 2, "item_core": 2},
    )
    data_dir = tmp_path / "data"
    real_write = pipeline_module._write

    def write_then_crash(directory: Path, *args: object) -> None:
        real_write(directory, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline_module, "_write", write_then_crash)
    with pytest.raises(KeyboardInterrupt):
        source.prepare(data_dir)
    assert tree(data_dir / "processed") == []
    monkeypatch.undo()
    assert source.prepare(data_dir).num_users == 6


def test_cache_key_follows_content_not_mirror(tmp_path: Path) -> None:
    def folder_for(**kwargs: object) -> Path:
        return cache_directory(MovieLens("ml-1m", "ml-1m", **kwargs), tmp_path)

    md5 = "c4d9eecfca2ab87c1945afe126590906"
    assert folder_for(url="http://a/ml-1m.zip", md5=md5) == folder_for(
        url="http://b/ml-1m.zip", md5=md5.upper()
    )
    assert folder_for(url="http://a/ml-1m.zip", md5=None) != folder_for(
        url="http://b/ml-1m.zip", md5=None
    )
    for setting in ({"min_rating": 4}, {"max_seq_len": 50}, {"dedup": "first"}):
        assert folder_for(url="http://a/ml-1m.zip", md5=md5) != folder_for(
            url="http://a/ml-1m.zip", md5=md5, preprocess=setting
        )


def test_movielens_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown MovieLens variant 'ml-2m'"):
        MovieLens("x", "ml-2m", url="http://a", md5=None)
    with pytest.raises(ValueError, match="url or an extracted raw_dir"):
        MovieLens("x", "ml-1m", url=None, md5=None)
    with pytest.raises(ValueError, match="dataset name"):
        MovieLens("../x", "ml-1m", url="http://a", md5=None)


@pytest.mark.parametrize(
    "error",
    [
        ChecksumError("http://a/b.zip", "0" * 32, "1" * 32),
        MissingFilesError(Path("/data/ml"), ["u.data"], "Point raw_dir elsewhere."),
        EmptyDatasetError("rating filter (min_rating=5.0)", 12),
        UnsafeArchiveError(Path("a.zip"), "../x", "has a '..' component"),
        CorruptArchiveError(Path("a.zip"), "truncated"),
        DownloadError("http://a", "timed out"),
    ],
)
def test_errors_survive_pickling(error: DataError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error) and copy.__dict__ == error.__dict__
