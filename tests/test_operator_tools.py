"""Apache Kafka's operator tools (from the 4.3.1 jars) against Keel:
`kafka-log-dirs --describe` (LogDirsCommand, DescribeLogDirs), and the
same request on the wire for the fields the tool does not print."""
from __future__ import annotations

import json
import os

from confluent_kafka import Producer

import kafka_tools
import kafka_wire as w
from conftest import unique
from kclient import CLIENT_TIMEOUT_S, create_topic

DESCRIBE_LOG_DIRS = 35


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
            name = r.take(r.uvarint() - 1).decode()
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
