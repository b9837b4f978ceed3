"""Tiered storage: sealed segments move from the fast tier to a capacity dir,
a `file://` object store or a real S3-compatible server (versitygw), and
everything reads back byte for byte with a real client, across kill -9,
retention, DeleteRecords and an object store that goes away.

Each scenario runs against every tier configuration."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic,
                                  ResourceType)

from conftest import IMPL, unique, wait_until
from kclient import CLIENT_TIMEOUT_S, DeliveryLog, consume_range, consumer, create_topic, produce_all

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="Keel's tiers")

TIERS = ["capacity", "file", "s3"]
SEGMENT = 16_384
# Record timestamps: recent enough that time-based retention keeps them.
T0 = int(time.time() * 1000) - 3_600_000


def tier_setup(kind: str, request, tmp_path: Path) -> tuple[dict, dict, callable]:
    """Broker settings, topic configs, and a function listing the files of
    every copy in the tier (paths relative to the tier's root)."""
    # A small tail cache, so history is read from the tiers, not memory.
    sets = {"keel.tier.check.interval.ms": "100", "keel.tier.move.bytes.per.sec": "0",
            "keel.tail.cache.bytes": str(64 << 10)}
    if kind == "capacity":
        root = tmp_path / "capacity"
        sets["keel.tier.capacity.dirs"] = str(root)
        return sets, {"segment.bytes": str(SEGMENT)}, lambda: files_under(root)
    if kind == "file":
        root = tmp_path / "remote"
        sets["keel.tier.remote"] = f"file://{root}"
        return sets, {"segment.bytes": str(SEGMENT), "remote.storage.enable": "true"}, lambda: files_under(root)
    s3 = request.getfixturevalue("s3server")
    sets.update({
        "keel.tier.remote": f"s3://{s3.bucket}",
        "keel.tier.remote.endpoint": s3.endpoint,
        "keel.tier.remote.region": s3.region,
        "keel.tier.remote.access.key.id": s3.access_key,
        "keel.tier.remote.secret.access.key": s3.secret_key,
    })
    return sets, {"segment.bytes": str(SEGMENT), "remote.storage.enable": "true"}, s3.object_keys


def files_under(root: Path) -> list[str]:
    if not root.exists():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def stats(b) -> dict:
    with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
        return json.load(r)


def passes_after(b, n: int):
    """Waits until the mover has finished `n` more passes."""
    done = stats(b)["tiers"]["passes"]
    wait_until(lambda: stats(b)["tiers"]["passes"] >= done + n, 60, f"{n} mover passes")


def tier_counts(b, topic: str) -> dict:
    """Per partition: the tier block of /stats."""
    return {p["partition"]: p["tiers"] for p in stats(b)["partitions"] if p["topic"] == topic}


def records(n: int, partitions: int):
    """Record i goes to partition i % partitions with timestamp T0 + i."""
    for i in range(n):
        yield {"partition": i % partitions, "key": b"k%06d" % i, "value": (b"v%06d-" % i) * 20,
               "headers": [("i", b"%d" % i)], "timestamp": T0 + i}


def check_all(bs: str, topic: str, n: int, partitions: int, start: dict | None = None):
    """Reads every partition from its start and compares with `records`."""
    start = start or {}
    for p in range(partitions):
        first = start.get(p, 0)
        expected = [r for r in records(n, partitions) if r["partition"] == p][first:]
        got = consume_range(bs, topic, [p], len(expected), timeout_s=120, start_offset=first)[p]
        assert len(got) == len(expected)
        for off, (m, r) in enumerate(zip(got, expected), start=first):
            assert m.offset() == off
            assert (m.key(), m.value(), m.headers(), m.timestamp()[1]) == \
                (r["key"], r["value"], r["headers"], r["timestamp"]), f"partition {p} offset {off}"


def produce(bs: str, topic: str, n: int, partitions: int, **conf):
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 5,
                  "batch.size": 4096, **conf})
    log = DeliveryLog()
    produce_all(p, records(n, partitions), log, topic)
    log.check()


