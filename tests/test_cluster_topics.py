"""A cluster's topics on a real etcd: a topic created, grown, reconfigured
or deleted at any broker is every broker's; each partition is led by one
broker the cluster chose (or the request named), which every broker
names in Metadata, and only it takes the partition's reads and writes;
a leader that dies has its partitions led by live brokers in a new
leader epoch, their logs rebuilt from the object store with every
acknowledged record. Keel's own, so skipped under KEEL_TEST_IMPL=kafka."""
from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.request

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                  NewPartitions, NewTopic)

import consumer_group_wire as cg
import group_wire as gw
import kafka_tools
import kafka_wire as w
from conftest import IMPL, Broker, wait_until
from test_cluster import TIMEOUT_S, member, start_cluster, stats

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="cluster mode over etcd is Keel's")

NOT_LEADER_OR_FOLLOWER = 6
NOT_COORDINATOR = 16


def leaders(b, topic):
    """{partition: leader} as `b` answers Metadata (-1: none), or None if
    it does not list the topic."""
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=5)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return None
    return {p.id: p.leader for p in t.partitions.values()}


def leadership(b, topic):
    """{partition: (leader, leader epoch)} from `b`'s /stats."""
    with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=5) as r:
        parts = json.load(r)["partitions"]
    return {p["partition"]: (p["leader"], p["leader_epoch"]) for p in parts if p["topic"] == topic}


def create(b, topic, **kw):
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    a.create_topics([NewTopic(topic, **kw)], operation_timeout=10)[topic].result(15)


def produce(b, topic, n, partition=None, key_prefix="k", pad=0):
    """n records through a client bootstrapped at `b`, acks=all and
    idempotent (values padded with `pad` dots); all must be acknowledged."""
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    errors = []
    for i in range(n):
        kw = {} if partition is None else {"partition": partition}
        value = f"{key_prefix}-{i}".encode() + b"." * pad
        p.produce(topic, key=f"{key_prefix}{i}".encode(), value=value,
                  on_delivery=lambda e, m: e and errors.append(e), **kw)
        p.poll(0)
    assert p.flush(30) == 0 and not errors, errors[:3]


