"""Client-side helpers shared by the tests (confluent-kafka based)."""
from __future__ import annotations

import time
from collections import defaultdict

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_wire as kw
from conftest import wait_until

# Short timeouts everywhere: a hung broker fails fast instead of stalling CI.
CLIENT_TIMEOUT_S = 15


CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
FIND_COORDINATOR = 10


def expected_codec(bootstrap: str, codec: str) -> int:
    """The codec id librdkafka actually writes for `codec`. It enables LZ4
    only when the broker advertises FindCoordinator (its proxy for "Kafka >=
    0.8.2") and sends uncompressed batches otherwise."""
    if codec == "lz4" and FIND_COORDINATOR not in kw.advertised_apis(bootstrap):
        return CODEC_IDS["none"]
    return CODEC_IDS[codec]


def stored_codecs(bootstrap: str, topic: str, partition: int, max_bytes: int = 1 << 20) -> set[int]:
    """Codec ids of the first stored batches of a partition (up to max_bytes)."""
    return {b["codec"] for b in kw.fetch_batches(bootstrap, topic, partition, max_bytes=max_bytes)}


def assert_stored_codec(bootstrap: str, topic: str, partition: int, codec: str):
    """The partition's first batches are stored with `codec`. librdkafka sends
    a batch uncompressed when compressing would not shrink it (a few random
    values), so codec 0 may appear beside the requested one; the requested one
    must be there."""
    want = expected_codec(bootstrap, codec)
    stored = stored_codecs(bootstrap, topic, partition)
    assert want in stored and stored <= {0, want}, (codec, partition, stored)


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def topic_partitions(bootstrap: str, topic: str) -> dict | None:
    """partition id -> leader for `topic`, or None if metadata doesn't know it."""
    md = admin(bootstrap).list_topics(topic=topic, timeout=CLIENT_TIMEOUT_S)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return None
    return {p: pm.leader for p, pm in t.partitions.items()}


def wait_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = CLIENT_TIMEOUT_S):
    """Wait until metadata shows `topic` with `partitions` partitions, all led."""
    def ok():
        parts = topic_partitions(bootstrap, topic)
        return parts is not None and len(parts) == partitions and all(l >= 0 for l in parts.values())
    wait_until(ok, timeout_s, f"topic {topic} with {partitions} led partitions in metadata")


def topic_absent(bootstrap: str, topic: str) -> bool:
    md = admin(bootstrap).list_topics(timeout=CLIENT_TIMEOUT_S)
    return topic not in md.topics


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict | None = None):
    a = admin(bootstrap)  # keep the handle alive until the futures resolve
    fs = a.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=CLIENT_TIMEOUT_S, request_timeout=CLIENT_TIMEOUT_S)
    fs[topic].result(timeout=CLIENT_TIMEOUT_S)
    wait_topic(bootstrap, topic, partitions)


class DeliveryLog:
    """Collects delivery reports; raises on the first delivery error at check().

    acked: (index, partition, offset), index = position in the produced
    sequence (delivery reports don't carry headers, so we tag each callback)."""

    def __init__(self):
        self.acked = []
        self.errors = []

    def callback(self, index: int):
        def cb(err, msg):
            if err is not None:
                self.errors.append((index, err))
            else:
                self.acked.append((index, msg.partition(), msg.offset()))
        return cb

    def check(self):
        assert not self.errors, f"{len(self.errors)} delivery errors, first: {self.errors[0]}"


def produce_all(producer: Producer, records, log: DeliveryLog, topic: str, timeout_s: float = 60):
    """records: iterable of dicts of Producer.produce kwargs (without topic)."""
    n = 0
    for r in records:
        while True:
            try:
                producer.produce(topic, on_delivery=log.callback(n), **r)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 1000 == 0:
            producer.poll(0)
    left = producer.flush(timeout_s)
    assert left == 0, f"{left} messages still undelivered after {timeout_s}s"
    return n


def consumer(bootstrap: str, **overrides) -> Consumer:
    conf = {
        "bootstrap.servers": bootstrap,
        # group.id is required by librdkafka even for assign(); no group APIs
        # are used as long as nothing is committed or subscribed.
        "group.id": "keel-tests-unused",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "check.crcs": True,
        "socket.timeout.ms": 10000,
    }
    conf.update(overrides)
    return Consumer(conf)


# librdkafka looks up the group coordinator whenever group.id is set, even for
# assign()-only consumers. A broker without consumer groups may make that
# lookup fail; such client-level (topic-less) coordinator errors say nothing
# about the data path and are ignored. Any other error fails the read.
_COORDINATOR_CODES = {KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
                      KafkaError.COORDINATOR_LOAD_IN_PROGRESS}


def _group_noise(m) -> bool:
    e = m.error()
    return m.topic() is None and (e.code() in _COORDINATOR_CODES
                                  or "coordinator" in e.str().lower())


def consume_range(bootstrap: str, topic: str, partitions, expected: int,
                  timeout_s: float = 60, start_offset: int = 0, **conf) -> dict:
    """assign() every partition from start_offset and read until `expected`
    records arrived. Returns partition -> [Message] in offset order. Fails on any
    consumer error (including CRC errors) or on more records than expected."""
    c = consumer(bootstrap, **conf)
    try:
        c.assign([TopicPartition(topic, p, start_offset) for p in partitions])
        out = defaultdict(list)
        got = 0
        deadline = time.monotonic() + timeout_s
        while got < expected:
            if time.monotonic() > deadline:
                raise AssertionError(f"read {got} of {expected} records from {topic} in {timeout_s}s")
            for m in c.consume(5000, timeout=0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF or _group_noise(m):
                        continue
                    raise KafkaException(m.error())
                out[m.partition()].append(m)
                got += 1
        # Nothing beyond what we expect: every partition was read up to its
        # high watermark, so no extra (duplicate) records are hiding there.
        for p in partitions:
            _lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=CLIENT_TIMEOUT_S)
            have = out[p][-1].offset() + 1 if out[p] else start_offset
            assert hi == have, f"partition {p}: high watermark {hi} but read up to offset {have}"
        return out
    finally:
        c.close()


def round_trip(bootstrap: str, topic: str, extra: dict, n: int = 200) -> list[bytes]:
    """Produces `n` records with `extra` client settings (a security
    protocol and its keys), then reads the topic back with a consumer of a
    new group: -> the values read."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **extra})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode())
    assert p.flush(CLIENT_TIMEOUT_S) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}-{time.monotonic_ns()}",
                  "auto.offset.reset": "earliest", **extra})
    got: list[bytes] = []
    what = " ".join(str(extra.get(k, "")) for k in ("security.protocol", "sasl.mechanism")).strip() or "PLAINTEXT"
    try:
        c.subscribe([topic])
        wait_until(lambda: got.extend(m.value() for m in c.consume(100, timeout=0.5) if not m.error())
                   or len(got) >= n, 60, f"{n} records over {what}")
    finally:
        c.close()
    return got