@pytest.mark.parametrize("kind", TIERS)
def test_segments_move_and_read_back_from_every_tier(kind, broker_factory, request, tmp_path):
    sets, topic_config, tier_files = tier_setup(kind, request, tmp_path)
    b = broker_factory({**sets, "keel.tier.fast.max.bytes": str(6 * SEGMENT)})
    bs, topic, n = b.bootstrap, unique("tier"), 6000
    create_topic(bs, topic, 2, topic_config)
    produce(bs, topic, n, 2)

    # Sealed segments are copied, then the oldest local copies go until the
    # fast tier is within its budget.
    def moved():
        counts = tier_counts(b, topic)
        return all(c["cold"] >= 5 and c["copying"] == 0 for c in counts.values()) and \
            not stats(b)["tiers"]["fast_over_budget"]
    wait_until(moved, 60, f"segments of {topic} moved to the {kind} tier")
    s = stats(b)
    t = s["tiers"]
    assert t["copies"] >= 10 and t["copy_failures"] == 0 and t["fast_bytes"] <= 6 * SEGMENT, t
    assert sum(c["local_bytes"] for c in tier_counts(b, topic).values()) <= 6 * SEGMENT
    # Per partition, the bytes with a copy in each colder tier.
    for c in tier_counts(b, topic).values():
        here, other = ("capacity_bytes", "object_store_bytes") if kind == "capacity" else \
            ("object_store_bytes", "capacity_bytes")
        assert c[here] >= c["cold_bytes"] >= 5 * 4096 and c[other] == 0, c

    # The copies are named by cluster, topic, topic id, partition and base offset,
    # never by a local path; each has a .log, .index and .timeindex.
    def copies_match():
        copies = sum(c["both"] + c["cold"] + c["copying"] for c in tier_counts(b, topic).values())
        return len(tier_files()) == 3 * copies
    wait_until(copies_match, 30, "three files per copy")
    files = tier_files()
    assert all(f.split("/")[1].startswith(f"{topic}-") and str(b.data_dir) not in f for f in files), files
    assert {f.rsplit(".", 1)[1] for f in files} == {"log", "index", "timeindex"}

    # `keel stats` shows the tier and where each partition's bytes are.
    out = subprocess.run([str(b.bin), "stats", "--admin", b.admin], capture_output=True, text=True,
                         timeout=CLIENT_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    assert "\ntiers        " in out.stdout and "fast tier " in out.stdout, out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith(topic + " ")]
    # The last column (bytes in the colder tier, "<n> <unit>") is not zero.
    assert len(rows) == 2 and all(r[-2:] != ["0", "B"] for r in rows), out.stdout

    # Everything reads back, from the colder tier and from the fast one.
    check_all(bs, topic, n, 2)
    assert stats(b)["tiers"]["read_bytes"] > 0

    # ListOffsets by timestamp, inside cold segments and locally.
    c = consumer(bs)
    try:
        for i in (0, 1, 10, 501, 2400, n - 2, n - 1):
            want = TopicPartition(topic, i % 2, T0 + i)
            got = c.offsets_for_times([want], timeout=CLIENT_TIMEOUT_S)[0]
            assert got.offset == i // 2, (i, got)
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=CLIENT_TIMEOUT_S)
        assert (lo, hi) == (0, n // 2)
    finally:
        c.close()

    # kill -9 and restart: the manifests bring the same routing back.
    b.kill9()
    b.start()
    check_all(bs, topic, n, 2)


@pytest.mark.parametrize("kind", TIERS)
def test_kill9_during_moves_loses_nothing_and_leaves_no_stray_copies(kind, broker_factory, request, tmp_path):
    sets, topic_config, tier_files = tier_setup(kind, request, tmp_path)
    # A slow mover, so kills land in the middle of copies; a short orphan
    # grace, so an object store write that completes after a kill (and whose
    # copy was rolled back) is swept within the test.
    sets["keel.tier.move.bytes.per.sec"] = str(64 << 10)
    sets["keel.tier.orphan.grace.ms"] = "1000"
    b = broker_factory({**sets, "keel.tier.fast.max.bytes": str(4 * SEGMENT)})
    bs, topic, n = b.bootstrap, unique("tierkill"), 6000
    create_topic(bs, topic, 2, topic_config)
    produce(bs, topic, n, 2)
    for delay in (0.3, 0.7, 0.2, 1.1, 0.5):
        time.sleep(delay)
        b.kill9()
        b.start()
    b.stop()
    b.sets["keel.tier.move.bytes.per.sec"] = "0"
    b.start()

    def settled():
        counts = tier_counts(b, topic)
        return all(c["cold"] >= 5 and c["copying"] == 0 and c["deleting"] == 0 for c in counts.values())
    wait_until(settled, 60, "moves to finish after the kills")
    check_all(bs, topic, n, 2)
    # Rolled-back copies were deleted: the tier holds exactly the live ones.
    copies = sum(c["both"] + c["cold"] for c in tier_counts(b, topic).values())
    wait_until(lambda: len(tier_files()) == 3 * copies, 30, "stray copies deleted")


@pytest.mark.parametrize("kind", TIERS)
def test_retention_and_delete_records_reach_the_colder_tier(kind, broker_factory, request, tmp_path):
    sets, topic_config, tier_files = tier_setup(kind, request, tmp_path)
    b = broker_factory({**sets, "keel.tier.fast.max.bytes": str(4 * SEGMENT),
                        "log.retention.check.interval.ms": "200"})
    bs, topic, n = b.bootstrap, unique("tierret"), 6000
    create_topic(bs, topic, 2, topic_config)
    produce(bs, topic, n, 2)
    wait_until(lambda: all(c["cold"] >= 5 for c in tier_counts(b, topic).values()), 60, "moves")

    # DeleteRecords deep inside the cold range of partition 0.
    a = AdminClient({"bootstrap.servers": bs})
    fs = a.delete_records([TopicPartition(topic, 0, 1000)], request_timeout=CLIENT_TIMEOUT_S)
    for f in fs.values():
        assert f.result(timeout=CLIENT_TIMEOUT_S).low_watermark == 1000
    check_all(bs, topic, n, 2, start={0: 1000})
    c = consumer(bs)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=CLIENT_TIMEOUT_S)[0] == 1000
    finally:
        c.close()

    # Retention: the topic keeps ~5 segments per partition, across tiers.
    b.stop()
    b.sets["log.retention.bytes"] = str(5 * SEGMENT)
    b.start()

    def retained():
        ps = [p for p in stats(b)["partitions"] if p["topic"] == topic]
        return all(p["log_start_offset"] > 1000 and p["tiers"]["deleting"] == 0 for p in ps)
    wait_until(retained, 60, "retention across tiers")
    starts = {p["partition"]: p["log_start_offset"] for p in stats(b)["partitions"] if p["topic"] == topic}
    check_all(bs, topic, n, 2, start=starts)
    copies = sum(c["both"] + c["cold"] for c in tier_counts(b, topic).values())
    wait_until(lambda: len(tier_files()) == 3 * copies, 30, "deleted copies gone from the tier")


