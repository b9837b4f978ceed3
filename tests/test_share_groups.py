"""Share groups (KIP-932) with Apache Kafka 4.3.1's own KafkaShareConsumer
(tests/java/ShareConsume.java): several consumers on one group with
explicit and implicit acknowledgement, records rejected, released and
redelivered, the delivery count limit, and a consumer that dies (kill -9)
or hangs (SIGSTOP) while it holds records: every record is processed,
none past the limit, none twice."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request

import pytest

import kafka_tools
from conftest import IMPL, unique, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic
from test_java_transactions import java, last_json

# Short locks, so a hung consumer's records come back within the test.
LOCK_MS = 2000
SHARE = {"keel.share.version": "1", "group.share.record.lock.duration.ms": str(LOCK_MS),
         "group.share.min.record.lock.duration.ms": str(LOCK_MS)}


def stats(b) -> dict:
    with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
        return json.loads(r.read())


def share_partitions(b, group: str) -> list[dict]:
    return [p for p in stats(b)["share_groups"]["partitions"] if p["group"] == group]


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(java("ShareConsume.java", *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def await_line(proc: subprocess.Popen, prefix: str, timeout_s: float = 90) -> str:
    """The first line of `proc`'s output that starts with `prefix`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"no {prefix} line; stderr:\n{proc.stderr.read()[-4000:]}")


def produce(b, topic: str, first: int, count: int) -> None:
    done = subprocess.run(java("ShareConsume.java", "produce", b.bootstrap, topic, str(first), str(count)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]


def finish(proc: subprocess.Popen, timeout_s: float = 120) -> dict:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-4000:]
    return last_json(out)


def consume(b, topic: str, group: str, mode: str, consumers: int, expected: int, *extra: str) -> subprocess.Popen:
    proc = start("consume", b.bootstrap, topic, group, mode, str(consumers), str(expected), "60", *extra)
    await_line(proc, "READY")
    return proc


@pytest.mark.skipif(IMPL != "keel", reason="keel.share.version is Keel's")
def test_share_groups_are_served_at_share_version_1(broker_factory):
    """`kafka-features describe`: Keel supports share.version 0 to 1 and
    finalizes the level keel.share.version sets (at 0 Kafka leaves it out
    of the finalized features)."""
    for level, finalized in (("0", None), ("1", "1")):
        b = broker_factory(sets={"keel.share.version": level})
        done = kafka_tools.run("org.apache.kafka.tools.FeatureCommand", "--bootstrap-server", b.bootstrap,
                               "describe")
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        [line] = [line for line in done.stdout.splitlines() if "share.version" in line]
        fields = dict(re.findall(r"(\w+): (\S+)", line))
        assert (fields["SupportedMinVersion"], fields["SupportedMaxVersion"]) == ("0", "1"), line
        assert fields.get("FinalizedVersionLevel", "0") == (finalized or "0"), line
        assert stats(b)["share_groups"]["enabled"] is (finalized is not None)


def test_share_consumers_accept_reject_and_release_with_explicit_acknowledgement(broker_factory):
    """Three consumers on two partitions: a value divisible by 10 is
    rejected (archived, never delivered again), one divisible by 7 is
    released on its first delivery (delivered again, count 2), the rest
    accepted. Every value ends accepted or rejected, once."""
    b = broker_factory(sets=SHARE)
    topic, group = unique("share-explicit"), unique("workers")
    create_topic(b.bootstrap, topic, 2)
    proc = consume(b, topic, group, "explicit", 3, 300)
    produce(b, topic, 0, 300)
    result = finish(proc)
    released = [v for v in range(300) if v % 7 == 0 and v % 10 != 0]
    assert result["complete"], result
    assert (result["accepted"], result["rejected"]) == (270, 30), result
    assert result["accepted_twice"] == 0 and result["delivered_after_done"] == 0, result
    assert result["released"] == len(released) and result["max_delivery_count"] == 2, result
    assert result["rejected_values"] == list(range(0, 300, 10)), result
    if IMPL != "keel":
        return
    parts = share_partitions(b, group)
    assert len(parts) == 2, parts
    assert sum(p["redeliveries"] for p in parts) == len(released), parts
    # Everything is done with: nothing in flight, the start at the log end.
    assert all(p["start_offset"] == p["end_offset"] and p["acquired"] == 0 for p in parts), parts
    assert sum(p["end_offset"] for p in parts) == 300, parts


