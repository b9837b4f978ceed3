"""Hostile requests, faults and crashes, against a real broker process:
forged batches, a fetch's disk reads bounded by its budget, damaged and torn
segments, a failed fsync, running out of descriptors during a roll, deleting
a topic while the mover copies it, producer state across retention and
restarts, and Kafka's connection limits."""
from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import hardening_wire as hw
import kafka_wire as w
from conftest import IMPL, unique, wait_until
from kclient import CLIENT_TIMEOUT_S, DeliveryLog, consume_range, create_topic, produce_all

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="Keel's own failure handling")

NONE, CORRUPT_MESSAGE, INVALID_RECORD, KAFKA_STORAGE_ERROR = 0, 2, 87, 56
OUT_OF_ORDER_SEQUENCE = 45


def stats(b) -> dict:
    with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
        return json.load(r)


def failpoint(b, rule: str) -> None:
    query = urllib.parse.quote_plus(rule)
    req = urllib.request.Request(f"http://{b.admin}/failpoints/add?{query}", method="POST")
    with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT_S) as r:
        assert r.status == 200


def failpoint_fired(b) -> list[int]:
    """How many operations each failpoint rule has acted on, in the order added."""
    with urllib.request.urlopen(f"http://{b.admin}/failpoints", timeout=CLIENT_TIMEOUT_S) as r:
        text = r.read().decode()
    return [int(m) for m in re.findall(r" fired=(\d+)", text)]


def partition_stats(b, topic: str, partition: int = 0) -> dict:
    return next(p for p in stats(b)["partitions"] if p["topic"] == topic and p["partition"] == partition)


def segment_files(b, topic: str, partition: int = 0) -> list[Path]:
    return sorted((b.data_dir / f"{topic}-{partition}").glob("*.log"))


def values(batch_count: int, tag: str) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(batch_count)]


# ------------------------------------------------------------ forged batches

def test_forged_batches_are_refused_and_cost_no_offsets(shared_broker):
    """Kafka refuses with INVALID_RECORD: a second batch in one partition
    (here one whose lastOffsetDelta would burn 2^31 offsets), a record count
    that disagrees with lastOffsetDelta, a negative count, magic < 2, and
    records that do not match their count. None may cost an offset or
    wedge the partition."""
    b = shared_broker
    topic = unique("forged")
    create_topic(b.bootstrap, topic, 1)
    good = w.record_batch([(b"k", b"v")])
    big = w.record_batch([(b"k", b"x" * 5000)])
    burner = hw.forge(w.record_batch([(b"k", b"v")]), last_offset_delta=2**31 - 1)
    two_records = w.record_batch([(b"a", b"1"), (b"b", b"2")])
    forged = {
        "two batches, the second burning 2^31 offsets": (big + burner, INVALID_RECORD),
        "count != lastOffsetDelta + 1": (hw.forge(good, last_offset_delta=2**31 - 1), INVALID_RECORD),
        "negative count": (hw.forge(good, records_count=-1), INVALID_RECORD),
        "magic 1": (hw.forge(good, magic=1), INVALID_RECORD),
        "fewer records than counted": (hw.forge(good, last_offset_delta=1, records_count=2), INVALID_RECORD),
        "more records than counted": (hw.forge(two_records, last_offset_delta=0, records_count=1), INVALID_RECORD),
        "a producer without a sequence": (hw.forge(good, producer_id=77, base_sequence=-1), INVALID_RECORD),
        "a bad CRC": (hw.forge(good, resign=False, records_count=1, last_offset_delta=0)[:-1] + b"\x01",
                      CORRUPT_MESSAGE),
    }
    with w.Conn(b.bootstrap) as c:
        next_offset = 0
        for what, (records, want) in forged.items():
            err, _ = hw.produce(c, topic, 0, records)
            assert err == want, f"{what}: error {err}, expected {want}"
            err, base = hw.produce(c, topic, 0, good)
            assert (err, base) == (NONE, next_offset), f"after {what}: {(err, base)}"
            next_offset += 1
    got = consume_range(b.bootstrap, topic, [0], next_offset)
    assert [m.offset() for m in got[0]] == list(range(next_offset))


# ------------------------------------------------------------ fetch budget