@pytest.mark.parametrize("kind", TIERS)
def test_deleted_topics_and_orphans_leave_the_tier(kind, broker_factory, request, tmp_path):
    sets, topic_config, tier_files = tier_setup(kind, request, tmp_path)
    b = broker_factory({**sets, "keel.tier.orphan.grace.ms": "1500"})
    bs, gone, kept = b.bootstrap, unique("tiergone"), unique("tierkept")
    create_topic(bs, gone, 1, topic_config)
    create_topic(bs, kept, 1, topic_config)
    produce(bs, gone, 2000, 1)
    produce(bs, kept, 2000, 1)
    wait_until(lambda: all(tier_counts(b, t)[0]["both"] >= 5 for t in (gone, kept)), 60, "copies")
    assert any(f.split("/")[1].startswith(gone) for f in tier_files())

    a = AdminClient({"bootstrap.servers": bs})
    a.delete_topics([gone], request_timeout=CLIENT_TIMEOUT_S)[gone].result(timeout=CLIENT_TIMEOUT_S)
    wait_until(lambda: not any(f.split("/")[1].startswith(gone) for f in tier_files()), 30,
               "the deleted topic's copies to go")

    # A copy under this cluster's prefix that no manifest names is deleted
    # once older than the grace; the live topic's copies stay.
    live = [f for f in tier_files() if f.endswith(".log")]
    cluster = live[0].split("/")[0]
    orphan = f"{cluster}/{kept}-0000/0/00000000000000000000-feed"
    for suffix in ("log", "index", "timeindex"):
        if kind == "s3":
            s3 = request.getfixturevalue("s3server")
            s3.client().put(s3.bucket, f"{orphan}.{suffix}", b"x")
        else:
            root = tmp_path / ("capacity" if kind == "capacity" else "remote")
            path = root / f"{orphan}.{suffix}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
    wait_until(lambda: not any(f.startswith(orphan) for f in tier_files()), 30, "the orphan to be swept")
    # The sweep counts an orphan once all its files are deleted.
    wait_until(lambda: stats(b)["tiers"]["orphans_deleted"] >= 1, 10, "the sweep to count the orphan")
    assert set(live) <= set(tier_files()), "live copies are never swept"
    check_all(bs, kept, 2000, 1)


