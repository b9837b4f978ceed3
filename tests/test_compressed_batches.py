"""Compressed batches whose records disagree with their header, sent on raw
frames: Kafka's LogValidator reads every record of a compressed batch a
client sends, and so does Keel. Runs against Kafka too (KEEL_TEST_IMPL=kafka);
where Keel refuses what Kafka lets through, the test says so."""
from __future__ import annotations

import gzip
import struct
import time

import pytest

import kafka_wire as w
from conftest import IMPL, unique
from kclient import create_topic

UNKNOWN_SERVER_ERROR, NONE, INVALID_RECORD = -1, 0, 87
GZIP = 1
DELETE_HORIZON = 0x40  # the record batch attribute only the cleaner sets


@pytest.fixture(scope="module")
def b(shared_broker):
    return shared_broker


def records(n: int, deltas: list[int] | None = None) -> bytes:
    deltas = list(range(n)) if deltas is None else deltas
    return b"".join(w.record(d, b"k%d" % i, b"value-%d" % i) for i, d in enumerate(deltas))


def gzip_batch(section: bytes, count: int, attributes: int = 0) -> bytes:
    """A gzip batch of the records `section`, whose header claims `count`
    records (last offset delta count - 1, so the header agrees with
    itself), with a correct CRC."""
    ts = int(time.time() * 1000)
    body = gzip.compress(section)
    after_crc = (w.i16(GZIP | attributes) + w.i32(count - 1) + w.i64(ts) + w.i64(ts)
                 + w.i64(-1) + w.i16(-1) + w.i32(-1) + w.i32(count) + body)
    after_len = w.i32(-1) + w.i8(2) + struct.pack(">I", w.crc32c(after_crc)) + after_crc
    return w.i64(0) + w.i32(len(after_len)) + after_len


def produce_v8(b, topic: str, batch: bytes) -> dict:
    with w.Conn(b.bootstrap) as c:
        c.send(w.produce_request(8, 5, topic, 0, batch))
        _cid, body = c.recv_response()
    [p] = w.parse_produce_v8(body)
    return p


def high_watermark(b, topic: str) -> int:
    with w.Conn(b.bootstrap) as c:
        c.send(w.fetch_request_v4(6, topic, 0, 0, max_wait_ms=0))
        _cid, body = c.recv_response()
    [(_n, _p, err, hw, _records)] = w.parse_fetch_v4(body)
    assert err == NONE
    return hw


def topic(b) -> str:
    t = unique("gz")
    create_topic(b.bootstrap, t, partitions=1)
    return t


def test_a_sound_gzip_batch_is_stored(b):
    t = topic(b)
    p = produce_v8(b, t, gzip_batch(records(3), 3))
    assert (p["error_code"], p["base_offset"]) == (NONE, 0)
    assert high_watermark(b, t) == 3


@pytest.mark.parametrize("held, claimed, message", [
    (3, 4, "Incorrect declared batch size, premature EOF reached"),
    (3, 2, "Incorrect declared batch size, records still remaining in file"),
])
def test_a_gzip_batch_whose_record_count_lies_is_refused(b, held, claimed, message):
    t = topic(b)
    p = produce_v8(b, t, gzip_batch(records(held), claimed))
    # Kafka logs the message with the exception and answers without it.
    expected = None if IMPL == "kafka" else message
    assert (p["error_code"], p["error_message"]) == (INVALID_RECORD, expected)
    assert high_watermark(b, t) == 0


def test_gzip_offset_deltas_out_of_order(b):
    t = topic(b)
    p = produce_v8(b, t, gzip_batch(records(3, deltas=[1, 0, 2]), 3))
    if IMPL == "kafka":
        # Kafka means to rebuild the batch with offsets in order, but it
        # read the records without their keys and values (the batch's codec
        # is the topic's), so the rebuild throws: UNKNOWN_SERVER_ERROR
        # ("key is skipped in PartialDefaultRecord" in its log).
        assert p["error_code"] == UNKNOWN_SERVER_ERROR
    else:
        assert p["error_code"] == INVALID_RECORD
        assert "offset delta 1, expected 0" in p["error_message"]
    assert high_watermark(b, t) == 0


def test_a_producer_set_delete_horizon(b):
    t = topic(b)
    p = produce_v8(b, t, gzip_batch(records(2), 2, attributes=DELETE_HORIZON))
    if IMPL == "kafka":
        # Kafka stores the flag as sent; its cleaner would take the base
        # timestamp for the batch's delete horizon.
        assert p["error_code"] == NONE
        return
    assert p["error_code"] == INVALID_RECORD
    assert "delete horizon" in p["error_message"]
    assert high_watermark(b, t) == 0
