"""Raw Kafka requests for the hardening tests: forged record batches, a
multi-partition Fetch, InitProducerId, ListOffsets, Produce v12 and
EndTxn v5 in their flexible versions."""
from __future__ import annotations

import struct

import kafka_wire as w

INIT_PRODUCER_ID = 22
END_TXN = 26
TRANSACTIONAL = 0x10  # the record batch attribute

# Record batch header field offsets (docs/format.md).
LENGTH_AT, MAGIC_AT, CRC_AT, ATTRIBUTES_AT = 8, 16, 17, 21
LAST_OFFSET_DELTA_AT, PRODUCER_ID_AT, BASE_SEQUENCE_AT, RECORDS_COUNT_AT = 23, 43, 53, 57


def forge(batch: bytes, resign: bool = True, **fields) -> bytes:
    """A copy of `batch` with header fields replaced (magic, last_offset_delta,
    records_count, base_sequence) and, unless told otherwise, a CRC that
    matches again, as a hostile client would send it."""
    b = bytearray(batch)
    layout = {"magic": (MAGIC_AT, ">b"), "last_offset_delta": (LAST_OFFSET_DELTA_AT, ">i"),
              "records_count": (RECORDS_COUNT_AT, ">i"), "base_sequence": (BASE_SEQUENCE_AT, ">i"),
              "producer_id": (PRODUCER_ID_AT, ">q")}
    for name, value in fields.items():
        at, fmt = layout[name]
        struct.pack_into(fmt, b, at, value)
    if resign:
        struct.pack_into(">I", b, CRC_AT, w.crc32c(bytes(b[ATTRIBUTES_AT:])))
    return bytes(b)


def produce_v3(topic: str, partition: int, records: bytes, correlation_id: int = 1) -> bytes:
    """Produce v3 with a raw records field (any bytes, any number of batches)."""
    return w.produce_request(3, correlation_id, topic, partition, records)


def produce_v3_many(parts: list[tuple[str, int, bytes]], correlation_id: int = 1) -> bytes:
    """Produce v3 of several (topic, partition, records), one topic entry
    each, in one request."""
    topics = b"".join(w.string(t) + w.i32(1) + w.i32(p) + w.nbytes(r) for t, p, r in parts)
    body = w.string(None) + w.i16(-1) + w.i32(30000) + w.i32(len(parts)) + topics
    return w.frame(w.header_v1(w.PRODUCE, 3, correlation_id) + body)


def produce(conn: w.Conn, topic: str, partition: int, records: bytes) -> tuple[int, int]:
    """(error_code, base_offset) of a Produce v3 on `conn`."""
    conn.send(produce_v3(topic, partition, records))
    _cid, body = conn.recv_response()
    [(_t, _p, err, base)] = w.parse_produce(body, 3)
    return err, base


def fetch_v4(topic: str, partitions: list[int], offset: int, max_bytes: int, partition_max_bytes: int,
             max_wait_ms: int = 500, min_bytes: int = 1, correlation_id: int = 1) -> bytes:
    """Fetch v4 of several partitions of one topic, all from `offset`."""
    parts = b"".join(w.i32(p) + w.i64(offset) + w.i32(partition_max_bytes) for p in partitions)
    body = (w.i32(-1) + w.i32(max_wait_ms) + w.i32(min_bytes) + w.i32(max_bytes) + w.i8(0)
            + w.i32(1) + w.string(topic) + w.i32(len(partitions)) + parts)
    return w.frame(w.header_v1(w.FETCH, 4, correlation_id) + body)


def fetch_empty_v4(max_wait_ms: int, min_bytes: int = 1) -> bytes:
    """Fetch v4 naming no partition at all."""
    body = w.i32(-1) + w.i32(max_wait_ms) + w.i32(min_bytes) + w.i32(1 << 20) + w.i8(0) + w.i32(0)
    return w.frame(w.header_v1(w.FETCH, 4, 1) + body)


def init_producer_id(conn: w.Conn, producer_id: int = -1, epoch: int = -1,
                     transactional_id: str | None = None) -> tuple[int, int, int]:
    """InitProducerId v4 -> (error, id, epoch)."""
    body = (w.compact_string(transactional_id) + w.i32(60000) + w.i64(producer_id) + w.i16(epoch)
            + w.EMPTY_TAGS)
    conn.send(w.frame(w.header_v2(INIT_PRODUCER_ID, 4, 7) + body))
    _cid, resp = conn.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()  # throttle
    return r.i16(), r.i64(), r.i16()