def test_object_store_outage_does_not_stop_produce_or_tail_reads(broker_factory, request, tmp_path):
    sets, topic_config, tier_files = tier_setup("s3", request, tmp_path)
    s3 = request.getfixturevalue("s3server")
    b = broker_factory({**sets, "keel.tier.fast.max.bytes": str(4 * SEGMENT)})
    bs, topic = b.bootstrap, unique("tierout")
    create_topic(bs, topic, 1, topic_config)
    produce(bs, topic, 2000, 1)
    wait_until(lambda: tier_counts(b, topic)[0]["cold"] >= 3, 60, "first moves")

    s3.stop()
    produce(bs, topic, 6000, 1)  # the same records again, offsets 2000..7999
    wait_until(lambda: stats(b)["tiers"]["copy_failures"] > 0, 30, "a failed copy")
    t = stats(b)["tiers"]
    assert t["last_error"] and t["backoff_ms"] > 0, t
    assert t["fast_over_budget"], t
    # The tail is served from the fast tier meanwhile.
    got = consume_range(bs, topic, [0], 1000, start_offset=7000)[0]
    assert got[0].offset() == 7000 and got[-1].offset() == 7999

    s3.start()
    wait_until(lambda: not stats(b)["tiers"]["fast_over_budget"] and tier_counts(b, topic)[0]["copying"] == 0,
               90, "moves to resume after the object store returns")
    assert tier_counts(b, topic)[0]["cold"] > 5
    got = consume_range(bs, topic, [0], 8000, timeout_s=120)[0]
    values = [m.value() for m in got]
    want = [r["value"] for r in records(2000, 1)] + [r["value"] for r in records(6000, 1)]
    assert values == want