def test_a_fetch_reads_from_disk_within_its_budget(broker_factory):
    """One Fetch v4 over 40 partitions holding ~4 MB each below the tail
    cache, with a 1 MiB request limit and 64 MiB partition limits: Kafka
    reads partitions in order with what is left of the budget, so the
    broker reads about 1 MiB from disk, not everything the partition
    limits allow."""
    b = broker_factory({"keel.tail.cache.bytes": str(1 << 20)})
    topic, parts, per_part = unique("budget"), 40, 4 << 20
    create_topic(b.bootstrap, topic, parts)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "batch.size": 256 << 10,
                  "compression.type": "none", "acks": 1})
    value = os.urandom(64 << 10)
    for part in range(parts):
        for _ in range(per_part // len(value)):
            p.produce(topic, value=value, partition=part)
        p.poll(0)
    assert p.flush(60) == 0
    before = stats(b)["cold_reads"]["disk_bytes"]
    with w.Conn(b.bootstrap, timeout_s=30) as c:
        c.send(hw.fetch_v4(topic, list(range(parts)), 0, max_bytes=1 << 20, partition_max_bytes=64 << 20))
        _cid, body = c.recv_response()
    answered = sum(len(r or b"") for (_t, _p, err, _hw, r) in w.parse_fetch_v4(body) if err == 0)
    time.sleep(1.0)  # let the read-ahead of the next chunk finish, it counts too
    read = stats(b)["cold_reads"]["disk_bytes"] - before
    batch = 256 << 10
    assert 0 < answered <= (1 << 20) + batch, answered
    # The fetch's own read (1 MiB, plus a window's rounding) and the
    # read-ahead of the next chunk within the same share.
    assert read <= 2 * ((1 << 20) + batch + (64 << 10)), f"read {read} bytes from disk for a 1 MiB fetch"


def test_fetches_with_nothing_to_wait_for_return_at_once(shared_broker):
    b = shared_broker
    topic = unique("nowait")
    create_topic(b.bootstrap, topic, 1)
    with w.Conn(b.bootstrap) as c:
        for request in (hw.fetch_v4(topic, [0], 0, 1 << 20, 1 << 20, max_wait_ms=10_000, min_bytes=0),
                        hw.fetch_empty_v4(max_wait_ms=10_000, min_bytes=1)):
            started = time.monotonic()
            c.send(request)
            c.recv_response()
            # Ten seconds is what a long poll would take; a second is slack.
            assert time.monotonic() - started < 1.0


# ------------------------------------------------------- damaged segments

def _fill(b, topic: str, n: int, size: int = 900) -> None:
    """n records of about `size` bytes, one per batch."""
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "acks": "all", "batch.num.messages": 1})
    log = DeliveryLog()
    produce_all(p, [{"value": b"%06d" % i + b"." * size, "partition": 0} for i in range(n)], log, topic)
    log.check()


def _raw_fetch(b, topic: str, offset: int) -> tuple[int, bytes]:
    with w.Conn(b.bootstrap) as c:
        c.send(w.fetch_request_v4(1, topic, 0, offset, max_wait_ms=0))
        _cid, body = c.recv_response()
    [(_t, _p, err, _hw, records)] = w.parse_fetch_v4(body)
    return err, records or b""


