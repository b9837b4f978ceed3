"""Compacted topics against a real broker: the cleaner keeps the latest
record of every key at its original offset (checked with a real consumer and
with Apache Kafka's DumpLogSegments), tombstones go after
delete.retention.ms, retention leaves compact-only topics alone, records
without a key are refused, and the combinations Kafka refuses (remote
storage, DeleteRecords) are refused with Kafka's errors."""
from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from conftest import unique, wait_until
from kclient import CLIENT_TIMEOUT_S, DeliveryLog, admin, consume_range, create_topic, produce_all

import kafka_tools
from test_hardening import partition_stats


def _fill(bootstrap: str, topic: str, n: int) -> DeliveryLog:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    log = DeliveryLog()
    produce_all(p, [{"key": b"k%d" % (i % 50), "value": b"v" * 500 + b"%d" % i, "headers": None}
                    for i in range(n)], log, topic)
    return log


def test_retention_never_deletes_a_compact_only_topic(broker_factory):
    """retention.ms and retention.bytes delete old segments of a `delete`
    topic and of a `compact,delete` one, never of a `compact` one (the
    cleaner is off, so every record must still be there)."""
    b = broker_factory({"log.retention.check.interval.ms": "200", "log.cleaner.enable": "false"})
    tight = {"segment.bytes": str(16 << 10), "retention.ms": "1000", "retention.bytes": str(20 << 10)}
    topics = {policy: unique(f"ret-{policy.replace(',', '-')}") for policy in
              ("compact", "delete", "compact,delete")}
    for policy, topic in topics.items():
        create_topic(b.bootstrap, topic, 1, {**tight, "cleanup.policy": policy})
        _fill(b.bootstrap, topic, 300)
    wait_until(lambda: all(partition_stats(b, topics[p])["log_start_offset"] > 0
                           for p in ("delete", "compact,delete")),
               30, "retention to delete old segments of the delete topics")
    compact = topics["compact"]
    assert partition_stats(b, compact)["log_start_offset"] == 0
    b.restart()
    assert partition_stats(b, compact)["log_start_offset"] == 0
    consumed = consume_range(b.bootstrap, compact, [0], 300)
    assert [m.offset() for m in consumed[0]] == list(range(300))


