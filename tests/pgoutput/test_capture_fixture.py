"""The codec against real pgoutput bytes saved in tests/fixtures/pgoutput_capture.bin.

No server needed: the file was captured from PostgreSQL 16 by
``tests/fixtures/make_pgoutput_capture.py`` (format: ``tests/pgoutput/capture_file.py``).
Its header records what the workload knew (xids, gids, origin, the TOAST value), so
the decoded fields are checked against the workload, not against the decoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput import Decoder, encode
from sparkapply.pgoutput import messages as m
from tests.pgoutput.capture_file import CaptureFile, read_capture

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pgoutput_capture.bin"

# The tag of every message of the representative workload, in order (see
# capture.representative_workload for the transactions that make them).
EXPECTED_TAGS = (
    "BYYRIIRIIRIRIC"  # inserts into the four replica-identity kinds (enum, domain types)
    "BUUUUDDC"  # updates (u, K, O, no old) and deletes (K, O)
    "BOIC"  # from a replication origin
    "MBMIC"  # non-transactional message first, then the transactional one
    "BRIRRTRTC"  # TRUNCATE parent, child RESTART IDENTITY CASCADE; TRUNCATE log_t
    "bRIPK"  # PREPARE 'gid-1', COMMIT PREPARED
    "bIPr"  # PREPARE 'gid-1' again, ROLLBACK PREPARED
    "bIPK"  # PREPARE '', COMMIT PREPARED
    "SYYRIESIEASYYRIESMEc"  # streamed; ROLLBACK TO SAVEPOINT aborts a subxact; commit
    "SOYYRIESIEA"  # streamed from an origin, aborted at the top level
    "SRIESIEpK"  # streamed prepare, COMMIT PREPARED
    "SRIESIEpr"  # streamed prepare (gid reused), ROLLBACK PREPARED
)

TAG_TYPES: dict[str, type[Any]] = {
    "B": m.Begin,
    "C": m.Commit,
    "O": m.Origin,
    "R": m.Relation,
    "Y": m.Type,
    "I": m.Insert,
    "U": m.Update,
    "D": m.Delete,
    "T": m.Truncate,
    "M": m.LogicalMessage,
    "S": m.StreamStart,
    "E": m.StreamStop,
    "c": m.StreamCommit,
    "A": m.StreamAbort,
    "b": m.BeginPrepare,
    "P": m.Prepare,
    "K": m.CommitPrepared,
    "r": m.RollbackPrepared,
    "p": m.StreamPrepare,
}


def _decode(capture: CaptureFile) -> list[m.Message]:
    header = capture.header
    dec = Decoder(proto_version=header["proto_version"], streaming=header["streaming"])
    return [dec.decode(r.payload) for r in capture.records]


def _of(msgs: Sequence[m.Message], cls: type[Any]) -> list[Any]:
    return [x for x in msgs if isinstance(x, cls)]


def check_representative(header: dict[str, Any], msgs: Sequence[m.Message]) -> None:
    """Everything the representative workload guarantees about its decoded messages."""
    xids: dict[str, int] = header["xids"]
    assert [type(x) for x in msgs] == [TAG_TYPES[t] for t in EXPECTED_TAGS]
    assert set(TAG_TYPES.values()) == {type(x) for x in msgs}, "every message kind occurs"
    _check_transactions(msgs, xids)
    rels = _check_relations(msgs)
    _check_rows(msgs, header["toast_value"].encode())
    _check_origins_and_messages(msgs, header, xids)
    _check_truncates(msgs, rels)
    _check_two_phase(msgs, xids)
    _check_streams(msgs, xids)


def _check_transactions(msgs: Sequence[m.Message], xids: dict[str, int]) -> None:
    """Transactions: Begin/Commit pairs, xids from the workload, LSNs ascending."""
    begins, commits = _of(msgs, m.Begin), _of(msgs, m.Commit)
    assert [b.xid for b in begins] == [
        xids[k] for k in ("insert", "update", "origin", "message", "truncate")
    ]
    assert [b.final_lsn for b in begins] == [c.commit_lsn for c in commits]
    assert [b.commit_time for b in begins] == [c.commit_time for c in commits]
    ends = [c.end_lsn for c in commits]
    assert all(c.commit_lsn < c.end_lsn for c in commits) and ends == sorted(set(ends))


def _check_relations(msgs: Sequence[m.Message]) -> dict[str, m.Relation]:
    """Relations: the four replica identities; Type for the enum and (as int4) the domain."""
    rels = {r.name: r for r in _of(msgs, m.Relation)}
    assert {n: (r.namespace, r.replica_identity) for n, r in rels.items()} == {
        "items": ("app", "d"),
        "full_t": ("app", "f"),
        "idx_t": ("app", "i"),
        "log_t": ("app", "n"),
        "parent": ("app", "d"),
        "child": ("app", "d"),
    }
    assert [(c.name, c.is_key) for c in rels["items"].columns] == [
        ("id", True),
        ("name", False),
        ("price", False),
        ("mood", False),
        ("qty", False),
        ("note", False),
    ]
    assert [c.type_modifier for c in rels["items"].columns][1:3] == [24, (12 << 16 | 2) + 4]
    assert [c.is_key for c in rels["idx_t"].columns] == [True, True, False]
    assert all(c.is_key for c in rels["full_t"].columns)
    assert not any(c.is_key for c in rels["log_t"].columns)
    types = {(t.namespace, t.name) for t in _of(msgs, m.Type)}
    assert types == {("app", "mood"), ("", "int4")}
    mood, posint = (c.type_oid for c in rels["items"].columns[3:5])
    assert {t.type_oid for t in _of(msgs, m.Type)} == {mood, posint}
    return rels


def _check_rows(msgs: Sequence[m.Message], toast: bytes) -> None:
    """Rows: NULLs, the toasted value once in full, then unchanged ('u')."""
    ins = _of(msgs, m.Insert)
    assert ins[0].new == m.TupleData(b"tttttt", (b"1", b"apple", b"12.50", b"happy", b"3", toast))
    assert ins[1].new == m.TupleData(b"tnnnnn", (b"2", None, None, None, None, None))
    u_toast, u_key, u_full, u_plain = _of(msgs, m.Update)
    assert u_toast.old is None and u_toast.new.kinds == b"tttttu"
    assert u_toast.new.values[4:] == (b"4", m.UNCHANGED) and u_toast.new.is_unchanged(5)
    assert u_key.old_kind == "K" and u_key.old.values[0] == b"2" and u_key.old.kinds == b"tnnnnn"
    assert u_key.new.values[0] == b"10"
    assert (u_full.old_kind, u_full.old.values, u_full.new.values) == (
        "O",
        (b"1", b"one"),
        (b"1", b"uno"),
    )
    assert u_plain.old_kind is None and u_plain.new.values == (b"1", b"1", b"y")
    d_key, d_full = _of(msgs, m.Delete)
    assert (d_key.old_kind, d_key.old.values[0], d_full.old_kind) == ("K", b"10", "O")
    assert d_full.old.values == (b"2", b"two")


def _check_origins_and_messages(
    msgs: Sequence[m.Message], header: dict[str, Any], xids: dict[str, int]
) -> None:
    """Origin: with its LSN after Begin, with LSN 0 after the first Stream Start; and
    the logical messages."""
    origins = _of(msgs, m.Origin)
    assert origins == [
        m.Origin(header["origin_lsn"], header["origin_name"]),
        m.Origin(0, header["origin_name"]),
    ]

    # Logical messages: non-transactional, transactional, transactional in a stream.
    nt, tx, streamed = _of(msgs, m.LogicalMessage)
    assert (nt.transactional, nt.prefix, nt.content, nt.xid) == (
        False,
        "sparkapply",
        b"\x00\xff",
        None,
    )
    assert (tx.transactional, tx.content, tx.xid) == (True, b"in a transaction", None)
    assert (streamed.transactional, streamed.content) == (True, b"in a stream")
    assert streamed.xid == xids["stream_commit"]
    assert nt.lsn > tx.lsn  # emitted second, delivered first


def _check_truncates(msgs: Sequence[m.Message], rels: dict[str, m.Relation]) -> None:
    """Truncate: both option bits on two relations, then none on one."""
    t1, t2 = _of(msgs, m.Truncate)
    assert (t1.cascade, t1.restart_identity) == (True, True)
    assert t1.relation_ids == (rels["parent"].relation_id, rels["child"].relation_id)
    assert (t2.options, t2.relation_ids) == (0, (rels["log_t"].relation_id,))


def _check_two_phase(msgs: Sequence[m.Message], xids: dict[str, int]) -> None:
    """Two-phase: gids (one reused, one empty), xids, LSNs agree between the messages."""
    bps, ps = _of(msgs, m.BeginPrepare), _of(msgs, m.Prepare)
    names = ("prepare_commit", "prepare_rollback", "prepare_empty_gid")
    assert [(b.xid, b.gid) for b in bps] == [
        (xids[n], g) for n, g in zip(names, ("gid-1", "gid-1", ""), strict=True)
    ]
    assert [(p.xid, p.gid, p.prepare_lsn, p.end_lsn) for p in ps] == [
        (b.xid, b.gid, b.prepare_lsn, b.end_lsn) for b in bps
    ]
    cps, rps = _of(msgs, m.CommitPrepared), _of(msgs, m.RollbackPrepared)
    assert [(c.xid, c.gid) for c in cps] == [
        (xids["prepare_commit"], "gid-1"),
        (xids["prepare_empty_gid"], ""),
        (xids["stream_prepare_commit"], "gid-s"),
    ]
    assert [(r.xid, r.gid) for r in rps] == [
        (xids["prepare_rollback"], "gid-1"),
        (xids["stream_prepare_rollback"], "gid-s"),
    ]
    assert rps[0].prepare_end_lsn == ps[1].end_lsn and rps[0].prepare_time == ps[1].prepare_time


def _check_streams(msgs: Sequence[m.Message], xids: dict[str, int]) -> None:
    """Streams: xids of segments and of the changes in them, first-segment flags."""
    ins, rps = _of(msgs, m.Insert), _of(msgs, m.RollbackPrepared)
    starts = _of(msgs, m.StreamStart)
    assert [s.xid for s in starts] == [
        *[xids["stream_commit"]] * 4,
        *[xids["stream_abort"]] * 2,
        *[xids["stream_prepare_commit"]] * 2,
        *[xids["stream_prepare_rollback"]] * 2,
    ]
    assert [s.first_segment for s in starts] == [True, False, False, False] + [True, False] * 3
    in_stream = [i for i in ins if i.xid is not None]
    assert [i.xid for i in in_stream] == [
        xids["stream_commit"],
        xids["stream_subxact"],
        xids["stream_subxact_2"],
        xids["stream_abort"],
        xids["stream_abort"],
        *[xids["stream_prepare_commit"]] * 2,
        *[xids["stream_prepare_rollback"]] * 2,
    ]
    assert all(i.xid is None for i in ins[: len(ins) - len(in_stream)])
    sub_abort, top_abort = _of(msgs, m.StreamAbort)
    assert (sub_abort.xid, sub_abort.subxid) == (xids["stream_commit"], xids["stream_subxact"])
    assert (top_abort.xid, top_abort.subxid) == (xids["stream_abort"],) * 2
    commit = _of(msgs, m.StreamCommit)[0]
    assert commit.xid == xids["stream_commit"]
    assert sub_abort.abort_lsn is not None and sub_abort.abort_lsn < commit.commit_lsn
    assert sub_abort.abort_time is not None and sub_abort.abort_time <= commit.commit_time
    assert top_abort.abort_lsn is not None and top_abort.abort_lsn > commit.end_lsn
    sps = _of(msgs, m.StreamPrepare)
    assert [(s.xid, s.gid) for s in sps] == [
        (xids["stream_prepare_commit"], "gid-s"),
        (xids["stream_prepare_rollback"], "gid-s"),
    ]
    assert rps[1].prepare_end_lsn == sps[1].end_lsn


@pytest.fixture(scope="module")
def capture() -> CaptureFile:
    return read_capture(FIXTURE)


def test_fixture_header_and_size(capture: CaptureFile) -> None:
    h = capture.header
    assert (h["proto_version"], h["streaming"], h["two_phase"], h["messages"]) == (
        4,
        "parallel",
        True,
        True,
    )
    assert h["server_version"] >= 160000
    assert len(capture.records) == len(EXPECTED_TAGS)
    assert "".join(r.tag for r in capture.records) == EXPECTED_TAGS
    assert 2_000 < sum(len(p) for p in capture.payloads) < 16_000


def test_fixture_decodes_to_what_the_workload_did(capture: CaptureFile) -> None:
    check_representative(capture.header, _decode(capture))


def test_encoder_reproduces_every_real_payload(capture: CaptureFile) -> None:
    h = capture.header
    for rec, msg in zip(capture.records, _decode(capture), strict=True):
        assert encode(msg, proto_version=h["proto_version"], streaming=h["streaming"]) == (
            rec.payload
        ), msg


def test_decoder_accepts_memoryview_and_bytearray(capture: CaptureFile) -> None:
    expected = _decode(capture)
    for wrap in (memoryview, bytearray):
        dec = Decoder(proto_version=4, streaming="parallel")
        assert [dec.decode(wrap(p)) for p in capture.payloads] == expected


def _states(capture: CaptureFile) -> list[bool]:
    """For each record, whether the decoder is inside a stream block before it."""
    dec = Decoder(proto_version=4, streaming="parallel")
    states = []
    for p in capture.payloads:
        states.append(dec.in_stream)
        dec.decode(p)
    return states


def test_every_truncation_of_a_real_payload_is_a_protocol_error(capture: CaptureFile) -> None:
    for payload, in_stream in zip(capture.payloads, _states(capture), strict=True):
        # All cuts of small messages; of the big TOAST row, the cuts near its fields.
        cuts = (
            range(len(payload))
            if len(payload) < 300
            else [*range(120), *range(len(payload) - 60, len(payload))]
        )
        for n in cuts:
            dec = Decoder(proto_version=4, streaming="parallel", in_stream=in_stream)
            with pytest.raises(ProtocolError):
                dec.decode(payload[:n])
            assert dec.in_stream == in_stream, "a failed decode must not change the state"


def test_trailing_bytes_after_a_real_payload_are_a_protocol_error(capture: CaptureFile) -> None:
    for payload, in_stream in zip(capture.payloads, _states(capture), strict=True):
        dec = Decoder(proto_version=4, streaming="parallel", in_stream=in_stream)
        with pytest.raises(ProtocolError):
            dec.decode(payload + b"\x00")


def test_parallel_stream_abort_is_rejected_when_streaming_is_on(capture: CaptureFile) -> None:
    """A protocol-4 parallel abort (25 bytes) is not a valid streaming='on' abort (9)."""
    aborts = [r.payload for r in capture.records if r.tag == "A"]
    assert [len(a) for a in aborts] == [25, 25]
    for a in aborts:
        with pytest.raises(ProtocolError):
            Decoder(proto_version=4, streaming="on").decode(a)
