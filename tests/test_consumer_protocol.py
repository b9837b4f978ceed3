"""The consumer group protocol (KIP-848, `group.protocol=consumer`) with
Apache Kafka's own console consumer (4.3.1) against Keel: partitions are
spread by the server-side assignor and move on join and leave, committed
offsets survive a broker restart, `kafka-consumer-groups` shows the
group, and a classic confluent-kafka group migrates online to the consumer
protocol and back. ConsumerGroupHeartbeat's refusals are checked on the
wire."""
from __future__ import annotations

import json
import signal
import subprocess
import threading
import uuid

from confluent_kafka import Consumer, Producer

import consumer_group_wire as cg
import kafka_tools
from conftest import IMPL, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic

INVALID_REQUEST, UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH = 42, 25, 110
UNSUPPORTED_ASSIGNOR, GROUP_ID_NOT_FOUND, STALE_MEMBER_EPOCH = 112, 69, 113

# Rebalances take a few heartbeats: short ones keep the test quick.
FAST = {"group.consumer.heartbeat.interval.ms": "300", "group.consumer.min.heartbeat.interval.ms": "300",
        "group.consumer.session.timeout.ms": "6000", "group.consumer.min.session.timeout.ms": "6000"}


class ConsoleConsumer:
    """Kafka's console consumer in a group of the consumer protocol; it
    prints each value and, as JSON lines, its partitions as they are
    assigned and revoked."""

    def __init__(self, bootstrap: str, topic: str, group: str, *extra: str):
        cmd = ["java", "-Xmx256m", "-cp", kafka_tools.classpath(),
               f"-Dlog4j2.configurationFile={kafka_tools.LOG4J}",
               "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap,
               "--topic", topic, "--group", group, "--from-beginning", "--enable-systest-events",
               "--command-property", "group.protocol=consumer",
               "--command-property", "auto.commit.interval.ms=200", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.values: list[str] = []
        self.events: list[dict] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            with self.lock:
                if line.startswith("{") and '"name"' in line:
                    self.events.append(json.loads(line))
                else:
                    self.values.append(line)

    def consumed(self) -> list[str]:
        with self.lock:
            return list(self.values)

    def stop(self) -> None:
        """SIGTERM: the consumer leaves the group and commits, as on Ctrl-C."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=5)


def produce(bootstrap: str, topic: str, values: list[str], partitions: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, v in enumerate(values):
        p.produce(topic, value=v.encode(), partition=i % partitions)
    assert p.flush(CLIENT_TIMEOUT_S) == 0


def spread(bootstrap: str, group: str, members: int, partitions: int) -> dict:
    """Waits until the group is stable with `members` members holding every
    partition, each its even share; -> the group."""
    def settled():
        g = cg.describe(bootstrap, group)
        held = [sum(len(ps) for ps in m["assignment"].values()) for m in g["members"].values()]
        share = {partitions // members, -(-partitions // members)}
        return g if (g["state"] == "Stable" and len(held) == members and sum(held) == partitions
                     and set(held) <= share) else None
    return wait_until(settled, 60, f"{members} members sharing {partitions} partitions")


def test_kafka_console_consumers_share_partitions_and_resume_after_a_restart(broker_factory):
    b = broker_factory(FAST)
    topic, group, partitions = "kip848", "kip848-group", 6
    create_topic(b.bootstrap, topic, partitions=partitions)
    first = [f"a{i}" for i in range(60)]
    produce(b.bootstrap, topic, first, partitions)

    consumers = [ConsoleConsumer(b.bootstrap, topic, group)]
    try:
        g = spread(b.bootstrap, group, 1, partitions)
        assert g["assignor"] == "uniform", g
        [m] = g["members"].values()
        assert m["topics"] == [topic] and m["type"] == 1, m
        consumers.append(ConsoleConsumer(b.bootstrap, topic, group))
        spread(b.bootstrap, group, 2, partitions)
        consumers.append(ConsoleConsumer(b.bootstrap, topic, group))
        g3 = spread(b.bootstrap, group, 3, partitions)
        # A member that leaves hands its partitions to the others.
        consumers[1].stop()
        g2 = spread(b.bootstrap, group, 2, partitions)
        assert g2["epoch"] > g3["epoch"]

        second = [f"b{i}" for i in range(30)]
        produce(b.bootstrap, topic, second, partitions)
        everything = set(first + second)
        wait_until(lambda: everything <= {v for c in consumers for v in c.consumed()}, 60,
                   "every record consumed by the group")
        # kafka-consumer-groups reads the group through ConsumerGroupDescribe.
        done = kafka_tools.run("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                               "--bootstrap-server", b.bootstrap, "--describe", "--group", group, "--members")
        assert done.returncode == 0, done.stderr[-3000:]
        live = cg.describe(b.bootstrap, group)["members"]
        assert len(live) == 2 and all(member_id in done.stdout for member_id in live), done.stdout
        # Committed: the console consumers commit every 200 ms.
        done = kafka_tools.run("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                               "--bootstrap-server", b.bootstrap, "--describe", "--group", group)
        assert done.returncode == 0 and topic in done.stdout, done.stdout + done.stderr[-3000:]
    finally:
        for c in consumers:
            c.stop()

    b.kill9()
    b.start()
    third = [f"c{i}" for i in range(12)]
    again = ConsoleConsumer(b.bootstrap, topic, group)
    try:
        spread(b.bootstrap, group, 1, partitions)
        produce(b.bootstrap, topic, third, partitions)
        wait_until(lambda: set(third) <= set(again.consumed()), 60, "the new records")
        # It resumed from the committed offsets: nothing from before.
        assert set(again.consumed()) == set(third), again.consumed()
    finally:
        again.stop()


def test_members_go_on_at_their_epochs_across_a_broker_restart(broker_factory):
    """The group is in the group log: after a kill -9 and a restart, the
    console consumers' heartbeats are answered at the epochs they had, with
    the partitions they held, and they go on consuming."""
    b = broker_factory(FAST)
    topic, group, partitions = "restarted", "restarted-group", 4
    create_topic(b.bootstrap, topic, partitions=partitions)
    consumers = [ConsoleConsumer(b.bootstrap, topic, group) for _ in range(2)]
    try:
        before = spread(b.bootstrap, group, 2, partitions)
        b.kill9()
        b.start()
        after = spread(b.bootstrap, group, 2, partitions)
        assert after["epoch"] == before["epoch"], (before, after)
        assert {i: m["assignment"] for i, m in after["members"].items()} == \
            {i: m["assignment"] for i, m in before["members"].items()}
        values = [f"r{i}" for i in range(20)]
        produce(b.bootstrap, topic, values, partitions)
        wait_until(lambda: set(values) <= {v for c in consumers for v in c.consumed()}, 60,
                   "the records produced after the restart")
        assert cg.describe(b.bootstrap, group)["epoch"] == before["epoch"]
    finally:
        for c in consumers:
            c.stop()


def test_heartbeats_are_checked_as_kafka_checks_them(broker_factory):
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "hb", partitions=2)
    member = str(uuid.uuid4())
    for kwargs, code, message in [
        (dict(member_id="", epoch=0, topics=["hb"], owned=[]), INVALID_REQUEST, "MemberId can't be empty."),
        (dict(member_id=member, epoch=0, topics=["hb"], owned=[], rebalance_timeout_ms=-1), INVALID_REQUEST,
         "RebalanceTimeoutMs must be provided in first request."),
        (dict(member_id=member, epoch=0, topics=["hb"]), INVALID_REQUEST,
         "TopicPartitions must be empty when (re-)joining."),
        (dict(member_id=member, epoch=0, owned=[]), INVALID_REQUEST,
         "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining."),
        (dict(member_id=member, epoch=0, topics=["hb"], owned=[], assignor="sticky"), UNSUPPORTED_ASSIGNOR, None),
    ]:
        got = cg.heartbeat(b.bootstrap, "hb-group", **kwargs)
        assert got["error"] == code, (kwargs, got)
        if message:
            assert got["message"] == message, (kwargs, got)

    # As clients do, find the coordinator first (Kafka creates its offsets
    # topic then).
    wait_until(lambda: cg.find_coordinator(b.bootstrap, "hb-group") == 0, 30, "the coordinator")
    joined = wait_until(lambda: (j := cg.heartbeat(b.bootstrap, "hb-group", member, 0, topics=["hb"], owned=[],
                                                   assignor="range"))["error"] == 0 and j, 30, "a join")
    epoch = joined["epoch"]
    assert joined["member_id"] == member and epoch >= 1, joined
    unknown = cg.heartbeat(b.bootstrap, "hb-group", str(uuid.uuid4()), 1, owned=[])
    assert unknown["error"] == UNKNOWN_MEMBER_ID, unknown
    [(topic_id, held)] = joined["assignment"]
    assert held == [0, 1] and joined["interval"] == 300
    # OffsetFetch from a member is checked against its epoch (v9).
    assert cg.offset_fetch_error(b.bootstrap, "hb-group", member, epoch) == 0
    assert cg.offset_fetch_error(b.bootstrap, "hb-group", member, epoch + 1) == STALE_MEMBER_EPOCH
    assert cg.offset_fetch_error(b.bootstrap, "hb-group", "someone-else", epoch) == UNKNOWN_MEMBER_ID
    assert cg.offset_fetch_error(b.bootstrap, "hb-group", None, -1) == 0
    fenced = cg.heartbeat(b.bootstrap, "hb-group", member, epoch + 5, owned=[(topic_id, held)])
    assert fenced["error"] == FENCED_MEMBER_EPOCH, fenced
    same = cg.heartbeat(b.bootstrap, "hb-group", member, epoch, owned=[(topic_id, held)])
    assert same["error"] == 0 and same["epoch"] == epoch, same
    g = cg.describe(b.bootstrap, "hb-group")
    m = g["members"][member]
    assert (g["state"], g["assignor"], m["assignment"], m["target"]) == ("Stable", "range", {"hb": [0, 1]},
                                                                       {"hb": [0, 1]}), g
    assert (m["topics"], m["regex"], m["type"]) == (["hb"], "", 1), m
    if IMPL == "keel":
        # A member of a group Keel does not know (its log lost, or written
        # by a Keel that kept no consumer groups) is asked to rejoin; Kafka
        # answers GROUP_ID_NOT_FOUND, which its Java client takes as fatal.
        lost = cg.heartbeat(b.bootstrap, "forgotten-group", member, 3, owned=[])
        assert lost["error"] == UNKNOWN_MEMBER_ID, lost
    # v0: the coordinator names a joining member.
    v0 = cg.heartbeat(b.bootstrap, "hb-v0", "", 0, topics=["hb"], owned=[], version=0)
    assert v0["error"] == 0 and len(v0["member_id"]) == 22, v0
    # Leaving empties the group, which stays (with its offsets) until
    # deleted.
    left = cg.heartbeat(b.bootstrap, "hb-group", member, -1)
    assert (left["error"], left["epoch"]) == (0, -1), left
    g = cg.describe(b.bootstrap, "hb-group")
    assert (g["error"], g["state"], g["members"]) == (0, "Empty", {}), g
    assert cg.describe(b.bootstrap, "no-such-group")["error"] == GROUP_ID_NOT_FOUND


def classic_consume(bootstrap: str, topic: str, group: str, expected: set[str]) -> set[str]:
    """A confluent-kafka (classic protocol) member of `group` reads until it
    has `expected`, commits and leaves: -> everything it read."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": 6000})
    got: set[str] = set()
    try:
        c.subscribe([topic])
        wait_until(lambda: got.update(m.value().decode() for m in c.consume(100, timeout=0.5) if not m.error())
                   or expected <= got, 60, f"{len(expected)} records in the classic consumer")
        c.commit(asynchronous=False)
    finally:
        c.close()
    return got


