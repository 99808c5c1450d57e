"""storage.py: the file system of a location, from the catalog's FileIO properties."""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from sparkapply import location, storage
from sparkapply.errors import LocationError
from sparkapply.storage import Storage

WEIRD = "wörk [0] x 'q' \"dq\" (p) a+b=c;d,e&f@g$h!i~j%41k"
SECRET = "1e5-do-not-print"
S3 = {
    "s3.endpoint": "http://127.0.0.1:1",
    "s3.access-key-id": "key-id",
    "s3.secret-access-key": SECRET,
    "s3.force-virtual-addressing": "false",
}


def test_of_keeps_only_file_io_properties() -> None:
    props = {**S3, "uri": "http://x", "credential": "a:b", "warehouse": "w", "gcs.project-id": "p"}
    props["auth.manager"] = object()  # type: ignore[assignment]  # as in a table's io.properties
    assert dict(Storage.of(props).properties) == {**S3, "gcs.project-id": "p"}


def test_repr_and_pickle_carry_no_value_into_text() -> None:
    s = Storage.of(S3)
    assert SECRET not in repr(s) and "s3.secret-access-key" in repr(s)
    assert pickle.loads(pickle.dumps(s)) == s


def test_a_local_location_is_not_parsed_as_a_uri(tmp_path: Path) -> None:
    weird = tmp_path / WEIRD
    weird.mkdir()
    table = pa.table({"a": [1, 2]})
    for loc in (location.from_path(weird / "f.parquet"), str(weird / "g.parquet")):
        fs, path = Storage.of(S3).filesystem(loc)
        assert isinstance(fs, pafs.LocalFileSystem)
        pq.write_table(table, path, filesystem=fs)
    assert sorted(p.name for p in weird.iterdir()) == ["f.parquet", "g.parquet"]
    assert pq.read_table(str(weird / "f.parquet")).equals(table)


def test_an_s3_location_uses_the_catalog_settings_and_is_split_unescaped() -> None:
    fs, path = Storage.of(S3).filesystem("s3://bucket/a b/[0]/wörk%41.parquet")
    assert isinstance(fs, pafs.S3FileSystem)
    assert path == "bucket/a b/[0]/wörk%41.parquet"
    # An endpoint without a region: us-east-1, not a region lookup at AWS.
    assert fs.region == storage.DEFAULT_ENDPOINT_REGION
    fs, _ = Storage.of({**S3, "s3.region": "eu-west-3"}).filesystem("s3a://bucket/k")
    assert fs.region == "eu-west-3"


@pytest.mark.parametrize(
    ("props", "missing"),
    [
        ({k: v for k, v in S3.items() if k != "s3.secret-access-key"}, "s3.secret-access-key"),
        ({"s3.endpoint": "http://127.0.0.1:1"}, "no credential"),
    ],
)
def test_a_store_configured_without_its_credential_is_refused(
    props: dict[str, str], missing: str
) -> None:
    with pytest.raises(LocationError, match=missing) as caught:
        Storage.of(props).filesystem("s3://bucket/k")
    assert caught.value.kind.value == "operator"


def test_an_unknown_scheme_is_a_location_error_without_values() -> None:
    with pytest.raises(LocationError, match="nosuchscheme://x/y") as caught:
        Storage.of(S3).filesystem("nosuchscheme://x/y")
    assert SECRET not in str(caught.value)


def test_a_task_runs_under_its_settings_in_its_thread_only() -> None:
    installed, task = Storage.of({"gcs.project-id": "p"}), Storage.of(S3)
    before = storage.current()
    storage.install(installed)
    try:
        seen: list[Storage] = []
        with storage.using(task):
            assert storage.current() == task
            other = threading.Thread(target=lambda: seen.append(storage.current()))
            other.start()
            other.join()
        assert seen == [installed]
        assert storage.current() == installed
    finally:
        storage.install(before)


def test_pyiceberg_own_variables_reach_our_file_writes(tmp_path: Path) -> None:
    # pyiceberg reads PYICEBERG_CATALOG__<NAME>__… when it is imported: a fresh process.
    script = (
        "from sparkapply import storage\n"
        "from sparkapply.sink.catalog import open_catalog\n"
        f"open_catalog('lake', {{'type': 'sql', 'uri': 'sqlite:///{tmp_path}/c.db',\n"
        f"    'warehouse': '{tmp_path}/wh', 's3.access-key-id': 'k'}})\n"
        "print(dict(storage.current().properties))\n"
    )
    env = {**os.environ, "PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY": "from-pyiceberg"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert ast.literal_eval(out) == {
        "s3.access-key-id": "k",
        "s3.secret-access-key": "from-pyiceberg",
    }


def test_a_refusal_of_the_credentials_is_an_operator_error() -> None:
    # pyarrow's words for a wrong secret (SeaweedFS's answers, as pyarrow raised them).
    wrong = OSError(
        "When initiating multiple part upload for key 'x/y.parquet' in bucket 'b': AWS "
        "Error SIGNATURE_DOES_NOT_MATCH during CreateMultipartUpload operation: The request "
        "signature we calculated does not match the signature you provided."
    )
    denied = OSError(
        "When reading information for key 'k' in bucket 'b': AWS Error "
        "ACCESS_DENIED during HeadObject operation: No response body."
    )
    for exc in (wrong, denied):
        error = storage.refused(exc)
        assert error is not None and error.kind.value == "operator"
        assert "refused the credentials" in str(error)
    try:
        raise RuntimeError("wrapped") from denied
    except RuntimeError as wrapped:
        assert storage.refused(wrapped) is not None
    assert storage.refused(OSError("AWS Error NETWORK_CONNECTION during HeadObject")) is None
    assert storage.refused(ValueError("AWS Error ACCESS_DENIED")) is None
