"""Reads below the tail cache: byte-for-byte correct through O_DIRECT and
read-ahead, and within the broker's cold-read budget over a backfill."""
from __future__ import annotations

import json
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import IMPL, unique
from kclient import CLIENT_TIMEOUT_S, create_topic

BUDGET = 2_000_000  # bytes per second
RECORDS = 16_000
VALUE = 500  # ~8.5 MB of batches


def _produce_history(bs: str, topic: str) -> None:
    """RECORDS records of VALUE bytes, record i's value its number."""
    p = Producer({"bootstrap.servers": bs, "linger.ms": 20})
    for i in range(RECORDS):
        p.produce(topic, value=(b"%08d" % i) * (VALUE // 8))
        if i % 4000 == 0:
            p.poll(0)
    assert p.flush(CLIENT_TIMEOUT_S) == 0


@pytest.mark.skipif(IMPL != "keel", reason="Keel's cold-read budget")
def test_backfill_stays_within_the_cold_read_budget(broker_factory):
    b = broker_factory({"keel.tail.cache.bytes": str(256 << 10),
                        "keel.cold.read.bytes.per.sec": str(BUDGET)})
    bs, topic = b.bootstrap, unique("cold")
    create_topic(bs, topic, 1)
    _produce_history(bs, topic)

    c = Consumer({"bootstrap.servers": bs, "group.id": unique("g"), "enable.auto.commit": False,
                  "fetch.max.bytes": 1 << 20, "max.partition.fetch.bytes": 1 << 20})
    c.assign([TopicPartition(topic, 0, 0)])
    started = time.monotonic()
    seen = total = 0
    while seen < RECORDS:
        m = c.poll(10)
        assert m is not None, f"stalled at {seen}"
        assert not m.error(), m.error()
        assert m.offset() == seen and m.value() == (b"%08d" % seen) * (VALUE // 8)
        total += len(m.value())
        seen += 1
    elapsed = time.monotonic() - started
    c.close()
    # The bucket starts with one second of budget; everything else is paced.
    # Reads are charged what they actually read, after reading: the reads
    # still in flight at the end (a fetch's and its read-ahead, each at most
    # max.partition.fetch.bytes) may be charged after the consumer got them.
    # (A lower bound on time only: a slow machine cannot fail this.)
    allowed = BUDGET * (elapsed + 1.0) + 2 * (1 << 20)
    assert total <= allowed, f"read {total} bytes in {elapsed:.2f}s under a {BUDGET} B/s budget"
    with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
        cold = json.load(r)["cold_reads"]
    assert cold["budget_bytes_per_sec"] == BUDGET
    assert cold["throttled_us_total"] > 0, cold
    assert cold["bytes"] >= total - (512 << 10), cold  # all but the tail cache's share


def _hundred_records(b, prefix: str) -> str:
    """A new one-partition topic holding 100 records."""
    topic = unique(prefix)
    create_topic(b.bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    for i in range(100):
        p.produce(topic, value=b"%03d" % i)
    assert p.flush(CLIENT_TIMEOUT_S) == 0
    return topic


def _assigned(b, topic: str, client_id: str, offset: int) -> Consumer:
    """A consumer of partition 0 from `offset`, as `client_id`."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": unique("g"), "client.id": client_id,
                  "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, 0, offset)])
    return c


@pytest.mark.skipif(IMPL != "keel", reason="Keel's /stats")
def test_every_fetch_names_its_reader(broker_factory):
    """Each partition keeps where each client last read it: a consumer at
    the start and one at the end show in /stats with their own offsets."""
    b = broker_factory()
    topic = _hundred_records(b, "readers")
    loader, tail = _assigned(b, topic, "loader", 0), _assigned(b, topic, "tail", 100)
    m = loader.poll(10)
    assert m is not None and not m.error() and m.offset() == 0
    deadline = time.monotonic() + 20
    readers: dict = {}
    while time.monotonic() < deadline:
        tail.poll(0.2)
        with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
            stats = json.load(r)
        [part] = [q for q in stats["partitions"] if q["topic"] == topic]
        readers = {r["client_id"]: r for r in part["readers"]}
        if "tail" in readers and "loader" in readers:
            break
    loader.close()
    tail.close()
    assert readers["tail"]["offset"] == 100, readers
    assert 0 <= readers["loader"]["offset"] <= 100, readers
    assert readers["tail"]["address"] and readers["tail"]["at_ms"] > 0, readers


@pytest.mark.skipif(IMPL != "keel", reason="Keel's /stats")
def test_two_consumers_with_one_client_id_on_one_host_are_two_readers(broker_factory):
    """A client library's default client id is shared by every consumer
    it makes: two such consumers on one host, reading one partition at
    different offsets, are two readers (each connection its own), each at
    its own offset."""
    b = broker_factory()
    topic = _hundred_records(b, "same-id")
    consumers = [_assigned(b, topic, "rdkafka", offset) for offset in (0, 100)]
    first = consumers[0].poll(10)
    assert first is not None and not first.error() and first.offset() == 0
    deadline = time.monotonic() + 20
    readers: list = []
    while time.monotonic() < deadline:
        consumers[1].poll(0.2)
        with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
            stats = json.load(r)
        [part] = [q for q in stats["partitions"] if q["topic"] == topic]
        readers = [r for r in part["readers"] if r["client_id"] == "rdkafka"]
        if len(readers) == 2 and any(r["offset"] == 100 for r in readers):
            break
    for c in consumers:
        c.close()
    assert len(readers) == 2, readers
    assert len({r["port"] for r in readers}) == 2 and {r["address"] for r in readers} == {"/127.0.0.1"}, readers
    assert max(r["offset"] for r in readers) == 100, readers


@pytest.mark.skipif(IMPL != "keel", reason="Keel's /stats")
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_reader_shows_the_group_its_client_is_a_member_of(broker_factory, protocol):
    """A fetch names its client, not its group (Fetch carries none); /stats
    names the groups whose members have that client id and address, for
    both group protocols, and none for a client that only assigns."""
    b = broker_factory()
    bs, topic, group = b.bootstrap, unique("reader-group"), unique("g")
    create_topic(bs, topic, 1)
    p = Producer({"bootstrap.servers": bs})
    for i in range(10):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(CLIENT_TIMEOUT_S) == 0
    member = Consumer({"bootstrap.servers": bs, "group.id": group, "client.id": "member",
                       "group.protocol": protocol, "auto.offset.reset": "earliest",
                       "enable.auto.commit": False})
    member.subscribe([topic])
    loner = Consumer({"bootstrap.servers": bs, "group.id": unique("g"), "client.id": "loner"})
    loner.assign([TopicPartition(topic, 0, 0)])
    readers: dict = {}
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            member.poll(0.2)
            loner.poll(0.2)
            with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
                stats = json.load(r)
            [part] = [q for q in stats["partitions"] if q["topic"] == topic]
            readers = {r["client_id"]: r for r in part["readers"]}
            if readers.get("member", {}).get("groups") and "loner" in readers:
                break
    finally:
        member.close()
        loner.close()
    assert readers["member"]["groups"] == [group], readers
    assert readers["loner"]["groups"] == [], readers


GROUP_RECORDS = 45_000
GROUP_VALUE = 1_000  # ~46 MB of batches


@pytest.mark.skipif(IMPL != "keel", reason="Keel's shared scans")
def test_three_groups_at_different_offsets_share_one_pass(broker_factory):
    """Three consumer groups committed at 0, 1/3 and 2/3 of a partition's
    history read to its end at the same time, below the tail cache and
    under a cold-read budget (the disk contends). Each gets exactly its
    range, in order; and the broker reads the history from disk about
    once, not the twice (1 + 2/3 + 1/3) that reading each range for its
    own reader costs: the readers ahead are paced until the group behind
    reaches them, then ride its reads (keel.scan.window.bytes is small
    here, so nothing is shared by holding data alone)."""
    b = broker_factory({"keel.tail.cache.bytes": str(64 << 10),
                        "keel.cold.read.bytes.per.sec": str(20_000_000),
                        "keel.cold.read.max.concurrent": "1",
                        "keel.scan.window.bytes": str(4 << 20)})
    bs, topic = b.bootstrap, unique("groups")
    create_topic(bs, topic, 1)
    p = Producer({"bootstrap.servers": bs, "linger.ms": 20})
    value = lambda i: (b"%08d" % i) * (GROUP_VALUE // 8)  # noqa: E731
    for i in range(GROUP_RECORDS):
        p.produce(topic, value=value(i))
        if i % 2000 == 0:
            p.poll(0)
    assert p.flush(CLIENT_TIMEOUT_S) == 0

    starts = [0, GROUP_RECORDS // 3, 2 * GROUP_RECORDS // 3]
    consumers = []
    for k, start in enumerate(starts):
        c = Consumer({"bootstrap.servers": bs, "group.id": unique(f"backfill{k}"),
                      "client.id": f"backfill-{k}", "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, start)])
        c.commit(offsets=[TopicPartition(topic, 0, start)], asynchronous=False)
        consumers.append(c)
    next_offset = list(starts)
    deadline = time.monotonic() + 120
    while any(n < GROUP_RECORDS for n in next_offset):
        assert time.monotonic() < deadline, f"stalled at {next_offset}"
        for k, c in enumerate(consumers):
            if next_offset[k] >= GROUP_RECORDS:
                continue
            for m in c.consume(num_messages=1000, timeout=0.05):
                assert not m.error(), m.error()
                assert m.offset() == next_offset[k], (k, m.offset(), next_offset[k])
                assert m.value() == value(m.offset())
                next_offset[k] += 1
    for c in consumers:
        c.close()
    assert next_offset == [GROUP_RECORDS] * 3

    with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
        stats = json.load(r)
    [part] = [q for q in stats["partitions"] if q["topic"] == topic]
    history = part["tiers"]["local_bytes"]
    cold, scan = stats["cold_reads"], stats["scan"]
    histories = cold["disk_bytes"] / history
    print(f"three groups: {histories:.2f} histories read from disk, "
          f"{scan['shared_bytes'] / history:.2f} served from another's reads, {scan['paced_fetches']} fetches paced")
    assert histories <= 1.3, f"read {histories:.2f} histories from disk: {cold} {scan}"
    assert scan["shared_bytes"] > 0 and scan["paced_fetches"] > 0, scan


@pytest.mark.skipif(IMPL != "keel", reason="Keel's I/O governor")
def test_a_live_path_over_its_target_cuts_the_cold_read_budget(broker_factory):
    """keel.io.live.latency.target.ms at 10 µs, below what any produce over a
    socket takes: while a backfill reads below the tail cache and a producer
    writes live, the governor finds the live path over its target and cuts
    the cold-read budget below its ceiling (never below its floor). The
    backfill still gets every record in order; and the target turned off (a
    dynamic config), the budget is back at its ceiling."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    ceiling = 4_000_000
    b = broker_factory({"keel.tail.cache.bytes": str(256 << 10),
                        "keel.cold.read.bytes.per.sec": str(ceiling),
                        "keel.io.live.latency.target.ms": "0.01"})
    bs, topic, live = b.bootstrap, unique("history"), unique("live")
    create_topic(bs, topic, 1)
    create_topic(bs, live, 1)
    _produce_history(bs, topic)

    def stats() -> dict:
        with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
            return json.load(r)

    def cold_read(s: dict) -> dict:
        [io] = [c for c in s["io"] if c["class"] == "cold_read"]
        return io

    assert cold_read(stats())["budget_bytes_per_sec"] == ceiling
    livep = Producer({"bootstrap.servers": bs, "linger.ms": 0})
    c = Consumer({"bootstrap.servers": bs, "group.id": unique("g"), "enable.auto.commit": False,
                  "fetch.max.bytes": 1 << 20, "max.partition.fetch.bytes": 1 << 20})
    c.assign([TopicPartition(topic, 0, 0)])
    seen, deadline = 0, time.monotonic() + 120
    while seen < RECORDS:
        assert time.monotonic() < deadline, f"stalled at {seen}"
        livep.produce(live, value=b"now")
        livep.poll(0)
        for m in c.consume(num_messages=1000, timeout=0.05):
            assert not m.error(), m.error()
            assert m.offset() == seen and m.value() == (b"%08d" % seen) * (VALUE // 8)
            seen += 1
    c.close()
    assert livep.flush(CLIENT_TIMEOUT_S) == 0

    s = stats()
    budget = cold_read(s)["budget_bytes_per_sec"]
    print(f"governor: {s['io_governor']}, cold-read budget {budget} of {ceiling}, "
          f"live produce {s['live_latency']['produce']['last_10s']}")
    assert s["io_governor"]["cuts"] >= 1, s["io_governor"]
    assert s["io_governor"]["target_ms"] == 0.01
    assert 1 << 20 <= budget < ceiling, cold_read(s)
    assert cold_read(s)["ceiling_bytes_per_sec"] == ceiling
    assert s["live_latency"]["produce"]["last_10s"]["count"] > 0
    assert sum(n for _, n in s["live_latency"]["produce"]["buckets"]) > RECORDS // 1000

    admin = AdminClient({"bootstrap.servers": bs})
    off = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("keel.io.live.latency.target.ms", "0", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([off])[off].result(CLIENT_TIMEOUT_S)
    s = stats()
    assert s["io_governor"]["target_ms"] is None
    assert cold_read(s)["budget_bytes_per_sec"] == ceiling