def list_offsets_v10(conn: w.Conn, topic: str, partition: int, timestamp: int) -> tuple[int, int]:
    """ListOffsets v10 (flexible) -> (error, offset)."""
    conn.send(list_offsets_v10_request(topic, partition, timestamp))
    _cid, resp = conn.recv_response_flexible()
    return parse_list_offsets_v10(resp)


def list_offsets_v10_request(topic: str, partition: int, timestamp: int, correlation_id: int = 9) -> bytes:
    part = w.i32(partition) + w.i32(-1) + w.i64(timestamp) + w.EMPTY_TAGS
    topics = w.uvarint(2) + w.compact_string(topic) + w.uvarint(2) + part + w.EMPTY_TAGS
    body = w.i32(-1) + w.i8(0) + topics + w.i32(5000) + w.EMPTY_TAGS
    return w.frame(w.header_v2(w.LIST_OFFSETS, 10, correlation_id) + body)


def parse_list_offsets_v10(resp: bytes) -> tuple[int, int]:
    """A ListOffsets v10 response body of one partition -> (error, offset)."""
    r = w.Reader(resp)
    r.i32()  # throttle
    assert r.uvarint() == 2
    r.take(r.uvarint() - 1)  # topic name
    assert r.uvarint() == 2
    r.i32()  # partition index
    err, _ts, offset = r.i16(), r.i64(), r.i64()
    return err, offset


WRITE_TXN_MARKERS = 27


def write_txn_markers(conn: w.Conn, topic: str, partition: int, producer_id: int, epoch: int,
                      commit: bool, coordinator_epoch: int) -> int:
    """WriteTxnMarkers v1 with one marker for one partition -> its error."""
    topics = w.uvarint(2) + w.compact_string(topic) + w.uvarint(2) + w.i32(partition) + w.EMPTY_TAGS
    marker = (w.i64(producer_id) + w.i16(epoch) + w.i8(1 if commit else 0) + topics
              + w.i32(coordinator_epoch) + w.EMPTY_TAGS)
    conn.send(w.frame(w.header_v2(WRITE_TXN_MARKERS, 1, 11) + w.uvarint(2) + marker + w.EMPTY_TAGS))
    _cid, resp = conn.recv_response_flexible()
    r = w.Reader(resp)
    assert r.uvarint() == 2
    r.i64()  # producer id
    assert r.uvarint() == 2
    r.take(r.uvarint() - 1)  # topic name
    assert r.uvarint() == 2
    r.i32()  # partition index
    return r.i16()


def produce_v12(conn: w.Conn, topic: str, partition: int, records: bytes,
                transactional_id: str | None = None) -> tuple[int, int]:
    """Produce v12 (transactions v2: a transactional batch adds its
    partition to the transaction) of one batch -> (error, base offset)."""
    partitions = w.uvarint(2) + w.i32(partition) + w.uvarint(len(records) + 1) + records + w.EMPTY_TAGS
    topics = w.uvarint(2) + w.compact_string(topic) + partitions + w.EMPTY_TAGS
    body = w.compact_string(transactional_id) + w.i16(-1) + w.i32(5000) + topics + w.EMPTY_TAGS
    conn.send(w.frame(w.header_v2(w.PRODUCE, 12, 13) + body))
    _cid, resp = conn.recv_response_flexible()
    r = w.Reader(resp)
    assert r.uvarint() == 2
    r.take(r.uvarint() - 1)  # topic name
    assert r.uvarint() == 2
    r.i32()  # partition index
    return r.i16(), r.i64()


def end_txn_v5(conn: w.Conn, transactional_id: str, producer_id: int, epoch: int,
               commit: bool) -> tuple[int, int, int]:
    """EndTxn v5 (transactions v2) -> (error, producer id, epoch) the
    client goes on with."""
    body = (w.compact_string(transactional_id) + w.i64(producer_id) + w.i16(epoch)
            + w.i8(1 if commit else 0) + w.EMPTY_TAGS)
    conn.send(w.frame(w.header_v2(END_TXN, 5, 17) + body))
    _cid, resp = conn.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()  # throttle
    return r.i16(), r.i64(), r.i16()