def consume(b, topic, partitions, expect):
    """Every record of `partitions`, read from the start through a client
    bootstrapped at `b` (assigned, no group): {partition: [values]}."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "unused", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    got: dict[int, list[bytes]] = {p: [] for p in partitions}
    try:
        def done():
            for m in c.consume(500, 1.0):
                if m.error() is None:
                    got[m.partition()].append(m.value())
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(m.error())
            return sum(len(v) for v in got.values()) >= expect
        wait_until(done, 30, f"{expect} records")
    finally:
        c.close()
    return got


def produce_v12_hints(b, topic, partition):
    """Produce v12 of one record to a partition -> (error, current leader
    hint (id, epoch) or None, {node: port} of the response's endpoints)."""
    batch = w.record_batch([(b"k", b"v")])
    parts = w.uvarint(2) + w.i32(partition) + w.uvarint(len(batch) + 1) + batch + w.EMPTY_TAGS
    topics = w.uvarint(2) + w.compact_string(topic) + parts + w.EMPTY_TAGS
    body = w.compact_string(None) + w.i16(-1) + w.i32(5000) + topics + w.EMPTY_TAGS
    with w.Conn(b.bootstrap) as c:
        c.send(w.frame(w.header_v2(w.PRODUCE, 12, 7) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    assert r.uvarint() == 2
    r.take(r.uvarint() - 1)  # topic name
    assert r.uvarint() == 2
    r.i32()
    error = r.i16()
    r.i64(), r.i64(), r.i64()  # base offset, log append time, log start offset
    for _ in range(r.uvarint() - 1):  # record errors
        r.i32()
        r.compact_string()
        r.skip_tags()
    r.compact_string()  # error message
    hint = None
    for _ in range(r.uvarint()):
        tag, size = r.uvarint(), r.uvarint()
        if tag == 0:
            hint = (r.i32(), r.i32())
            r.skip_tags()
        else:
            r.take(size)
    r.skip_tags()  # the topic's
    r.i32()  # throttle
    nodes = {}
    for _ in range(r.uvarint()):
        tag, size = r.uvarint(), r.uvarint()
        if tag != 0:
            r.take(size)
            continue
        for _ in range(r.uvarint() - 1):
            node, _host, port = r.i32(), r.compact_string(), r.i32()
            r.compact_string()  # rack
            r.skip_tags()
            nodes[node] = port
    return error, hint, nodes


def test_a_topic_made_at_one_broker_is_every_brokers_and_each_partition_has_one_leader(etcd, tmp_path):
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3])
    create(brokers[1], "orders", num_partitions=6)
    # Every broker names the same leaders, two partitions each.
    wait_until(lambda: all(leaders(b, "orders") is not None for b in brokers.values()),
               TIMEOUT_S, "every broker to list the topic")
    seen = [leaders(b, "orders") for b in brokers.values()]
    assert seen[0] == seen[1] == seen[2], seen
    assert sorted(seen[0].values()) == [1, 1, 2, 2, 3, 3], seen[0]
    for b in brokers.values():
        assert leadership(b, "orders") == {p: (n, 0) for p, n in seen[0].items()}

    # A client that knows one broker writes to and reads from every leader.
    produce(brokers[2], "orders", 600)
    got = consume(brokers[3], "orders", range(6), 600)
    assert sum(len(v) for v in got.values()) == 600
    for values in got.values():  # each partition in the order produced
        assert values == sorted(values, key=lambda v: int(v.split(b"-")[1]))
    # Only the leader serves a partition: the others answer
    # NOT_LEADER_OR_FOLLOWER.
    led_by_1 = next(p for p, n in seen[0].items() if n == 1)
    batch = w.record_batch([(b"k", b"v")])
    with w.Conn(brokers[2].bootstrap) as c:
        c.send(w.produce_request(7, 1, "orders", led_by_1, batch))
        _, body = c.recv_response()
    assert w.parse_produce(body, 7)[0][2] == NOT_LEADER_OR_FOLLOWER
    with w.Conn(brokers[1].bootstrap) as c:
        c.send(w.produce_request(7, 2, "orders", led_by_1, batch))
        _, body = c.recv_response()
    assert w.parse_produce(body, 7)[0][2] == 0
    # Produce v10+ tells the client who leads and where it is (KIP-951).
    assert produce_v12_hints(brokers[3], "orders", led_by_1) == (
        NOT_LEADER_OR_FOLLOWER, (1, 0), {1: brokers[1].port})
    assert produce_v12_hints(brokers[1], "orders", led_by_1) == (0, None, {})

    # Apache Kafka's tool, asked at broker 3, shows each leader.
    done = kafka_tools.run("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                           brokers[3].bootstrap, "--describe", "--topic", "orders")
    assert done.returncode == 0, done.stderr[-3000:]
    for p, n in seen[0].items():
        assert f"Partition: {p}\tLeader: {n}\t" in done.stdout, done.stdout

    # Configs altered at one broker are every broker's.
    a2 = AdminClient({"bootstrap.servers": brokers[2].bootstrap})
    res = ConfigResource("topic", "orders", incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    a2.incremental_alter_configs([res])[res].result(15)

    def retention(b):
        a = AdminClient({"bootstrap.servers": b.bootstrap})
        r = ConfigResource("topic", "orders")
        return a.describe_configs([r])[r].result(10)["retention.ms"].value
    wait_until(lambda: all(retention(b) == "3600000" for b in brokers.values()), TIMEOUT_S,
               "every broker to take the altered config")

    # Partitions added at broker 3 are every broker's, placed evenly.
    a3 = AdminClient({"bootstrap.servers": brokers[3].bootstrap})
    a3.create_partitions([NewPartitions("orders", 9)])["orders"].result(15)
    wait_until(lambda: all(len(leaders(b, "orders") or {}) == 9 for b in brokers.values()),
               TIMEOUT_S, "every broker to list nine partitions")
    assert sorted(leaders(brokers[1], "orders").values()) == [1, 1, 1, 2, 2, 2, 3, 3, 3]

    # Deleted at broker 2: gone from every broker, and from its disk.
    a2.delete_topics(["orders"], operation_timeout=10)["orders"].result(15)
    wait_until(lambda: all(leaders(b, "orders") is None for b in brokers.values()),
               TIMEOUT_S, "every broker to drop the topic")
    wait_until(lambda: not any(d.name.startswith("orders-")
                               for b in brokers.values() for d in b.data_dir.iterdir()),
               TIMEOUT_S, "the partition directories to go")


def test_a_dead_leaders_partitions_move_to_live_brokers_with_every_record(etcd, tmp_path):
    """A leader killed (kill -9) loses its partitions one session timeout
    later: the controller gives each to the live broker leading the
    fewest, in a new leader epoch, and that broker rebuilds the log from
    the object store (the sealed segments the dead leader copied there and
    recorded in etcd, then the WAL objects past them; the controller has
    deleted the WAL objects the segments cover, and once idle segments
    roll, all of them). Every acknowledged
    record is read back in order, writes go on at once, and the dead
    broker, back, leads nothing."""
    from test_cluster_durability import PREFIX, etcd_range, metric
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3], extra={"keel.cluster.wal.gc.interval.ms": "300",
                                                               "keel.cluster.wal.segment.roll.ms": "3000"})
    # Placed where the request says: partition 0 on broker 2, 1 on 3.
    create(brokers[1], "placed", num_partitions=2, replica_assignment=[[2], [3]],
           config={"segment.bytes": "20000"})
    wait_until(lambda: leaders(brokers[1], "placed") == {0: 2, 1: 3}, TIMEOUT_S, "the placement")
    for r in range(5):  # one batch of 20 KB each: segments of 20 KB roll
        produce(brokers[1], "placed", 20, partition=0, key_prefix=f"k{r}", pad=1000)
    # Broker 2 copies the sealed segments and records them in etcd.
    wait_until(lambda: len(etcd_range(etcd, f"{PREFIX}.segments/")) >= 3, TIMEOUT_S,
               "sealed segments recorded in etcd")
    # Each beside its producer-state snapshot, for the next leader.
    assert list((tmp_path / "objects").rglob("*.snapshot")), "no producer snapshot in the object store"
    # The WAL objects the segments cover go, with their index keys.
    wal_objects = lambda: list((tmp_path / "objects").rglob("*.wal"))
    wait_until(lambda: len(wal_objects()) <= 2, TIMEOUT_S, "covered WAL objects deleted")
    # Each object goes first, then its index keys.
    wait_until(lambda: len(etcd_range(etcd, f"{PREFIX}.wal/")) == len(wal_objects()), TIMEOUT_S,
               "the collected objects' index keys deleted")
    assert sum(metric(b, "keel_cluster_wal_collected_objects_total") for b in brokers.values()) >= 3

    # DeleteRecords inside a batch: its log start is recorded in etcd
    # before the answer, so the new leader starts the log there too.
    a = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    [deleted] = a.delete_records([TopicPartition("placed", 0, 45)]).values()
    assert deleted.result(15).low_watermark == 45

    brokers[2].kill9()
    # Broker 1 leads nothing, broker 3 one partition: broker 1 takes it.
    wait_until(lambda: leadership(brokers[3], "placed") == {0: (1, 1), 1: (3, 0)}, TIMEOUT_S,
               "broker 1 to lead partition 0 in epoch 1")
    produce(brokers[3], "placed", 50, partition=0, key_prefix="after")
    got = consume(brokers[3], "placed", [0], 105)[0]
    expected = [f"k{r}-{i}".encode() for r in range(5) for i in range(20)][45:]
    assert [v.rstrip(b".") for v in got[:55]] == expected
    assert got[55:] == [f"after-{i}".encode() for i in range(50)]
    c = Consumer({"bootstrap.servers": brokers[3].bootstrap, "group.id": "marks"})
    assert c.get_watermark_offsets(TopicPartition("placed", 0), timeout=10) == (45, 150)
    c.close()
    log = brokers[1].log_tail()
    assert "rebuilt the partition's log from the object store" in log, log
    assert re.search(r"segments=[1-9]", log), log

    # Operators see it: `keel stats` names the leaders, /metrics counts the change.
    shown = subprocess.run([str(brokers[3].bin), "stats", "--admin", brokers[3].admin],
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert "1 (1)" in shown.stdout and "3 (0)" in shown.stdout, shown.stdout
    changes = 0
    for b in (brokers[1], brokers[3]):
        text = urllib.request.urlopen(f"http://{b.admin}/metrics", timeout=5).read().decode()
        assert re.search(r"^keel_cluster_partitions_leaderless 0$", text, re.M), text
        changes += sum(float(l.split()[-1]) for l in text.splitlines()
                       if l.startswith("keel_cluster_leader_changes_total"))
    assert changes == 1, changes

    # Idle, the active segments roll (keel.cluster.wal.segment.roll.ms)
    # and reach the object store: no WAL object is needed any more.
    # (The collector deletes an object, then its index key.)
    wait_until(lambda: not wal_objects() and not etcd_range(etcd, f"{PREFIX}.wal/"), TIMEOUT_S,
               "every WAL object and its index collected")

    brokers[2].start()
    wait_until(lambda: not stats(brokers[2])["fenced"], TIMEOUT_S, "broker 2 to register")
    wait_until(lambda: leadership(brokers[2], "placed") == {0: (1, 1), 1: (3, 0)}, TIMEOUT_S,
               "broker 2 to see the leaders as they are")


def test_a_directory_brings_its_topics_into_a_cluster_and_sets_aside_ones_deleted_while_away(etcd, tmp_path):
    # A broker that ran alone...
    alone = Broker(tmp_path / "b1" / "data", tmp_path / "alone.log", sets={"node.id": "1"})
    alone.start()
    create(alone, "legacy", num_partitions=1)
    produce(alone, "legacy", 20, partition=0)
    alone.stop()
    # ...joins a cluster on its directory: its topics become the cluster's.
    brokers = start_cluster(etcd, tmp_path, [1, 2])
    wait_until(lambda: leaders(brokers[2], "legacy") == {0: 1}, TIMEOUT_S,
               "broker 2 to list broker 1's topic")
    assert len(consume(brokers[2], "legacy", [0], 20)[0]) == 20

    # Deleted while broker 1 is away: when it comes back, its copy is
    # renamed aside, not deleted and not brought back.
    brokers[1].stop()
    a2 = AdminClient({"bootstrap.servers": brokers[2].bootstrap})
    a2.delete_topics(["legacy"], operation_timeout=10)["legacy"].result(15)
    brokers[1].start()
    wait_until(lambda: any(d.name.startswith("legacy-0.") and d.name.endswith("-stray")
                           for d in brokers[1].data_dir.iterdir()),
               TIMEOUT_S, "the deleted topic's directory to be set aside")
    assert leaders(brokers[1], "legacy") is None and leaders(brokers[2], "legacy") is None
    assert "not the cluster's" in brokers[1].log_tail()


def test_a_group_has_one_coordinator_whichever_broker_its_members_ask(etcd, tmp_path):
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3])
    create(brokers[1], "shared", num_partitions=6)
    produce(brokers[2], "shared", 300)
    # Two members of one group, each knowing a different broker: one
    # group (they split the partitions), not two (each reading all).
    members = [Consumer({"bootstrap.servers": brokers[n].bootstrap, "group.id": "one-group",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
               for n in (1, 3)]
    got: list[list[bytes]] = [[], []]
    try:
        for c in members:
            c.subscribe(["shared"])

        def settled():
            for i, c in enumerate(members):
                for m in c.consume(100, 0.5):
                    if m.error() is None:
                        got[i].append(m.value())
            return (sum(map(len, got)) >= 300 and all(c.assignment() for c in members)
                    and sum(len(c.assignment()) for c in members) == 6)
        wait_until(settled, 60, "both members to share the partitions and read every record")
        for i, c in enumerate(members):
            c.commit(asynchronous=False)
    finally:
        for c in members:
            c.close()
    assert sorted(got[0] + got[1]) == sorted(f"k-{i}".encode() for i in range(300))

    # Asked at any broker, Apache Kafka's tool finds the same coordinator,
    # and it holds the offsets both members committed.
    coordinators = set()
    for b in brokers.values():
        done = kafka_tools.run("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                               "--bootstrap-server", b.bootstrap, "--describe",
                               "--group", "one-group", "--state")
        assert done.returncode == 0, done.stderr[-3000:]
        line = next(l for l in done.stdout.splitlines() if l.startswith("one-group"))
        coordinators.add(line.split("(")[1].split(")")[0])
        offsets = kafka_tools.run("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                                  "--bootstrap-server", b.bootstrap, "--describe",
                                  "--group", "one-group", "--offsets")
        assert offsets.returncode == 0, offsets.stderr[-3000:]
        committed = [l.split() for l in offsets.stdout.splitlines() if l.startswith("one-group")]
        assert sum(int(cols[3]) for cols in committed) == 300, offsets.stdout
    assert len(coordinators) == 1, coordinators
    # Only the coordinator serves the group; the others send the client
    # back to FindCoordinator.
    coordinator = int(coordinators.pop())
    for node, b in brokers.items():
        with gw.GroupConn(b.bootstrap) as c:
            error = c.heartbeat("one-group", 1, "nobody")
        assert (error == NOT_COORDINATOR) == (node != coordinator), (node, coordinator, error)
        # OffsetFetch v9 names the group: the others refuse it too,
        # rather than answer that it has no offsets.
        error, offsets = cg._offset_fetch(b.bootstrap, "one-group", None, -1)
        if node == coordinator:
            assert error == 0 and sum(offsets.values()) == 300, (error, offsets)
        else:
            assert (error, offsets) == (NOT_COORDINATOR, {}), (node, error, offsets)


def test_the_java_consumer_reads_on_across_its_leaders_new_epochs(etcd, tmp_path):
    """Apache Kafka's Java consumer checks its position against the
    leader's epochs (OffsetForLeaderEpoch) whenever the epoch rises: a
    partition whose leader died and whose log another broker rebuilt from
    the object store must not look like a truncated log."""
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3])
    consumer = None
    try:
        create(brokers[1], "bounce", num_partitions=1, replica_assignment=[[2]])
        produce(brokers[1], "bounce", 50, partition=0, key_prefix="before")
        cmd = ["java", "-Xmx256m", "-cp", kafka_tools.classpath(),
               f"-Dlog4j2.configurationFile={kafka_tools.LOG4J}",
               "org.apache.kafka.tools.consumer.ConsoleConsumer",
               "--bootstrap-server", brokers[1].bootstrap, "--topic", "bounce",
               "--partition", "0", "--offset", "earliest", "--max-messages", "100",
               "--timeout-ms", "60000"]
        errors = tmp_path / "consumer.err"
        consumer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(errors, "w"), text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(consumer.stdout), daemon=True)
        reader.start()
        wait_until(lambda: len(lines) >= 50, 60, "the consumer to read the first 50")

        brokers[2].kill9()
        wait_until(lambda: leadership(brokers[3], "bounce") == {0: (1, 1)}, TIMEOUT_S,
                   "broker 1 to lead, in epoch 1")
        produce(brokers[3], "bounce", 50, partition=0, key_prefix="after")

        consumer.wait(timeout=90)
        reader.join(10)
        err = errors.read_text()
        assert consumer.returncode == 0, err[-3000:]
        assert [l.strip() for l in lines] == (
            [f"before-{i}" for i in range(50)] + [f"after-{i}" for i in range(50)]), lines
        assert "Truncation" not in err and "OutOfRange" not in err, err[-3000:]
    finally:
        if consumer and consumer.poll() is None:
            consumer.kill()
        for b in brokers.values():
            b.close()


