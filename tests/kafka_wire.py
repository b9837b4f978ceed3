"""Hand-built Kafka wire frames for tests that clients cannot express
(malformed input, exact versions). Pure Python, no I/O except `Conn`.

Covers: request header v1/v2, ApiVersions v0-v3, Metadata v1, Produce v3-v7
(non-flexible) with one record batch v2, Fetch v4, and the CRC-32C and
zig-zag varints that record batches use. `fetch_batches` and
`advertised_apis` ask a broker what it stores and what it advertises.
"""
from __future__ import annotations

import socket
import struct
import time

# ------------------------------------------------------------- primitives

def _crc32c_table():
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def uvarint(n: int) -> bytes:
    assert n >= 0
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint(n: int) -> bytes:
    """Zig-zag signed varint (also used for varlong)."""
    return uvarint((n << 1) ^ (n >> 63))


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def i8(n): return struct.pack(">b", n)
def i16(n): return struct.pack(">h", n)
def i32(n): return struct.pack(">i", n)
def i64(n): return struct.pack(">q", n)


def string(s: str | None) -> bytes:
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def compact_string(s: str | None) -> bytes:
    if s is None:
        return uvarint(0)
    b = s.encode()
    return uvarint(len(b) + 1) + b


def compact_array(items: list[bytes]) -> bytes:
    """A flexible version's array: its length + 1 as an unsigned varint."""
    return uvarint(len(items) + 1) + b"".join(items)


def nbytes(b: bytes | None) -> bytes:
    if b is None:
        return i32(-1)
    return i32(len(b)) + b


EMPTY_TAGS = uvarint(0)

# ------------------------------------------------------------------ keys

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
API_VERSIONS = 18

# ----------------------------------------------------------------- headers

def header_v1(api_key: int, version: int, correlation_id: int, client_id: str | None = "keel-wire") -> bytes:
    return i16(api_key) + i16(version) + i32(correlation_id) + string(client_id)


def header_v2(api_key: int, version: int, correlation_id: int, client_id: str | None = "keel-wire") -> bytes:
    return header_v1(api_key, version, correlation_id, client_id) + EMPTY_TAGS


def frame(payload: bytes) -> bytes:
    return i32(len(payload)) + payload

# ------------------------------------------------------------- requests

def api_versions_request(version: int, correlation_id: int) -> bytes:
    """ApiVersions vN. v3+ is flexible (header v2, client software name/version);
    versions above 3 are sent in v3 layout, as a newer client would."""
    if version < 3:
        return frame(header_v1(API_VERSIONS, version, correlation_id))
    body = compact_string("keel-tests") + compact_string("1.0") + EMPTY_TAGS
    return frame(header_v2(API_VERSIONS, version, correlation_id) + body)


def metadata_request_v1(correlation_id: int, topics: list[str] | None) -> bytes:
    if topics is None:
        body = i32(-1)
    else:
        body = i32(len(topics)) + b"".join(string(t) for t in topics)
    return frame(header_v1(METADATA, 1, correlation_id) + body)


def record(offset_delta: int, key: bytes | None, value: bytes | None,
           headers=(), ts_delta: int = 0) -> bytes:
    body = i8(0) + varint(ts_delta) + varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(len(headers))
    for hk, hv in headers:
        hkb = hk.encode()
        body += varint(len(hkb)) + hkb
        body += varint(-1) if hv is None else varint(len(hv)) + hv
    return varint(len(body)) + body


def record_batch(records: list[tuple[bytes | None, bytes | None]], base_timestamp: int | None = None,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 attributes: int = 0, timestamp_deltas: list[int] | None = None) -> bytes:
    """An uncompressed magic-2 batch (base offset 0) with a correct CRC.
    Records carry the base timestamp plus their timestamp_deltas (default 0)."""
    ts = int(time.time() * 1000) if base_timestamp is None else base_timestamp
    deltas = timestamp_deltas or [0] * len(records)
    recs = b"".join(record(i, k, v, ts_delta=d) for i, ((k, v), d) in enumerate(zip(records, deltas)))
    after_crc = (i16(attributes) + i32(len(records) - 1) + i64(ts) + i64(ts + max(deltas, default=0))
                 + i64(producer_id) + i16(producer_epoch) + i32(base_sequence)
                 + i32(len(records)) + recs)
    # batchLength counts from partitionLeaderEpoch to the end.
    after_len = i32(-1) + i8(2) + struct.pack(">I", crc32c(after_crc)) + after_crc
    return i64(0) + i32(len(after_len)) + after_len