def test_tier_settings_are_checked(broker_factory, tmp_path):
    b = broker_factory({})
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    fs = a.create_topics([NewTopic(unique("noremote"), 1, 1, config={"remote.storage.enable": "true"})],
                         request_timeout=CLIENT_TIMEOUT_S)
    err = next(iter(fs.values())).exception(timeout=CLIENT_TIMEOUT_S)
    assert err is not None and "keel.tier.remote" in str(err), err

    for bad in ("ftp://nowhere", "file://relative/dir", "s3://"):
        out = subprocess.run([str(b.bin), "serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
                              "--set", f"keel.tier.remote={bad}"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and "keel.tier.remote" in out.stdout + out.stderr, (bad, out)
    # The fast tier, a capacity dir nested in it (or holding it), or a file://
    # store inside it: each would see the other's files, so start-up refuses.
    for setting in (f"keel.tier.capacity.dirs={tmp_path / 'd'}",
                    f"keel.tier.capacity.dirs={tmp_path / 'd' / 'cold'}",
                    f"keel.tier.capacity.dirs={tmp_path}",
                    f"keel.tier.remote=file://{tmp_path / 'd' / 'bucket'}"):
        out = subprocess.run([str(b.bin), "serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
                              "--set", setting],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and "log.dirs" in out.stdout + out.stderr, (setting, out)
        assert not (tmp_path / "d" / "cold").exists()


@pytest.mark.parametrize("kind", TIERS)
def test_read_committed_reads_of_cold_segments_skip_aborted_transactions(kind, broker_factory, request, tmp_path):
    """Aborted transactions in segments that moved to a colder tier stay
    hidden from read_committed readers, before and after a restart: their
    aborted-transaction index goes with them (`<object>.txnindex`, and the
    manifest)."""
    from test_transactions import _read_all, _txn_producer
    sets, topic_config, tier_files = tier_setup(kind, request, tmp_path)
    b = broker_factory({**sets, "keel.tier.fast.max.bytes": str(2 * SEGMENT)})
    bs, topic = b.bootstrap, unique("txtier")
    create_topic(bs, topic, 1, topic_config)
    p = _txn_producer(bs, unique("tx"), **{"batch.size": 4096})
    committed = []
    for round_ in range(12):
        p.begin_transaction()
        values = [(b"r%02d-%03d-" % (round_, i)) * 30 for i in range(40)]
        for v in values:
            p.produce(topic, value=v)
        p.flush(CLIENT_TIMEOUT_S)
        if round_ % 3 == 1:
            p.abort_transaction(CLIENT_TIMEOUT_S)
        else:
            p.commit_transaction(CLIENT_TIMEOUT_S)
            committed += values
    wait_until(lambda: tier_counts(b, topic)[0]["cold"] >= 4, 60, "segments to go cold")
    assert any(f.endswith(".txnindex") for f in tier_files()), tier_files()
    for attempt in ("before", "after"):
        assert _read_all(bs, topic, "read_committed") == committed, f"{attempt} the restart"
        assert len(_read_all(bs, topic, "read_uncommitted")) == 12 * 40
        b.restart()


def test_remote_storage_read_only_and_turned_off_with_its_data(broker_factory, request, tmp_path):
    """Kafka's two ways out of a topic's remote storage (KIP-950):
    `remote.log.copy.disable=true` keeps the copies readable and makes no
    more; `remote.storage.enable=false` only together with
    `remote.log.delete.on.disable=true`, which deletes the copies and the
    offsets held only there. Turning it off alone is refused."""
    sets, topic_config, tier_files = tier_setup("file", request, tmp_path)
    b = broker_factory({**sets, "keel.tier.fast.max.bytes": str(4 * SEGMENT)})
    bs, topic, n = b.bootstrap, unique("tier-off"), 6000
    create_topic(bs, topic, 1, topic_config)
    every = list(records(n, 1))
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 5, "batch.size": 4096})
    log = DeliveryLog()
    produce_all(p, every[:n // 2], log, topic)
    log.check()
    wait_until(lambda: tier_counts(b, topic)[0]["cold"] >= 3, 60, "segments only in the object store")
    admin = AdminClient({"bootstrap.servers": bs})

    def alter(**changes):
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
            ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
            for k, v in changes.items()])
        return admin.incremental_alter_configs([res])[res].result(CLIENT_TIMEOUT_S)

    def refused(**changes) -> str:
        with pytest.raises(KafkaException) as e:
            alter(**changes)
        assert e.value.args[0].code() == KafkaError.INVALID_CONFIG, e.value
        return e.value.args[0].str()

    # Read-only: the local log must then keep everything retention keeps.
    why = refused(remote_log_copy_disable="true", local_retention_ms="60000")
    assert "When `remote.log.copy.disable` is set to true, the `local.retention.ms`" in why, why
    alter(remote_log_copy_disable="true")
    copies = lambda: sum(tier_counts(b, topic)[0][k] for k in ("both", "cold", "copying"))  # noqa: E731
    # The pass under way may finish the copy it had begun; the one after
    # it started under the new config.
    passes_after(b, 2)
    made = copies()
    produce_all(p, every[n // 2:], log, topic)
    log.check()
    passes_after(b, 10)
    assert copies() == made, "copies made with remote.log.copy.disable=true"
    check_all(bs, topic, n, 1)

    # Off alone is refused with Kafka's message, which names both ways out.
    why = refused(remote_storage_enable="false")
    assert "It is invalid to disable remote storage without deleting remote data." in why, why
    assert "remote.log.delete.on.disable=true" in why, why
    # Off with deletion: the copies go, and the offsets only they held.
    alter(remote_storage_enable="false", remote_log_delete_on_disable="true")
    wait_until(lambda: tier_files() == [], 30, "the object store's copies deleted")
    # The mover forgets a deleted copy's manifest entry just after deleting
    # the object.
    wait_until(lambda: tier_counts(b, topic)[0]["deleting"] == 0, 30, "the deleted copies forgotten")
    counts = tier_counts(b, topic)[0]
    assert counts["both"] == counts["cold"] == counts["deleting"] == 0, counts
    start = next(q["log_start_offset"] for q in stats(b)["partitions"] if q["topic"] == topic)
    assert 0 < start < n // 2, start
    check_all(bs, topic, n, 1, start={0: start})
    c = consumer(bs)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=CLIENT_TIMEOUT_S) == (start, n)
    finally:
        c.close()
    configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    described = next(iter(configs.values())).result(CLIENT_TIMEOUT_S)
    assert (described["remote.storage.enable"].value, described["remote.log.delete.on.disable"].value) == \
        ("false", "true")


def test_a_group_behind_keeps_the_segments_it_is_about_to_read_on_the_fast_tier(broker_factory, request,
                                                                                 tmp_path):
    """Reader-aware tiering: a group that committed offset 0 (recently, so
    it is a reader) holds the oldest local segment it has yet to read on the
    fast tier past the topic's local.retention.bytes, and so everything after
    it; a topic nobody reads goes down to its local retention as before. The
    group then reads its whole range from the fast tier, none of it from the
    capacity tier, and the segments go once it has passed them."""
    sets, topic_config, _ = tier_setup("capacity", request, tmp_path)
    b = broker_factory(sets)
    bs, read, unread, n = b.bootstrap, unique("held"), unique("unheld"), 3000
    configs = {**topic_config, "local.retention.bytes": str(2 * SEGMENT)}
    create_topic(bs, read, 1, configs)
    create_topic(bs, unread, 1, configs)
    group = unique("lagging")
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(read, 0, 0)], asynchronous=False)
    produce(bs, read, n, 1)
    produce(bs, unread, n, 1)

    wait_until(lambda: tier_counts(b, unread)[0]["cold"] >= 20, 60, "the unread topic released")
    passes_after(b, 3)
    t = stats(b)["tiers"]
    if t["fast_fs_free_bytes"] < 0.05 * t["fast_fs_total_bytes"]:
        pytest.skip("the fast tier's filesystem is under 5 % free here: readers hold nothing then, by design")
    held = tier_counts(b, read)[0]
    assert held["cold"] == 0, held
    assert held["held_for_reader"]["base_offset"] == 0, held
    assert held["held_for_reader"]["reader"] == f"group {group}", held
    assert stats(b)["tiers"]["reader_holds"] >= 1

    c.assign([TopicPartition(read, 0, 0)])
    expected = list(records(n, 1))
    for off in range(n):
        m = c.poll(30)
        assert m is not None and not m.error(), (off, m and m.error())
        assert (m.offset(), m.value()) == (off, expected[off]["value"])
    c.commit(offsets=[TopicPartition(read, 0, n)], asynchronous=False)
    c.close()
    s = stats(b)
    [part] = [p for p in s["partitions"] if p["topic"] == read]
    print(f"read {part['tiers']['held_read_bytes']} bytes from held segments, "
          f"{s['tiers']['read_bytes']} from the capacity tier")
    assert part["tiers"]["held_read_bytes"] > 0, part["tiers"]
    assert s["tiers"]["read_bytes"] == 0, s["tiers"]
    assert s["tiers"]["reader_hold_overrides"] == 0, s["tiers"]
    wait_until(lambda: tier_counts(b, read)[0]["cold"] >= 20, 60, "the read topic released once passed")
    # The mover may reuse the groups' commits it read for up to 10 s
    # (when reading them was slow): the hold goes once it sees the new one.
    wait_until(lambda: tier_counts(b, read)[0]["held_for_reader"] is None, 60, "the hold gone once passed")


def test_readers_may_take_the_fast_tier_only_a_tenth_over_its_budget(broker_factory, request, tmp_path):
    """A group at offset 0 holds segments, but not past 10 % over
    keel.tier.fast.max.bytes: beyond that the oldest go regardless, each
    counted, and the fast tier comes back within the allowance."""
    sets, topic_config, _ = tier_setup("capacity", request, tmp_path)
    budget = 8 * SEGMENT
    b = broker_factory({**sets, "keel.tier.fast.max.bytes": str(budget)})
    bs, topic = b.bootstrap, unique("overheld")
    create_topic(bs, topic, 1, topic_config)
    c = Consumer({"bootstrap.servers": bs, "group.id": unique("lagging"), "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    c.close()
    produce(bs, topic, 3000, 1)
    wait_until(lambda: tier_counts(b, topic)[0]["cold"] >= 15, 60, "segments released past the allowance")
    passes_after(b, 3)
    t = stats(b)["tiers"]
    assert t["reader_hold_overrides"] >= 15, t
    # Within the budget and its allowance, give or take the active segment.
    assert t["fast_bytes"] <= budget * 1.1 + SEGMENT, t
