"""Apache Kafka's operator tools (from the 4.3.1 jars) against Keel:
`kafka-log-dirs --describe` (LogDirsCommand, DescribeLogDirs, and the same
request on the wire for the fields the tool does not print), and
`kafka-configs` on topics (ConfigCommand: IncrementalAlterConfigs,
DescribeConfigs), with confluent-kafka's AdminClient for the operations the
tool does not send."""
from __future__ import annotations

import json
import os
import re
import urllib.request

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

import kafka_tools
import kafka_wire as w
from conftest import unique, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic
from test_hardening import failpoint

DESCRIBE_LOG_DIRS = 35
KAFKA_STORAGE_ERROR = 56


def clear_failpoints(b) -> None:
    req = urllib.request.Request(f"http://{b.admin}/failpoints/clear", method="POST")
    with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT_S) as r:
        assert r.status == 200


def open_connections(b) -> int:
    """The broker's `keel_connections` gauge."""
    with urllib.request.urlopen(f"http://{b.admin}/metrics", timeout=CLIENT_TIMEOUT_S) as r:
        text = r.read().decode()
    return int(float(re.search(r"^keel_connections (\S+)$", text, re.M).group(1)))


def api_requests(b, api: str) -> int:
    """Requests of `api` the broker has answered (its stage histograms)."""
    with urllib.request.urlopen(f"http://{b.admin}/metrics", timeout=CLIENT_TIMEOUT_S) as r:
        text = r.read().decode()
    pattern = r'keel_request_stage_seconds_count\{[^}]*api="%s"[^}]*stage="total"[^}]*\} (\S+)' % api
    return sum(int(float(v)) for v in re.findall(pattern, text))


def segment_bytes(data_dir, topic: str, partition: int) -> int:
    return sum(f.stat().st_size for f in (data_dir / f"{topic}-{partition}").glob("*.log"))


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, n in counts.items():
        for i in range(n):
            p.produce(topic, value=b"v%05d" % i + b"x" * 1000, partition=partition)
    assert p.flush(CLIENT_TIMEOUT_S) == 0


def test_kafka_log_dirs_describes_the_data_dir_and_each_partitions_bytes(broker):
    topic = unique("logdirs")
    create_topic(broker.bootstrap, topic, partitions=3)
    produce(broker.bootstrap, topic, {0: 300, 1: 40})
    done = kafka_tools.run("org.apache.kafka.tools.LogDirsCommand", "--bootstrap-server", broker.bootstrap,
                           "--describe", "--topic-list", topic)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("{")]
    described = json.loads(line)
    [b] = described["brokers"]
    [d] = b["logDirs"]
    assert d["logDir"] == str(broker.data_dir.resolve()) and d["error"] is None, d
    sizes = {p["partition"]: p["size"] for p in d["partitions"]}
    assert sizes == {f"{topic}-{i}": segment_bytes(broker.data_dir, topic, i) for i in range(3)}, sizes
    assert sizes[f"{topic}-0"] > 300_000 and sizes[f"{topic}-2"] == 0, sizes
    assert all(p["offsetLag"] == 0 and p["isFuture"] is False for p in d["partitions"]), d


def describe_log_dirs_v4(bootstrap: str, topics: dict[str, list[int]] | None) -> dict:
    """DescribeLogDirs v4 on the wire -> the response as a dict."""
    if topics is None:
        body = w.uvarint(0)
    else:
        body = w.uvarint(len(topics) + 1)
        for name, parts in topics.items():
            body += w.compact_string(name) + w.uvarint(len(parts) + 1)
            body += b"".join(w.i32(p) for p in parts) + w.EMPTY_TAGS
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(DESCRIBE_LOG_DIRS, 4, 7) + body + w.EMPTY_TAGS))
        cid, resp = c.recv_response_flexible()
    assert cid == 7
    r = w.Reader(resp)
    out = {"throttle_ms": r.i32(), "error": r.i16(), "dirs": []}
    for _ in range(r.uvarint() - 1):
        d = {"error": r.i16(), "dir": r.take(r.uvarint() - 1).decode(), "partitions": {}}
        for _ in range(r.uvarint() - 1):
            name = r.compact_string()
            for _ in range(r.uvarint() - 1):
                index, size, lag, future = r.i32(), r.i64(), r.i64(), r.i8()
                r.skip_tags()
                d["partitions"][(name, index)] = (size, lag, future)
            r.skip_tags()
        d["total"], d["usable"] = r.i64(), r.i64()
        r.skip_tags()
        out["dirs"].append(d)
    r.skip_tags()
    assert r.done()
    return out