def test_a_group_moves_between_the_classic_and_consumer_protocols_with_its_offsets(broker_factory):
    """Offline migration, as in Kafka 4.x: once a classic group is empty, a
    consumer-protocol member takes its id and its committed offsets, and
    the other way round; `kafka-consumer-groups --list` shows the kind."""
    b = broker_factory(FAST)
    topic, group = "migrate", "migrating-group"
    create_topic(b.bootstrap, topic, partitions=2)
    first = [f"a{i}" for i in range(10)]
    produce(b.bootstrap, topic, first, 2)
    assert classic_consume(b.bootstrap, topic, group, set(first)) == set(first)

    second = [f"b{i}" for i in range(10)]
    modern = ConsoleConsumer(b.bootstrap, topic, group)
    try:
        spread(b.bootstrap, group, 1, 2)
        produce(b.bootstrap, topic, second, 2)
        wait_until(lambda: set(second) <= set(modern.consumed()), 60, "the second records")
        assert set(modern.consumed()) == set(second), modern.consumed()
        done = kafka_tools.run("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                               "--bootstrap-server", b.bootstrap, "--list", "--state")
        assert done.returncode == 0, done.stderr[-3000:]
        [line] = [l for l in done.stdout.splitlines() if l.startswith(group)]
        assert "Stable" in line, done.stdout
    finally:
        modern.stop()

    # The empty consumer group's offsets, with kafka-consumer-groups: deleted,
    # then set again at the log end (so the classic member below reads only
    # what comes next: had the reset not worked, it would read from the
    # start).
    def tool(*args: str) -> str:
        done = kafka_tools.run("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                               "--bootstrap-server", b.bootstrap, "--group", group, *args)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        return done.stdout
    tool("--delete-offsets", "--topic", topic)
    assert not cg.offset_fetch_committed(b.bootstrap, group)
    tool("--reset-offsets", "--topic", topic, "--to-latest", "--execute")
    assert cg.offset_fetch_committed(b.bootstrap, group) == {(topic, 0): 10, (topic, 1): 10}

    third = [f"c{i}" for i in range(10)]
    produce(b.bootstrap, topic, third, 2)
    assert classic_consume(b.bootstrap, topic, group, set(third)) == set(third)


def test_a_static_member_restarts_into_its_place_without_a_rebalance(broker_factory):
    """A console consumer with `group.instance.id` leaves for a while (on
    close, with epoch -2) and comes back under a new member id: it gets its
    partitions back, and the group epoch does not move. Its session is
    long enough that a JVM starting slowly on a loaded machine still finds
    its place kept."""
    b = broker_factory({**FAST, "group.consumer.session.timeout.ms": "30000"})
    topic, group = "static", "static-group"
    create_topic(b.bootstrap, topic, partitions=4)
    static = ("--command-property", "group.instance.id=host-a")
    a = ConsoleConsumer(b.bootstrap, topic, group, *static)
    other = ConsoleConsumer(b.bootstrap, topic, group)
    try:
        before = spread(b.bootstrap, group, 2, 4)
        held = {i: m["assignment"] for i, m in before["members"].items()}
        a.stop()
        g = cg.describe(b.bootstrap, group)
        # Still two members: the static one's place is kept.
        assert len(g["members"]) == 2 and g["epoch"] == before["epoch"], g
        a = ConsoleConsumer(b.bootstrap, topic, group, *static)
        # A new member id takes the place, with the same partitions.
        wait_until(lambda: set(cg.describe(b.bootstrap, group)["members"]) != set(held), 60,
                   "the static member to come back")
        after = spread(b.bootstrap, group, 2, 4)
        assert after["epoch"] == before["epoch"], (before, after)
        assert sorted(held.values(), key=str) == sorted((m["assignment"] for m in after["members"].values()), key=str)
    finally:
        a.stop()
        other.stop()


class ClassicMember:
    """A confluent-kafka consumer of the classic protocol, polling in a
    thread: it keeps what it reads and the partitions it holds."""

    def __init__(self, bootstrap: str, topic: str, group: str):
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                                  "heartbeat.interval.ms": 300, "auto.commit.interval.ms": 200})
        self.consumer.subscribe([topic])
        self.values: set[str] = set()
        self.held: set[int] = set()
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stopping.is_set():
            for m in self.consumer.consume(100, timeout=0.1):
                if m.error():
                    self.errors.append(str(m.error()))
                else:
                    self.values.add(m.value().decode())
            self.held = {tp.partition for tp in self.consumer.assignment()}
        self.consumer.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)


