"""ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69) v1 on the
wire (KIP-848): the answers no client library exposes whole (a group's
epochs, each member's assignment and target)."""
from __future__ import annotations

import uuid

import kafka_wire as w

HEARTBEAT, DESCRIBE = 68, 69


def _assignment(r: w.Reader) -> dict[str, list[int]]:
    """-> {topic name: partitions}"""
    out = {}
    for _ in range(r.uvarint() - 1):
        r.take(16)  # topic id
        name = r.compact_string()
        out[name] = sorted(r.i32() for _ in range(r.uvarint() - 1))
        r.skip_tags()
    r.skip_tags()
    return out


def describe(bootstrap: str, group: str) -> dict:
    """-> {"error", "state", "epoch", "assignment_epoch", "assignor",
    "members": {member id: {"epoch", "client_id", "topics", "assignment", "target"}}}"""
    body = w.compact_array([w.compact_string(group)]) + w.i8(0) + w.EMPTY_TAGS
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(DESCRIBE, 1, 5) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()
    assert r.uvarint() - 1 == 1
    g = {"error": r.i16(), "message": r.compact_string()}
    r.compact_string()  # group id
    g["state"] = r.compact_string()
    g["epoch"], g["assignment_epoch"] = r.i32(), r.i32()
    g["assignor"] = r.compact_string()
    members = {}
    for _ in range(r.uvarint() - 1):
        member_id = r.compact_string()
        r.compact_string(), r.compact_string()  # instance id, rack id
        m = {"epoch": r.i32(), "client_id": r.compact_string(), "client_host": r.compact_string()}
        m["topics"] = [r.compact_string() for _ in range(r.uvarint() - 1)]
        m["regex"] = r.compact_string()
        m["assignment"] = _assignment(r)
        m["target"] = _assignment(r)
        m["type"] = r.i8()
        r.skip_tags()
        members[member_id] = m
    g["members"] = members
    r.i32()  # authorized operations
    r.skip_tags()
    return g


def heartbeat(bootstrap: str, group: str, member_id: str, epoch: int, topics: list[str] | None = None,
              owned: list[tuple[uuid.UUID, list[int]]] | None = None, rebalance_timeout_ms: int = 30000,
              assignor: str | None = None, regex: str | None = None, version: int = 1) -> dict:
    """One ConsumerGroupHeartbeat: -> {"error", "message", "member_id", "epoch", "interval", "assignment"}"""
    topics_field = w.uvarint(0) if topics is None else w.compact_array([w.compact_string(t) for t in topics])
    owned_field = w.uvarint(0) if owned is None else w.compact_array([
        t.bytes + w.compact_array([w.i32(p) for p in ps]) + w.EMPTY_TAGS for t, ps in owned])
    body = (w.compact_string(group) + w.compact_string(member_id) + w.i32(epoch)
            + w.compact_string(None) + w.compact_string(None) + w.i32(rebalance_timeout_ms)
            + topics_field + (w.compact_string(regex) if version >= 1 else b"")
            + w.compact_string(assignor) + owned_field + w.EMPTY_TAGS)
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(HEARTBEAT, version, 6) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()
    out = {"error": r.i16(), "message": r.compact_string(), "member_id": r.compact_string(), "epoch": r.i32(),
           "interval": r.i32()}
    present = r.i8()
    if present >= 0:
        assignment = []
        for _ in range(r.uvarint() - 1):
            topic_id = uuid.UUID(bytes=r.take(16))
            assignment.append((topic_id, sorted(r.i32() for _ in range(r.uvarint() - 1))))
            r.skip_tags()
        r.skip_tags()
        out["assignment"] = assignment
    else:
        out["assignment"] = None
    r.skip_tags()
    return out



def find_coordinator(bootstrap: str, group: str) -> int:
    """FindCoordinator v1 for a group: -> the error code (0: ready). Kafka
    creates its offsets topic on the first one, and answers group requests
    with NOT_COORDINATOR until then."""
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v1(10, 1, 4) + w.string(group) + w.i8(0)))
        _cid, resp = c.recv_response()
    r = w.Reader(resp)
    r.i32()
    return r.i16()


def _offset_fetch(bootstrap: str, group: str, member_id: str | None, member_epoch: int
                  ) -> tuple[int, dict[tuple[str, int], int]]:
    """OffsetFetch v9 of every offset of `group`: -> (group-level error,
    {(topic, partition): committed offset})."""
    body = (w.compact_array([w.compact_string(group) + w.compact_string(member_id) + w.i32(member_epoch)
                    + w.uvarint(0) + w.EMPTY_TAGS]) + w.i8(0) + w.EMPTY_TAGS)
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(9, 9, 8) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()
    assert r.uvarint() - 1 == 1
    r.compact_string()
    committed = {}
    for _ in range(r.uvarint() - 1):
        topic = r.compact_string()
        for _ in range(r.uvarint() - 1):
            partition, offset, _epoch = r.i32(), r.i64(), r.i32()
            r.compact_string()
            r.i16()
            r.skip_tags()
            if offset >= 0:
                committed[(topic, partition)] = offset
        r.skip_tags()
    return r.i16(), committed


def offset_fetch_error(bootstrap: str, group: str, member_id: str | None, member_epoch: int) -> int:
    """OffsetFetch v9 as a member (or as an admin tool: no member, epoch
    -1): -> the group-level error code."""
    return _offset_fetch(bootstrap, group, member_id, member_epoch)[0]


def offset_fetch_committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets, read as an admin tool does."""
    error, committed = _offset_fetch(bootstrap, group, None, -1)
    assert error == 0, error
    return committed