def test_a_damaged_sealed_segment_is_reported_and_the_rest_serves(broker_factory):
    """Data below the recovery point that turns out invalid (here the tail of
    a sealed segment zeroed after a clean stop) is reported, never cut:
    the broker starts, reads before it and after it are served, reads of it
    fail with KAFKA_STORAGE_ERROR, and the other topics are untouched."""
    b = broker_factory({})
    topic, other = unique("damaged"), unique("healthy")
    create_topic(b.bootstrap, topic, 1, {"segment.bytes": str(16 << 10)})
    create_topic(b.bootstrap, other, 1)
    _fill(b, topic, 100)
    _fill(b, other, 10)
    b.stop()
    segments = segment_files(b, topic)
    assert len(segments) >= 4, segments
    victim = segments[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2:] = bytes(len(data) - len(data) // 2)
    victim.write_bytes(bytes(data))
    b.start()
    damaged = partition_stats(b, topic)["damaged_segments"]
    assert [d["base_offset"] for d in damaged] == [int(victim.stem)], damaged
    assert partition_stats(b, topic)["offline"] is None
    assert _raw_fetch(b, topic, 0)[0] == NONE
    next_base = int(segments[2].stem)
    err, _ = _raw_fetch(b, topic, next_base - 1)
    assert err == KAFKA_STORAGE_ERROR, "a read of the damaged range fails, it is not skipped"
    assert _raw_fetch(b, topic, next_base)[0] == NONE
    assert len(consume_range(b.bootstrap, other, [0], 10)[0]) == 10
    _fill(b, topic, 3)  # the partition still takes appends


def test_a_torn_older_segment_above_the_recovery_point_is_cut(broker_factory):
    """After a crash, segments from the recovery point on may hold torn data
    in any of them (a roll's fsync had not run): recovery cuts at the first
    invalid batch and drops the segments after it, and start-up succeeds."""
    b = broker_factory({})
    topic = unique("torn")
    create_topic(b.bootstrap, topic, 1, {"segment.bytes": str(16 << 10)})
    _fill(b, topic, 100)
    b.kill9()
    # As if nothing had been made durable: recovery starts at the first segment.
    # (A seal may not have written one yet when the broker was killed.)
    (b.data_dir / f"{topic}-0" / "recovery-point").unlink(missing_ok=True)
    segments = segment_files(b, topic)
    victim = segments[1]
    data = bytearray(victim.read_bytes())
    cut = len(data) // 2
    data[cut:] = bytes(len(data) - cut)
    victim.write_bytes(bytes(data))
    b.start()
    end = partition_stats(b, topic)["high_watermark"]
    assert int(victim.stem) < end < int(segments[2].stem), (end, segments)
    assert segment_files(b, topic)[-1] == victim, "the segments after the cut are gone"
    got = consume_range(b.bootstrap, topic, [0], end)[0]
    assert [m.offset() for m in got] == list(range(end))
    assert all(m.value().startswith(b"%06d" % m.offset()) for m in got)
    _fill(b, topic, 3)
    assert partition_stats(b, topic)["high_watermark"] == end + 3


# ------------------------------------------------------- failed fsync

def test_a_failed_fsync_takes_the_log_dir_offline_and_nothing_is_stored_twice(broker_factory):
    """After a failed fsync the page cache cannot be trusted: the log dir
    goes offline (KAFKA_STORAGE_ERROR, /stats says why, metadata still
    answers). An idempotent producer keeps retrying; after a restart its
    retries land, each record once."""
    b = broker_factory({}, env={"KEEL_FAILPOINTS": "1"})
    topic, other = unique("fsync"), unique("bystander")
    create_topic(b.bootstrap, topic, 1, {"flush.messages": "1"})
    create_topic(b.bootstrap, other, 1)
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "acks": "all",
                  "message.timeout.ms": 120_000, "retry.backoff.ms": 200, "linger.ms": 0})
    first = DeliveryLog()
    produce_all(p, [{"value": b"a-%d" % i, "partition": 0} for i in range(50)], first, topic)
    first.check()
    failpoint(b, f"sync eio path={topic}-0 times=1")
    pending = DeliveryLog()
    for i in range(50):
        p.produce(topic, value=b"b-%d" % i, partition=0, on_delivery=pending.callback(i))
    wait_until(lambda: p.poll(0.1) is not None and stats(b)["log_dirs"][0]["offline"], 30,
               "the log dir to go offline")
    s = stats(b)
    assert "injected" in (s["log_dirs"][0]["error"] or ""), s["log_dirs"]
    assert partition_stats(b, other)["offline"], "the whole dir is offline"
    with w.Conn(b.bootstrap) as c:
        err, _ = hw.produce(c, other, 0, w.record_batch([(None, b"x")]))
        assert err == KAFKA_STORAGE_ERROR
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=CLIENT_TIMEOUT_S)
    assert topic in md.topics, "metadata still answers"
    assert not pending.errors and len(pending.acked) < 50, "nothing is acknowledged while offline"
    b.restart()
    assert p.flush(90) == 0
    pending.check()
    got = consume_range(b.bootstrap, topic, [0], 100)[0]
    assert [m.value() for m in got] == [b"a-%d" % i for i in range(50)] + [b"b-%d" % i for i in range(50)]
    time.sleep(0.5)
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": unique("g"), "enable.auto.commit": False})
    low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=CLIENT_TIMEOUT_S)
    c.close()
    assert (low, high) == (0, 100), "no record stored twice"