def test_describe_log_dirs_filters_topics_and_reports_the_volume(broker):
    """Null topics describe every partition; a list describes only those
    that exist (unknown topics and partitions are left out, as Kafka does);
    v4 reports the volume's total and usable bytes."""
    a, b = unique("logdirs-a"), unique("logdirs-b")
    create_topic(broker.bootstrap, a, partitions=2)
    create_topic(broker.bootstrap, b, partitions=1)
    produce(broker.bootstrap, a, {1: 20})
    everything = describe_log_dirs_v4(broker.bootstrap, None)
    assert everything["error"] == 0
    [d] = everything["dirs"]
    assert {(a, 0), (a, 1), (b, 0)} <= set(d["partitions"]), d
    assert d["partitions"][(a, 1)] == (segment_bytes(broker.data_dir, a, 1), 0, 0)
    some = describe_log_dirs_v4(broker.bootstrap, {a: [1, 7], "no-such-topic": [0]})
    [d] = some["dirs"]
    assert d["error"] == 0 and d["dir"] == str(broker.data_dir.resolve())
    assert list(d["partitions"]) == [(a, 1)], d
    vfs = os.statvfs(broker.data_dir)
    assert d["total"] == vfs.f_blocks * vfs.f_frsize, d
    assert 0 < d["usable"] <= d["total"], d


# ------------------------------------------------------ topic configs

CONFIGS = "kafka.admin.ConfigCommand"


def kafka_configs(bootstrap: str, *args: str, ok: bool = True):
    done = kafka_tools.run(CONFIGS, "--bootstrap-server", bootstrap, *args)
    if ok:
        assert done.returncode == 0, f"kafka-configs {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done


def kafka_acls(bootstrap: str, *args: str, ok: bool = True):
    """Apache Kafka's `kafka-acls` (AclCommand) against `bootstrap`."""
    done = kafka_tools.run("org.apache.kafka.tools.AclCommand", "--bootstrap-server", bootstrap, *args)
    if ok:
        assert done.returncode == 0, f"kafka-acls {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done


def topic_overrides(bootstrap: str, topic: str) -> dict[str, str]:
    """`kafka-configs --describe` of a topic: its dynamic (overridden) configs."""
    done = kafka_configs(bootstrap, "--describe", "--entity-type", "topics", "--entity-name", topic)
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("  ") and "=" in line:
            key, rest = line.strip().split("=", 1)
            out[key] = rest.split(" sensitive=", 1)[0]
    return out


