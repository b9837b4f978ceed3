"""Consumer groups with unmodified clients: assignment across members,
rebalancing when members leave or die, committed offsets across restarts,
admin operations, and Kafka's error codes for stale or unknown members.

Brokers here run with short group timeouts (the same Kafka config keys
work against Apache Kafka with KEEL_TEST_IMPL=kafka)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

import group_wire as gw
from conftest import unique, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic

GROUP_SETS = {
    "group.min.session.timeout.ms": "1000",
    "group.initial.rebalance.delay.ms": "200",
}
SESSION_MS = 3000
PARTITIONS = 6
PER_PARTITION = 50


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory):
    from conftest import _live_brokers, _make_broker
    b = _make_broker(tmp_path_factory, "groups", GROUP_SETS)
    _live_brokers.append(b)
    yield b
    _live_brokers.remove(b)
    b.close()


def fill_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS, per_partition: int = PER_PARTITION):
    create_topic(bootstrap, topic, partitions)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for part in range(partitions):
        for i in range(per_partition):
            p.produce(topic, key=f"k{i}".encode(), value=f"{part}:{i}".encode(), partition=part)
    assert p.flush(CLIENT_TIMEOUT_S) == 0


class Member(threading.Thread):
    """A confluent-kafka consumer polling in its own thread, recording its
    assignment and every record it sees."""

    def __init__(self, bootstrap: str, group: str, topic: str, strategy: str = "range", **extra):
        super().__init__(daemon=True)
        conf = {
            "bootstrap.servers": bootstrap, "group.id": group,
            "partition.assignment.strategy": strategy,
            "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 300,
            "auto.offset.reset": "earliest", "enable.auto.commit": True,
            "auto.commit.interval.ms": 200,
        }
        conf.update(extra)
        self.consumer = Consumer(conf)
        self.topic = topic
        self.seen: list[tuple[int, int]] = []
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.owned: set[int] = set()

    # Assignment is tracked from the rebalance callbacks, which run inside
    # poll() on this member's thread: the consumer is only ever used from it.
    def _assigned(self, _consumer, partitions):
        with self.lock:
            self.owned |= {tp.partition for tp in partitions}

    def _revoked(self, _consumer, partitions):
        with self.lock:
            self.owned -= {tp.partition for tp in partitions}

    def run(self):
        self.consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked,
                                on_lost=self._revoked)
        while not self.stop_flag.is_set():
            m = self.consumer.poll(0.1)
            if m is None:
                continue
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF:
                    self.errors.append(str(m.error()))
                continue
            with self.lock:
                self.seen.append((m.partition(), m.offset()))
        self.consumer.close()
        with self.lock:
            self.owned = set()

    def assignment(self) -> set[int]:
        with self.lock:
            return set(self.owned)

    def leave(self):
        self.stop_flag.set()
        self.join(CLIENT_TIMEOUT_S)


def balanced(members, partitions: int = PARTITIONS) -> bool:
    sets = [m.assignment() for m in members]
    if any(not s for s in sets):
        return False
    union = set().union(*sets)
    return union == set(range(partitions)) and sum(len(s) for s in sets) == partitions


def seen_all(members, partitions: int = PARTITIONS, per_partition: int = PER_PARTITION) -> bool:
    got = set()
    for m in members:
        with m.lock:
            got.update(m.seen)
    return got >= {(p, o) for p in range(partitions) for o in range(per_partition)}


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_three_members_split_six_partitions(group_broker, strategy):
    bs = group_broker.bootstrap
    topic, group = unique(f"grp-{strategy}"), unique("g")
    fill_topic(bs, topic)
    members = [Member(bs, group, topic, strategy) for _ in range(3)]
    for m in members:
        m.start()
    try:
        wait_until(lambda: balanced(members), 30, f"3 members to split {PARTITIONS} partitions")
        wait_until(lambda: seen_all(members), 30, "every record consumed")
        assert all(len(m.assignment()) == 2 for m in members), [m.assignment() for m in members]
        assert not any(m.errors for m in members), [m.errors for m in members]
    finally:
        for m in members:
            m.leave()


def test_mixed_clients_in_one_group(group_broker):
    """Two confluent-kafka members and one kafka-python member (range)."""
    from kafka import KafkaConsumer
    bs = group_broker.bootstrap
    topic, group = unique("grp-mixed"), unique("g")
    fill_topic(bs, topic)
    members = [Member(bs, group, topic) for _ in range(2)]
    kp = KafkaConsumer(topic, bootstrap_servers=bs, group_id=group, auto_offset_reset="earliest",
                       session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300,
                       partition_assignment_strategy=[__import__("kafka").coordinator.assignors.range.RangePartitionAssignor])
    kp_seen: set = set()
    stop = threading.Event()

    def kp_loop():
        while not stop.is_set():
            for tp, msgs in kp.poll(timeout_ms=100).items():
                kp_seen.update((tp.partition, m.offset) for m in msgs)
    t = threading.Thread(target=kp_loop, daemon=True)
    for m in members:
        m.start()
    t.start()
    try:
        def split():
            kp_parts = {tp.partition for tp in kp.assignment()}
            sets = [m.assignment() for m in members] + [kp_parts]
            return all(sets) and sum(map(len, sets)) == PARTITIONS and set().union(*sets) == set(range(PARTITIONS))
        wait_until(split, 30, "confluent + kafka-python members to split the partitions")
        def all_seen():
            got = set(kp_seen)
            for m in members:
                with m.lock:
                    got.update(m.seen)
            return len(got) == PARTITIONS * PER_PARTITION
        wait_until(all_seen, 30, "every record consumed by the mixed group")
    finally:
        stop.set()
        t.join(CLIENT_TIMEOUT_S)
        kp.close()
        for m in members:
            m.leave()


def test_partitions_move_when_a_member_leaves(group_broker):
    bs = group_broker.bootstrap
    topic, group = unique("grp-leave"), unique("g")
    fill_topic(bs, topic)
    # A session far longer than the wait below: the partitions can only move
    # in time because close() sends LeaveGroup, not because the session of
    # the member that left expired.
    long_session_ms = 60_000
    members = [Member(bs, group, topic, **{"session.timeout.ms": long_session_ms}) for _ in range(3)]
    for m in members:
        m.start()
    try:
        wait_until(lambda: balanced(members), 30, "initial split")
        members[0].leave()  # close() sends LeaveGroup
        wait_until(lambda: balanced(members[1:]), long_session_ms / 4000, "the leaver's partitions to move")
    finally:
        for m in members[1:]:
            m.leave()


KILLED_CONSUMER = r"""
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "session.timeout.ms": int(sys.argv[4]), "heartbeat.interval.ms": 300,
              "auto.offset.reset": "earliest"})