def test_share_consumers_with_implicit_acknowledgement_take_each_record_once(broker_factory):
    b = broker_factory(sets=SHARE)
    topic, group = unique("share-implicit"), unique("workers")
    create_topic(b.bootstrap, topic, 3)
    proc = consume(b, topic, group, "implicit", 2, 500)
    produce(b, topic, 0, 500)
    result = finish(proc)
    assert result["complete"] and result["accepted"] == 500, result
    assert result["accepted_twice"] == 0 and result["max_delivery_count"] == 1, result
    assert all(n > 0 for n in result["per_consumer"]), result


def test_records_released_at_every_delivery_are_archived_at_the_limit(broker_factory):
    """group.share.delivery.count.limit=3: a record released at every
    delivery is delivered three times, then archived."""
    b = broker_factory(sets={**SHARE, "group.share.delivery.count.limit": "3"})
    topic, group = unique("share-limit"), unique("workers")
    create_topic(b.bootstrap, topic, 1)
    proc = consume(b, topic, group, "release", 2, 40, "3")
    produce(b, topic, 0, 40)
    result = finish(proc)
    assert result["complete"] and result["rejected"] == 40, result
    assert result["max_delivery_count"] == 3 and result["delivered_after_done"] == 0, result
    if IMPL != "keel":
        return
    [part] = share_partitions(b, group)
    assert part["archived_at_limit"] == 40 and part["redeliveries"] == 80, part
    assert part["start_offset"] == part["end_offset"] == 40, part