def test_group_configs_are_the_clusters(etcd, tmp_path):
    """A group's configs altered at one broker are the cluster's: every
    broker (the group's coordinator among them) describes them."""
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3])
    done = kafka_tools.run("kafka.admin.ConfigCommand", "--bootstrap-server",
                           brokers[1].bootstrap, "--alter", "--entity-type", "groups",
                           "--entity-name", "slow-group", "--add-config",
                           "consumer.session.timeout.ms=50000")
    assert done.returncode == 0, done.stderr[-3000:]
    for b in brokers.values():
        shown = kafka_tools.run("kafka.admin.ConfigCommand", "--bootstrap-server",
                                b.bootstrap, "--describe", "--entity-type", "groups",
                                "--entity-name", "slow-group")
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert "consumer.session.timeout.ms=50000" in shown.stdout, shown.stdout
    # Removed at another broker: gone everywhere.
    done = kafka_tools.run("kafka.admin.ConfigCommand", "--bootstrap-server",
                           brokers[3].bootstrap, "--alter", "--entity-type", "groups",
                           "--entity-name", "slow-group", "--delete-config",
                           "consumer.session.timeout.ms")
    assert done.returncode == 0, done.stderr[-3000:]
    shown = kafka_tools.run("kafka.admin.ConfigCommand", "--bootstrap-server",
                            brokers[2].bootstrap, "--describe", "--entity-type", "groups",
                            "--entity-name", "slow-group")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "consumer.session.timeout.ms=50000" not in shown.stdout, shown.stdout


