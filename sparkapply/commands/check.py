"""``sparkapply check``: the preflight, a pass/fail line per check with its fix.

It asks the publisher everything ``run`` needs (:mod:`sparkapply.source.preflight`),
then the work_dir, the catalog, and whether a Spark task can write, read and delete a
file where the tables' files go: on a cluster the executors, not the driver, write
them, so that is the only test of their credentials and mounts. It changes nothing
that stays: the probe file is deleted, no slot or table is made. Exit 0 when nothing
failed, 2 otherwise.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog

from sparkapply import location, storage
from sparkapply.config import Config
from sparkapply.errors import SparkapplyError
from sparkapply.sink.catalog import open_catalog
from sparkapply.sink.progress import LSN_TABLE_PROPERTY
from sparkapply.source.preflight import Finding, from_error, publisher_findings
from sparkapply.storage import Storage


def run_checks(config: Config) -> list[Finding]:
    found = publisher_findings(config.source)
    found.append(_work_dir(config.work_dir))
    try:
        catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
        namespaces = catalog.list_namespaces()
    except SparkapplyError as exc:
        return [*found, from_error("catalog", exc)]
    except Exception as exc:  # a catalog client may fail in any of its libraries
        detail = f"catalog {config.sink.catalog_name} does not answer: {type(exc).__name__}"
        return [*found, Finding("catalog", "fail", detail, "check [sink.catalog]")]
    found.append(
        Finding("catalog", "pass", f"{config.sink.catalog_name}: {len(namespaces)} namespace(s)")
    )
    found.append(_warehouse(config, catalog))
    return found


def _work_dir(work: Path) -> Finding:
    probe = work / f".check-{uuid.uuid4().hex}"
    try:
        work.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"sparkapply check")
        probe.unlink()
    except OSError as exc:
        return Finding(
            "work_dir",
            "fail",
            f"cannot write in {work}: {exc.strerror or exc}",
            "point work_dir at a folder this user can write (on a cluster: one every node "
            "mounts at the same path)",
        )
    free = os.statvfs(work).f_bavail * os.statvfs(work).f_frsize
    return Finding("work_dir", "pass", f"{work} writable, {free / 2**30:.1f} GiB free")


def _warehouse_location(config: Config, catalog: Catalog) -> tuple[str, Storage] | None:
    """Where data files go, and the storage settings the tasks write there with: a
    mirrored table's data path and its io properties, else the catalog's warehouse
    when it is a location (a REST catalog's may be a name)."""
    for namespace in catalog.list_namespaces():
        for ident in catalog.list_tables(namespace):
            table = catalog.load_table(ident)
            if LSN_TABLE_PROPERTY in table.properties:
                settings = {**catalog.properties, **table.io.properties}
                return table.location_provider().data_path, Storage.of(settings)
    warehouse = config.catalog_properties().get("warehouse", "")
    if not location.scheme(warehouse):
        return None
    return warehouse, Storage.of(catalog.properties)


def _warehouse(config: Config, catalog: Catalog) -> Finding:
    found = _warehouse_location(config, catalog)
    if found is None:
        return Finding(
            "warehouse",
            "note",
            "no table yet and the catalog names no warehouse location: the catalog gives "
            "each table its location at creation",
        )
    from sparkapply.apply.session import get_session

    s = config.spark
    spark: Any = get_session(s.master, s.app_name, s.conf)
    where, settings = found
    target = location.join(where, f"sparkapply-check-{uuid.uuid4().hex}")
    probe = spark.sparkContext.parallelize([(target, settings)], 1)
    errors = probe.map(probe_file).collect()
    if errors[0] is None:
        detail = f"a Spark task wrote, read and deleted a file in {where}"
        return Finding("warehouse", "pass", detail)
    return Finding(
        "warehouse",
        "fail",
        f"a Spark task cannot write, read and delete a file in {where}: {errors[0]}",
        "check the warehouse's credentials and permissions where the executors run "
        "([sink.catalog] storage settings; on a cluster, the executors' mounts)",
    )


def probe_file(job: tuple[str, Storage]) -> str | None:
    """On an executor: write the target under the storage settings the job carries,
    read it back, delete it; None, or what failed."""
    target, settings = job
    payload = b"sparkapply check " + target.encode()
    try:
        with storage.using(settings):
            fs, path = storage.filesystem(target)
            storage.make_parent(fs, path.rsplit("/", 1)[0])
            with fs.open_output_stream(path) as out:
                out.write(payload)
            with fs.open_input_stream(path) as back:
                same = back.read() == payload
            fs.delete_file(path)
    except Exception as exc:  # any file system's failure is the answer
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None if same else "the file read back differs from what was written"


def render_text(found: list[Finding]) -> str:
    width = max(len(f.name) for f in found)
    lines = []
    for f in found:
        lines.append(f"{f.outcome.upper():<5} {f.name:<{width}}  {f.detail}")
        if f.fix:
            lines.append(f"{'':<5} {'':<{width}}  fix: {f.fix}")
    failed = sum(f.failed for f in found)
    lines.append("")
    lines.append(
        f"check: {failed} of {len(found)} checks failed"
        if failed
        else f"check: OK, nothing failed ({len(found)} checks)"
    )
    return "\n".join(lines)


def to_json(found: list[Finding]) -> str:
    return json.dumps(
        {"ok": not any(f.failed for f in found), "checks": [f.as_dict() for f in found]}, indent=2
    )