def test_records_without_a_key_are_refused_on_compacted_topics(shared_broker):
    """Also inside compressed batches, which Keel opens on compacted topics."""
    bs = shared_broker.bootstrap
    for policy, codec in (("compact", "none"), ("compact,delete", "none"), ("compact", "zstd"),
                          ("compact", "snappy")):
        topic = unique("nokey")
        create_topic(bs, topic, 1, {"cleanup.policy": policy})
        p = Producer({"bootstrap.servers": bs, "retries": 0, "message.timeout.ms": 10000,
                      "compression.type": codec})
        results = []
        for key in (b"k", None):
            p.produce(topic, value=b"v", key=key, partition=0,
                      on_delivery=lambda err, msg: results.append(err))
            p.flush(CLIENT_TIMEOUT_S)
        assert results[0] is None, results
        assert results[1] is not None and results[1].code() == KafkaError.INVALID_RECORD, results
    plain = unique("nokey-delete")
    create_topic(bs, plain, 1)
    p = Producer({"bootstrap.servers": bs})
    errors = []
    p.produce(plain, value=b"v", partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(CLIENT_TIMEOUT_S)
    assert errors == [None]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_a_batch_with_keyless_records_names_each_of_them(shared_broker, codec):
    """KIP-467: the Produce response names the refused records of a batch
    (`record_errors`), so librdkafka fails those with INVALID_RECORD and the
    rest of the batch with _INVALID_DIFFERENT_RECORD, as against Kafka."""
    bs = shared_broker.bootstrap
    topic = unique(f"nokey-{codec}")
    create_topic(bs, topic, 1, {"cleanup.policy": "compact"})
    p = Producer({"bootstrap.servers": bs, "retries": 0, "message.timeout.ms": 10000,
                  "compression.type": codec, "linger.ms": 5000, "batch.num.messages": 100})
    # The partition's leader known first, so the 100 records go out as one
    # batch (record_errors index records within their batch).
    p.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
    errors: dict[int, KafkaError | None] = {}
    for i in range(100):
        key = None if i % 10 == 9 else b"k%d" % i
        p.produce(topic, value=b"v%d" % i, key=key, partition=0,
                  on_delivery=lambda err, msg, i=i: errors.__setitem__(i, err))
    assert p.flush(CLIENT_TIMEOUT_S) == 0
    assert len(errors) == 100
    codes = {i: (e.code() if e is not None else None) for i, e in errors.items()}
    keyless = [i for i in range(100) if i % 10 == 9]
    assert [i for i, c in codes.items() if c == KafkaError.INVALID_RECORD] == keyless, codes
    assert all(codes[i] == KafkaError._INVALID_DIFFERENT_RECORD
               for i in range(100) if i not in keyless), codes


def test_remote_storage_and_delete_records_are_refused_on_compacted_topics(shared_broker):
    bs = shared_broker.bootstrap
    a = admin(bs)
    topic = unique("remote-compact")
    fut = a.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact",
                                                         "remote.storage.enable": "true"})])[topic]
    with pytest.raises(KafkaException) as refused:
        fut.result(CLIENT_TIMEOUT_S)
    err = refused.value.args[0]
    assert err.code() == KafkaError.INVALID_CONFIG, err
    assert "Remote log storage is unsupported for the compacted topics" in err.str(), err

    compact = unique("dr-compact")
    create_topic(bs, compact, 1, {"cleanup.policy": "compact"})
    _fill(bs, compact, 20)
    res = a.delete_records([TopicPartition(compact, 0, 10)])
    with pytest.raises(KafkaException) as refused:
        next(iter(res.values())).result(CLIENT_TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.POLICY_VIOLATION, refused.value
    both = unique("dr-both")
    create_topic(bs, both, 1, {"cleanup.policy": "compact,delete"})
    _fill(bs, both, 20)
    res = a.delete_records([TopicPartition(both, 0, 10)])
    assert next(iter(res.values())).result(CLIENT_TIMEOUT_S).low_watermark == 10


# Small segments that roll after a second, and a cleaner that looks often:
# a pass runs within moments of a segment being sealed.
CLEAN_FAST = {"log.cleaner.backoff.ms": "100"}
COMPACT_SMALL = {"cleanup.policy": "compact", "segment.bytes": str(8 << 10), "segment.ms": "1000",
                 "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0"}


def _produce_rounds(bootstrap: str, topic: str, rounds: list[list[tuple[bytes, bytes | None]]],
                    latest: dict, codecs: list[str] | None = None) -> None:
    """Produces each round in order (round i compressed with codecs[i]),
    noting every key's latest offset and value."""
    producers: dict[str, Producer] = {}
    for i, records in enumerate(rounds):
        codec = codecs[i] if codecs else "none"
        if codec not in producers:
            producers[codec] = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                         "enable.idempotence": True, "compression.type": codec})
        p = producers[codec]
        log = DeliveryLog()
        produce_all(p, [{"key": k, "value": v, "partition": 0} for k, v in records], log, topic)
        log.check()
        for index, _partition, offset in log.acked:
            k, v = records[index]
            latest[k] = (offset, v)


def _load_and_seal(b, topic: str, keys: list[bytes], rounds: int, pad: bytes,
                   config: dict | None = None) -> dict:
    """Creates `topic` (compacted, small segments), produces `rounds` rounds
    over `keys`, then a second later one record with a key of its own, which
    rolls the segment: every round is sealed. Returns each key's latest
    (offset, value); the rolling record's key is b"roll"."""
    create_topic(b.bootstrap, topic, 1, config or COMPACT_SMALL)
    latest: dict = {}
    _produce_rounds(b.bootstrap, topic, [[(k, b"round-%d-" % r + pad) for k in keys]
                                         for r in range(rounds)], latest)
    time.sleep(1.2)
    _produce_rounds(b.bootstrap, topic, [[(b"roll", b"roll")]], latest)
    return latest