def test_the_default_broker_configs_are_the_clusters(etcd, tmp_path):
    """`kafka-configs --entity-type brokers --entity-default` at one broker
    is in force at every broker, and at one that starts later."""
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3])

    def effective(b, node):
        shown = kafka_tools.run("kafka.admin.ConfigCommand", "--bootstrap-server", b.bootstrap,
                                "--describe", "--entity-type", "brokers", "--entity-name",
                                str(node), "--all")
        assert shown.returncode == 0, shown.stderr[-3000:]
        return shown.stdout

    done = kafka_tools.run("kafka.admin.ConfigCommand", "--bootstrap-server",
                           brokers[1].bootstrap, "--alter", "--entity-type", "brokers",
                           "--entity-default", "--add-config", "log.retention.ms=7200000")
    assert done.returncode == 0, done.stderr[-3000:]
    for node, b in brokers.items():
        wait_until(lambda: "log.retention.ms=7200000" in effective(b, node), TIMEOUT_S,
                   f"broker {node} to take the cluster default")
    brokers[3].stop()
    brokers[3].start()
    wait_until(lambda: "log.retention.ms=7200000" in effective(brokers[3], 3), TIMEOUT_S,
               "a restarted broker to take it")
    assert "altered dynamic broker configs" in brokers[2].log_tail()


