"""A batch in one REST request (sink/rest_commit.py), on SeaweedFS's Iceberg REST
catalog over its S3 store; and a server without the route, which gets table by table."""

from __future__ import annotations

import http.server
import os
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from sparkapply.datafiles import data_directory
from sparkapply.lsn import Lsn
from sparkapply.sink import (
    CommitConflictError,
    applied_lsn,
    commit_files,
    current_snapshot_id,
    ensure_table,
    open_catalog,
    read_table,
)
from sparkapply.sink.atomic import atomic_commits, commit_mode, commit_together
from sparkapply.sink.commit import StagedSnapshot, stage_files
from sparkapply.storage import Storage
from tests.seaweedfs import SeaweedFS

from .conftest import orders_schema
from .executor_files import order, to_arrow

pytestmark = pytest.mark.integration


def rest_catalog(weed: SeaweedFS, uri: str | None = None) -> Catalog:
    uri = uri or weed.catalog_uri
    return open_catalog(
        "lake",
        {
            "type": "rest",
            "uri": uri,
            "warehouse": weed.warehouse,
            "credential": weed.credential,
            "oauth2-server-uri": f"{uri}/v1/oauth/tokens",
            "s3.endpoint": weed.s3_endpoint,
            # pyiceberg's own FileIO asks AWS for a bucket's region when none is given.
            "s3.region": "us-east-1",
            "s3.access-key-id": weed.key_id,
            "s3.secret-access-key": weed.secret,
            "s3.force-virtual-addressing": "false",
        },
    )


@pytest.fixture()
def catalog(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> Catalog:
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    return rest_catalog(seaweedfs)


@pytest.fixture()
def namespace() -> str:
    return f"r{uuid.uuid4().hex[:12]}"  # the tests share one server


def write_orders(table: Table, ids: list[int]) -> str:
    path = f"{data_directory(table)}/{uuid.uuid4()}.parquet"
    fs, fs_path = Storage.of(table.io.properties).filesystem(path)
    pq.write_table(to_arrow([order(i) for i in ids]), fs_path, filesystem=fs)
    return path


def stage(table: Table, ids: list[int], lsn: int) -> StagedSnapshot:
    return stage_files(
        table,
        added=[write_orders(table, ids)],
        lsn=Lsn(lsn),
        base_snapshot_id=current_snapshot_id(table),
    )


def ids(table: Table) -> list[int]:
    return sorted(read_table(table).column("id").to_pylist())


def test_a_batch_lands_in_every_table_at_once(catalog: Catalog, namespace: str) -> None:
    assert atomic_commits(catalog)
    assert commit_mode(catalog) == "atomic: one REST multi-table commit per batch"
    orders = ensure_table(catalog, (namespace, "orders"), orders_schema())
    lines = ensure_table(catalog, (namespace, "lines"), orders_schema())
    commit_together(catalog, [stage(orders, [1, 2], 10), stage(lines, [7], 10)])
    commit_together(catalog, [stage(orders, [3], 20), stage(lines, [8, 9], 20)])
    for name, want in (("orders", [1, 2, 3]), ("lines", [7, 8, 9])):
        fresh = catalog.load_table((namespace, name))  # as another process sees it
        assert ids(fresh) == want and applied_lsn(fresh) == Lsn(20)
        assert len(fresh.metadata.snapshots) == 2
    # The tables held were brought up to date.
    assert orders.metadata_location == catalog.load_table((namespace, "orders")).metadata_location


def test_a_table_that_moved_fails_the_whole_batch(catalog: Catalog, namespace: str) -> None:
    orders = ensure_table(catalog, (namespace, "orders"), orders_schema())
    lines = ensure_table(catalog, (namespace, "lines"), orders_schema())
    commit_together(catalog, [stage(orders, [1], 10), stage(lines, [2], 10)])
    staged = [stage(orders, [3], 20), stage(lines, [4], 20)]
    # Another writer commits to `lines` after the batch planned against it.
    other = catalog.load_table((namespace, "lines"))
    commit_files(other, added=[write_orders(other, [5])], lsn=Lsn(15))
    before = catalog.load_table((namespace, "orders")).metadata_location

    with pytest.raises(CommitConflictError, match="refused the batch"):
        commit_together(catalog, staged)
    # Nothing of the batch is visible, in the table that did not move either.
    assert catalog.load_table((namespace, "orders")).metadata_location == before
    assert ids(catalog.load_table((namespace, "orders"))) == [1]
    assert ids(catalog.load_table((namespace, "lines"))) == [2, 5]
    # Its manifests are gone from the store (its data files are the caller's).
    for one in staged:
        for path in one.delta.written:
            fs, fs_path = Storage.of(orders.io.properties).filesystem(path)
            assert fs.get_file_info(fs_path).type.name == "NotFound", path


class _WithoutMultiTableCommit(http.server.BaseHTTPRequestHandler):
    """The real catalog behind a proxy that refuses the multi-table route, as a server
    without it answers (fault injection: every other request reaches SeaweedFS)."""

    upstream = ""

    def _forward(self) -> None:
        if self.path.endswith("/transactions/commit"):
            self.send_error(404, "no such route")
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host",)}
        request = urllib.request.Request(
            self.upstream + self.path, data=body, headers=headers, method=self.command
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, data, reply = response.status, response.read(), response.headers
        except urllib.error.HTTPError as exc:
            status, data, reply = exc.code, exc.read(), exc.headers
        self.send_response(status)
        for key, value in reply.items():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture()
def proxy(seaweedfs: SeaweedFS) -> Iterator[str]:
    handler = type("Handler", (_WithoutMultiTableCommit,), {"upstream": seaweedfs.catalog_uri})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_without_the_route_commits_table_by_table(
    seaweedfs: SeaweedFS, proxy: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    catalog = rest_catalog(seaweedfs, proxy)
    assert not atomic_commits(catalog)
    assert commit_mode(catalog).startswith("table by table (the REST catalog does not take")
    orders = ensure_table(catalog, (namespace, "orders"), orders_schema())
    commit_files(orders, added=[write_orders(orders, [1, 2])], lsn=Lsn(10))
    assert ids(catalog.load_table((namespace, "orders"))) == [1, 2]
