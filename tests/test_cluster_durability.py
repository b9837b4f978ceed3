"""A cluster's acks=all writes are durable in the object store before
they are acknowledged: each leader writes its partitions' batches into
WAL objects in the object store (a real S3 server here, versitygw) and
commits them in etcd, and only then answers the producer and lets
consumers read them (the high watermark is the committed offset). While
the object store is away, produce is never acknowledged, and what the
producer sent is committed exactly once when it is back. Keel's own, so
skipped under KEEL_TEST_IMPL=kafka."""
from __future__ import annotations

import base64
import json
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import IMPL, wait_until
from test_cluster import TIMEOUT_S, start_cluster
from test_cluster_topics import consume, create, leaders

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="cluster mode over etcd is Keel's")

PREFIX = "/keel-test"


def s3_sets(s3):
    return {
        "keel.tier.remote": f"s3://{s3.bucket}",
        "keel.tier.remote.endpoint": s3.endpoint,
        "keel.tier.remote.region": s3.region,
        "keel.tier.remote.access.key.id": s3.access_key,
        "keel.tier.remote.secret.access.key": s3.secret_key,
    }


def etcd_range(etcd, prefix: str) -> dict[str, dict]:
    """Every key under `prefix` in etcd (its JSON gateway), decoded."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                       "range_end": base64.b64encode(end.encode()).decode()}).encode()
    req = urllib.request.Request(f"{etcd.endpoint}/v3/kv/range", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        kvs = json.load(r).get("kvs", [])
    return {base64.b64decode(kv["key"]).decode(): json.loads(base64.b64decode(kv["value"])) for kv in kvs}


def metric(b, name: str) -> float:
    with urllib.request.urlopen(f"http://{b.admin}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def high_watermark(b, topic, partition) -> int:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "hw"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)[1]
    finally:
        c.close()


class Sender:
    """An idempotent acks=all producer that waits long for its records
    (they may wait for the object store), and what it was told."""

    def __init__(self, b, topic):
        self.topic = topic
        self.p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                           "message.timeout.ms": 120000, "request.timeout.ms": 3000})
        self.acked, self.errors = [], []

    def send(self, values):
        for v in values:
            self.p.produce(self.topic, value=v, partition=0, on_delivery=self._delivered)
            self.p.poll(0)

    def _delivered(self, e, m):
        if e:
            self.errors.append(e)
        else:
            self.acked.append(m.value())


def test_acknowledged_records_are_in_wal_objects_committed_in_etcd(etcd, s3server, tmp_path):
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3], extra=s3_sets(s3server))
    b1 = brokers[1]
    create(b1, "orders", num_partitions=3, replication_factor=1)
    wait_until(lambda: all(v >= 0 for v in (leaders(b1, "orders") or {0: -1}).values()), TIMEOUT_S,
               "leaders for orders")
    p = Producer({"bootstrap.servers": b1.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    acked = []
    for i in range(300):
        p.produce("orders", key=str(i).encode(), value=f"v{i}".encode(), partition=i % 3,
                  on_delivery=lambda e, m: e is None and acked.append((m.partition(), m.offset())))
        p.poll(0)
    assert p.flush(30) == 0 and len(acked) == 300
    # Each partition's commit in etcd ends where its acknowledged records do.
    commits = etcd_range(etcd, f"{PREFIX}.logs/")
    ends = {}
    for key, c in commits.items():
        ends[int(key.rsplit("/", 1)[1])] = (c["end_offset"], c["leader"])
    assert {part: end for part, (end, _) in ends.items()} == {0: 100, 1: 100, 2: 100}, commits
    # The WAL objects the index keys name hold the committed ranges.
    indexes = etcd_range(etcd, f"{PREFIX}.wal/")
    assert indexes, "no WAL object was committed"
    objects = set(s3server.object_keys())
    covered = {0: 0, 1: 0, 2: 0}
    for index in indexes.values():
        assert index["object"] in objects, (index["object"], sorted(objects)[:5])
        for r in index["ranges"]:
            covered[r["partition"]] += r["end_offset"] - r["base_offset"]
            # The bytes at the range are the partition's batches: base offset first.
            data = s3server.object_path(index["object"]).read_bytes()
            chunk = data[r["position"]:r["position"] + r["length"]]
            assert int.from_bytes(chunk[:8], "big") == r["base_offset"]
    assert covered == {0: 100, 1: 100, 2: 100}
    written = sum(metric(b, "keel_cluster_wal_objects_total") for b in brokers.values())
    assert written >= len(indexes) > 0
    got = consume(b1, "orders", [0, 1, 2], 300)
    assert all(v == [f"v{i}".encode() for i in range(part, 300, 3)] for part, v in got.items())


def test_produce_waits_for_the_object_store_and_commits_exactly_once(etcd, s3server, tmp_path):
    brokers = start_cluster(etcd, tmp_path, [1, 2], extra=s3_sets(s3server))
    b1 = brokers[1]
    create(b1, "events", num_partitions=1, replication_factor=1)
    wait_until(lambda: (leaders(b1, "events") or {0: -1})[0] >= 0, TIMEOUT_S, "a leader for events")
    leader = brokers[leaders(b1, "events")[0]]
    s = Sender(b1, "events")
    p, acked, errors, send = s.p, s.acked, s.errors, s.send
    send([f"before-{i}".encode() for i in range(50)])
    assert p.flush(30) == 0 and len(acked) == 50
    assert high_watermark(leader, "events", 0) == 50
    s3server.stop()
    send([f"during-{i}".encode() for i in range(50)])
    # No acknowledgement while the object store is away, and consumers
    # see nothing past what was committed.
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        p.poll(0.2)
    assert len(acked) == 50 and not errors, (len(acked), errors[:3])
    assert high_watermark(leader, "events", 0) == 50
    # Waiting for the store (its write failures count only once the object
    # store client's own retries give up, which takes longer under load).
    assert metric(leader, "keel_cluster_wal_pending_bytes") > 0
    s3server.start()
    assert p.flush(60) == 0, "the producer's records were not acknowledged once the store was back"
    assert len(acked) == 100 and not errors, errors[:3]
    got = consume(b1, "events", [0], 100)[0]
    expected = [f"before-{i}".encode() for i in range(50)] + [f"during-{i}".encode() for i in range(50)]
    assert got == expected, "records lost, duplicated or out of order"


def test_a_zombie_leader_acknowledges_nothing_it_could_not_commit(etcd, s3server, tmp_path):
    """The leader holds writes it could not commit (the object store is
    away), then stops (SIGSTOP) past its session: the other broker is
    given its partition and claims it, but rebuilds its log only once the
    object store is back. When the stopped broker runs again its commits
    fail against etcd (its session ended), so none of those writes is
    acknowledged; the producer's retries go to the new leader, which
    commits each record once, after the ones it replayed."""
    import signal
    brokers = start_cluster(etcd, tmp_path, [1, 2], extra=s3_sets(s3server))
    b1 = brokers[1]
    create(b1, "zombie", num_partitions=1, replica_assignment=[[1]])
    wait_until(lambda: (leaders(b1, "zombie") or {0: -1})[0] == 1, TIMEOUT_S, "broker 1 to lead")
    s = Sender(brokers[2], "zombie")
    p, acked, errors, send = s.p, s.acked, s.errors, s.send
    send([f"a-{i}".encode() for i in range(20)])
    assert p.flush(30) == 0 and len(acked) == 20
    s3server.stop()
    send([f"b-{i}".encode() for i in range(20)])
    wait_until(lambda: metric(b1, "keel_cluster_wal_pending_bytes") > 0, TIMEOUT_S,
               "writes waiting for the object store")
    b1.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: (leaders(brokers[2], "zombie") or {0: 1})[0] == 2, TIMEOUT_S,
                   "the other broker to be given the partition")
        s3server.start()
    finally:
        b1.proc.send_signal(signal.SIGCONT)
    assert p.flush(60) == 0, "the producer's records were not acknowledged after the leader came back"
    assert metric(b1, "keel_cluster_wal_fenced_groups_total") > 0, "no write was fenced"
    assert len(acked) == 40 and not errors, errors[:3]
    got = consume(brokers[2], "zombie", [0], 40)[0]
    assert got == [f"a-{i}".encode() for i in range(20)] + [f"b-{i}".encode() for i in range(20)]
    commits = etcd_range(etcd, f"{PREFIX}.logs/")
    assert [(c["leader_epoch"], c["end_offset"], c["writer"]) for c in commits.values()] == [(1, 40, 2)], commits


def test_etcd_restarted_under_produce_acknowledges_nothing_it_did_not_commit(etcd, tmp_path):
    """etcd stopped while an idempotent producer writes: commits cannot
    land, so nothing more is acknowledged and the high watermark stays
    (the brokers fence themselves after a session timeout); when etcd is
    back the cluster leads again and every record the producer sent is
    committed once, in order."""
    brokers = start_cluster(etcd, tmp_path, [1, 2])
    b1 = brokers[1]
    create(b1, "steady", num_partitions=1, replica_assignment=[[1]])
    wait_until(lambda: (leaders(b1, "steady") or {0: -1})[0] == 1, TIMEOUT_S, "broker 1 to lead")
    s = Sender(brokers[2], "steady")
    p, acked, errors, send = s.p, s.acked, s.errors, s.send
    send([f"a-{i}".encode() for i in range(50)])
    assert p.flush(30) == 0 and len(acked) == 50
    etcd.stop()
    try:
        send([f"b-{i}".encode() for i in range(50)])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            p.poll(0.2)
        assert len(acked) == 50 and not errors, (len(acked), errors[:3])
        # Written, not committed: the leader's high watermark stays.
        with urllib.request.urlopen(f"http://{b1.admin}/stats", timeout=5) as r:
            [hw] = [q["high_watermark"] for q in json.load(r)["partitions"] if q["topic"] == "steady"]
        assert hw == 50, hw
    finally:
        etcd.start()
    assert p.flush(90) == 0, "the producer's records were not acknowledged once etcd was back"
    assert len(acked) == 100 and not errors, errors[:3]
    got = consume(brokers[2], "steady", [0], 100)[0]
    assert got == [f"a-{i}".encode() for i in range(50)] + [f"b-{i}".encode() for i in range(50)]


@pytest.mark.parametrize("store", ["file", "s3"])
def test_a_wal_object_no_commit_names_is_deleted_an_hour_after_its_write(etcd, tmp_path, request, store):
    """A WAL object written and never committed (its broker crashed between
    the write and the commit) is deleted by the controller once it is an
    hour old (by the object store's clock: its files are dated two hours
    back here); a younger one is left for its commit, and committed
    objects, however old, stay while their records need them. In a
    directory store and in S3 (versitygw, whose objects are files)."""
    import os
    from test_cluster_topics import produce
    extra = {"keel.cluster.wal.gc.interval.ms": "300"}
    if store == "s3":
        s3 = request.getfixturevalue("s3server")
        extra.update(s3_sets(s3))
        objects = s3.bucket_dir
    else:
        objects = tmp_path / "objects"
    brokers = start_cluster(etcd, tmp_path, [1], extra=extra)
    create(brokers[1], "orphans", num_partitions=1)
    produce(brokers[1], "orphans", 20)
    mine = wait_until(lambda: next(objects.glob("*/wal/1"), None), TIMEOUT_S, "the broker's WAL objects")
    committed = sorted(mine.glob("*.wal"))
    assert committed
    # A crashed broker 7's objects: one written two hours ago, one now.
    crashed = mine.parent / "7"
    crashed.mkdir()
    old, young = crashed / "00000000000000000001-00000000000000000001.wal", crashed / "00000000000000000001-00000000000000000002.wal"
    old.write_bytes(b"x" * 100)
    young.write_bytes(b"y" * 100)
    two_hours_ago = time.time() - 7200
    for f in [old, *committed]:
        os.utime(f, (two_hours_ago, two_hours_ago))
    # The pass that deleted it listed the others too.
    wait_until(lambda: not old.exists(), TIMEOUT_S, "the old uncommitted object deleted")
    assert young.exists()
    assert all(f.exists() for f in committed)
    assert metric(brokers[1], "keel_cluster_wal_collected_orphans_total") == 1
    assert len(consume(brokers[1], "orphans", [0], 20)[0]) == 20