# ------------------------------------------------------- a slow write

def test_a_slow_write_stalls_only_its_partition(broker_factory):
    """A write that takes 3 s (injected through the storage seam, as an
    ext4 journal commit stalls one write()) holds up only its partition.
    Meanwhile other connections' produce requests to another partition
    complete (counted), and so does the other partition of the stalled
    request itself, readable before that request is answered. A connection
    answers its requests in order, as Kafka's do: the stalled partition's
    requests pipelined behind it complete afterwards, in order."""
    b = broker_factory({}, env={"KEEL_FAILPOINTS": "1"})
    slow, fast = unique("slow"), unique("fast")
    create_topic(b.bootstrap, slow, 1)
    create_topic(b.bootstrap, fast, 1)

    def batch(value: bytes) -> bytes:
        return w.record_batch([(None, value)])

    with w.Conn(b.bootstrap) as c:
        assert hw.produce(c, slow, 0, batch(b"warm"))[0] == NONE
        assert hw.produce(c, fast, 0, batch(b"warm"))[0] == NONE
    failpoint(b, f"write delay=3000 path={slow}-0/ times=1")
    with w.Conn(b.bootstrap, timeout_s=30) as stalled, w.Conn(b.bootstrap) as other:
        started = time.monotonic()
        stalled.send(hw.produce_v3_many([(slow, 0, batch(b"s1")), (fast, 0, batch(b"f1"))], correlation_id=1))
        stalled.send(hw.produce_v3(slow, 0, batch(b"s2"), correlation_id=2))
        stalled.send(hw.produce_v3(slow, 0, batch(b"s3"), correlation_id=3))
        acks = 0
        while time.monotonic() - started < 1.0:
            assert hw.produce(other, fast, 0, batch(b"other"))[0] == NONE
            acks += 1
        fast_end = hw.list_offsets_v10(other, fast, 0, -1)[1]
        # Still unwritten after all that: the stall covered the count.
        slow_end = hw.list_offsets_v10(other, slow, 0, -1)[1]
        assert slow_end == 1, "the stalled write is not visible yet"
        print(f"{acks} produce requests to another partition completed in the first second of a 3 s stall")
        assert acks >= 5, f"only {acks} produce requests to another partition completed during the stall"
        assert fast_end == 2 + acks, "the stalled request's other partition was appended meanwhile"
        answers = []
        for _ in range(3):
            cid, body = stalled.recv_response()
            answers.append((cid, [(t, err, base) for t, _p, err, base in w.parse_produce(body, 3)]))
    # The stalled request's fast batch raced the other connection's for
    # its offset; the slow partition's come in request order.
    [(first_cid, [first_slow, (fast_topic, fast_err, fast_base)]), *rest] = answers
    assert (first_cid, first_slow) == (1, (slow, NONE, 1)), answers
    assert fast_topic == fast and fast_err == NONE and 1 <= fast_base <= 1 + acks, answers
    assert rest == [(2, [(slow, NONE, 2)]), (3, [(slow, NONE, 3)])], answers


# ------------------------------------------------------- pipelined produce requests