def test_renewed_locks_outlive_the_lock_duration(broker_factory):
    """RENEW acknowledgements (ShareFetch and ShareAcknowledge v2,
    KIP-1222), from a consumer in the record_limit acquire mode (KIP-1206)
    with max.poll.records 4: it holds the four records of the topic for
    twice the 2 s lock, renewing them, then accepts them. No lock runs
    out, so each record is delivered once."""
    b = broker_factory(sets=SHARE)
    topic, group = unique("share-renew"), unique("workers")
    create_topic(b.bootstrap, topic, 1)
    group_configs(b, group, "--alter", "--add-config", "share.auto.offset.reset=earliest")
    produce(b, topic, 0, 4)
    done = subprocess.run(java("ShareConsume.java", "renew", b.bootstrap, topic, group, "4", str(2 * LOCK_MS), "90"),
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = last_json(done.stdout)
    assert result["accepted"] == 4 and result["max_delivery"] == 1, result
    # Held twice the lock: each record renewed twice at least.
    assert result["renewals"] >= 4 * 2 and 1 <= result["most_in_poll"] <= 4, result
    if IMPL != "keel":
        return
    [part] = share_partitions(b, group)
    assert part["lock_expiries"] == 0 and part["redeliveries"] == 0, part
    assert part["start_offset"] == part["end_offset"] == 4, part


@pytest.mark.parametrize("fault", ["kill9", "stop"])
def test_a_consumer_that_dies_holding_records_loses_none(broker_factory, fault):
    """A consumer acquires records and dies with them (kill -9: its
    connection closes and they are released at once) or hangs (SIGSTOP:
    they come back when their locks run out, after
    group.share.record.lock.duration.ms). Other consumers then process
    every record, the held ones on their second delivery."""
    b = broker_factory(sets=SHARE)
    topic, group = unique(f"share-{fault}"), unique("workers")
    create_topic(b.bootstrap, topic, 1)
    holder = start("hold", b.bootstrap, topic, group)
    try:
        await_line(holder, "READY")
        produce(b, topic, 0, 100)
        held = json.loads(await_line(holder, "HELD ")[len("HELD "):])["values"]
        assert held, "the holder holds records"
        if IMPL == "keel":
            acquired = sum(p["acquired"] for p in share_partitions(b, group))
            assert acquired >= len(held), acquired
        if fault == "kill9":
            holder.kill()
            holder.wait()
        else:
            holder.send_signal(signal.SIGSTOP)
        proc = consume(b, topic, group, "implicit", 2, 100)
        result = finish(proc)
    finally:
        if holder.poll() is None:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
            holder.wait()
    assert result["complete"] and result["accepted"] == 100, result
    assert result["accepted_twice"] == 0 and result["max_delivery_count"] == 2, result
    if IMPL != "keel":
        return
    [part] = share_partitions(b, group)
    assert part["redeliveries"] == len(held), (part, held)
    # Released by the lock running out (stopped), or at once as its
    # connection closed (killed).
    if fault == "stop":
        assert part["lock_expiries"] >= len(held), part
    else:
        assert part["lock_expiries"] == 0, part
    wait_until(lambda: share_partitions(b, group)[0]["acquired"] == 0, 10, "nothing acquired")


@pytest.mark.parametrize("how", ["kill9", "restart"])
def test_share_state_survives_the_broker(broker_factory, how):
    """Half the records are accepted; a consumer then holds some of the
    rest when the broker dies (kill -9) or restarts. Afterwards the
    accepted ones are never delivered again, the held ones are delivered
    again (their first delivery counted), and every record is processed:
    the share partition's start offset, acknowledged records and delivery
    counts survived."""
    b = broker_factory(sets=SHARE)
    topic, group = unique(f"share-durable-{how}"), unique("workers")
    create_topic(b.bootstrap, topic, 1)
    first = consume(b, topic, group, "explicit", 1, 50)
    produce(b, topic, 0, 50)
    done = finish(first)
    assert done["complete"] and done["accepted"] + done["rejected"] == 50, done
    holder = start("hold", b.bootstrap, topic, group)
    try:
        await_line(holder, "READY")
        produce(b, topic, 50, 50)
        held = json.loads(await_line(holder, "HELD ")[len("HELD "):])["values"]
        assert held and min(held) >= 50, held
        if IMPL == "keel":
            [before] = share_partitions(b, group)
            assert before["start_offset"] == 50 and before["acquired"] >= len(held), before
        if how == "kill9":
            b.kill9()
        else:
            b.stop()
        holder.kill()
        holder.wait()
        b.start()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    if IMPL == "keel":
        [after] = share_partitions(b, group)
        assert after["start_offset"] == 50 and after["acquired"] == 0, after
        assert after["available"] == after["end_offset"] - 50, after
    second = consume(b, topic, group, "implicit", 2, 50)
    result = finish(second)
    assert result["complete"] and result["accepted"] == 50, result
    assert result["values"] == list(range(50, 100)), result
    # Keel writes each acquisition, so the held records' first delivery
    # counts across the restart; Kafka 4.3.1 writes delivery counts only
    # with acknowledgements, and delivers them as if for the first time.
    delivered = 2 if IMPL == "keel" else 1
    assert result["accepted_twice"] == 0 and result["max_delivery_count"] == delivered, result


def share_groups_tool(b, *args: str) -> str:
    done = kafka_tools.run("org.apache.kafka.tools.consumer.group.ShareGroupCommand", "--bootstrap-server",
                           b.bootstrap, *args)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def start_offsets(out: str, group: str) -> dict[int, int]:
    """`kafka-share-groups --describe`'s rows: partition -> start offset."""
    rows = [line.split() for line in out.splitlines() if line.startswith(group + " ")]
    return {int(r[2]): int(r[3]) for r in rows}


def lags(out: str, group: str) -> dict[int, int | None]:
    """`kafka-share-groups --describe`'s rows: partition -> lag (None: "-",
    unknown)."""
    rows = [line.split() for line in out.splitlines() if line.startswith(group + " ")]
    return {int(r[2]): None if r[4] == "-" else int(r[4]) for r in rows}


def test_kafka_share_groups_lists_describes_resets_and_deletes(broker_factory):
    """Apache Kafka 4.3.1's `kafka-share-groups` (ShareGroupCommand): the
    group is listed; its start offsets are where consumption ended, its
    state Empty once its consumers left; a reset to earliest makes a new
    consumer read everything again; deleting the offsets and then the group
    leaves nothing."""
    b = broker_factory(sets=SHARE)
    topic, group = unique("share-tool"), unique("workers")
    create_topic(b.bootstrap, topic, 2)
    first = consume(b, topic, group, "implicit", 1, 40)
    produce(b, topic, 0, 40)
    assert finish(first)["accepted"] == 40
    assert group in share_groups_tool(b, "--list").split()
    described = share_groups_tool(b, "--describe", "--group", group)
    offsets = start_offsets(described, group)
    assert sorted(offsets) == [0, 1], offsets
    # DescribeShareGroupOffsets v1: nothing left to deliver.
    assert lags(described, group) == {0: 0, 1: 0}, described
    # Keel's start offsets are past every record acknowledged. Kafka
    # 4.3.1 answers 0 for both here (with lag 0: its share coordinator's
    # summary keeps the start of the acknowledged records in flight).
    assert sum(offsets.values()) == (40 if IMPL == "keel" else 0), offsets
    state = share_groups_tool(b, "--describe", "--group", group, "--state")
    [row] = [line.split() for line in state.splitlines() if line.startswith(group + " ")]
    assert row[-2:] == ["Empty", "0"], state
    reset = share_groups_tool(b, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest",
                              "--execute")
    assert start_offsets(reset, group) == {0: 0, 1: 0}, reset
    described = share_groups_tool(b, "--describe", "--group", group)
    assert start_offsets(described, group) == {0: 0, 1: 0}
    # Every record is to be delivered again.
    assert sum(lags(described, group).values()) == 40, described
    again = finish(consume(b, topic, group, "implicit", 1, 40))
    assert again["complete"] and again["values"] == list(range(40)), again
    deleted = share_groups_tool(b, "--delete-offsets", "--group", group, "--topic", topic)
    assert re.search(rf"{topic}\s+Successful", deleted), deleted
    assert "no offset information" in share_groups_tool(b, "--describe", "--group", group)
    assert "was successful" in share_groups_tool(b, "--delete", "--group", group)
    assert group not in share_groups_tool(b, "--list").split()


def group_configs(b, group: str, *args: str) -> str:
    done = kafka_tools.run("kafka.admin.ConfigCommand", "--bootstrap-server", b.bootstrap,
                           "--entity-type", "groups", "--entity-name", group, *args)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def test_share_group_configs_set_with_kafka_configs(broker_factory):
    """`kafka-configs --entity-type groups`: share.auto.offset.reset=earliest
    makes a new group read what was written before it joined, and its own
    share.delivery.count.limit (2, under the broker's 5) archives records
    released at every delivery after two."""
    b = broker_factory(sets=SHARE)
    topic, group = unique("share-configs"), unique("workers")
    create_topic(b.bootstrap, topic, 1)
    produce(b, topic, 0, 30)
    group_configs(b, group, "--alter", "--add-config",
                  "share.auto.offset.reset=earliest,share.delivery.count.limit=2")
    described = group_configs(b, group, "--describe")
    assert "share.auto.offset.reset=earliest" in described, described
    assert "share.delivery.count.limit=2" in described, described
    result = finish(consume(b, topic, group, "release", 1, 30, "2"))
    assert result["complete"] and result["rejected"] == 30, result
    assert result["max_delivery_count"] == 2 and result["delivered_after_done"] == 0, result


def test_share_auto_offset_reset_by_duration_starts_at_the_first_record_that_young(broker_factory):
    """share.auto.offset.reset=by_duration:PT1H: a new share group starts at
    the first record at most an hour old, so of ten records two hours old
    and ten new ones it reads the new ones only."""
    from confluent_kafka import Producer
    b = broker_factory(sets=SHARE)
    topic, group = unique("share-duration"), unique("workers")
    create_topic(b.bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    old_ms = int(time.time() * 1000) - 2 * 3600 * 1000
    for v in range(20):
        p.produce(topic, key=str(v).encode(), value=str(v).encode(), partition=0,
                  timestamp=old_ms + v if v < 10 else 0)
    assert p.flush(30) == 0
    refused = kafka_tools.run("kafka.admin.ConfigCommand", "--bootstrap-server", b.bootstrap, "--entity-type",
                              "groups", "--entity-name", group, "--alter", "--add-config",
                              "share.auto.offset.reset=by_duration:-PT1H")
    assert refused.returncode != 0 and "by_duration:<PnDTnHnMn.nS>" in refused.stdout + refused.stderr, \
        refused.stdout + refused.stderr[-2000:]
    group_configs(b, group, "--alter", "--add-config", "share.auto.offset.reset=by_duration:PT1H")
    result = finish(consume(b, topic, group, "implicit", 1, 10))
    assert result["complete"] and result["values"] == list(range(10, 20)), result


def test_a_groups_own_session_timeout_removes_a_hung_member(broker_factory):
    """share.session.timeout.ms=3000 and share.heartbeat.interval.ms=1000
    set on the group (within the broker's lowered
    group.share.min.session.timeout.ms and min.heartbeat.interval.ms): a
    member that stops heartbeating (SIGSTOP) leaves the group after about
    3 s, long before the broker's 45 s. `kafka-share-groups --describe
    --members` shows it until then."""
    b = broker_factory(sets={**SHARE, "group.share.min.session.timeout.ms": "2000",
                             "group.share.min.heartbeat.interval.ms": "500"})
    topic, group = unique("share-session"), unique("workers")
    create_topic(b.bootstrap, topic, 1)
    group_configs(b, group, "--alter", "--add-config", "share.session.timeout.ms=3000,share.heartbeat.interval.ms=1000")
    holder = start("hold", b.bootstrap, topic, group)
    try:
        await_line(holder, "READY")
        # `kafka-share-groups --describe --members`: the member and its
        # assignment.
        listed = share_groups_tool(b, "--describe", "--group", group, "--members")
        assert re.search(rf"{group}\s+\S+\s+\S+\s+\S+\s+1\s+{topic}:0", listed), listed
        holder.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()

        def members() -> str:
            out = share_groups_tool(b, "--describe", "--group", group, "--state")
            [row] = [line.split() for line in out.splitlines() if line.startswith(group + " ")]
            return row[-1]
        # Well before the broker's own 45 s.
        wait_until(lambda: members() == "0", 25, "the hung member removed", interval_s=0.5)
        print(f"hung member removed {time.monotonic() - stopped:.1f} s after it stopped")
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()


def test_read_committed_share_consumers_skip_aborted_transactions(broker_factory):
    """share.isolation.level=read_committed: a transactional producer
    commits every other transaction and aborts the rest; share consumers
    get exactly the committed records, never an aborted one or a marker."""
    from confluent_kafka import Producer
    b = broker_factory(sets=SHARE)
    topic, group = unique("share-txn"), unique("workers")
    create_topic(b.bootstrap, topic, 1)
    group_configs(b, group, "--alter", "--add-config",
                  "share.auto.offset.reset=earliest,share.isolation.level=read_committed")
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": unique("txn")})
    p.init_transactions(CLIENT_TIMEOUT_S)
    committed = []
    for r in range(6):
        p.begin_transaction()
        values = list(range(r * 10, r * 10 + 10))
        for v in values:
            p.produce(topic, key=str(v), value=str(v))
        if r % 2 == 0:
            p.commit_transaction(CLIENT_TIMEOUT_S)
            committed += values
        else:
            p.abort_transaction(CLIENT_TIMEOUT_S)
    result = finish(consume(b, topic, group, "implicit", 2, len(committed)))
    assert result["complete"] and result["values"] == committed, result
    assert result["accepted_twice"] == 0 and result["delivered_after_done"] == 0, result
