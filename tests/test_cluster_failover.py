"""The kill -9 loop: while an idempotent acks=all producer (librdkafka),
Apache Kafka's Java console producer and a consumer group run, the
leader of their partition is killed (SIGKILL) and restarted again and
again. Each time another broker takes the partition over, rebuilding its
log from the object store, and the clients go on. At the end every
acknowledged record is in the log exactly once, in the order it was
produced, and the group has read them all. Prints the failover time of
every kill. Keel's own, so skipped under KEEL_TEST_IMPL=kafka."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import consumer_group_wire as cg
import kafka_tools
import kafka_wire as w
from conftest import IMPL, wait_until
from test_cluster import TIMEOUT_S, start_cluster, stats
from test_cluster_topics import create, leadership, produce

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="cluster mode over etcd is Keel's")

KILLS = 4


class Writer(threading.Thread):
    """librdkafka, idempotent, acks=all: `r-<n>` to partition 0, in order."""

    def __init__(self, bootstrap):
        super().__init__(daemon=True)
        self.p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2,
                           "message.timeout.ms": 120000, "request.timeout.ms": 5000, "log_level": 0})
        self.sent = 0
        self.acked: list[bytes] = []
        self.errors: list = []
        self.running = True

    def run(self):
        while self.running:
            self.p.produce("loop", value=f"r-{self.sent}".encode() + b"." * 200, partition=0,
                           on_delivery=self._delivered)
            self.sent += 1
            self.p.poll(0.003)

    def _delivered(self, e, m):
        if e:
            self.errors.append(e)
        else:
            self.acked.append(m.value().rstrip(b"."))


class Reader(threading.Thread):
    """A consumer group member reading everything it is assigned."""

    def __init__(self, bootstrap):
        super().__init__(daemon=True)
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": "loop-readers",
                           "auto.offset.reset": "earliest", "log_level": 0})
        self.seen: set[bytes] = set()
        self.running = True

    def run(self):
        self.c.subscribe(["loop"])
        while self.running:
            for m in self.c.consume(500, 0.2):
                if m.error() is None:
                    self.seen.add(m.value().rstrip(b"."))
        self.c.close()


def read_all(bootstrap, expect, topic="loop", partitions=(0, 1)) -> dict[int, list[bytes]]:
    """Every record of `partitions` (values without their padding), once
    `expect` are in and a second has brought nothing more."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in partitions])
    got: dict[int, list[bytes]] = {p: [] for p in partitions}
    try:
        def done():
            for m in c.consume(1000, 1.0):
                if m.error() is None:
                    got[m.partition()].append(m.value().rstrip(b"."))
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(m.error())
            return sum(len(v) for v in got.values()) >= expect
        wait_until(done, 60, f"{expect} records")
        time.sleep(1)  # nothing more than acknowledged, no duplicate after them
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                got[m.partition()].append(m.value().rstrip(b"."))
    finally:
        c.close()
    return got