def test_pipelined_produce_requests_are_written_together_and_answered_in_order(broker_factory):
    """A producer's pipelined Produce requests (max.in.flight) to one
    partition do not each wait for the one before to be answered. With
    every write of the partition taking 400 ms, six idempotent requests
    sent at once are written in two writes (the first, then the five queued
    behind it), not six. They are answered in request order, with offsets
    and sequences in request order; a ListOffsets sent behind them waits
    for all six and sees them."""
    b = broker_factory({}, env={"KEEL_FAILPOINTS": "1"})
    topic = unique("pipelined")
    create_topic(b.bootstrap, topic, 1)
    with w.Conn(b.bootstrap, timeout_s=30) as c:
        err, pid, epoch = hw.init_producer_id(c)
        assert err == NONE

        def batch(seq: int) -> bytes:
            return w.record_batch([(None, b"v%d" % seq)], producer_id=pid, producer_epoch=epoch,
                                  base_sequence=seq)

        assert hw.produce(c, topic, 0, batch(0)) == (NONE, 0)
        failpoint(b, f"write delay=400 path={topic}-0/00000000000000000000.log")
        started = time.monotonic()
        for seq in range(1, 7):
            c.send(hw.produce_v3(topic, 0, batch(seq), correlation_id=100 + seq))
        c.send(hw.list_offsets_v10_request(topic, 0, -1, correlation_id=200))
        answers = []
        for _ in range(6):
            cid, body = c.recv_response()
            answers.append((cid, [(err, base) for _t, _p, err, base in w.parse_produce(body, 3)]))
        cid, body = c.recv_response_flexible()
        elapsed = time.monotonic() - started
    assert answers == [(100 + seq, [(NONE, seq)]) for seq in range(1, 7)], answers
    assert (cid, hw.parse_list_offsets_v10(body)) == (200, (NONE, 7))
    # Two writes of the segment; answered one at a time it would take six.
    writes = failpoint_fired(b)
    assert writes == [2], f"six pipelined requests took {writes} writes and {elapsed:.2f} s"
    got = consume_range(b.bootstrap, topic, [0], 7)[0]
    assert [m.value() for m in got] == [b"v%d" % i for i in range(7)]


# ------------------------------------------------------- EMFILE at a roll

def test_running_out_of_descriptors_during_a_roll_fails_the_append_cleanly(broker_factory):
    """A roll that cannot open its new segment fails that append with
    KAFKA_STORAGE_ERROR and leaves no stray segment; once descriptors are
    free again the partition rolls and nothing was lost or burned."""
    b = broker_factory({}, nofile=160)
    topic = unique("emfile")
    create_topic(b.bootstrap, topic, 1, {"segment.bytes": str(12 << 10)})
    batch = w.record_batch([(b"k", b"v" * 8000)])
    hoard: list[socket.socket] = []
    with w.Conn(b.bootstrap) as c:
        assert hw.produce(c, topic, 0, batch) == (NONE, 0)
        fds = Path(f"/proc/{b.proc.pid}/fd")
        try:
            while len(list(fds.iterdir())) < 160 and len(hoard) < 400:
                hoard.append(socket.create_connection(("127.0.0.1", b.port)))
                time.sleep(0.002)
            wait_until(lambda: len(list(fds.iterdir())) >= 159, 10, "the broker's descriptor table to fill")
            err, _ = hw.produce(c, topic, 0, batch)
            assert err == KAFKA_STORAGE_ERROR, err
            assert len(segment_files(b, topic)) == 1, "no stray segment"
        finally:
            for s in hoard:
                s.close()
        wait_until(lambda: len(list(fds.iterdir())) < 120, 10, "the hoarded connections to close")
        assert hw.produce(c, topic, 0, batch) == (NONE, 1), "nothing burned"
    assert len(segment_files(b, topic)) == 2
    got = consume_range(b.bootstrap, topic, [0], 2)[0]
    assert [m.offset() for m in got] == [0, 1]


# ------------------------------------------- delete and re-create a topic

