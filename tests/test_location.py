"""location.py: one spelling of locations, escaped once at the SQLAlchemy boundary."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from sparkapply import location
from sparkapply.errors import LocationError, SinkError

WEIRD = "wörk [0] x 'q' \"dq\" (p) a+b=c;d,e&f@g$h!i~j%41k"


def test_scheme() -> None:
    assert location.scheme("/a/b") == ""
    assert location.scheme("a/b") == ""
    assert location.scheme("C:/a") == ""  # a drive letter, not a scheme
    assert location.scheme("file:///a") == "file"
    assert location.scheme("FILE:/a") == "file"
    assert location.scheme("s3://bucket/k") == "s3"
    assert location.scheme("sqlite:///x.db") == "sqlite"


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        ("/tmp/a b/[0]", "/tmp/a b/[0]"),
        ("rel/a", "rel/a"),
        ("file:///tmp/wörk [0]/x", "/tmp/wörk [0]/x"),
        ("file:/tmp/a b", "/tmp/a b"),
        ("file://localhost/tmp/a", "/tmp/a"),
        ("file:///tmp/a%20b", "/tmp/a%20b"),  # stored spelling: never unescaped
        ("s3://bucket/a b", None),
    ],
)
def test_local_path(loc: str, path: str | None) -> None:
    assert location.local_path(loc) == path


def test_a_file_location_on_another_host_is_refused() -> None:
    with pytest.raises(LocationError, match="another host"):
        location.local_path("file://server/share/x")


def test_from_path_and_normalize_spell_locations_unescaped(tmp_path: Path) -> None:
    weird = tmp_path / WEIRD
    assert location.from_path(weird) == "file://" + str(weird)
    assert location.from_path("rel") == "file://" + str(Path("rel").absolute())
    assert location.normalize(str(weird)) == "file://" + str(weird)
    assert location.normalize("file:" + str(weird)) == "file://" + str(weird)
    assert location.normalize("s3://b/a b") == "s3://b/a b"


def test_join() -> None:
    assert location.join("file:///w/", "Sales Dept", "/Order-Items/") == (
        "file:///w/Sales Dept/Order-Items"
    )
    assert location.join("s3://b", "k") == "s3://b/k"
    assert location.join("/a") == "/a"


def test_check_local_refuses_what_url_parsers_cut() -> None:
    location.check_local(f"file:///tmp/{WEIRD}", what="warehouse")
    location.check_local("s3://b/a#b", what="warehouse")  # not local: the store decides
    for bad in ("/tmp/a#b", "file:///tmp/a?b"):
        with pytest.raises(LocationError, match="warehouse") as info:
            location.check_local(bad, what="warehouse")
        assert isinstance(info.value, SinkError) and info.value.hint


def test_path_segment() -> None:
    for safe in ("Order-Items", "Sales Dept", 'a"b', "wörk [0]", "MixedCase"):
        assert location.path_segment(safe) == safe
    a, b = location.path_segment("a/b"), location.path_segment("a_b/")
    assert a.startswith("a_b-") and "/" not in a and a != b
    for bad in ("x#y", "x?y", "x%y", "x\\y", "x\ny", "", ".", ".."):
        seg = location.path_segment(bad)
        assert seg not in ("", ".", "..")
        assert not any(c in seg for c in "/\\#?%\n"), seg
    assert location.path_segment("x#y") != location.path_segment("x?y")


def test_escape_path_round_trips_through_sqlalchemy(tmp_path: Path) -> None:
    path = str(tmp_path / WEIRD / "catalog.db")
    url = make_url("sqlite:///" + location.escape_path(path))
    assert url.database == path


def test_expand_work_dir(tmp_path: Path) -> None:
    wd = tmp_path / WEIRD
    assert location.expand_work_dir("file://{work_dir}/warehouse", wd) == f"file://{wd}/warehouse"
    assert location.expand_work_dir("{work_dir}/warehouse", wd) == f"{wd}/warehouse"
    sqlite = location.expand_work_dir("sqlite:///{work_dir}/catalog.db", wd)
    assert " " not in sqlite and "[" not in sqlite
    assert make_url(sqlite).database == f"{wd}/catalog.db"
    assert location.expand_work_dir("s3://b/x", wd) == "s3://b/x"
