"""The file systems behind table locations, built from the catalog's storage settings.

ONE PLACE
    Every file sparkapply reads or writes itself (the copy's and the apply's data
    files, staged pieces, compaction, the cuts table's files, the orphan sweep) is
    opened through :func:`filesystem`, which builds the pyarrow file system of a
    location from the FileIO properties of ``[sink.catalog]`` (``s3.*``, ``client.*``,
    ``gcs.*``, ``adls.*``, ``hdfs.*``, ``oss.*``): the properties pyiceberg's own
    ``PyArrowFileIO`` reads, mapped by that same class, so a file sparkapply writes and
    a file pyiceberg reads go to the same store with the same keys. A REST catalog may
    add storage settings in its config and LoadTable responses; pyiceberg merges them
    into the catalog's and the table's properties, and :meth:`Storage.of` takes them
    from there (a table's ``io.properties`` where a table is at hand).

WHICH SETTINGS A PROCESS USES
    The driver installs the catalog's settings when it opens the catalog
    (:func:`install`). A Spark task carries the :class:`Storage` in its pickled inputs
    and runs under it (:func:`using`), so executors never look at their environment,
    and nothing crosses in Spark's configuration, which its UI and event log show.

NO SILENT FALLBACK
    A catalog that configures the object store (an endpoint, a key) gets exactly that:
    an access key without its secret, or an endpoint without any credential, is a
    :class:`~sparkapply.errors.LocationError` naming the missing property, never a
    quiet fall back to the AWS SDK's default credential chain (environment,
    ``~/.aws``, instance metadata). An endpoint without a region gets ``us-east-1``
    rather than pyiceberg's region lookup, which asks AWS about the bucket. A catalog
    that configures nothing of S3 uses the SDK's chain, as pyiceberg does (an AWS
    deployment with an instance role).

SECRETS
    A :class:`Storage` holds keys; its ``repr`` names the properties, never a value,
    and errors raised here quote no property value.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO

from sparkapply import location
from sparkapply.errors import LocationError

# The FileIO property families pyiceberg's PyArrowFileIO reads.
_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hdfs.", "oss.")
_S3_SCHEMES = ("s3", "s3a", "s3n")
# What identifies us to an S3 store without the SDK's default chain.
_S3_IDENTITY = (
    "s3.access-key-id",
    "client.access-key-id",
    "s3.role-arn",
    "client.role-arn",
    "s3.profile-name",
    "client.profile-name",
)
_S3_SECRET = {
    "s3.access-key-id": "s3.secret-access-key",
    "client.access-key-id": "client.secret-access-key",
}
DEFAULT_ENDPOINT_REGION = "us-east-1"


@dataclass(frozen=True, slots=True)
class Storage:
    """The storage settings of a catalog or a table: picklable, repr without values."""

    properties: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, properties: Mapping[str, Any]) -> Storage:
        """The FileIO properties among ``properties`` (a catalog's, or a table's
        ``io.properties``); other keys and non-string values are left out."""
        kept = {
            k: v for k, v in properties.items() if isinstance(v, str) and k.startswith(_PREFIXES)
        }
        return cls(tuple(sorted(kept.items())))

    def __repr__(self) -> str:
        return f"Storage({', '.join(k for k, _ in self.properties)})"

    def filesystem(self, where: str) -> tuple[pafs.FileSystem, str]:
        """The pyarrow file system holding ``where`` and the path to hand to it.

        Local locations are used as stored (no URI parser sees them); others are
        split as pyiceberg splits them (``bucket/key`` for an object store)."""
        path = location.local_path(where)
        if path is not None:
            return pafs.LocalFileSystem(), path
        scheme, netloc, fs_path = PyArrowFileIO.parse_location(where)
        try:
            fs = _file_io(self).fs_by_scheme(scheme, netloc)
        except LocationError:
            raise
        except Exception as exc:  # pyarrow raises ValueError, OSError, ArrowInvalid
            raise LocationError(
                f"cannot open the file system of {where}: {type(exc).__name__}",
                hint="check the object store's properties in [sink.catalog] "
                f"(set: {', '.join(k for k, _ in self.properties) or 'none'})",
            ) from None  # pyarrow's message may quote a key
        return fs, fs_path


@functools.lru_cache(maxsize=16)
def _file_io(storage: Storage) -> PyArrowFileIO:
    """One FileIO per distinct settings (it caches a file system per bucket)."""
    props = dict(storage.properties)
    _check_s3(props)
    if "s3.endpoint" in props and not ({"s3.region", "client.region"} & props.keys()):
        props["s3.region"] = DEFAULT_ENDPOINT_REGION
    return PyArrowFileIO(props)


def _check_s3(props: Mapping[str, str]) -> None:
    """Refuse S3 settings that would make pyarrow fall back to the SDK's chain."""
    s3 = [k for k in props if k.startswith(("s3.", "client."))]
    if not s3 or props.get("s3.anonymous", "").lower() == "true":
        return
    for key_id, secret in _S3_SECRET.items():
        if props.get(key_id) and not props.get(secret):
            raise LocationError(
                f"[sink.catalog] sets {key_id} but not {secret}",
                hint=f"pass {secret} (README: Secrets from the environment)",
            )
    if not any(props.get(k) for k in _S3_IDENTITY):
        raise LocationError(
            "[sink.catalog] configures the object store but no credential for it",
            hint="set s3.access-key-id and s3.secret-access-key (or s3.role-arn, "
            "s3.profile-name, or s3.anonymous = true)",
        )