def held_apart(members: list[ClassicMember], shares: set[int], partitions: int) -> bool:
    """Each classic member holds a share in `shares`, and no partition is
    held twice; with `partitions` held in all."""
    held = [set(m.held) for m in members]
    return ({len(h) for h in held} <= shares and sum(len(h) for h in held) == len(set().union(*held)) == partitions)


def test_a_classic_group_migrates_online_to_the_consumer_protocol_and_back(broker_factory):
    """Two confluent-kafka consumers (classic protocol) share a topic; a
    console consumer with `group.protocol=consumer` joins the same group,
    which becomes a consumer group hosting the classic members, and the
    server-side assignor spreads the partitions over all three. When it
    leaves, the group is a classic group again and the two share
    everything. No record is lost on the way."""
    b = broker_factory(FAST)
    topic, group, partitions = "online", "online-group", 6
    create_topic(b.bootstrap, topic, partitions=partitions)
    first = [f"a{i}" for i in range(60)]
    produce(b.bootstrap, topic, first, partitions)
    classic = [ClassicMember(b.bootstrap, topic, group) for _ in range(2)]
    modern = None
    try:
        wait_until(lambda: held_apart(classic, {3}, partitions), 60, "the classic members sharing the partitions")
        assert cg.describe(b.bootstrap, group)["error"] == GROUP_ID_NOT_FOUND, "a classic group"

        modern = ConsoleConsumer(b.bootstrap, topic, group)
        g = spread(b.bootstrap, group, 3, partitions)
        assert sorted(m["type"] for m in g["members"].values()) == [0, 0, 1], g
        wait_until(lambda: held_apart(classic, {2}, partitions - 2), 60, "the classic members giving up a partition each")
        second = [f"b{i}" for i in range(30)]
        produce(b.bootstrap, topic, second, partitions)
        everything = set(first + second)
        wait_until(lambda: everything <= set(modern.consumed()).union(*(m.values for m in classic)), 60,
                   "every record consumed by the group")
        # kafka-consumer-groups shows the classic members with the other.
        done = kafka_tools.run("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                               "--bootstrap-server", b.bootstrap, "--describe", "--group", group, "--members")
        assert done.returncode == 0, done.stderr[-3000:]
        assert all(member_id in done.stdout for member_id in g["members"]), done.stdout

        modern.stop()
        # Downgraded: a classic group of the two, which rebalances.
        wait_until(lambda: cg.describe(b.bootstrap, group)["error"] == GROUP_ID_NOT_FOUND, 60,
                   "the group to become a classic group")
        wait_until(lambda: held_apart(classic, {3}, partitions), 60, "the classic members sharing everything again")
        third = [f"c{i}" for i in range(30)]
        produce(b.bootstrap, topic, third, partitions)
        wait_until(lambda: set(third) <= set().union(*(m.values for m in classic)), 60, "the last records")
        assert not any(m.errors for m in classic), [m.errors for m in classic]
    finally:
        if modern:
            modern.stop()
        for m in classic:
            m.stop()
