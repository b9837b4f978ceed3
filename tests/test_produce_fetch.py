"""Produce/fetch round trips, admin and offset APIs with real clients."""
from __future__ import annotations

import random
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic,
                                  OffsetSpec)

from conftest import unique, wait_until
import kafka_wire as kw
from kclient import (CLIENT_TIMEOUT_S, CODEC_IDS, DeliveryLog, admin, consume_range, consumer, create_topic,
                     assert_stored_codec, expected_codec, produce_all, stored_codecs, topic_absent,
                     topic_partitions, wait_topic)

# ----------------------------------------------------------------- records

def make_records(n: int, seed: int):
    """Deterministic, varied records: compressible and random values, empty and
    null keys/values, null header values, a few large values."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = f"key-{i % 5003}-{seed}".encode()
        if i % 97 == 0:
            key = None
        elif i % 101 == 0:
            key = b""
        kind = i % 4
        if kind == 0:
            value = (f"value {i} ".encode() * rng.randint(1, 40))
        elif kind == 1:
            value = rng.randbytes(rng.randint(0, 300))
        elif kind == 2:
            value = f"{i}".encode() + b"\x00" * rng.randint(0, 2000)
        else:
            value = b""
        if i % 89 == 0:
            value = None
        if i % 5000 == 17:
            value = rng.randbytes(200_000)
        headers = [("i", str(i).encode()), ("seed", str(seed).encode())]
        if i % 7 == 0:
            headers.append(("null-header", None))
        if i % 11 == 0:
            headers.append(("i", b"duplicate header name"))
        if i % 13 == 0:
            headers = []
        out.append({"key": key, "value": value, "headers": headers})
    return out


def norm_headers(h):
    return [(k, v) for k, v in (h or [])]


def check_roundtrip(records, log: DeliveryLog, consumed: dict, check_offsets: bool = True):
    """Every produced record came back byte for byte, in produce order per partition."""
    log.check()
    assert len(log.acked) == len(records)
    by_i = {i: (part, off) for i, part, off in log.acked}
    expected = {}
    for i, r in enumerate(records):
        expected.setdefault(by_i[i][0], []).append((i, r))
    total = sum(len(v) for v in consumed.values())
    assert total == len(records), f"consumed {total}, produced {len(records)}"
    for part, msgs in consumed.items():
        want = expected.get(part, [])
        assert len(msgs) == len(want), f"partition {part}: {len(msgs)} consumed, {len(want)} produced"
        prev = -1
        for m, (i, r) in zip(msgs, want):
            assert m.offset() > prev, f"partition {part}: offsets not increasing at {m.offset()}"
            prev = m.offset()
            assert m.key() == r["key"], f"record {i}: key {m.key()!r} != {r['key']!r}"
            assert m.value() == r["value"], f"record {i}: value differs"
            assert norm_headers(m.headers()) == norm_headers(r["headers"]), \
                f"record {i}: headers {m.headers()!r} != {r['headers']!r}"
            if check_offsets:
                assert by_i[i] == (part, m.offset()), f"record {i}: acked at {by_i[i]}, read at {m.offset()}"
        if check_offsets and msgs:
            # Fresh topic, no transactions: offsets are dense from 0.
            assert [m.offset() for m in msgs] == list(range(len(msgs)))


# ---------------------------------------------------------- confluent-kafka

@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_idempotent_roundtrip_per_codec(shared_broker, codec):
    n = 100_000
    bs = shared_broker.bootstrap
    topic = unique(f"rt-{codec}")
    create_topic(bs, topic, partitions=4)
    records = make_records(n, seed=n + len(codec))
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "acks": "all",
                  "compression.type": codec, "linger.ms": 5, "message.timeout.ms": 30000,
                  "queue.buffering.max.messages": 200_000})
    log = DeliveryLog()
    produce_all(p, records, log, topic)
    assert len({a[1] for a in log.acked}) == 4, "keys should spread over all 4 partitions"
    consumed = consume_range(bs, topic, range(4), n)
    check_roundtrip(records, log, consumed)
    for part in range(4):
        assert_stored_codec(bs, topic, part, codec)


@pytest.mark.parametrize("acks", ["0", "1"])
def test_roundtrip_acks(shared_broker, acks):
    bs = shared_broker.bootstrap
    topic = unique(f"acks{acks}")
    create_topic(bs, topic, partitions=3)
    records = make_records(20_000, seed=int(acks) + 7)
    for i, r in enumerate(records):
        r["partition"] = i % 3
    p = Producer({"bootstrap.servers": bs, "acks": acks, "enable.idempotence": False,
                  "linger.ms": 5, "max.in.flight": 1 if acks == "0" else 5,
                  "message.timeout.ms": 30000})
    log = DeliveryLog()
    produce_all(p, records, log, topic)
    consumed = consume_range(bs, topic, range(3), len(records))
    # With acks=0 delivery reports carry no offset.
    check_roundtrip(records, log, consumed, check_offsets=(acks != "0"))


def test_timestamps_and_list_offsets(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("ts")
    create_topic(bs, topic, partitions=2)
    base = int(time.time() * 1000) - 3_600_000
    p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 0})
    log = DeliveryLog()
    recs = [{"partition": part, "value": f"{part}-{i}".encode(), "timestamp": base + i * 1000}
            for part in range(2) for i in range(10)]
    produce_all(p, recs, log, topic)
    c = consumer(bs)
    try:
        for part in range(2):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, part), timeout=CLIENT_TIMEOUT_S)
            assert (lo, hi) == (0, 10)
        q = [TopicPartition(topic, 0, base + 3500),   # between 3 and 4 -> 4
             TopicPartition(topic, 1, base),          # exact first -> 0
             ]
        res = c.offsets_for_times(q, timeout=CLIENT_TIMEOUT_S)
        assert [(r.partition, r.offset) for r in res] == [(0, 4), (1, 0)]
        res = c.offsets_for_times([TopicPartition(topic, 0, base + 9000)], timeout=CLIENT_TIMEOUT_S)
        assert res[0].offset == 9
        # After the last timestamp: no such offset (-1, i.e. end).
        res = c.offsets_for_times([TopicPartition(topic, 0, base + 60_000)], timeout=CLIENT_TIMEOUT_S)
        assert res[0].offset == -1
        # Timestamps come back as produced (CreateTime).
        c.assign([TopicPartition(topic, 1, 5)])
        m = wait_until(lambda: c.poll(0.5), CLIENT_TIMEOUT_S, "a record at offset 5")
        assert m.error() is None and m.offset() == 5
        assert m.timestamp() == (1, base + 5000)  # TIMESTAMP_CREATE_TIME
    finally:
        c.close()


def test_admin_list_offsets_specs(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("lo")
    create_topic(bs, topic, partitions=1)
    base = int(time.time() * 1000) - 100_000
    # Out-of-order timestamps: max timestamp is at offset 2.
    stamps = [base + 10, base + 20, base + 90, base + 30]
    p = Producer({"bootstrap.servers": bs, "acks": "all"})
    log = DeliveryLog()
    produce_all(p, [{"partition": 0, "value": b"x", "timestamp": t} for t in stamps], log, topic)
    a = admin(bs)
    tp = TopicPartition(topic, 0)

    def lo(spec):
        return a.list_offsets({tp: spec}, request_timeout=CLIENT_TIMEOUT_S)[tp].result()
    assert lo(OffsetSpec.earliest()).offset == 0
    assert lo(OffsetSpec.latest()).offset == 4
    r = lo(OffsetSpec.max_timestamp())
    assert (r.offset, r.timestamp) == (2, base + 90)
    assert lo(OffsetSpec.for_timestamp(base + 25)).offset == 2


def test_out_of_range_fetch(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("oor")
    create_topic(bs, topic, partitions=1)
    p = Producer({"bootstrap.servers": bs, "acks": "all"})
    log = DeliveryLog()
    produce_all(p, [{"partition": 0, "value": f"v{i}".encode()} for i in range(10)], log, topic)

    # 'earliest': the fetch at 1000 is out of range, the client resets to 0.
    c = consumer(bs, **{"auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, 1000)])
        m = wait_until(lambda: c.poll(0.5), CLIENT_TIMEOUT_S, "a record after reset")
        assert m.error() is None, m.error()
        assert (m.offset(), m.value()) == (0, b"v0")
    finally:
        c.close()

    # 'latest': resets to the end; only new records arrive.
    c = consumer(bs, **{"auto.offset.reset": "latest"})
    try:
        c.assign([TopicPartition(topic, 0, 1000)])
        # Keep producing fresh records until one arrives: whatever arrives
        # first must be new (offset >= 10), never one of v0..v9.
        k = 0
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        m = None
        while m is None:
            assert time.monotonic() < deadline, "no record after reset to latest"
            produce_all(p, [{"partition": 0, "value": f"new{k}".encode()}], DeliveryLog(), topic)
            k += 1
            m = c.poll(0.3)
        assert m.error() is None, m.error()
        assert m.offset() >= 10 and m.value().startswith(b"new"), (m.offset(), m.value())
    finally:
        c.close()

    # 'error': the client surfaces the out-of-range error instead of resetting.
    c = consumer(bs, **{"auto.offset.reset": "error"})
    try:
        c.assign([TopicPartition(topic, 0, 1000)])
        m = wait_until(lambda: c.poll(0.5), CLIENT_TIMEOUT_S, "an error event")
        assert m.error() is not None, f"expected an error, got record at {m.offset()}"
        assert m.error().code() == KafkaError._AUTO_OFFSET_RESET, m.error()
        assert "out of range" in m.error().str().lower(), m.error()
    finally:
        c.close()


def test_auto_create_on_produce(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("auto")
    assert topic_absent(bs, topic)
    p = Producer({"bootstrap.servers": bs, "acks": "all", "message.timeout.ms": 20000})
    log = DeliveryLog()
    produce_all(p, [{"value": b"hello"}], log, topic, timeout_s=30)
    log.check()
    assert log.acked[0][2] == 0
    parts = topic_partitions(bs, topic)
    assert parts, "auto-created topic missing from metadata"
    got = consume_range(bs, topic, [log.acked[0][1]], 1)
    assert [m.value() for ms in got.values() for m in ms] == [b"hello"]


def test_auto_create_disabled(broker_factory):
    b = broker_factory({"auto.create.topics.enable": "false"})
    topic = unique("noauto")
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "message.timeout.ms": 3000})
    log = DeliveryLog()
    p.produce(topic, b"x", on_delivery=log.callback(0))
    p.flush(10)
    assert len(log.errors) == 1 and not log.acked
    assert topic_absent(b.bootstrap, topic)


def test_delete_topic(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("del")
    create_topic(bs, topic, partitions=2)
    produce_all(Producer({"bootstrap.servers": bs}), [{"value": b"x"}] * 10, DeliveryLog(), topic)
    a = admin(bs)
    a.delete_topics([topic], operation_timeout=CLIENT_TIMEOUT_S)[topic].result(CLIENT_TIMEOUT_S)
    wait_until(lambda: topic_absent(bs, topic), CLIENT_TIMEOUT_S, f"{topic} gone from metadata")
    # Deleting it again is UNKNOWN_TOPIC_OR_PARTITION.
    with pytest.raises(KafkaException) as ei:
        a.delete_topics([topic], operation_timeout=CLIENT_TIMEOUT_S)[topic].result(CLIENT_TIMEOUT_S)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_create_topic_errors_and_configs(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("cfg")
    create_topic(bs, topic, partitions=3, config={"retention.ms": "3600000", "cleanup.policy": "delete"})
    # Creating it again: TOPIC_ALREADY_EXISTS.
    from confluent_kafka.admin import NewTopic
    a = admin(bs)
    with pytest.raises(KafkaException) as ei:
        a.create_topics([NewTopic(topic, 3, 1)])[topic].result(CLIENT_TIMEOUT_S)
    assert ei.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    # DescribeConfigs: the override is reported as a dynamic topic config.
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    cfg = a.describe_configs([res])[res].result(CLIENT_TIMEOUT_S)
    assert cfg["retention.ms"].value == "3600000"
    assert cfg["retention.ms"].source == 1  # DYNAMIC_TOPIC_CONFIG
    for k in ("cleanup.policy", "segment.bytes", "max.message.bytes", "min.insync.replicas"):
        assert k in cfg, f"{k} missing from DescribeConfigs"
    # Broker configs for node 1.
    res = ConfigResource(ConfigResource.Type.BROKER, "1")
    bcfg = a.describe_configs([res])[res].result(CLIENT_TIMEOUT_S)
    assert "log.segment.bytes" in bcfg and "auto.create.topics.enable" in bcfg


def test_create_partitions(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("cp")
    create_topic(bs, topic, partitions=2)
    a = admin(bs)
    a.create_partitions([NewPartitions(topic, 5)])[topic].result(CLIENT_TIMEOUT_S)
    wait_topic(bs, topic, 5)
    p = Producer({"bootstrap.servers": bs, "acks": "all", "topic.metadata.refresh.interval.ms": 1000})
    log = DeliveryLog()
    produce_all(p, [{"partition": 4, "value": b"on new partition"}], log, topic)
    assert log.acked[0][1:] == (4, 0)
    # Shrinking is refused (INVALID_PARTITIONS).
    with pytest.raises(KafkaException) as ei:
        a.create_partitions([NewPartitions(topic, 3)])[topic].result(CLIENT_TIMEOUT_S)
    assert ei.value.args[0].code() == KafkaError.INVALID_PARTITIONS


def test_describe_cluster(shared_broker):
    bs = shared_broker.bootstrap
    a = admin(bs)
    d = a.describe_cluster(request_timeout=CLIENT_TIMEOUT_S).result(CLIENT_TIMEOUT_S)
    assert [n.id for n in d.nodes] == [1]
    host, port = bs.rsplit(":", 1)
    assert (d.nodes[0].host, d.nodes[0].port) == (host, int(port))
    assert d.controller is not None and d.cluster_id


# ------------------------------------------------------------- kafka-python

def test_kafka_python_roundtrip(shared_broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTP
    bs = shared_broker.bootstrap
    topic = unique("kp")
    create_topic(bs, topic, partitions=3)
    n = 5000
    prod = KafkaProducer(bootstrap_servers=bs, acks="all", compression_type="gzip",
                         linger_ms=5, request_timeout_ms=10000)
    futures = []
    for i in range(n):
        futures.append(prod.send(topic, key=f"k{i % 50}".encode(), value=f"value-{i}".encode() * 3,
                                 headers=[("i", str(i).encode())]))
    prod.flush(timeout=30)
    metas = [f.get(timeout=10) for f in futures]
    prod.close(timeout=10)
    by_part = {}
    for i, md in enumerate(metas):
        by_part.setdefault(md.partition, []).append((md.offset, i))

    cons = KafkaConsumer(bootstrap_servers=bs, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="none", check_crcs=True, request_timeout_ms=20000)
    try:
        tps = [KTP(topic, p) for p in range(3)]
        cons.assign(tps)
        cons.seek_to_beginning()
        got = {}
        deadline = time.monotonic() + 60
        while sum(len(v) for v in got.values()) < n:
            assert time.monotonic() < deadline, "kafka-python consumer timed out"
            for tp, msgs in cons.poll(timeout_ms=500).items():
                for m in msgs:
                    got.setdefault(tp.partition, []).append(m)
        for part, want in by_part.items():
            have = got[part]
            assert [m.offset for m in have] == [o for o, _ in want]
            for m, (_off, i) in zip(have, want):
                assert m.key == f"k{i % 50}".encode()
                assert m.value == f"value-{i}".encode() * 3
                assert m.headers == [("i", str(i).encode())]
        assert cons.end_offsets(tps) == {KTP(topic, p): len(by_part.get(p, [])) for p in range(3)}
        assert cons.beginning_offsets(tps) == {KTP(topic, p): 0 for p in range(3)}
    finally:
        cons.close()


def test_kafka_python_out_of_range_raises(shared_broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTP
    from kafka.errors import OffsetOutOfRangeError
    bs = shared_broker.bootstrap
    topic = unique("kpoor")
    create_topic(bs, topic, partitions=1)
    prod = KafkaProducer(bootstrap_servers=bs, acks="all")
    prod.send(topic, b"only", partition=0).get(timeout=10)
    prod.close(timeout=10)
    cons = KafkaConsumer(bootstrap_servers=bs, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="none", request_timeout_ms=20000)
    try:
        tp = KTP(topic, 0)
        cons.assign([tp])
        cons.seek(tp, 50)
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        with pytest.raises(OffsetOutOfRangeError):
            while time.monotonic() < deadline:
                assert not cons.poll(timeout_ms=200), "records returned from an out-of-range offset"
    finally:
        cons.close()


def test_kafka_python_admin(shared_broker):
    from kafka.admin import ConfigResource as KCR, ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewPartitions as KNP, NewTopic as KNT
    bs = shared_broker.bootstrap
    a = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=15000)
    try:
        t1, t2 = unique("kpa"), unique("kpa")
        a.create_topics([KNT(t1, 2, 1), KNT(t2, 1, 1, topic_configs={"retention.ms": "600000"})],
                        timeout_ms=15000)
        wait_topic(bs, t1, 2)
        wait_topic(bs, t2, 1)
        assert {t1, t2} <= set(a.list_topics())
        a.create_partitions({t1: KNP(total_count=4)}, timeout_ms=15000)
        wait_topic(bs, t1, 4)
        resp = a.describe_configs([KCR(ConfigResourceType.TOPIC, t2)])
        entries = _kp_config_entries(resp)
        assert set(resp.get("topic", {})) == {t2}, resp
        assert entries.get("retention.ms") == "600000", entries
        a.delete_topics([t1, t2], timeout_ms=15000)
        wait_until(lambda: topic_absent(bs, t1) and topic_absent(bs, t2), CLIENT_TIMEOUT_S,
                   "deleted topics gone from metadata")
    finally:
        a.close()


def _kp_config_entries(resp) -> dict:
    """name -> value from kafka-python 3.x describe_configs() output, shaped
    {resource_type: {resource_name: {config_name: {"value": ..., ...}}}}."""
    out = {}

    def walk(d):
        for k, v in d.items():
            if isinstance(v, dict) and "value" in v and "config_source" in v:
                out[k] = v["value"]
            elif isinstance(v, dict):
                walk(v)
    walk(resp)
    return out


def test_kafka_python_auto_create(shared_broker):
    from kafka import KafkaProducer
    bs = shared_broker.bootstrap
    topic = unique("kpauto")
    prod = KafkaProducer(bootstrap_servers=bs, acks=1, max_block_ms=20000)
    try:
        md = prod.send(topic, b"v").get(timeout=20)
        assert md.offset == 0
    finally:
        prod.close(timeout=10)
    assert topic_partitions(bs, topic)


# ------------------------------------------------- the topic's compression.type

@pytest.mark.parametrize("producer_codec,topic_codec", [
    ("none", "gzip"), ("gzip", "uncompressed"), ("lz4", "zstd"), ("zstd", "snappy"), ("snappy", "lz4"),
])
def test_the_topic_compression_type_is_applied(shared_broker, producer_codec, topic_codec):
    """A topic whose compression.type names a codec stores every batch in
    it, whatever the producer sent (Kafka recompresses too); the records,
    offsets and idempotent sequences come back unchanged, and a change of
    compression.type applies to the next batches."""
    bs = shared_broker.bootstrap
    topic = unique(f"ct-{producer_codec}-{topic_codec}")
    extra = {"compression.zstd.level": "9"} if topic_codec == "zstd" else {}
    create_topic(bs, topic, partitions=1, config={"compression.type": topic_codec, **extra})
    records = make_records(3000, seed=len(producer_codec) + 31)
    for r in records:
        r["partition"] = 0
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "acks": "all",
                  "compression.type": producer_codec, "linger.ms": 5})
    log = DeliveryLog()
    produce_all(p, records, log, topic)
    check_roundtrip(records, log, consume_range(bs, topic, [0], len(records)))
    want = "none" if topic_codec == "uncompressed" else topic_codec
    assert stored_codecs(bs, topic, 0) == {CODEC_IDS[want]}
    assert all(b["crc_ok"] for b in kw.fetch_batches(bs, topic, 0, max_bytes=256 << 10, check_crc=True))

    # Back to the producer's codec for the batches that follow.
    a = admin(bs)  # kept alive until the future resolves
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("compression.type", "producer", incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([res])[res].result(timeout=CLIENT_TIMEOUT_S)
    more = make_records(500, seed=7)
    for r in more:
        r["partition"] = 0
    log2 = DeliveryLog()
    produce_all(p, more, log2, topic)
    log2.check()
    after = kw.fetch_batches(bs, topic, 0, offset=len(records), max_bytes=4 << 20)
    assert {b["codec"] for b in after} <= {0, expected_codec(bs, producer_codec)}, after[:3]


def test_compression_configs_are_checked_as_kafka_checks_them(shared_broker):
    bs = shared_broker.bootstrap
    a = admin(bs)
    bad = [
        ({"compression.type": "brotli"}, "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer"),
        ({"compression.gzip.level": "10"}, "compression.gzip.level"),
        ({"compression.zstd.level": "23"}, "compression.zstd.level"),
        ({"compression.lz4.level": "0"}, "compression.lz4.level"),
        ({"leader.replication.throttled.replicas": "0-1"}, "leader.replication.throttled.replicas"),
    ]
    for config, message in bad:
        topic = unique("ctbad")
        fs = a.create_topics([NewTopic(topic, 1, 1, config=config)], request_timeout=CLIENT_TIMEOUT_S)
        with pytest.raises(KafkaException) as e:
            fs[topic].result(timeout=CLIENT_TIMEOUT_S)
        err = e.value.args[0]
        assert err.code() == KafkaError.INVALID_CONFIG and message in err.str(), (config, err)
    # Kafka 4.3's other topic configs are taken and described.
    topic = unique("ctok")
    create_topic(bs, topic, 1, {"compression.gzip.level": "9", "compression.lz4.level": "17",
                                "compression.zstd.level": "-5", "leader.replication.throttled.replicas": "*",
                                "follower.replication.throttled.replicas": "0:1,0:2"})
    res = ConfigResource("topic", topic)
    described = a.describe_configs([res])[res].result(timeout=CLIENT_TIMEOUT_S)
    assert {k: described[k].value for k in (
        "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
        "leader.replication.throttled.replicas", "follower.replication.throttled.replicas",
        "remote.log.copy.disable", "remote.log.delete.on.disable")} == {
        "compression.gzip.level": "9", "compression.lz4.level": "17", "compression.zstd.level": "-5",
        "leader.replication.throttled.replicas": "*", "follower.replication.throttled.replicas": "0:1,0:2",
        "remote.log.copy.disable": "false", "remote.log.delete.on.disable": "false"}


def test_zstd_needs_produce_v7(shared_broker):
    """KIP-110, as Kafka 4.3 answers it: a zstd batch in a Produce below v7
    gets UNSUPPORTED_COMPRESSION_TYPE (76). A Fetch below v10 from a topic
    whose compression.type is zstd is answered with its zstd batches (Kafka
    4.x no longer refuses it, unlike Kafka 2.x and 3.x)."""
    bs = shared_broker.bootstrap
    plain, zstd = unique("zstd-old"), unique("zstd-topic")
    create_topic(bs, plain)
    create_topic(bs, zstd, config={"compression.type": "zstd"})
    # The codec bits say zstd; the check comes before anything is unpacked.
    flagged = kw.record_batch([(b"k", b"v")], attributes=4)
    with kw.Conn(bs) as c:
        c.send(kw.produce_request(3, 1, plain, 0, flagged))
        assert kw.parse_produce(c.recv_response()[1], 3) == [(plain, 0, 76, -1)]
        # An uncompressed batch to the zstd topic is taken (and stored as zstd).
        c.send(kw.produce_request(3, 2, zstd, 0, kw.record_batch([(b"k", b"v")])))
        assert kw.parse_produce(c.recv_response()[1], 3) == [(zstd, 0, 0, 0)]
        c.send(kw.fetch_request_v4(3, zstd, 0, 0, max_wait_ms=0))
        [(_t, _p, err, _hw, records)] = kw.parse_fetch_v4(c.recv_response()[1])
        assert err == 0 and [b["codec"] for b in kw.parse_batch_headers(records)] == [4]
        c.send(kw.fetch_request_v4(4, plain, 0, 0, max_wait_ms=0))
        [(_t, _p, err, hw, _records)] = kw.parse_fetch_v4(c.recv_response()[1])
        assert (err, hw) == (0, 0)
    # A current client reads the zstd topic.
    assert [m.value() for m in consume_range(bs, zstd, [0], 1)[0]] == [b"v"]