def delivery_errors(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> list:
    """Produces each record in a batch of its own (max.message.bytes limits
    a batch); returns the delivery errors (None: delivered)."""
    errors = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for key, value in records:
        p.produce(topic, key=key, value=value, partition=0, on_delivery=lambda e, _m: errors.append(e))
        assert p.flush(CLIENT_TIMEOUT_S) == 0
    return errors


def test_kafka_configs_alters_topic_configs_that_apply_at_once_and_persist(broker_factory):
    """`kafka-configs --alter` (IncrementalAlterConfigs) on a topic: the
    request path sees max.message.bytes at once, the open log rolls at the
    new segment.bytes, --delete-config goes back to the default, and the
    overrides survive a kill -9."""
    b = broker_factory({})
    topic = unique("alter")
    create_topic(b.bootstrap, topic, 1)
    alter = ("--alter", "--entity-type", "topics", "--entity-name", topic)
    kafka_configs(b.bootstrap, *alter, "--add-config",
                  "max.message.bytes=4000,segment.bytes=20000,cleanup.policy=[delete,compact]")
    assert topic_overrides(b.bootstrap, topic) == {
        "max.message.bytes": "4000", "segment.bytes": "20000", "cleanup.policy": "delete,compact"}

    [err] = delivery_errors(b.bootstrap, topic, [(b"big", b"x" * 6000)])
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    assert delivery_errors(b.bootstrap, topic, [(b"k%d" % i, b"y" * 3000) for i in range(20)]) == [None] * 20
    segments = list((b.data_dir / f"{topic}-0").glob("*.log"))
    assert len(segments) >= 3, f"20 x 3 KB at segment.bytes=20000 rolled into {len(segments)} segment(s)"

    kafka_configs(b.bootstrap, *alter, "--delete-config", "max.message.bytes")
    assert delivery_errors(b.bootstrap, topic, [(b"big", b"x" * 6000)]) == [None]

    # Acknowledged means saved: a kill -9 right after keeps it.
    b.kill9()
    b.start()
    assert topic_overrides(b.bootstrap, topic) == {"segment.bytes": "20000", "cleanup.policy": "delete,compact"}


def test_bad_topic_config_changes_are_refused_naming_the_key(broker):
    topic = unique("alter-bad")
    create_topic(broker.bootstrap, topic, 1)
    alter = ("--alter", "--entity-type", "topics", "--entity-name", topic)
    for config in ("retention.ms=soon", "no.such.config=1", "segment.bytes=3"):
        done = kafka_configs(broker.bootstrap, *alter, "--add-config", config, ok=False)
        out = done.stdout + done.stderr
        assert done.returncode != 0 and "InvalidConfigurationException" in out, out[-3000:]
        assert config.split("=")[0] in out, out[-3000:]
    assert topic_overrides(broker.bootstrap, topic) == {}
    done = kafka_configs(broker.bootstrap, "--alter", "--entity-type", "topics", "--entity-name",
                         unique("missing"), "--add-config", "retention.ms=1000", ok=False)
    assert done.returncode != 0 and "does not exist" in done.stdout + done.stderr


def test_incremental_alter_configs_append_subtract_validate_only_and_legacy_alter(broker):
    """confluent-kafka's AdminClient: APPEND and SUBTRACT edit a list config
    (and are refused on others), validate_only changes nothing, and the
    legacy AlterConfigs replaces the whole set of overrides."""
    topic = unique("alter-ops")
    create_topic(broker.bootstrap, topic, 1, {"retention.ms": "86400000"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def incremental(entries, validate_only=False):
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        return admin.incremental_alter_configs([res], validate_only=validate_only)[res].result(CLIENT_TIMEOUT_S)

    def error_code(fn) -> int:
        with pytest.raises(KafkaException) as e:
            fn()
        return e.value.args[0].code()

    op = AlterConfigOpType
    incremental([ConfigEntry("cleanup.policy", "compact", incremental_operation=op.APPEND)])
    assert topic_overrides(broker.bootstrap, topic)["cleanup.policy"] == "delete,compact"
    incremental([ConfigEntry("cleanup.policy", "delete", incremental_operation=op.SUBTRACT)])
    assert topic_overrides(broker.bootstrap, topic)["cleanup.policy"] == "compact"
    assert error_code(lambda: incremental([ConfigEntry("retention.ms", "5", incremental_operation=op.APPEND)])) \
        == KafkaError.INVALID_CONFIG

    incremental([ConfigEntry("retention.ms", "1000", incremental_operation=op.SET)], validate_only=True)
    assert topic_overrides(broker.bootstrap, topic)["retention.ms"] == "86400000"
    assert error_code(lambda: incremental([ConfigEntry("retention.ms", "x", incremental_operation=op.SET)],
                                          validate_only=True)) == KafkaError.INVALID_CONFIG

    res = ConfigResource(ResourceType.TOPIC, topic, set_config={"segment.ms": "600000"})
    admin.alter_configs([res])[res].result(CLIENT_TIMEOUT_S)
    assert topic_overrides(broker.bootstrap, topic) == {"segment.ms": "600000"}


def test_a_config_change_that_cannot_be_saved_changes_nothing(broker_factory):
    """The topic's description is written before anything changes: when
    the write fails (ENOSPC through the storage seam) the alter answers
    KAFKA_STORAGE_ERROR and neither the description nor the live topic
    has the new value; once the disk has room the same change goes in."""
    b = broker_factory({}, env={"KEEL_FAILPOINTS": "1"})
    topic = unique("alter-enospc")
    create_topic(b.bootstrap, topic, 1)
    failpoint(b, f"write enospc path=__keel_meta/topics/{topic}")
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "4000", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as e:
        admin.incremental_alter_configs([res])[res].result(CLIENT_TIMEOUT_S)
    assert e.value.args[0].code() == KafkaError.KAFKA_STORAGE_ERROR, e.value
    assert topic_overrides(b.bootstrap, topic) == {}
    assert delivery_errors(b.bootstrap, topic, [(b"big", b"x" * 6000)]) == [None]
    clear_failpoints(b)
    admin.incremental_alter_configs([res])[res].result(CLIENT_TIMEOUT_S)
    assert topic_overrides(b.bootstrap, topic) == {"max.message.bytes": "4000"}


def test_describe_log_dirs_reports_an_offline_dir_as_kafka_does(broker_factory):
    """After a failed fsync the data dir is offline: DescribeLogDirs says
    KAFKA_STORAGE_ERROR for it and lists nothing in it."""
    b = broker_factory({}, env={"KEEL_FAILPOINTS": "1"})
    topic = unique("logdirs-offline")
    create_topic(b.bootstrap, topic, 1, {"flush.messages": "1"})
    produce(b.bootstrap, topic, {0: 5})
    failpoint(b, f"sync eio path={topic}-0 times=1")
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "message.timeout.ms": 3000})
    p.produce(topic, value=b"x", partition=0)
    p.flush(10)

    def offline():
        [d] = describe_log_dirs_v4(b.bootstrap, None)["dirs"]
        return d if d["error"] == KAFKA_STORAGE_ERROR else None
    d = wait_until(offline, 30, "the log dir to be reported offline")
    assert d["partitions"] == {} and d["dir"] == str(b.data_dir.resolve()), d


def test_kafka_leader_election_finds_every_leader_already_elected(broker):
    """`kafka-leader-election` (ElectLeaders): one broker holds the only,
    preferred replica, so every named partition answers
    ELECTION_NOT_NEEDED, which the tool reports as already elected; an
    unknown partition is UNKNOWN_TOPIC_OR_PARTITION; all partitions at once
    list none (Kafka leaves out partitions that needed no election)."""
    topic = unique("elect")
    create_topic(broker.bootstrap, topic, 2)
    tool = "org.apache.kafka.tools.LeaderElectionCommand"
    for election in ("preferred", "unclean"):
        done = kafka_tools.run(tool, "--bootstrap-server", broker.bootstrap, "--election-type", election,
                               "--topic", topic, "--partition", "1")
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        assert "Valid replica already elected for partitions" in out and f"{topic}-1" in out, out
    done = kafka_tools.run(tool, "--bootstrap-server", broker.bootstrap, "--election-type", "preferred",
                           "--topic", topic, "--partition", "7")
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "UnknownTopicOrPartitionException" in out, out[-3000:]
    done = kafka_tools.run(tool, "--bootstrap-server", broker.bootstrap, "--election-type", "preferred",
                           "--all-topic-partitions")
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Successfully elected" not in out, out[-3000:]


def test_kafka_topics_describe_pages_through_topic_partitions(broker):
    """`kafka-topics --describe` (Admin.describeTopics, DescribeTopicPartitions
    in Kafka 4.x) with two partitions per response: the tool follows the
    cursor across partitions and topics and lists every partition once."""
    a, b = unique("dtp-a"), unique("dtp-b")
    create_topic(broker.bootstrap, a, 5)
    create_topic(broker.bootstrap, b, 3)
    tool = "org.apache.kafka.tools.TopicCommand"

    def described(*args: str) -> dict[str, list[int]]:
        done = kafka_tools.run(tool, "--bootstrap-server", broker.bootstrap, "--describe",
                               "--partition-size-limit-per-response", "2", *args)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        parts: dict[str, list[int]] = {}
        for line in done.stdout.splitlines():
            fields = dict(re.findall(r"(\w+): (\S*)", line))
            if "Partition" in fields:
                assert (fields["Leader"], fields["Replicas"], fields["Isr"]) == ("1", "1", "1"), line
                parts.setdefault(fields["Topic"], []).append(int(fields["Partition"]))
        return parts

    assert described("--topic", a) == {a: [0, 1, 2, 3, 4]}
    # Five partitions, two per response: three DescribeTopicPartitions.
    assert api_requests(broker, "DescribeTopicPartitions") == 3
    everything = described()
    assert everything[a] == [0, 1, 2, 3, 4] and everything[b] == [0, 1, 2], everything


def test_kafka_configs_changes_a_loggers_level_while_the_broker_runs(broker):
    """`kafka-configs --entity-type broker-loggers` (BROKER_LOGGER): the
    loggers are Keel's crates and modules, with `root`; setting one to DEBUG
    shows that module's debug lines at once, deleting it goes back to the
    root's level, and Kafka's refusals hold."""
    loggers = ("--entity-type", "broker-loggers", "--entity-name", "1")

    def levels() -> dict[str, str]:
        done = kafka_configs(broker.bootstrap, "--describe", *loggers)
        return {k: v for k, v in (line.strip().split(" ", 1)[0].split("=", 1)
                                  for line in done.stdout.splitlines()
                                  if line.startswith("  ") and "=" in line)}

    def refused_connection_logged() -> bool:
        """Sends a frame of negative size (the broker closes the connection,
        saying why at debug level) and says whether the log has that line.
        The broker counts a connection closed after logging why, so once no
        connection is open the line is there if it is ever written."""
        marker = len(broker.log_path.read_text(errors="replace"))
        with w.Conn(broker.bootstrap) as c:
            c.send(b"\xff\xff\xff\xff")
            assert c.closed_by_peer()
        wait_until(lambda: open_connections(broker) == 0, 10, "the broker to finish the connection")
        return "connection closed" in broker.log_path.read_text(errors="replace")[marker:]

    before = levels()
    assert before["root"] == "INFO" and before["keel"] == "INFO", before
    assert not refused_connection_logged()
    kafka_configs(broker.bootstrap, "--alter", *loggers, "--add-config", "keel=DEBUG")
    assert levels()["keel"] == "DEBUG"
    assert refused_connection_logged()
    kafka_configs(broker.bootstrap, "--alter", *loggers, "--delete-config", "keel")
    assert levels()["keel"] == "INFO"
    assert not refused_connection_logged()
    done = kafka_configs(broker.bootstrap, "--alter", *loggers, "--add-config", "keel=LOUD", ok=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "InvalidConfigurationException" in out, out[-3000:]
    assert "not a supported log level" in out, out[-3000:]
    # The tool itself refuses loggers the broker does not list.
    done = kafka_configs(broker.bootstrap, "--alter", *loggers, "--add-config",
                         "kafka.server.ReplicaManager=DEBUG", ok=False)
    assert done.returncode != 0 and "Invalid broker logger(s)" in done.stdout + done.stderr
    done = kafka_configs(broker.bootstrap, "--alter", *loggers, "--delete-config", "root", ok=False)
    assert done.returncode != 0 and "root logger is not allowed" in done.stdout + done.stderr


def list_config_resources(bootstrap: str, version: int, types: list[int]) -> tuple[int, list[tuple[str, int | None]]]:
    """ListConfigResources (74) on the wire: -> (error code, [(name, type)])."""
    body = (w.compact_array([w.i8(t) for t in types]) if version >= 1 else b"") + w.EMPTY_TAGS
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(74, version, 3) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()
    error, out = r.i16(), []
    for _ in range(r.uvarint() - 1):
        name = r.compact_string()
        kind = r.i8() if version >= 1 else None
        r.skip_tags()
        # Kafka lists its internal topics too; Keel has none.
        if not name.startswith("__"):
            out.append((name, kind))
    return error, out


def test_list_config_resources_answers_as_kafka_does(broker):
    """What Kafka 4.3.1 answers (probed on it): v1 lists the broker's
    logger, the broker and every topic, or the types asked; client metrics
    and groups list nothing without their configs; another type is
    UNSUPPORTED_VERSION. v0 lists client metrics resources only."""
    create_topic(broker.bootstrap, "listed-b", partitions=1)
    create_topic(broker.bootstrap, "listed-a", partitions=1)
    node = "1"
    assert list_config_resources(broker.bootstrap, 1, []) == (
        0, [(node, 8), (node, 4), ("listed-a", 2), ("listed-b", 2)])
    assert list_config_resources(broker.bootstrap, 1, [2, 32]) == (0, [("listed-a", 2), ("listed-b", 2)])
    assert list_config_resources(broker.bootstrap, 1, [4]) == (0, [(node, 4)])
    assert list_config_resources(broker.bootstrap, 1, [16]) == (0, [])
    for other in (0, 1, 99):
        assert list_config_resources(broker.bootstrap, 1, [other]) == (35, [])
    assert list_config_resources(broker.bootstrap, 0, []) == (0, [])
    done = kafka_tools.run("org.apache.kafka.tools.ClientMetricsCommand", "--bootstrap-server", broker.bootstrap,
                           "--list")
    assert done.returncode == 0, done.stderr[-3000:]