def _seal_and_wait_clean(b, topic: str, latest: dict) -> int:
    """Seals everything produced (a second later, one more record, with a
    key of its own, rolls the segment) and waits until the cleaner has
    cleaned up to it. Returns that record's offset."""
    time.sleep(1.2)
    key = b"end-%d" % sum(k.startswith(b"end-") for k in latest)
    _produce_rounds(b.bootstrap, topic, [[(key, b"end")]], latest)
    end = latest[key][0]

    def cleaned():
        c = partition_stats(b, topic)["cleaner"]
        return c is not None and (c["clean_end"] or 0) >= end
    wait_until(cleaned, 60, f"the cleaner to clean {topic} up to offset {end}")
    return end


def _read_all(bootstrap: str, topic: str, expected: int) -> list[tuple[int, bytes, bytes | None]]:
    got = consume_range(bootstrap, topic, [0], expected)[0]
    return [(m.offset(), m.key(), m.value()) for m in got]


def _survivors(latest: dict) -> list[tuple[int, bytes, bytes | None]]:
    return sorted((offset, k, v) for k, (offset, v) in latest.items())


def test_the_cleaner_keeps_the_latest_record_of_every_key(broker_factory):
    """Twenty rounds over sixty keys, the last round deleting ten of them:
    after cleaning, a consumer reading from 0 sees one record per key, the
    latest, at its original offset (tombstones included, until
    delete.retention.ms has passed and another pass ran). The cleaned files
    pass Apache Kafka's DumpLogSegments, and all of it survives a restart."""
    b = broker_factory(CLEAN_FAST)
    topic = unique("cleaned")
    create_topic(b.bootstrap, topic, 1, COMPACT_SMALL)
    keys = [b"key-%02d" % k for k in range(60)]
    rounds = [[(k, b"round-%d-" % r + b"x" * 200) for k in keys] for r in range(19)]
    rounds.append([(k, None if i < 10 else b"round-19-" + b"x" * 200) for i, k in enumerate(keys)])
    latest: dict = {}
    _produce_rounds(b.bootstrap, topic, rounds, latest)
    produced = sum(len(r) for r in rounds)
    _seal_and_wait_clean(b, topic, latest)

    expected = _survivors(latest)
    assert _read_all(b.bootstrap, topic, len(expected)) == expected
    st = partition_stats(b, topic)
    assert st["cleaner"]["passes"] >= 1 and st["cleaner"]["records_removed"] >= produced - len(expected), st
    assert st["cleaner"]["bytes_reclaimed"] > 0, st

    # Tombstones are clean now and past delete.retention.ms=0: the next pass
    # (another round of values makes the log dirty again) drops them.
    _produce_rounds(b.bootstrap, topic, [[(k, b"round-20") for k in keys[10:]]], latest)
    _seal_and_wait_clean(b, topic, latest)
    for k in keys[:10]:
        del latest[k]
    expected = _survivors(latest)
    assert _read_all(b.bootstrap, topic, len(expected)) == expected

    _check_with_dump_log_segments(b.data_dir / f"{topic}-0", expected)
    b.restart()
    assert _read_all(b.bootstrap, topic, len(expected)) == expected


def test_compressed_batches_are_cleaned_in_their_own_codec(broker_factory):
    """Rounds produced with gzip, snappy, lz4 and zstd, each superseding
    all but one eighth of the round before: every batch keeps some records,
    so the cleaner decompresses, filters and compresses it again in its own
    codec. librdkafka reads the result from 0, and Apache Kafka's
    DumpLogSegments (Java's codecs) finds every batch valid, in its codec."""
    b = broker_factory(CLEAN_FAST)
    topic = unique("cleaned-codecs")
    create_topic(b.bootstrap, topic, 1, COMPACT_SMALL)
    codecs = ["gzip", "snappy", "lz4", "zstd"] * 2
    rounds = [[(b"key-%02d" % k, None if k % 8 == 7 and r == 7 else b"round-%d-" % r + b"y" * 300)
               for k in range(64) if k % 8 >= r] for r in range(8)]
    latest: dict = {}
    _produce_rounds(b.bootstrap, topic, rounds, latest, codecs)
    _seal_and_wait_clean(b, topic, latest)
    expected = _survivors(latest)
    assert _read_all(b.bootstrap, topic, len(expected)) == expected
    st = partition_stats(b, topic)["cleaner"]
    assert st["records_removed"] > 0 and not st["uncleanable"], st
    out = _check_with_dump_log_segments(b.data_dir / f"{topic}-0", expected)
    kept = set(re.findall(r"^baseOffset: .* count: [1-9]\d* .*compresscodec: (\w+)", out, re.M))
    assert {"gzip", "snappy", "lz4", "zstd"} <= kept, out[-4000:]


