"""One rule for every connection string sparkapply builds from the configured DSN."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from sparkapply.source.connection import SESSION_OPTIONS, replication_conninfo, session_conninfo

DSN = "host=db port=5433 user=app password='p w' dbname=shop options='-c work_mem=8MB'"


def test_session_conninfo_keeps_the_dsn_and_appends_session_options() -> None:
    p = conninfo_to_dict(session_conninfo(DSN))
    assert (p["host"], p["port"], p["user"], p["password"], p["dbname"]) == (
        "db",
        "5433",
        "app",
        "p w",
        "shop",
    )
    assert p["options"] == "-c work_mem=8MB " + SESSION_OPTIONS
    assert p["client_encoding"] == "UTF8" and p["application_name"] == "sparkapply"


def test_session_conninfo_extras() -> None:
    p = conninfo_to_dict(
        session_conninfo(DSN + " application_name=mine", options="-c statement_timeout=0")
    )
    assert p["application_name"] == "mine"
    assert str(p["options"]).endswith(SESSION_OPTIONS + " -c statement_timeout=0")
    tagged = conninfo_to_dict(session_conninfo(DSN, application_name="copy-1"))
    assert tagged["application_name"] == "copy-1"


def test_replication_conninfo() -> None:
    p = conninfo_to_dict(replication_conninfo("dbname=x", connect_timeout=0.2))
    assert p["replication"] == "database" and p["connect_timeout"] == "1"
    assert p["options"] == SESSION_OPTIONS and p["application_name"] == "sparkapply"