def test_deleting_and_recreating_a_topic_during_a_mover_pass(broker_factory, tmp_path):
    """A topic deleted while the mover copies it, and re-created at once
    under the same name: the old partitions are fenced and renamed away
    first, so nothing of the old topic touches the new one's files."""
    cap = tmp_path / "cap"
    # A copy (and its read-back) of a 16 KiB segment takes about a second.
    b = broker_factory({"keel.tier.capacity.dirs": str(cap), "keel.tier.move.bytes.per.sec": str(24 << 10),
                        "keel.tier.check.interval.ms": "50", "keel.tier.fast.max.bytes": "0"})
    topic = unique("phoenix")
    config = {"segment.bytes": str(16 << 10)}
    create_topic(b.bootstrap, topic, 1, config)
    _fill(b, topic, 300)
    wait_until(lambda: stats(b)["tiers"]["copies"] >= 1, 30, "the mover to copy")
    old_id = json.loads((b.data_dir / "__keel_meta" / "topics" / f"{topic}.json").read_text())["topic_id"]
    group = unique("g")
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 123)], asynchronous=False)
    assert c.committed([TopicPartition(topic, 0)], timeout=CLIENT_TIMEOUT_S)[0].offset == 123
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    a.delete_topics([topic], operation_timeout=30)[topic].result(CLIENT_TIMEOUT_S)
    create_topic(b.bootstrap, topic, 1, config)
    new_id = json.loads((b.data_dir / "__keel_meta" / "topics" / f"{topic}.json").read_text())["topic_id"]
    assert new_id != old_id
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "batch.num.messages": 1})
    log = DeliveryLog()
    # Ten records stay in the new topic's active segment, which the mover
    # never touches: anything that happens to its files is the old topic's.
    produce_all(p, [{"value": b"new-%d" % i + b"." * 900, "partition": 0} for i in range(10)], log, topic)
    log.check()
    time.sleep(3)  # the copy of the old topic in flight finishes, or fails
    got = consume_range(b.bootstrap, topic, [0], 10)[0]
    assert [m.value()[:8].rstrip(b".") for m in got] == [b"new-%d" % i for i in range(10)]
    assert partition_stats(b, topic)["high_watermark"] == 10
    # Kafka removes a deleted topic's committed offsets.
    assert c.committed([TopicPartition(topic, 0)], timeout=CLIENT_TIMEOUT_S)[0].offset < 0
    c.close()
    manifest = b.data_dir / f"{topic}-0" / "tier-manifest"
    if manifest.exists():
        objects = [line.split()[-1] for line in manifest.read_text().splitlines()[1:]]
        stale = [o for o in objects if old_id.replace("-", "") in o]
        assert not stale, f"the old topic's mover wrote into the new topic's manifest: {stale}"
    wait_until(lambda: not list(b.data_dir.glob(f"{topic}-0.*-delete")), 30, "the old directory to go")
    b.restart()
    got = consume_range(b.bootstrap, topic, [0], 10)[0]
    assert [m.value()[:8].rstrip(b".") for m in got] == [b"new-%d" % i for i in range(10)]


# ------------------------------------------- producer state and retention

def test_producer_state_survives_retention_and_a_restart(broker_factory):
    """Retention removes every batch of an idempotent producer, the broker
    restarts, and the producer's retry of its last batch is still recognised
    as a duplicate (Kafka's producer snapshots), not stored again."""
    b = broker_factory({"log.retention.check.interval.ms": "200"})
    topic = unique("pstate")
    create_topic(b.bootstrap, topic, 1, {"segment.bytes": str(4 << 10), "retention.bytes": str(8 << 10)})
    with w.Conn(b.bootstrap) as c:
        err, pid, epoch = hw.init_producer_id(c)
        assert err == NONE
        sent = []
        for seq in range(5):
            batch = w.record_batch([(b"k", b"p-%d" % seq)], producer_id=pid, producer_epoch=epoch,
                                   base_sequence=seq)
            err, base = hw.produce(c, topic, 0, batch)
            assert err == NONE
            sent.append((batch, base))
        filler = w.record_batch([(None, b"f" * 1000)])
        for _ in range(60):
            assert hw.produce(c, topic, 0, filler)[0] == NONE
    wait_until(lambda: partition_stats(b, topic)["log_start_offset"] > sent[-1][1], 20,
               "retention to remove the producer's batches")
    b.restart()
    with w.Conn(b.bootstrap) as c:
        end = partition_stats(b, topic)["high_watermark"]
        last_batch, last_base = sent[-1]
        assert hw.produce(c, topic, 0, last_batch) == (NONE, last_base), "a retry is a duplicate"
        assert partition_stats(b, topic)["high_watermark"] == end, "and is not stored again"
        nxt = w.record_batch([(b"k", b"p-5")], producer_id=pid, producer_epoch=epoch, base_sequence=5)
        assert hw.produce(c, topic, 0, nxt) == (NONE, end)
        gap = w.record_batch([(b"k", b"p-9")], producer_id=pid, producer_epoch=epoch, base_sequence=9)
        assert hw.produce(c, topic, 0, gap)[0] == OUT_OF_ORDER_SEQUENCE