def _check_with_dump_log_segments(partition_dir, expected) -> str:
    """DumpLogSegments reads every segment and its index files: every batch
    valid, no index entry that disagrees with the log, and exactly the
    expected offsets (and keys) in the data. Returns its output."""
    logs = sorted(partition_dir.glob("*.log"))
    indexes = sorted(partition_dir.glob("*.index")) + sorted(partition_dir.glob("*.timeindex"))
    out = kafka_tools.dump_log_segments(*logs, *indexes)
    assert "isValid: false" not in out and "isvalid: false" not in out, out[-4000:]
    for marker in ("Mismatches in", "timestamp mismatch", "out of order", "not in", "Exception"):
        assert marker not in out, f"DumpLogSegments reports `{marker}`:\n{out[-4000:]}"
    offsets = [int(m) for m in re.findall(r"^\| offset: (\d+)", out, re.M)]
    assert offsets == [o for o, _k, _v in expected], out[-4000:]
    # Emptied batches stay only at the end of a cleaned segment or as the
    # producer's newest batch, never one per superseded batch.
    empty = len(re.findall(r"^baseOffset: .* count: 0 ", out, re.M))
    assert empty <= len(logs) + 1, f"{empty} empty batches in {len(logs)} segments:\n{out[-4000:]}"
    return out


