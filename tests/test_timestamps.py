"""Topic timestamp configs as in Kafka: message.timestamp.type=LogAppendTime
(the broker stamps each batch with its own clock) and the CreateTime window
message.timestamp.before.max.ms / message.timestamp.after.max.ms
(INVALID_TIMESTAMP, error code 32)."""
from __future__ import annotations

import time

import pytest

from confluent_kafka import (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, KafkaError,
                             Producer, TopicPartition)

import kafka_wire as kw
from conftest import unique
from kclient import CLIENT_TIMEOUT_S, DeliveryLog, consume_range, consumer, create_topic, produce_all

HOUR_MS = 3_600_000
INVALID_TIMESTAMP = 32


def now_ms() -> int:
    return int(time.time() * 1000)


def test_log_append_time_topic(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("lat")
    create_topic(bs, topic, partitions=2, config={"message.timestamp.type": "LogAppendTime"})
    # CreateTime a day old: LogAppendTime ignores it (and the CreateTime window).
    old = now_ms() - 24 * HOUR_MS
    stamps = {}

    def on_delivery(err, msg):
        assert err is None, err
        stamps[(msg.partition(), msg.offset())] = msg.timestamp()

    p = Producer({"bootstrap.servers": bs, "acks": "all", "compression.type": "gzip",
                  "linger.ms": 5, "enable.idempotence": True})
    before = now_ms()
    for i in range(200):
        p.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=i % 2,
                  timestamp=old + i, on_delivery=on_delivery)
    assert p.flush(CLIENT_TIMEOUT_S) == 0
    after = now_ms()

    # The Produce response carries the log append time; librdkafka reports it.
    assert len(stamps) == 200
    for (part, off), (ts_type, ts) in stamps.items():
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME, (part, off, ts_type)
        assert before <= ts <= after, (part, off, ts, before, after)

    got = consume_range(bs, topic, range(2), 200)
    for part, msgs in got.items():
        for m in msgs:
            assert m.timestamp() == stamps[(part, m.offset())], (part, m.offset(), m.timestamp())
        # Stored batches: timestamp-type bit set, max timestamp = broker
        # time, CRC valid after the rewrite, codec kept.
        batches = kw.fetch_batches(bs, topic, part, check_crc=True)
        assert batches
        for b in batches:
            assert b["log_append_time"] and b["crc_ok"] and b["codec"] == 1, b
            assert before <= b["max_timestamp"] <= after, b

    # Time lookups use the broker's time: everything is at or after `before`.
    c = consumer(bs)
    try:
        res = c.offsets_for_times([TopicPartition(topic, 0, old), TopicPartition(topic, 1, after + 1)],
                                  timeout=CLIENT_TIMEOUT_S)
        assert [(r.partition, r.offset) for r in res] == [(0, 0), (1, -1)]
    finally:
        c.close()