BATCH_CRC_OFFSET = 8 + 4 + 4 + 1   # baseOffset, batchLength, leaderEpoch, magic


def produce_request(version: int, correlation_id: int, topic: str, partition: int,
                    batch: bytes, acks: int = -1, timeout_ms: int = 5000) -> bytes:
    """Produce v3..v8 (non-flexible): one topic, one partition, one batch."""
    assert 3 <= version <= 8
    body = (string(None) + i16(acks) + i32(timeout_ms) + i32(1) + string(topic)
            + i32(1) + i32(partition) + nbytes(batch))
    return frame(header_v1(PRODUCE, version, correlation_id) + body)


def fetch_request_v4(correlation_id: int, topic: str, partition: int, offset: int,
                     max_wait_ms: int, min_bytes: int = 1, max_bytes: int = 1 << 20) -> bytes:
    body = (i32(-1) + i32(max_wait_ms) + i32(min_bytes) + i32(max_bytes) + i8(0)
            + i32(1) + string(topic) + i32(1) + i32(partition) + i64(offset) + i32(max_bytes))
    return frame(header_v1(FETCH, 4, correlation_id) + body)

# -------------------------------------------------------------- responses

class Reader:
    def __init__(self, buf: bytes):
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        assert self.pos + n <= len(self.buf), f"short response: need {n} at {self.pos}/{len(self.buf)}"
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def i8(self): return struct.unpack(">b", self.take(1))[0]
    def i16(self): return struct.unpack(">h", self.take(2))[0]
    def i32(self): return struct.unpack(">i", self.take(4))[0]
    def i64(self): return struct.unpack(">q", self.take(8))[0]

    def uvarint(self):
        n, self.pos = read_uvarint(self.buf, self.pos)
        return n

    def string(self):
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def compact_string(self):
        n = self.uvarint() - 1
        return None if n < 0 else self.take(n).decode()

    def bytes_(self):
        n = self.i32()
        return None if n < 0 else self.take(n)

    def skip_tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())

    def done(self) -> bool:
        return self.pos == len(self.buf)


def parse_api_versions(body: bytes, version: int) -> tuple[int, dict]:
    """-> (error_code, {api_key: (min, max)}). The response header is always v0."""
    r = Reader(body)
    err = r.i16()
    apis = {}
    n = r.uvarint() - 1 if version >= 3 else r.i32()
    for _ in range(n):
        k, lo, hi = r.i16(), r.i16(), r.i16()
        if version >= 3:
            r.skip_tags()
        apis[k] = (lo, hi)
    if version >= 1:
        r.i32()  # throttle_time_ms
    if version >= 3:
        r.skip_tags()
    assert r.done(), f"{len(body) - r.pos} trailing bytes in ApiVersions v{version} response"
    return err, apis


def parse_produce(body: bytes, version: int) -> list[tuple[str, int, int, int]]:
    """Produce v3..v7 -> [(topic, partition, error_code, base_offset)]."""
    r = Reader(body)
    out = []
    for _ in range(r.i32()):
        name = r.string()
        for _ in range(r.i32()):
            part, err, base = r.i32(), r.i16(), r.i64()
            r.i64()  # log_append_time
            if version >= 5:
                r.i64()  # log_start_offset
            out.append((name, part, err, base))
    r.i32()  # throttle_time_ms
    assert r.done(), "trailing bytes in Produce response"
    return out


def parse_produce_v8(body: bytes) -> list[dict]:
    """Produce v8 (the last non-flexible version) -> one dict per partition
    with error_code, base_offset, log_append_time_ms, log_start_offset,
    record_errors [(batch_index, message)] and error_message."""
    r = Reader(body)
    out = []
    for _ in range(r.i32()):
        name = r.string()
        for _ in range(r.i32()):
            p = {"topic": name, "partition": r.i32(), "error_code": r.i16(),
                 "base_offset": r.i64(), "log_append_time_ms": r.i64(),
                 "log_start_offset": r.i64()}
            p["record_errors"] = [(r.i32(), r.string()) for _ in range(r.i32())]
            p["error_message"] = r.string()
            out.append(p)
    r.i32()  # throttle_time_ms
    assert r.done(), "trailing bytes in Produce v8 response"
    return out