def test_a_damaged_batch_makes_the_partition_uncleanable_not_wedged(broker_factory):
    """A batch damaged on disk fails the pass that reads it (its CRC is
    checked, so it is never rewritten under a fresh checksum). The partition
    is then left alone until restart, as Kafka's cleaner does, instead of
    reading the dirty section again every backoff; it keeps taking writes."""
    b = broker_factory({**CLEAN_FAST, "log.cleaner.enable": "false"})
    topic = unique("damaged")
    latest = _load_and_seal(b, topic, [b"key-%02d" % k for k in range(40)], 6, b"z" * 200)
    b.stop()
    first = sorted((b.data_dir / f"{topic}-0").glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[200] ^= 0xFF  # inside the first batch's records
    first.write_bytes(bytes(data))
    b.sets["log.cleaner.enable"] = "true"
    b.start()

    def uncleanable():
        c = partition_stats(b, topic)["cleaner"]
        return c if c and c["uncleanable"] else None
    c = wait_until(uncleanable, 30, "the pass over the damaged batch to fail")
    assert c["failed_passes"] == 1 and c["last_error"], c
    assert "uncleanable until restart" in c["not_cleanable"], c
    time.sleep(1.5)  # fifteen backoffs
    assert partition_stats(b, topic)["cleaner"]["failed_passes"] == 1
    _produce_rounds(b.bootstrap, topic, [[(b"after", b"still writable")]], latest)
    end = latest[b"after"][0]
    assert [(m.key(), m.value()) for m in consume_range(b.bootstrap, topic, [0], 1, start_offset=end)[0]] == \
        [(b"after", b"still writable")]


def test_a_failing_colder_tier_fails_a_pass_and_the_partition_is_cleaned_once_it_answers(broker_factory,
                                                                                       tmp_path):
    """A pass that cannot read a segment's copy in the capacity tier (or,
    in a cluster, the object store) fails, but the partition is not left
    alone until restart as for a damaged batch: it is tried again after
    `log.cleaner.backoff.ms`, and cleaned once the tier answers."""
    capacity = tmp_path / "capacity"
    b = broker_factory({**CLEAN_FAST, "log.cleaner.enable": "false",
                        "keel.tier.capacity.dirs": str(capacity), "keel.tier.check.interval.ms": "100",
                        "keel.tier.move.bytes.per.sec": "0"})
    topic = unique("tier-fails")
    latest = _load_and_seal(b, topic, [b"key-%02d" % k for k in range(40)], 6, b"t" * 200,
                            {**COMPACT_SMALL, "local.retention.bytes": "0"})
    roll = latest[b"roll"][0]
    wait_until(lambda: (t := partition_stats(b, topic)["tiers"])["cold"] >= 3 and t["local_segments"] <= 1,
               60, "the sealed segments to move to the capacity tier")
    b.stop()
    away = [p for p in capacity.rglob("*.log")]
    for p in away:
        p.rename(p.with_name(p.name + ".away"))
    b.sets["log.cleaner.enable"] = "true"
    b.start()

    def failed():
        c = partition_stats(b, topic)["cleaner"]
        return c if c and c["failed_passes"] >= 1 else None
    c = wait_until(failed, 30, "a pass to fail on the capacity tier")
    assert not c["uncleanable"] and c["retry_at_ms"], c
    assert "colder tier failed" in c["not_cleanable"], c
    for p in away:
        p.with_name(p.name + ".away").rename(p)
    wait_until(lambda: (partition_stats(b, topic)["cleaner"]["clean_end"] or 0) >= roll, 60,
               f"the cleaner to clean {topic} up to offset {roll}")
    expected = _survivors(latest)
    assert _read_all(b.bootstrap, topic, len(expected)) == expected


def _plan(b, topic: str, *args: str) -> dict:
    done = subprocess.run([str(b.bin), "compaction", "plan", "--topic", topic,
                           "--data-dir", str(b.data_dir), "--json", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_compaction_plan_scans_a_topic_the_broker_wrote(broker_factory):
    """`keel compaction plan --topic` reads the partition directories of a
    running broker: records and distinct keys of the dirty part, and the
    passes a map of a given size needs; after the cleaner ran, nothing
    sealed is dirty."""
    b = broker_factory({**CLEAN_FAST, "log.cleaner.enable": "false"})
    topic = unique("planned")
    keys = [b"key-%03d" % k for k in range(300)]
    latest = _load_and_seal(b, topic, keys, 4, b"p" * 100)
    before = _plan(b, topic, "--map-bytes", str(100 * 14))
    scanned = before["scanned"][0]
    assert scanned["records"] == 4 * len(keys) + 1, scanned
    assert abs(scanned["keys"] - (len(keys) + 1)) <= 3, scanned
    part = before["partitions"][0]
    assert abs(part["dirty_keys"] - len(keys)) <= 3, part
    # 100 slots of 14 bytes, full at 7/8: 87 keys; 300 dirty keys take 4 passes.
    assert before["cleaner"]["keel_map_keys"] == 87, before["cleaner"]
    assert part["keel"]["passes"] == 4, part
    assert part["keel"]["bytes_reclaimed"] > 0, part

    b.stop()
    b.sets["log.cleaner.enable"] = "true"
    b.start()
    roll = latest[b"roll"][0]
    wait_until(lambda: (partition_stats(b, topic)["cleaner"]["clean_end"] or 0) >= roll, 60,
               f"the cleaner to clean {topic} up to offset {roll}")
    after = _plan(b, topic)
    assert after["partitions"][0]["dirty_records"] == 0, after["partitions"][0]
    assert after["scanned"][0]["records"] < scanned["records"], after["scanned"]


def test_the_cleaner_cleans_segments_in_the_capacity_tier(broker_factory, tmp_path):
    """A compacted topic's sealed segments move to a capacity dir like any
    other topic's (never to the object store). The cleaner reads them
    there and stores each cleaned group back in the tier as a new copy;
    the old copies are deleted. A reader from 0 sees one record per key
    (librdkafka included: a cleaned copy can be a single emptied batch, and
    the fetch reads on past it), and so it stays after a restart."""
    capacity = tmp_path / "capacity"
    b = broker_factory({**CLEAN_FAST, "log.cleaner.enable": "false",
                        "keel.tier.capacity.dirs": str(capacity), "keel.tier.check.interval.ms": "100",
                        "keel.tier.move.bytes.per.sec": "0", "keel.tail.cache.bytes": str(64 << 10)})
    topic = unique("cold-compact")
    latest = _load_and_seal(b, topic, [b"key-%02d" % k for k in range(60)], 12, b"c" * 200,
                            {**COMPACT_SMALL, "local.retention.bytes": "0", "file.delete.delay.ms": "500"})
    roll = latest[b"roll"][0]

    def tiers():
        return partition_stats(b, topic)["tiers"]
    cold_before = wait_until(lambda: (t := tiers())["cold"] >= 5 and t["local_segments"] <= 1 and t,
                             60, "the sealed segments to move to the capacity tier")
    copies_before = {p.name for p in capacity.rglob("*.log")}

    b.stop()
    b.sets["log.cleaner.enable"] = "true"
    b.start()
    wait_until(lambda: (partition_stats(b, topic)["cleaner"]["clean_end"] or 0) >= roll, 60,
               f"the cleaner to clean {topic} up to offset {roll}")
    c = partition_stats(b, topic)["cleaner"]
    assert c["bytes_reclaimed"] > 0 and not c["uncleanable"], c
    expected = _survivors(latest)
    assert _read_all(b.bootstrap, topic, len(expected)) == expected
    # The old copies go (file.delete.delay.ms after the swap); the cleaned
    # ones are new copies, and smaller. Only
    # the newest round's segment, holding nothing superseded, stays as it is.
    after = wait_until(lambda: (t := tiers())["deleting"] == 0 and t, 30, "the replaced copies to go")
    assert after["cold"] >= 1 and after["cold_bytes"] < cold_before["cold_bytes"] / 5, (cold_before, after)
    copies_after = {p.name for p in capacity.rglob("*.log")}
    assert len(copies_after & copies_before) <= 1, sorted(copies_after & copies_before)
    # `keel compaction plan` scans the copies too, given the capacity dir.
    scanned = _plan(b, topic, "--capacity-dir", str(capacity))["scanned"][0]
    assert scanned["records"] == len(expected), scanned
    missing = subprocess.run([str(b.bin), "compaction", "plan", "--topic", topic,
                              "--data-dir", str(b.data_dir)], capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "capacity tier" in missing.stderr, missing.stderr
    b.restart()
    assert _read_all(b.bootstrap, topic, len(expected)) == expected


def test_the_cleaner_removes_aborted_transactions_and_keeps_committed_values(broker_factory):
    """A compacted topic written in transactions, every other one aborted
    (a Kafka Streams changelog's shape): after cleaning, each key's value
    is its last committed one, the aborted records are gone even for
    read_uncommitted readers, and read_committed readers see one record per
    key."""
    from test_transactions import _read_all as read_isolated, _txn_producer
    b = broker_factory(CLEAN_FAST)
    topic = unique("txclean")
    create_topic(b.bootstrap, topic, 1, COMPACT_SMALL)
    keys = [b"key-%02d" % k for k in range(30)]
    p = _txn_producer(b.bootstrap, unique("tx"))
    for r in range(8):
        p.begin_transaction()
        for k in keys:
            p.produce(topic, key=k, value=b"%s-%d-" % (b"commit" if r % 2 == 0 else b"abort", r) + b"x" * 200,
                      partition=0)
        p.flush(CLIENT_TIMEOUT_S)
        if r % 2 == 0:
            p.commit_transaction(CLIENT_TIMEOUT_S)
        else:
            p.abort_transaction(CLIENT_TIMEOUT_S)
    latest: dict = {}
    _seal_and_wait_clean(b, topic, latest)
    everything = read_isolated(b.bootstrap, topic, "read_uncommitted")
    assert not [v for v in everything if v.startswith(b"abort")], "aborted records were cleaned away"
    committed = [v for v in read_isolated(b.bootstrap, topic, "read_committed") if v.startswith(b"commit")]
    assert sorted(committed) == [b"commit-6-" + b"x" * 200] * len(keys)