c.subscribe([sys.argv[3]])
while True:
    m = c.poll(0.1)
    if c.assignment():
        print("assigned", flush=True)
"""


def test_partitions_move_when_a_member_is_killed(group_broker):
    bs = group_broker.bootstrap
    topic, group = unique("grp-kill"), unique("g")
    fill_topic(bs, topic)
    members = [Member(bs, group, topic) for _ in range(2)]
    victim = subprocess.Popen([sys.executable, "-c", KILLED_CONSUMER, bs, group, topic, str(SESSION_MS)],
                              stdout=subprocess.PIPE, text=True)
    for m in members:
        m.start()
    try:
        wait_until(lambda: sum(len(m.assignment()) for m in members) == PARTITIONS - 2
                   and all(m.assignment() for m in members), 30, "three-way split with the subprocess")
        victim.kill()
        victim.wait()
        wait_until(lambda: balanced(members), SESSION_MS / 1000 + 15, "the dead member's partitions to move")
    finally:
        if victim.poll() is None:
            victim.kill()
        for m in members:
            m.leave()


def consume_n(bs: str, group: str, topic: str, n: int, commit: bool = True) -> list[int]:
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": SESSION_MS})
    c.subscribe([topic])
    offsets = []
    deadline = time.monotonic() + 30
    while len(offsets) < n and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is None or m.error():
            continue
        offsets.append(m.offset())
        if len(offsets) == n and commit:
            c.commit(message=m, asynchronous=False)
    c.close()
    return offsets


@pytest.mark.parametrize("how", ["restart", "kill9"])
def test_committed_offsets_survive_the_broker(broker_factory, how):
    b = broker_factory(GROUP_SETS)
    bs = b.bootstrap
    topic, group = unique("grp-resume"), unique("g")
    fill_topic(bs, topic, partitions=1, per_partition=100)
    first = consume_n(bs, group, topic, 40)
    assert first == list(range(40))
    if how == "restart":
        b.restart()
    else:
        b.kill9()
        b.start()
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest"})
    # A coordinator that is still loading answers NOT_COORDINATOR or
    # COORDINATOR_LOAD_IN_PROGRESS, which committed() does not retry.
    committed = wait_until(lambda: c.committed([TopicPartition(topic, 0)], timeout=CLIENT_TIMEOUT_S),
                           CLIENT_TIMEOUT_S, "the committed offset after the broker came back")
    assert committed[0].offset == 40
    c.close()
    # Its one member left before the broker went: the group comes back
    # Empty, so the next member does not wait out a departed one's session.
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bs})
    described = admin.describe_consumer_groups([group])[group].result(10)
    assert (described.state, described.members) == (ConsumerGroupState.EMPTY, []), described
    rest = consume_n(bs, group, topic, 60)
    assert rest == list(range(40, 100)), "resumed at the committed offset, nothing lost or repeated"


def test_kafka_python_admin_lists_describes_and_deletes(group_broker):
    from kafka import KafkaAdminClient, TopicPartition as KTP
    from kafka.structs import OffsetAndMetadata
    bs = group_broker.bootstrap
    topic, group = unique("grp-admin"), unique("g")
    fill_topic(bs, topic, partitions=2, per_partition=10)
    member = Member(bs, group, topic)
    member.start()
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        wait_until(lambda: len(member.assignment()) == 2, 30, "the member to own both partitions")
        wait_until(lambda: len(member.seen) == 20, 30, "all records")
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert listed[group]["protocol_type"] == "consumer"
        assert listed[group]["group_state"] == "Stable"
        desc = admin.describe_groups([group])[group]
        assert desc["group_state"] == "Stable" and desc["protocol_data"] == "range", desc
        (m,) = desc["members"]
        assert m["member_metadata"]["topics"] == [topic]
        assigned = m["member_assignment"]["assigned_partitions"]
        assert [(a["topic"], sorted(a["partitions"])) for a in assigned] == [(topic, [0, 1])]
        # An active group cannot be deleted.
        wait_until(lambda: len(admin.list_group_offsets({group: None})[group]) == 2, 15, "auto-commits")
        assert admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
        member.leave()
        wait_until(lambda: admin.describe_groups([group])[group]["group_state"] == "Empty", 15,
                   "the group to become empty")
        admin.alter_group_offsets(group, {KTP(topic, 0): OffsetAndMetadata(3, "", -1)})
        offsets = admin.list_group_offsets({group: None})[group]
        assert offsets[KTP(topic, 0)].offset == 3
        admin.delete_group_offsets(group, [KTP(topic, 1)])
        offsets = admin.list_group_offsets({group: None})[group]
        assert set(offsets) == {KTP(topic, 0)}
        missing = unique("g-missing")
        assert admin.delete_groups([group, missing]) == {group: "OK", missing: "GroupIdNotFoundError"}
        assert group not in {g["group_id"] for g in admin.list_groups()}
        assert admin.list_group_offsets({group: None})[group] == {}
    finally:
        member.leave()
        admin.close()


def test_error_codes_for_stale_and_unknown_members(group_broker):
    bs = group_broker.bootstrap
    topic, group = unique("grp-errors"), unique("g")
    create_topic(bs, topic, 1)
    with gw.GroupConn(bs) as a:
        first = a.join(group)
        assert first["error"] == gw.MEMBER_ID_REQUIRED and first["member_id"]
        me = first["member_id"]
        joined = a.join(group, me)
        assert joined["error"] == gw.NONE and joined["leader"] == me
        gen = joined["generation"]
        assert [m[0] for m in joined["members"]] == [me]
        assert a.sync(group, gen, me, assignments=[(me, b"mine")]) == (gw.NONE, b"mine")
        assert a.heartbeat(group, gen, me) == gw.NONE
        assert a.heartbeat(group, gen - 1, me) == gw.ILLEGAL_GENERATION
        assert a.heartbeat(group, gen, "nobody") == gw.UNKNOWN_MEMBER_ID
        assert a.sync(group, gen + 1, me)[0] == gw.ILLEGAL_GENERATION
        assert a.commit(group, gen + 1, me, topic, 0, 5) == gw.ILLEGAL_GENERATION
        assert a.commit(group, gen, "nobody", topic, 0, 5) == gw.UNKNOWN_MEMBER_ID
        assert a.commit(group, gen, me, topic, 0, 5) == gw.NONE
        assert a.join(group, "nobody")["error"] == gw.UNKNOWN_MEMBER_ID
        assert a.join(group, "", session_ms=10)["error"] == gw.INVALID_SESSION_TIMEOUT
        assert a.join(group, "", protocols=(("other", b""),))["error"] == gw.INCONSISTENT_GROUP_PROTOCOL
        # A second member starts a rebalance: the first learns of it from
        # its heartbeat and rejoins; both get the next generation.
        with gw.GroupConn(bs) as b:
            other = b.join(group)["member_id"]
            b.send_only(11, gw.JOIN_V, gw.join_body(group, other, None, 10000, (("range", b"meta"),)))
            wait_until(lambda: a.heartbeat(group, gen, me) == gw.REBALANCE_IN_PROGRESS, 10,
                       "REBALANCE_IN_PROGRESS from the heartbeat")
            again = a.join(group, me)
            theirs = b.join_reply()
            assert again["generation"] == theirs["generation"] == gen + 1
            assert a.heartbeat(group, gen, me) == gw.ILLEGAL_GENERATION
            assert b.leave(group, other) == (gw.NONE, gw.NONE)
        assert a.leave(group, "nobody") == (gw.NONE, gw.UNKNOWN_MEMBER_ID)
    # Static membership: a second instance with the same id fences the first.
    static_group = unique("g-static")
    with gw.GroupConn(bs) as a, gw.GroupConn(bs) as b:
        one = a.join(static_group, "", instance="instance-1")
        assert one["error"] == gw.NONE
        assert a.sync(static_group, one["generation"], one["member_id"], "instance-1",
                      [(one["member_id"], b"x")])[0] == gw.NONE
        two = b.join(static_group, "", instance="instance-1")
        assert two["error"] == gw.NONE and two["member_id"] != one["member_id"]
        assert a.heartbeat(static_group, one["generation"], one["member_id"], "instance-1") == gw.FENCED_INSTANCE_ID