def test_kill9_loop_loses_and_duplicates_no_acknowledged_record(etcd, tmp_path):
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3], extra={"keel.cluster.wal.gc.interval.ms": "500"})
    java = None
    try:
        create(brokers[1], "loop", num_partitions=2, config={"segment.bytes": "100000"})
        bootstrap = ",".join(b.bootstrap for b in brokers.values())
        writer, reader = Writer(bootstrap), Reader(bootstrap)
        writer.start()
        reader.start()
        java = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", kafka_tools.classpath(),
             f"-Dlog4j2.configurationFile={kafka_tools.LOG4J}",
             "org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", bootstrap, "--topic", "loop",
             "--producer-property", "acks=all", "--producer-property", "enable.idempotence=true",
             "--producer-property", "linger.ms=5", "--producer-property", "retries=2147483647"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "java.err", "w"), text=True)
        java_lines = []

        def feed():
            n = 0
            while java.poll() is None and not getattr(feed, "stop", False):
                line = f"j-{n}"
                java.stdin.write(line + "\n")
                java.stdin.flush()
                java_lines.append(line.encode())
                n += 1
                time.sleep(0.01)
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        wait_until(lambda: len(writer.acked) > 200, TIMEOUT_S, "the first acknowledged records")

        for kill in range(1, KILLS + 1):
            live = next(iter(brokers.values()))
            victim_id, epoch = leadership(live, "loop")[0]
            victim = brokers[victim_id]
            survivor = next(b for n, b in brokers.items() if n != victim_id)
            time.sleep(1.5)
            acked_before = len(writer.acked)
            t0 = time.monotonic()
            victim.kill9()
            wait_until(lambda: leadership(survivor, "loop")[0][0] not in (-1, victim_id), TIMEOUT_S,
                       f"partition 0 led again after kill {kill}")
            led = time.monotonic() - t0
            wait_until(lambda: len(writer.acked) > acked_before + 50, TIMEOUT_S,
                       f"writes acknowledged after kill {kill}")
            acked = time.monotonic() - t0
            new_leader, new_epoch = leadership(survivor, "loop")[0]
            print(f"kill {kill}: broker {victim_id} (epoch {epoch}) killed; broker {new_leader} leads "
                  f"in epoch {new_epoch} after {led:.2f}s, writes acknowledged again after {acked:.2f}s",
                  flush=True)
            assert new_epoch > epoch
            victim.start()
            wait_until(lambda: not stats(victim)["fenced"], TIMEOUT_S, f"broker {victim_id} to register")

        time.sleep(1)
        writer.running = False
        writer.join(10)
        assert writer.p.flush(60) == 0, "records still unacknowledged"
        feed.stop = True
        feeder.join(10)
        java.stdin.close()
        assert java.wait(timeout=120) == 0, (tmp_path / "java.err").read_text()[-3000:]
        java_err = (tmp_path / "java.err").read_text()
        assert "Error when sending" not in java_err, java_err[-3000:]
        assert not writer.errors, writer.errors[:3]

        expect = len(writer.acked) + len(java_lines)
        got = read_all(bootstrap, expect)
        mine = [v for v in got[0] if v.startswith(b"r-")]
        # Every acknowledged record once, in the order produced (none lost,
        # none written twice).
        assert mine == writer.acked, (len(mine), len(writer.acked))
        assert mine == [f"r-{i}".encode() for i in range(len(mine))]
        theirs = sorted(v for p in got.values() for v in p if v.startswith(b"j-"))
        assert theirs == sorted(java_lines), (len(theirs), len(java_lines))
        # The group went on through the kills and read everything.
        wait_until(lambda: reader.seen >= set(writer.acked) | set(java_lines), 60,
                   "the group to read every record")
        reader.running = False
        reader.join(10)
    finally:
        if java and java.poll() is None:
            java.kill()
        for b in brokers.values():
            b.close()


def offsets_partition(group: str, partitions: int = 50) -> int:
    """The partition of __consumer_offsets a group falls in: Kafka's
    abs(group.hashCode()) % partitions."""
    h = 0
    for unit in (group.encode("utf-16-be")[i:i + 2] for i in range(0, len(group.encode("utf-16-be")), 2)):
        h = (31 * h + int.from_bytes(unit, "big")) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if h == -(1 << 31) else abs(h) % partitions


ADMINS: dict[str, AdminClient] = {}


def coordinator_of(b, key, key_type=0) -> int | None:
    """The group's (key type 1: transactional id's) coordinator as
    FindCoordinator v1 at `b` answers it (None while there is none), on the
    wire: librdkafka's admin client polled while a coordinator dies can
    abort the process."""
    try:
        with w.Conn(b.bootstrap) as c:
            c.send(w.frame(w.header_v1(10, 1, 4) + w.string(key) + w.i8(key_type)))
            _cid, resp = c.recv_response()
    except OSError:
        return None
    r = w.Reader(resp)
    r.i32()
    error = r.i16()
    r.string()
    node = r.i32()
    return node if error == 0 else None