# How pyarrow's S3 client words a refusal of the credentials (AWS SDK error names).
_REFUSED_RE = re.compile(
    r"AWS Error (ACCESS_DENIED|SIGNATURE_DOES_NOT_MATCH|INVALID_ACCESS_KEY_ID"
    r"|INVALID_CLIENT_TOKEN_ID|EXPIRED_TOKEN|UNRECOGNIZED_CLIENT)|HTTP status 403"
)


def refused(exc: BaseException) -> LocationError | None:
    """An operator's error for ``exc`` if it is the object store refusing the
    credentials (a forgotten or wrong secret), else None. pyarrow's message names the
    bucket and key, never a secret."""
    for seen in (exc, exc.__cause__, exc.__context__):
        if isinstance(seen, OSError) and _REFUSED_RE.search(str(seen)):
            return LocationError(
                f"the object store refused the credentials: {seen}",
                hint="check s3.access-key-id and s3.secret-access-key in [sink.catalog] "
                "(README: Secrets from the environment)",
            )
    return None


_PROCESS = Storage()
_TASK: ContextVar[Storage | None] = ContextVar("sparkapply_storage", default=None)


def install(storage: Storage) -> None:
    """Make ``storage`` this process's settings (the driver, on opening the catalog)."""
    global _PROCESS
    _PROCESS = storage


def current() -> Storage:
    """The settings in force: the running task's, else the process's."""
    task = _TASK.get()
    return _PROCESS if task is None else task


@contextlib.contextmanager
def using(storage: Storage) -> Iterator[None]:
    """Run a task's body under the settings its inputs carry (this thread only)."""
    token = _TASK.set(storage)
    try:
        yield
    finally:
        _TASK.reset(token)


def filesystem(where: str) -> tuple[pafs.FileSystem, str]:
    """The file system and path of ``where`` under the settings in force."""
    return current().filesystem(where)


def is_object_store(fs: pafs.FileSystem) -> bool:
    """True for a store without directories (S3, GCS, Azure blobs): nothing to create
    before a write, and no directory marker objects."""
    return not isinstance(fs, pafs.LocalFileSystem | pafs.HadoopFileSystem)


def make_parent(fs: pafs.FileSystem, directory: str) -> None:
    """Create ``directory`` before files are written in it, on a file system that
    has directories; nothing on an object store (a marker object is a write some
    stores refuse, and readers never need it)."""
    if not is_object_store(fs):
        fs.create_dir(directory, recursive=True)


__all__ = [
    "Storage",
    "current",
    "filesystem",
    "install",
    "is_object_store",
    "make_parent",
    "refused",
    "using",
]