def parse_fetch_v4(body: bytes) -> list[tuple[str, int, int, int, bytes | None]]:
    """-> [(topic, partition, error_code, high_watermark, records)]."""
    r = Reader(body)
    r.i32()  # throttle
    out = []
    for _ in range(r.i32()):
        name = r.string()
        for _ in range(r.i32()):
            part, err, hw = r.i32(), r.i16(), r.i64()
            r.i64()  # last_stable_offset
            n_aborted = r.i32()
            for _ in range(max(n_aborted, 0)):
                r.i64(), r.i64()
            out.append((name, part, err, hw, r.bytes_()))
    assert r.done(), "trailing bytes in Fetch response"
    return out

# ------------------------------------------------------------------ socket

class Conn:
    """A blocking connection with a deadline on every read."""

    def __init__(self, bootstrap: str, timeout_s: float = 10.0):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.settimeout(timeout_s)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def recv_response(self) -> tuple[int, bytes]:
        """-> (correlation_id, body after a v0 response header)."""
        size = struct.unpack(">i", self._recv_exact(4))[0]
        payload = self._recv_exact(size)
        return struct.unpack(">i", payload[:4])[0], payload[4:]

    def recv_response_flexible(self) -> tuple[int, bytes]:
        """-> (correlation_id, body after a v1 (tagged) response header)."""
        cid, rest = self.recv_response()
        _tags, pos = read_uvarint(rest, 0)
        assert _tags == 0, "unexpected tagged fields in response header"
        return cid, rest[pos:]

    def closed_by_peer(self) -> bool:
        """True once the peer closed (EOF or reset); raises on timeout."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------ broker inspection

def advertised_apis(bootstrap: str) -> dict[int, tuple[int, int]]:
    """api_key -> (min, max) from an ApiVersions v0 request."""
    with Conn(bootstrap) as c:
        c.send(api_versions_request(0, 1))
        _cid, body = c.recv_response()
    err, apis = parse_api_versions(body, 0)
    assert err == 0, f"ApiVersions error {err}"
    return apis


def parse_batch_headers(records: bytes, check_crc: bool = False) -> list[dict]:
    """Headers of the whole v2 batches in a Fetch's records field; a partial
    batch at the end (the fetch's byte limit) is left out. With check_crc,
    `crc_ok` says whether the stored CRC-32C matches attributes..end (pure
    Python: slow on megabytes)."""
    out = []
    pos = 0
    while pos + 61 <= len(records):
        r = Reader(records[pos:pos + 61])
        base_offset, length, _epoch, magic = r.i64(), r.i32(), r.i32(), r.i8()
        crc = struct.unpack(">I", r.take(4))[0]
        end = pos + 12 + length
        if end > len(records):
            break
        attributes, last_delta = r.i16(), r.i32()
        base_ts, max_ts = r.i64(), r.i64()
        out.append({
            "base_offset": base_offset, "magic": magic, "attributes": attributes,
            "codec": attributes & 0x7, "log_append_time": bool(attributes & 0x8),
            "last_offset_delta": last_delta, "base_timestamp": base_ts,
            "max_timestamp": max_ts,
            "crc_ok": crc == crc32c(records[pos + 21:end]) if check_crc else None,
        })
        pos = end
    return out


def fetch_batches(bootstrap: str, topic: str, partition: int, offset: int = 0,
                  max_bytes: int = 64 << 20, check_crc: bool = False) -> list[dict]:
    """The stored batches from `offset` on, as one raw Fetch v4 returns them."""
    with Conn(bootstrap) as c:
        c.send(fetch_request_v4(1, topic, partition, offset, max_wait_ms=0, max_bytes=max_bytes))
        _cid, body = c.recv_response()
    [(_t, _p, err, _hw, records)] = parse_fetch_v4(body)
    assert err == 0, f"raw fetch of {topic}-{partition}: error {err}"
    return parse_batch_headers(records or b"", check_crc)