def group_state(b, group):
    """(coordinator node id, {(topic, partition): committed offset}, group
    type, members) as an admin client bootstrapped at `b` finds them; None
    while the group's coordinator is away or loading."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    # One client per broker for the whole test: a client made for each
    # poll and dropped with requests in flight can abort librdkafka.
    a = ADMINS.setdefault(b.bootstrap, AdminClient({"bootstrap.servers": b.bootstrap}))
    try:
        described = a.describe_consumer_groups([group], request_timeout=5)[group].result(10)
        listed = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                               request_timeout=5)[group].result(10)
    except Exception:  # noqa: BLE001 (a coordinator moving: asked again)
        return None
    offsets = {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions}
    return described.coordinator.id, offsets, described.type, len(described.members)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_groups_coordinator_fails_over_with_its_offsets(etcd, tmp_path, protocol):
    """A group's records are in its partition of __consumer_offsets: when
    the coordinator's broker is killed, another leads the partition (its
    log rebuilt from the object store, bounded by snapshots) and the group
    is there with every offset it committed. Its member goes on across the
    kill, and the next member starts from its last commit. Both group
    protocols (classic, and KIP-848's consumer groups)."""
    # Tiny snapshots: the group's partition is snapshotted and its log
    # start moved many times before the kill.
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3], extra={"offsets.topic.segment.bytes": "1024"})
    create(brokers[1], "orders", num_partitions=3)
    produce(brokers[2], "orders", 300)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    group = f"failing-over-{protocol}"
    config = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
              "enable.auto.commit": False, "group.protocol": protocol}
    c = Consumer(config)
    got = []

    def read(n, commit):
        def done():
            for m in c.consume(10, 0.5):
                if m.error() is None:
                    got.append(m.value())
                    if commit:
                        c.commit(message=m, asynchronous=False)
            return len(got) >= n
        return done
    try:
        c.subscribe(["orders"])
        wait_until(read(300, True), 90, "the group to read and commit every record")
        assert sorted(got) == sorted(f"k-{i}".encode() for i in range(300))
        before = group_state(brokers[1], group)
        assert before is not None
        coordinator, committed, kind, members = before
        assert sum(committed.values()) == 300, committed
        assert (kind.name.lower(), members) == (protocol, 1)
        # The group's partition was snapshotted: its log starts past 0.
        index = offsets_partition(group)
        probe = Consumer({"bootstrap.servers": brokers[coordinator].bootstrap, "group.id": "probe"})
        low, high = probe.get_watermark_offsets(TopicPartition("__consumer_offsets", index), timeout=10)
        probe.close()
        assert 0 < low < high, (low, high)

        brokers[coordinator].kill9()
        survivor = next(b for n, b in brokers.items() if n != coordinator)
        t0 = time.monotonic()
        # Polled on the wire; the admin client asks once it has moved
        # and its partition is loaded.
        wait_until(lambda: (n := coordinator_of(survivor, group)) not in (None, coordinator)
                   and cg._offset_fetch(brokers[n].bootstrap, group, None, -1)[0] == 0,
                   TIMEOUT_S * 2, "another broker to coordinate the group")
        state = wait_until(lambda: group_state(survivor, group), TIMEOUT_S, "the group described")
        moved, offsets, kind, members = state
        print(f"{protocol} group's coordinator {coordinator} killed: broker {moved} coordinates it "
              f"after {time.monotonic() - t0:.2f}s", flush=True)
        # Every offset, and the member, which goes on at its generation
        # or epoch.
        assert (offsets, kind.name.lower(), members) == (committed, protocol, 1)
        loaded = stats(brokers[moved])["group_log"]
        assert index in loaded["partitions"] and loaded["loads"] >= 1, loaded

        # The member goes on: it reads what is produced now, and commits.
        produce(survivor, "orders", 30, key_prefix="late")
        del got[:]
        wait_until(read(30, False), 60, "the member to read the new records")
        c.commit(asynchronous=False)
        time.sleep(1)
        got.extend(m.value() for m in c.consume(50, 1.0) if m.error() is None)
        assert sorted(got) == sorted(f"late-{i}".encode() for i in range(30))
    finally:
        c.close()
    # The group's next member starts where the last one committed.
    produce(survivor, "orders", 10, key_prefix="last")
    config["bootstrap.servers"] = ",".join(b.bootstrap for n, b in brokers.items() if n != coordinator)
    c = Consumer(config)
    del got[:]
    try:
        c.subscribe(["orders"])
        wait_until(read(10, False), 60, "the next member to read the last records")
        time.sleep(1)
        got.extend(m.value() for m in c.consume(50, 1.0) if m.error() is None)
    finally:
        c.close()
    assert sorted(got) == sorted(f"last-{i}".encode() for i in range(10))