def test_init_producer_id_without_a_transactional_id_hands_out_fresh_ids(shared_broker):
    """Kafka gives a fresh id whatever id and epoch the request names:
    nothing proves the caller owns them."""
    with w.Conn(shared_broker.bootstrap) as c:
        err, first, epoch = hw.init_producer_id(c)
        assert (err, epoch) == (NONE, 0) and first >= 0
        err, second, epoch = hw.init_producer_id(c, first, 0)
        assert (err, epoch) == (NONE, 0) and second != first


def test_list_offsets_special_timestamps(shared_broker):
    """-4 earliest local, -5 latest tiered, -6 earliest pending upload: a
    topic without a colder tier has nothing tiered (-1) and nothing pending
    (-1)."""
    b = shared_broker
    topic = unique("special")
    create_topic(b.bootstrap, topic, 1)
    _fill(b, topic, 5, size=10)
    with w.Conn(b.bootstrap) as c:
        assert hw.list_offsets_v10(c, topic, 0, -1) == (NONE, 5)
        assert hw.list_offsets_v10(c, topic, 0, -2) == (NONE, 0)
        assert hw.list_offsets_v10(c, topic, 0, -4) == (NONE, 0)
        assert hw.list_offsets_v10(c, topic, 0, -5) == (NONE, -1)
        assert hw.list_offsets_v10(c, topic, 0, -6) == (NONE, -1)


# ------------------------------------------------------------ connections

def _api_versions_answered(c: w.Conn) -> bool:
    c.send(w.api_versions_request(0, 5))
    try:
        c.recv_response()
        return True
    except (ConnectionError, socket.timeout):
        return False


def test_connection_limits_and_idle_connections(broker_factory):
    b = broker_factory({"max.connections.per.ip": "3", "connections.max.idle.ms": "1500"})
    # The fixture's readiness probes are connections too, until the broker
    # sees them closed.
    time.sleep(0.5)
    conns = [w.Conn(b.bootstrap, timeout_s=5) for _ in range(3)]
    try:
        assert all(_api_versions_answered(c) for c in conns)
        with w.Conn(b.bootstrap, timeout_s=5) as extra:
            assert extra.closed_by_peer(), "a fourth connection from one address is closed"
        # Idle past connections.max.idle.ms: closed by the broker.
        assert conns[0].closed_by_peer()
    finally:
        for c in conns:
            c.close()

    b2 = broker_factory({"max.connections": "2"})
    first, second = w.Conn(b2.bootstrap, timeout_s=1), w.Conn(b2.bootstrap, timeout_s=1)
    assert _api_versions_answered(first) and _api_versions_answered(second)
    third = w.Conn(b2.bootstrap, timeout_s=1)
    third.send(w.api_versions_request(0, 6))
    with pytest.raises(socket.timeout):
        third.recv_response()  # waits in the backlog: not accepted yet
    first.close()
    third.sock.settimeout(10)
    assert third.recv_response()[0] == 6, "accepted once a slot is free"
    second.close()
    third.close()


# ------------------------------------------------------------ stray dirs

def test_directories_no_topic_owns_are_renamed_never_deleted(broker_factory):
    b = broker_factory({})
    topic = unique("owned")
    create_topic(b.bootstrap, topic, 1)
    _fill(b, topic, 3, size=10)
    b.stop()
    ghost = b.data_dir / "ghost-0"
    ghost.mkdir()
    (ghost / "00000000000000000000.log").write_bytes(b"precious")
    beyond = b.data_dir / f"{topic}-7"
    beyond.mkdir()
    b.start()
    # The listeners are bound before the data dir is opened, so a port that
    # accepts says nothing yet about the directories.
    wait_until(lambda: len(list(b.data_dir.glob("*-stray"))) == 2, 30, "the strays renamed")
    assert not ghost.exists() and not beyond.exists()
    strays = sorted(p.name for p in b.data_dir.glob("*-stray"))
    assert len(strays) == 2 and strays[0].startswith("ghost-0."), strays
    kept = next(b.data_dir.glob("ghost-0.*-stray"))
    assert (kept / "00000000000000000000.log").read_bytes() == b"precious"
    assert len(consume_range(b.bootstrap, topic, [0], 3)[0]) == 3