def read_to_end(b, topic, partition=0):
    """Every record of the partition from its start to its end, through a
    client bootstrapped at `b`: [(key, value)] (values without padding;
    None for a tombstone). A client's transient errors are retried."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "unused", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    got = []
    try:
        while True:
            m = c.poll(10)
            assert m is not None, f"no end of {topic}-{partition} in 10 s"
            if m.error() is None:
                got.append((m.key().decode(), m.value() and m.value().rstrip(b".").decode()))
            elif m.error().code() == KafkaError._PARTITION_EOF:
                return got
            elif not (m.error().retriable() or m.error().code() == KafkaError._TRANSPORT):
                raise AssertionError(m.error())
    finally:
        c.close()


def test_a_compacted_topic_is_cleaned_in_the_object_store_and_needs_no_wal(etcd, tmp_path):
    """In a cluster a compacted topic's sealed segments go to the object
    store like any other's, so its WAL objects go once segments cover
    them, and a new leader rebuilds its log from the segments alone. The
    leader's cleaner cleans the copies there (their only copies, once the
    fast tier has released them): each cleaned group of copies is one new
    copy, recorded in etcd in place of the copies it replaces, beside the
    producer snapshot at its end; the replaced copies are then deleted.
    A broker leading the partition next cleans on from what it rebuilt."""
    from test_cluster_durability import PREFIX, etcd_range
    brokers = start_cluster(etcd, tmp_path, [1, 2], extra={
        "keel.cluster.wal.gc.interval.ms": "300", "keel.cluster.wal.segment.roll.ms": "2000",
        "keel.tier.check.interval.ms": "200", "log.cleaner.backoff.ms": "200"})
    # Small segments, released from the fast tier once copied; nothing
    # cleanable until they all are.
    create(brokers[1], "profiles", num_partitions=1, replica_assignment=[[2]], config={
        "cleanup.policy": "compact", "segment.bytes": "5000", "local.retention.bytes": "0",
        "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "3600000",
        "file.delete.delay.ms": "1000"})
    wait_until(lambda: leaders(brokers[1], "profiles") == {0: 2}, TIMEOUT_S, "the placement")
    errors = []
    # Batches of two or three records, so a round fills several segments.
    p = Producer({"bootstrap.servers": brokers[1].bootstrap, "enable.idempotence": True,
                  "batch.size": 3000, "linger.ms": 5})

    def send(key, value):
        p.produce("profiles", key=key, value=value, partition=0, on_delivery=lambda e, m: e and errors.append(e))

    # Each round writes keys k0..k19 ("v<round>-<i>" values); k0's last is a tombstone.
    for r in range(5):
        for i in range(20):
            last = r == 4 and i == 0
            send(f"k{i}", None if last else f"v{r}-{i}".encode() + b"." * 1000)
        assert p.flush(30) == 0 and not errors, errors
    written = read_to_end(brokers[1], "profiles")
    assert len(written) == 100, len(written)

    topic_dir = lambda: next((tmp_path / "objects").rglob("profiles-*/0"))
    copies = lambda: sorted(f.name for f in topic_dir().glob("*.log"))
    topic_id = lambda: topic_dir().parent.name.rsplit("-", 1)[1]
    recorded = lambda: etcd_range(etcd, f"{PREFIX}.segments/{topic_id()}/0/")
    local_logs = lambda: list((tmp_path / "b2" / "data").glob("profiles-0/*.log"))
    # Every sealed segment copied, recorded and released: only the active one is local.
    wait_until(lambda: (tmp_path / "objects").exists() and any((tmp_path / "objects").rglob("profiles-*/0"))
               and len(recorded()) >= 20 and len(local_logs()) == 1, TIMEOUT_S,
               "the segments copied to the object store and released")
    before = copies()
    stored = lambda: sum(f.stat().st_size for f in topic_dir().glob("*.log"))
    stored_before = stored()

    # Cleanable now, in groups of many copies (segment.bytes is the group's bound).
    a = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    resource = ConfigResource("topic", "profiles", incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("segment.bytes", str(1 << 20), incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([resource])[resource].result(15)
    latest = {f"k{i}": f"v4-{i}" for i in range(1, 20)}
    latest["k0"] = None
    compacted = lambda b: sorted(read_to_end(b, "profiles")) == sorted(latest.items())
    wait_until(lambda: compacted(brokers[1]), 30, "the partition cleaned in the object store")
    # The replaced copies are deleted, and etcd records the cleaned ones.
    wait_until(lambda: len(copies()) == len(recorded()), TIMEOUT_S, "the replaced copies deleted")
    assert len(copies()) < len(before) / 4, (copies(), before)
    assert set(copies()) != set(before) and stored() < stored_before / 2, (copies(), before, stored())
    objects = sorted(v["object"].rsplit("/", 1)[1] + ".log" for v in recorded().values())
    assert objects == copies()
    last = max(recorded().values(), key=lambda v: v["base_offset"])
    snapshot = tmp_path / "objects" / (last["object"] + ".snapshot")
    assert snapshot.exists(), f"no producer snapshot beside the last copy {last}"
    # No WAL object is needed any more, the compacted topic's included.
    wal_objects = lambda: list((tmp_path / "objects").rglob("*.wal"))
    wait_until(lambda: not wal_objects() and not etcd_range(etcd, f"{PREFIX}.wal/"), TIMEOUT_S,
               "every WAL object and its index collected")

    brokers[2].kill9()
    wait_until(lambda: leadership(brokers[1], "profiles") == {0: (1, 1)}, TIMEOUT_S,
               "broker 1 to lead the partition in epoch 1")
    assert compacted(brokers[1])
    rebuilt = [l for l in brokers[1].log_tail().splitlines()
               if "rebuilt the partition's log" in l and "topic=profiles" in l]
    assert rebuilt and "wal_ranges=0" in rebuilt[-1], rebuilt
    # Broker 1 cleans on: a new round replaces every value, the tombstone's
    # too (the idempotent producer goes on where it was: its state came
    # with the snapshot).
    for i in range(20):
        send(f"k{i}", f"v5-{i}".encode())
    assert p.flush(30) == 0 and not errors, errors
    latest = {f"k{i}": f"v5-{i}" for i in range(20)}
    wait_until(lambda: compacted(brokers[1]), 30, "broker 1 to clean the new round in")
    wait_until(lambda: len(copies()) == len(recorded()), TIMEOUT_S, "the copies broker 1 replaced deleted")
