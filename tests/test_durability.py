"""Data survives clean restarts and kill -9 of the broker process.

kill -9 kills the process, not the machine: whatever the broker acknowledged
was at least in the page cache, so every acknowledged record must be there
afterwards, exactly once, at the offset it was acknowledged with.
"""
from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from conftest import unique, wait_until
from kclient import CLIENT_TIMEOUT_S, DeliveryLog, consume_range, consumer, create_topic, produce_all
from test_produce_fetch import check_roundtrip, make_records


def read_everything(bootstrap: str, topic: str, partitions: int, timeout_s: float = 90) -> dict:
    """partition -> [Message], each partition read from 0 to its high watermark."""
    c = consumer(bootstrap)
    try:
        ends = {}
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=CLIENT_TIMEOUT_S)
            assert lo == 0, f"partition {p}: log start {lo}, expected 0"
            ends[p] = hi
    finally:
        c.close()
    return consume_range(bootstrap, topic, range(partitions), sum(ends.values()), timeout_s=timeout_s)


@pytest.mark.parametrize("segment_bytes", [None, 1 << 20])
def test_clean_restart_keeps_everything(broker_factory, segment_bytes):
    b = broker_factory({"log.segment.bytes": str(segment_bytes)} if segment_bytes else None)
    if not b.restartable:
        pytest.skip("external broker")
    topic = unique("restart")
    create_topic(b.bootstrap, topic, partitions=3)
    records = make_records(20_000, seed=3)
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "acks": "all",
                  "compression.type": "lz4", "linger.ms": 5})
    log = DeliveryLog()
    produce_all(p, records, log, topic)
    p.flush(10)
    del p

    b.restart()
    check_roundtrip(records, log, read_everything(b.bootstrap, topic, 3))

    # Appends continue after the old end, and survive another restart.
    more = make_records(3000, seed=4)
    for i, r in enumerate(more):
        r["partition"] = i % 3
    p2 = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "acks": "all"})
    log2 = DeliveryLog()
    produce_all(p2, more, log2, topic)
    log2.check()
    old_end = {part: max(off for _i, pp, off in log.acked if pp == part) + 1 for part in range(3)}
    for i, part, off in log2.acked:
        assert off >= old_end[part], f"new record {i} at offset {off} < old end {old_end[part]}"
    del p2
    b.restart()
    got = read_everything(b.bootstrap, topic, 3)
    assert sum(len(v) for v in got.values()) == len(records) + len(more)
    for i, part, off in log2.acked:
        m = got[part][off]
        assert m.offset() == off and m.value() == more[i]["value"]


class ContinuousProducer(threading.Thread):
    """Produces unique values as fast as the broker takes them, recording every
    acknowledgement; retries through broker outages (idempotent, acks=all)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        super().__init__(daemon=True)
        self.topic, self.partitions = topic, partitions
        self.p = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 2, "message.timeout.ms": 180_000, "request.timeout.ms": 10_000,
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "retry.backoff.ms": 50,
            "queue.buffering.max.messages": 20_000,
            "error_cb": self._on_error,
        })
        self.acked = {}           # value -> (partition, offset)
        self.failed = []          # (value, error)
        self.client_errors = []   # error_cb events (fatal ones fail the test)
        self.sent = 0
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.exc = None

    def _on_error(self, err):
        self.client_errors.append(err)

    def _cb(self, err, msg):
        with self.lock:
            if err is not None:
                self.failed.append((msg.value(), err))
            else:
                self.acked[msg.value()] = (msg.partition(), msg.offset())

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def run(self):
        try:
            i = 0
            while not self.stop_flag.is_set():
                value = b"v-%09d-" % i + b"p" * (i % 200)
                try:
                    self.p.produce(self.topic, value=value, key=b"k%d" % (i % 64), on_delivery=self._cb)
                    i += 1
                    self.sent = i
                    if i % 200 == 0:
                        self.p.poll(0)
                except BufferError:
                    self.p.poll(0.05)
            left = self.p.flush(120)
            assert left == 0, f"{left} messages neither delivered nor failed after 120s"
        except BaseException as e:  # noqa: BLE001 - surfaced by the test
            self.exc = e


def test_kill9_loop_loses_no_acknowledged_record(broker):
    if not broker.restartable:
        pytest.skip("external broker")
    seed = int(os.environ.get("KEEL_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    kills = int(os.environ.get("KEEL_TEST_KILLS", "6"))
    print(f"kill9 loop: seed={seed} kills={kills} (replay with KEEL_TEST_SEED={seed})")
    topic = unique("kill9")
    partitions = 3
    create_topic(broker.bootstrap, topic, partitions=partitions)

    prod = ContinuousProducer(broker.bootstrap, topic, partitions)
    prod.start()
    try:
        for k in range(kills + 1):
            # Progress first: the producer recovered and got new acks from
            # this incarnation of the broker.
            base = prod.acked_count()
            wait_until(lambda: prod.acked_count() >= base + 2000 or prod.exc, 60,
                       f"2000 new acks after start #{k + 1} (seed {seed})")
            assert prod.exc is None, prod.exc
            if k == kills:
                break
            time.sleep(rng.uniform(0.0, 0.8))   # a random moment mid-stream
            broker.kill9()
            time.sleep(rng.uniform(0.0, 0.3))   # clients notice the outage, or not
            broker.start()
    finally:
        prod.stop_flag.set()
        prod.join(180)
    assert not prod.is_alive(), "producer thread did not finish"
    assert prod.exc is None, f"producer failed (seed {seed}): {prod.exc!r}"
    fatal = [e for e in prod.client_errors if e.fatal()]
    assert not fatal, f"fatal producer errors (seed {seed}): {fatal}"
    assert not prod.failed, f"{len(prod.failed)} records failed delivery (seed {seed}), first {prod.failed[0]}"

    got = read_everything(broker.bootstrap, topic, partitions)
    seen = defaultdict(list)
    for part, msgs in got.items():
        last_i = -1
        for m in msgs:
            seen[m.value()].append((part, m.offset()))
            i = int(m.value()[2:11])
            assert i > last_i, f"partition {part}: record {i} after {last_i} at offset {m.offset()} (seed {seed})"
            last_i = i
    dups = {v: locs for v, locs in seen.items() if len(locs) > 1}
    assert not dups, f"{len(dups)} values stored more than once (seed {seed}), e.g. {next(iter(dups.items()))}"
    missing = [v for v in prod.acked if v not in seen]
    assert not missing, f"{len(missing)} acknowledged records lost (seed {seed}), e.g. {missing[:3]}"
    moved = [(v, loc, seen[v][0]) for v, loc in prod.acked.items() if seen[v][0] != loc]
    assert not moved, f"{len(moved)} records not at their acknowledged offset (seed {seed}), e.g. {moved[:3]}"
    print(f"kill9 loop: {len(prod.acked)} acked, {sum(len(v) for v in got.values())} stored, "
          f"{broker.starts} starts")
