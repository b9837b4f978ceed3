"""AlterClientQuotas (49) and DescribeClientQuotas (48) v1 on the wire, for
the answers no client library exposes whole (each entry's error message,
the filters' match types and `strict`)."""
from __future__ import annotations

import struct

import kafka_wire as w

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
EXACT, DEFAULT, ANY = 0, 1, 2

Entity = list[tuple[str, str | None]]


def _entity(r: w.Reader) -> Entity:
    out = []
    for _ in range(r.uvarint() - 1):
        kind = r.compact_string()
        name = r.compact_string()
        r.skip_tags()
        out.append((kind, name))
    return out


def alter(bootstrap: str, entries: list[tuple[Entity, list[tuple[str, float, bool]]]],
          validate_only: bool = False) -> list[tuple[int, str | None, Entity]]:
    """-> per entry (error code, message, entity echoed)."""
    body = w.compact_array([
        w.compact_array([w.compact_string(k) + w.compact_string(n) + w.EMPTY_TAGS for k, n in entity])
        + w.compact_array([w.compact_string(key) + struct.pack(">d", value) + w.i8(int(remove)) + w.EMPTY_TAGS
                  for key, value, remove in ops])
        + w.EMPTY_TAGS
        for entity, ops in entries]) + w.i8(int(validate_only)) + w.EMPTY_TAGS
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(ALTER_CLIENT_QUOTAS, 1, 7) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()  # throttle_time_ms
    out = []
    for _ in range(r.uvarint() - 1):
        code = r.i16()
        message = r.compact_string()
        entity = _entity(r)
        r.skip_tags()
        out.append((code, message, entity))
    return out


def describe(bootstrap: str, components: list[tuple[str, int, str | None]], strict: bool = False
             ) -> tuple[int, str | None, list[tuple[Entity, dict[str, float]]] | None]:
    """-> (error code, message, [(entity, {key: value})] or None)."""
    body = w.compact_array([w.compact_string(kind) + w.i8(match_type) + w.compact_string(name) + w.EMPTY_TAGS
                   for kind, match_type, name in components]) + w.i8(int(strict)) + w.EMPTY_TAGS
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(DESCRIBE_CLIENT_QUOTAS, 1, 8) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()
    code = r.i16()
    message = r.compact_string()
    n = r.uvarint() - 1
    if n < 0:
        return code, message, None
    entries = []
    for _ in range(n):
        entity = _entity(r)
        values = {}
        for _ in range(r.uvarint() - 1):
            key = r.compact_string()
            values[key] = struct.unpack(">d", r.take(8))[0]
            r.skip_tags()
        r.skip_tags()
        entries.append((sorted(entity, key=lambda e: e[0]), values))
    return code, message, entries


CREATE_TOPICS = 19


def create_topics(bootstrap: str, client_id: str, version: int, topics: list[tuple[str, int]]
                  ) -> tuple[int, list[tuple[str, int, str | None]]]:
    """CreateTopics v5-v7 (flexible) as `client_id`: -> (throttle_time_ms,
    [(topic, error code, message)])."""
    assert 5 <= version <= 7
    body = w.compact_array([w.compact_string(name) + w.i32(partitions) + w.i16(-1) + w.compact_array([]) + w.compact_array([])
                   + w.EMPTY_TAGS for name, partitions in topics]) + w.i32(30_000) + w.i8(0) + w.EMPTY_TAGS
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(CREATE_TOPICS, version, 9, client_id) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    throttle = r.i32()
    out = []
    for _ in range(r.uvarint() - 1):
        name = r.compact_string()
        if version >= 7:
            r.take(16)  # topic id
        code = r.i16()
        message = r.compact_string()
        r.i32()  # num_partitions
        r.i16()  # replication_factor
        for _ in range(r.uvarint() - 1):  # configs (null: -1 + 1 = 0 entries)
            r.compact_string()
            r.compact_string()
            r.take(3)  # read_only, config_source, is_sensitive
            r.skip_tags()
        r.skip_tags()
        out.append((name, code, message))
    return throttle, out
