"""DescribeConfigs v4 by hand, for what the client libraries do not expose:
each config's `documentation` (v3+), asked for with include_documentation."""
from __future__ import annotations

import struct

import kafka_wire as kw

DESCRIBE_CONFIGS = 32
RESOURCE_BROKER, RESOURCE_GROUP = 4, 32


def describe_configs_request(correlation_id: int, resource_type: int, name: str,
                             keys: list[str] | None = None) -> bytes:
    """DescribeConfigs v4 (flexible) for one resource, with synonyms and
    documentation."""
    key_array = b"\x00" if keys is None else kw.compact_array([kw.compact_string(k) for k in keys])
    resource = struct.pack(">b", resource_type) + kw.compact_string(name) + key_array + b"\x00"
    body = kw.compact_array([resource]) + b"\x01" + b"\x01" + b"\x00"
    return kw.frame(kw.header_v2(DESCRIBE_CONFIGS, 4, correlation_id) + body)


def describe_configs(bootstrap: str, resource_type: int, name: str,
                     keys: list[str] | None = None) -> dict:
    """-> {"error_code", "error_message", "configs": {name: {value, read_only,
    source, sensitive, synonyms: [(name, value, source)], type, documentation}}}."""
    with kw.Conn(bootstrap) as c:
        c.send(describe_configs_request(1, resource_type, name, keys))
        _cid, body = c.recv_response_flexible()
    r = kw.Reader(body)
    r.i32()  # throttle
    [result] = [_result(r) for _ in range(r.uvarint() - 1)]
    r.skip_tags()
    assert r.done()
    return result


def _result(r: kw.Reader) -> dict:
    out = {"error_code": r.i16(), "error_message": r.compact_string()}
    r.i8()
    r.compact_string()
    configs = {}
    for _ in range(r.uvarint() - 1):
        name = r.compact_string()
        c = {"value": r.compact_string(), "read_only": r.i8() != 0, "source": r.i8(),
             "sensitive": r.i8() != 0}
        synonyms = []
        for _ in range(r.uvarint() - 1):
            synonyms.append((r.compact_string(), r.compact_string(), r.i8()))
            r.skip_tags()
        c["synonyms"] = synonyms
        c["type"] = r.i8()
        c["documentation"] = r.compact_string()
        r.skip_tags()
        configs[name] = c
    r.skip_tags()
    out["configs"] = configs
    return out
