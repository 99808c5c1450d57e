"""Opening the Iceberg catalog: local directories, secret masking, one error type.

The catalog properties come from the config and may hold passwords, tokens and
object-store keys. Nothing in this module logs or raises them: messages go through
:func:`mask_properties` / :func:`_scrub`, and a pyiceberg error whose text echoes a
secret (``load_catalog`` puts every property into some of its ``ValueError``\\ s) is
re-raised without its cause attached, so a traceback cannot print it either.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import NoReturn

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import ForbiddenError, OAuthError, UnauthorizedError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from sparkapply import location
from sparkapply.config import is_sql_catalog
from sparkapply.errors import CredentialError, SinkError
from sparkapply.storage import Storage, install

logger = logging.getLogger(__name__)

MASK = "***"

# A property is secret when its key looks like one of these (pyiceberg, fsspec and
# cloud SDK spellings: s3.secret-access-key, adls.account-key, gcs.oauth2.token,
# rest "credential", "token", "password", sigv4 session tokens, SAS tokens).
_SECRET_KEY_RE = re.compile(
    r"password|passwd|secret|token|credential|private|session|account-key|access-key"
    r"|sas|signature|(^|[._-])key$",
    re.IGNORECASE,
)
# user:password@ inside any URI-ish value (a SQL catalog uri, a proxy, a REST uri).
_USERINFO_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*):(?P<pw>[^@/\s]*)@")


def open_catalog(name: str, properties: Mapping[str, str]) -> Catalog:
    """Load the catalog ``name`` (pyiceberg ``load_catalog``) from ``properties``.

    For a SQL catalog, the SQLite file's directory is created, and a warehouse that
    is a local path (plain or ``file:``) is created and passed on as an absolute
    ``file://`` location (spelled as :mod:`sparkapply.location` says), so table
    locations are absolute and every engine can read them. Other catalogs get their
    properties as written (a REST ``warehouse`` is a name the server resolves).
    The catalog's storage settings become this process's (:mod:`sparkapply.storage`).
    Any failure is a :class:`SinkError` naming the catalog, with secrets masked; a
    refused credential is a :class:`CredentialError` (an operator must fix it).
    """
    props = dict(properties)
    try:
        if is_sql_catalog(props):
            _prepare_local_paths(props)
        catalog = load_catalog(name, **props)
    except SinkError as exc:  # already says what to fix, and holds no secret
        raise exc.with_context(catalog=name) from exc.__cause__
    except Exception as exc:  # a catalog can fail in any of its client libraries
        _raise_open_error(name, props, exc)
    logger.info("opened Iceberg catalog %s %s", name, mask_properties(props))
    install(Storage.of(catalog.properties))
    return catalog


def mask_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``properties`` that is safe to log: secrets and URI passwords masked."""
    masked = {}
    for key, value in properties.items():
        if _is_secret_key(key):
            masked[key] = MASK
        else:
            masked[key] = _USERINFO_RE.sub(rf"\g<head>:{MASK}@", str(value))
    return masked


def _is_secret_key(key: str) -> bool:
    return _SECRET_KEY_RE.search(key) is not None


def _secret_values(properties: Mapping[str, str]) -> list[str]:
    """Every string that must not appear in a message: secret values, URI passwords."""
    values = [str(v) for k, v in properties.items() if _is_secret_key(k) and v]
    for value in properties.values():
        values.extend(m.group("pw") for m in _USERINFO_RE.finditer(str(value)) if m.group("pw"))
    # Longest first, so a secret that contains another is replaced whole.
    return sorted(set(values), key=len, reverse=True)


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, MASK)
    return _USERINFO_RE.sub(rf"\g<head>:{MASK}@", text)


def _prepare_local_paths(props: dict[str, str]) -> None:
    """Create the SQLite file's directory and a local warehouse; normalise the latter."""
    uri = props.get("uri")
    if uri and uri.startswith("sqlite"):
        try:
            database = make_url(uri).database
        except ArgumentError as exc:
            raise SinkError(
                "the catalog uri is not a valid SQLAlchemy URL",
                hint="write it as sqlite:///ABSOLUTE/PATH/catalog.db",
            ) from exc
        if database and database != ":memory:" and not database.startswith("file:"):
            os.makedirs(os.path.dirname(os.path.abspath(database)), exist_ok=True)

    warehouse = props.get("warehouse")
    if warehouse:
        local = location.local_path(warehouse)
        if local is not None:
            location.check_local(warehouse, what="warehouse")
            os.makedirs(os.path.abspath(local), exist_ok=True)
            props["warehouse"] = location.from_path(local)


def _raise_open_error(name: str, props: Mapping[str, str], exc: Exception) -> NoReturn:
    secrets = _secret_values(props)
    detail = f"{type(exc).__name__}: {exc}"
    scrubbed = _scrub(detail, secrets)
    error: SinkError
    if isinstance(exc, OAuthError | UnauthorizedError | ForbiddenError):
        error = CredentialError(
            f"Iceberg catalog {name!r} refused the credentials: {scrubbed}",
            hint="check [sink.catalog]'s credential or token (passed from the environment: "
            "README, Secrets from the environment); "
            f"properties used: {mask_properties(props)}",
            catalog=name,
        )
    else:
        error = SinkError(
            f"cannot open Iceberg catalog {name!r}: {scrubbed}",
            hint=(
                "check the catalog properties in [sink.catalog] (type, uri, warehouse) and "
                "[sink] catalog_name, and that the catalog is reachable; "
                f"properties used: {mask_properties(props)}"
            ),
            catalog=name,
        )
    if _leaks(exc, secrets):
        # Keep the secret out of tracebacks too: do not chain the original error.
        raise error from None
    raise error from exc


def _leaks(exc: BaseException, secrets: list[str]) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        text = f"{seen!s} {seen.args!r}"
        if any(s in text for s in secrets) or _USERINFO_RE.search(text):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