def test_a_transactions_coordinator_fails_over_mid_transaction(etcd, tmp_path):
    """A transactional id's state is in its partition of
    __transaction_state: when the coordinator's broker is killed in the
    middle of a transaction, the broker taking the partition over (its log
    rebuilt from the object store, bounded by snapshots) has the open
    transaction, with its partitions, and the producer commits it there
    and goes on with the same producer id. A read_committed consumer sees
    every committed record once. The data partition is placed on the
    coordinator's broker, so both move to the one survivor."""
    brokers = start_cluster(etcd, tmp_path, [1, 2], extra={
        "transaction.state.log.replication.factor": "2",
        "offsets.topic.replication.factor": "2",
        # Tiny snapshots: the id's partition is snapshotted many times.
        "transaction.state.log.segment.bytes": "512",
    })
    tid = "ledger-writer"
    coordinator = wait_until(lambda: coordinator_of(brokers[1], tid, 1), TIMEOUT_S,
                             "the transactional id's coordinator")
    survivor = next(b for n, b in brokers.items() if n != coordinator)
    create(brokers[1], "ledger", num_partitions=1, replica_assignment=[[coordinator]])
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                  "transaction.timeout.ms": 120000, "linger.ms": 5})
    p.init_transactions(30)

    def transaction(prefix, n, commit=True):
        p.begin_transaction()
        for i in range(n):
            p.produce("ledger", key=f"{prefix}{i}".encode(), value=f"{prefix}-{i}".encode(), partition=0)
        assert p.flush(30) == 0
        if commit:
            p.commit_transaction(60)

    for t in range(5):
        transaction(f"t{t}", 20)
    transaction("open", 20, commit=False)
    # The id's partition was snapshotted: its log starts past 0.
    index = offsets_partition(tid)
    probe = Consumer({"bootstrap.servers": brokers[coordinator].bootstrap, "group.id": "probe"})
    low, high = probe.get_watermark_offsets(TopicPartition("__transaction_state", index), timeout=10)
    probe.close()
    assert 0 < low < high, (low, high)
    loads = stats(survivor)["txn_log"]["loads"]
    brokers[coordinator].kill9()
    t0 = time.monotonic()
    p.commit_transaction(90)
    print(f"transaction coordinator {coordinator} killed: the open transaction committed at its "
          f"successor after {time.monotonic() - t0:.2f}s", flush=True)
    assert coordinator_of(survivor, tid, 1) not in (None, coordinator)
    transaction("after", 20)
    p.begin_transaction()
    p.produce("ledger", value=b"aborted", partition=0)
    assert p.flush(30) == 0
    p.abort_transaction(30)
    transaction("last", 20)

    c = Consumer({"bootstrap.servers": survivor.bootstrap, "group.id": "unused",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.assign([TopicPartition("ledger", 0, 0)])
    got = []
    try:
        def done():
            got.extend(m.value() for m in c.consume(100, 0.5) if m.error() is None)
            return len(got) >= 160
        wait_until(done, 60, "the committed records")
        time.sleep(1)
        got.extend(m.value() for m in c.consume(100, 1.0) if m.error() is None)
    finally:
        c.close()
    expect = [f"{prefix}-{i}".encode() for prefix in [f"t{t}" for t in range(5)] + ["open", "after", "last"]
              for i in range(20)]
    assert got == expect
    loaded = stats(survivor)["txn_log"]
    assert index in loaded["partitions"] and loaded["loads"] > loads, loaded


def led_counts(b, topic) -> dict[int, int]:
    counts: dict[int, int] = {}
    for leader, _epoch in leadership(b, topic).values():
        counts[leader] = counts.get(leader, 0) + 1
    return counts


def test_a_broker_back_takes_its_share_of_leaders_and_no_record_is_lost(etcd, tmp_path):
    """With `leader.imbalance.check.interval.seconds=1`: broker 3, killed,
    loses its partitions to brokers 1 and 2; back, the controller moves
    leaders (the topic's, and the group log's) to it until no broker leads
    two more than another. The moved partitions' old leaders are alive:
    they hand over while an idempotent producer writes to every partition
    and a consumer group reads, and every acknowledged record is read back
    once, in order."""
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3], extra={"leader.imbalance.check.interval.seconds": "1"})
    create(brokers[1], "spread", num_partitions=6, replica_assignment=[[1], [2], [3], [1], [2], [3]])
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2,
                  "message.timeout.ms": 120000, "request.timeout.ms": 5000, "log_level": 0})
    acked: dict[int, list[bytes]] = {i: [] for i in range(6)}
    errors: list = []
    running = True

    def write():
        n = 0
        while running:
            p.produce("spread", value=b"s-%d" % n, partition=n % 6,
                      on_delivery=lambda e, m: errors.append(e) if e else acked[m.partition()].append(m.value()))
            n += 1
            p.poll(0.002)
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "spread-readers",
                       "auto.offset.reset": "earliest", "log_level": 0})
    reader.subscribe(["spread"])
    seen: set[bytes] = set()
    reading = [True]

    def read():
        while reading[0]:
            for m in reader.consume(500, 0.2):
                if m.error() is None:
                    seen.add(m.value())
        reader.close()
    reader_thread = threading.Thread(target=read, daemon=True)
    reader_thread.start()
    wait_until(lambda: sum(map(len, acked.values())) > 300, TIMEOUT_S, "the first acknowledged records")

    brokers[3].kill9()
    wait_until(lambda: set(led_counts(brokers[1], "spread")) == {1, 2}, TIMEOUT_S,
               "broker 3's partitions led by brokers 1 and 2")
    brokers[3].start()
    wait_until(lambda: not stats(brokers[3])["fenced"], TIMEOUT_S, "broker 3 to register")
    t0 = time.monotonic()
    wait_until(lambda: led_counts(brokers[1], "spread") == {1: 2, 2: 2, 3: 2}, TIMEOUT_S,
               "two of the topic's partitions led by each broker")
    groups = wait_until(lambda: (lambda c: c if 3 in c else None)(led_counts(brokers[3], "__consumer_offsets")),
                        TIMEOUT_S, "broker 3 to lead partitions of the group log")
    print(f"balanced {time.monotonic() - t0:.2f}s after broker 3 registered; group log {groups}", flush=True)
    assert max(groups.values()) - min(groups.values()) <= 1, groups
    # Writes and reads go on where the partitions moved.
    before = sum(map(len, acked.values()))
    wait_until(lambda: sum(map(len, acked.values())) > before + 300, TIMEOUT_S, "writes after the moves")

    running = False
    writer.join(10)
    assert p.flush(60) == 0 and not errors, errors[:3]
    got = read_all(bootstrap, sum(map(len, acked.values())), "spread", range(6))
    # Every acknowledged record once, in the order produced.
    assert got == acked, {i: (len(got[i]), len(acked[i])) for i in range(6)}
    wait_until(lambda: seen >= {v for vs in acked.values() for v in vs}, 60, "the group to read every record")
    reading[0] = False
    reader_thread.join(10)
    log = "".join(b.log_path.read_text(errors="replace") for b in brokers.values())
    assert "partition leader moved to balance the brokers" in log