def test_log_append_time_kafka_python(shared_broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTP
    bs = shared_broker.bootstrap
    topic = unique("lat-kp")
    create_topic(bs, topic, partitions=1, config={"message.timestamp.type": "LogAppendTime"})
    prod = KafkaProducer(bootstrap_servers=bs, acks="all")
    before = now_ms()
    md = prod.send(topic, b"v", partition=0, timestamp_ms=1000).get(timeout=CLIENT_TIMEOUT_S)
    after = now_ms()
    prod.close(timeout=10)
    assert before <= md.timestamp <= after, md
    cons = KafkaConsumer(bootstrap_servers=bs, group_id=None, enable_auto_commit=False,
                         request_timeout_ms=20000)
    try:
        tp = KTP(topic, 0)
        cons.assign([tp])
        cons.seek_to_beginning()
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        msgs = []
        while not msgs:
            assert time.monotonic() < deadline, "no record"
            msgs = cons.poll(timeout_ms=500).get(tp, [])
        assert (msgs[0].timestamp_type, msgs[0].timestamp) == (1, md.timestamp)
    finally:
        cons.close()


def test_create_time_window(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("ctw")
    create_topic(bs, topic, partitions=1, config={"message.timestamp.before.max.ms": str(HOUR_MS)})
    now = now_ms()
    p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 0, "retries": 0})
    cases = {"old": now - 2 * HOUR_MS, "future": now + 2 * HOUR_MS,
             "recent": now - HOUR_MS // 2, "soon": now + HOUR_MS // 2}
    results = {}
    for name, ts in cases.items():
        p.produce(topic, value=name.encode(), partition=0, timestamp=ts,
                  on_delivery=lambda err, msg, name=name: results.__setitem__(name, err))
        # One batch per case: the verdict is per batch.
        assert p.flush(CLIENT_TIMEOUT_S) == 0
    assert results["recent"] is None and results["soon"] is None, results
    for name in ("old", "future"):
        assert results[name] is not None and results[name].code() == KafkaError.INVALID_TIMESTAMP, results

    got = consume_range(bs, topic, [0], 2)
    assert [(m.value(), m.timestamp()) for m in got[0]] == [
        (b"recent", (TIMESTAMP_CREATE_TIME, cases["recent"])),
        (b"soon", (TIMESTAMP_CREATE_TIME, cases["soon"]))]


def test_create_time_window_names_the_records(shared_broker):
    """Produce v8 reports which records of a refused batch are out of range."""
    bs = shared_broker.bootstrap
    topic = unique("ctw-wire")
    create_topic(bs, topic, partitions=1, config={"message.timestamp.before.max.ms": str(HOUR_MS)})
    now = now_ms()
    # Record 1 is two hours old, record 3 two hours ahead (the default
    # message.timestamp.after.max.ms is one hour).
    deltas = [0, -2 * HOUR_MS, 1000, 2 * HOUR_MS]
    batch = kw.record_batch([(None, b"x")] * 4, base_timestamp=now, timestamp_deltas=deltas)
    with kw.Conn(bs) as c:
        c.send(kw.produce_request(8, 5, topic, 0, batch))
        _cid, body = c.recv_response()
        [refused] = kw.parse_produce_v8(body)
        assert refused["error_code"] == INVALID_TIMESTAMP, refused
        assert [i for i, _msg in refused["record_errors"]] == [1, 3], refused
        assert refused["error_message"] == \
            "One or more records have been rejected due to invalid timestamp", refused
        assert "of message with offset 1 is out of range" in refused["record_errors"][0][1], refused

        # Within the window: appended, no log append time (-1).
        ok = kw.record_batch([(None, b"y")] * 2, base_timestamp=now, timestamp_deltas=[0, -1000])
        c.send(kw.produce_request(8, 6, topic, 0, ok))
        _cid, body = c.recv_response()
        [accepted] = kw.parse_produce_v8(body)
    assert (accepted["error_code"], accepted["base_offset"], accepted["log_append_time_ms"]) == (0, 0, -1)
    assert accepted["record_errors"] == [] and accepted["error_message"] is None


def test_producer_cannot_set_log_append_time(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("ctw-lat")
    create_topic(bs, topic, partitions=1)
    batch = kw.record_batch([(None, b"x")], attributes=0x08)
    with kw.Conn(bs) as c:
        c.send(kw.produce_request(8, 7, topic, 0, batch))
        _cid, body = c.recv_response()
    [refused] = kw.parse_produce_v8(body)
    assert refused["error_code"] == INVALID_TIMESTAMP, refused


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_every_record_of_a_compressed_batch_is_checked(shared_broker, codec):
    """Kafka opens compressed batches and checks every record's timestamp,
    naming the refused ones (KIP-467): out-of-range records in the middle of
    a batch are found in every codec, so librdkafka fails those with
    INVALID_RECORD (its code for any named record of a batch naming several)
    and the others with _INVALID_DIFFERENT_RECORD."""
    bs = shared_broker.bootstrap
    topic = unique(f"ctw-{codec}")
    create_topic(bs, topic, partitions=1, config={"message.timestamp.before.max.ms": str(HOUR_MS)})
    p = Producer({"bootstrap.servers": bs, "linger.ms": 5000, "retries": 0,
                  "compression.type": codec, "message.timeout.ms": 10000})
    # The partition's leader known first, so the ten records go out as one
    # batch (a record produced before it is known can leave alone).
    p.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
    now = now_ms()
    old = {3, 7}
    errors = {}
    for i in range(10):
        ts = now - 2 * HOUR_MS if i in old else now + i
        p.produce(topic, value=b"v" * 100, partition=0, timestamp=ts,
                  on_delivery=lambda err, msg, i=i: errors.__setitem__(i, err))
    assert p.flush(CLIENT_TIMEOUT_S) == 0
    codes = {i: (e.code() if e is not None else None) for i, e in sorted(errors.items())}
    assert {i for i, c in codes.items() if c == KafkaError.INVALID_RECORD} == old, codes
    assert all(codes[i] == KafkaError._INVALID_DIFFERENT_RECORD for i in range(10) if i not in old), codes
