"""kcat (librdkafka 2.0.x, older API versions: Metadata v4, ListOffsets v2,
Fetch v11) against a real broker: metadata listing, produce with keys,
headers and every codec, consume byte for byte, relative and timestamp
offsets, offset queries by timestamp, and records crossing between kcat and
confluent-kafka in both directions.

kcat's output is parsed with a -f format that prints key and payload
lengths, so binary keys and payloads (newlines, NUL bytes) compare exactly.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from dataclasses import dataclass

import pytest
from confluent_kafka import Producer

from conftest import unique
from kclient import (CODEC_IDS, DeliveryLog, assert_stored_codec, consume_range, create_topic,
                     produce_all)
from test_produce_fetch import make_records

KCAT = shutil.which("kcat")
KCAT_TIMEOUT_S = 60

# Producer input framing: records end with RS, a key ends with US. The
# generated keys and payloads never contain these two bytes; everything else
# (newlines, NUL, 0xff...) does occur.
RECORD_END = 0x1E
KEY_END = 0x1F
ALPHABET = bytes(b for b in range(256) if b not in (RECORD_END, KEY_END))

# Partition, offset, timestamp, key length, payload length (-1 for NULL),
# then key and payload bytes, then the headers as kcat prints them.
FORMAT = r"%p %o %T %K %S\n%k%s\n%h\n"

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


@pytest.fixture(autouse=True)
def _kcat_installed():
    """CI installs kcat (.ci/run); there a missing kcat is a failure, not a skip."""
    if KCAT is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kcat is not on PATH (CI=true; .ci/run installs it)")
        pytest.skip("kcat is not on PATH")


def kcat(bootstrap: str, *args: str, stdin: bytes | None = None,
         timeout_s: float = KCAT_TIMEOUT_S) -> bytes:
    """Runs kcat to completion; returns stdout, fails the test on a non-zero exit."""
    cmd = [KCAT, "-b", bootstrap, "-m", "10", *args]
    r = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout_s)
    assert r.returncode == 0, (f"{' '.join(cmd)} exited {r.returncode}:\n"
                               + r.stderr.decode(errors="replace"))
    return r.stdout


@dataclass
class Consumed:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: str


def parse_consumed(out: bytes) -> list[Consumed]:
    """Parses kcat output written with FORMAT."""
    recs = []
    pos = 0
    while pos < len(out):
        nl = out.index(b"\n", pos)
        part, off, ts, klen, vlen = (int(x) for x in out[pos:nl].split())
        pos = nl + 1
        key = None if klen < 0 else out[pos:pos + klen]
        pos += max(klen, 0)
        value = None if vlen < 0 else out[pos:pos + vlen]
        pos += max(vlen, 0)
        assert out[pos:pos + 1] == b"\n", f"format out of step at byte {pos}"
        nl = out.index(b"\n", pos + 1)
        headers = out[pos + 1:nl].decode()
        pos = nl + 1
        recs.append(Consumed(part, off, ts, key, value, headers))
    return recs


def consume_all(bootstrap: str, topic: str, *args: str) -> dict[int, list[Consumed]]:
    """kcat -C from the beginning of every partition to its end; partition -> records."""
    out = kcat(bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-f", FORMAT, *args)
    by_part: dict[int, list[Consumed]] = {}
    for r in parse_consumed(out):
        by_part.setdefault(r.partition, []).append(r)
    return by_part


def kcat_records(n: int, seed: int) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) pairs kcat -P -Z can express: NULL keys (no key
    delimiter), NULL values (empty after the key delimiter, with -Z), binary
    and compressible payloads, a few large ones. Never an empty key or value
    (-Z turns those into NULL) and never both NULL."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = None if i % 7 == 3 else bytes(rng.choices(ALPHABET, k=rng.randint(1, 24)))
        if i % 3 == 0:
            value = f"value {i} ".encode() * rng.randint(1, 50)
        else:
            value = bytes(rng.choices(ALPHABET, k=rng.randint(1, 1500)))
        if i % 500 == 250:
            value = bytes(rng.choices(ALPHABET, k=100_000))
        if i % 11 == 5 and key is not None:
            value = None
        out.append((key, value))
    return out


def kcat_input(records) -> bytes:
    parts = []
    for key, value in records:
        if key is not None:
            parts.append(key + bytes([KEY_END]))
        parts.append((value or b"") + bytes([RECORD_END]))
    return b"".join(parts)


def kcat_produce(bootstrap: str, topic: str, partition: int, records, *args: str) -> None:
    kcat(bootstrap, "-P", "-t", topic, "-p", str(partition), "-K", r"\x1f", "-D", r"\x1e",
         "-Z", *args, stdin=kcat_input(records))


def header_csv(headers) -> str:
    """Headers as kcat's %h prints them (n=v CSV, NULL for a null value)."""
    return ",".join(f"{k}={'NULL' if v is None else v.decode()}" for k, v in headers or [])


# ------------------------------------------------------------------- tests

def test_metadata_listing(shared_broker):
    bs = shared_broker.bootstrap
    t3, t1 = unique("kc-md3"), unique("kc-md1")
    create_topic(bs, t3, partitions=3)
    create_topic(bs, t1, partitions=1)

    md = json.loads(kcat(bs, "-L", "-J"))
    assert md["brokers"] == [{"id": 1, "name": bs}]
    assert md["controllerid"] == 1
    topics = {t["topic"]: t for t in md["topics"]}
    for name, n in ((t3, 3), (t1, 1)):
        t = topics[name]
        assert "error" not in t, t
        assert sorted(p["partition"] for p in t["partitions"]) == list(range(n))
        for p in t["partitions"]:
            assert p["leader"] == 1 and p["replicas"] == [{"id": 1}] and p["isrs"] == [{"id": 1}], p

    text = kcat(bs, "-L", "-t", t3).decode()
    assert f'topic "{t3}" with 3 partitions:' in text, text
    for p in range(3):
        assert f"partition {p}, leader 1, replicas: 1, isrs: 1" in text, text

    # A topic that does not exist, with auto-creation off in the request:
    # reported as unknown, and not created.
    missing = unique("kc-missing")
    text = kcat(bs, "-L", "-t", missing, "-X", "allow.auto.create.topics=false").decode()
    assert f'topic "{missing}" with 0 partitions: Broker: Unknown topic or partition' in text, text
    assert missing not in {t["topic"] for t in json.loads(kcat(bs, "-L", "-J"))["topics"]}


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_per_codec(shared_broker, codec):
    """kcat -P with keys, headers and a codec into three partitions; kcat -C
    reads every record back byte for byte at dense offsets."""
    bs = shared_broker.bootstrap
    topic = unique(f"kc-{codec}")
    create_topic(bs, topic, partitions=3)
    sent = {p: kcat_records(400, seed=p * 100 + CODEC_IDS[codec]) for p in range(3)}
    headers = ["-H", "trace=abc-123", "-H", "empty=", "-H", "null"]
    # Idempotence on for half of the codecs: sequence numbers ride along.
    extra = ["-X", "enable.idempotence=true"] if CODEC_IDS[codec] % 2 == 0 else []
    before_ms = int(time.time() * 1000)
    for p, recs in sent.items():
        kcat_produce(bs, topic, p, recs, "-z", codec, *headers, *extra)
    after_ms = int(time.time() * 1000)

    got = consume_all(bs, topic)
    assert sorted(got) == [0, 1, 2]
    for p, recs in sent.items():
        have = got[p]
        assert [r.offset for r in have] == list(range(len(recs))), f"partition {p}: offsets"
        for r, (key, value) in zip(have, recs):
            assert r.key == key, f"partition {p} offset {r.offset}: key differs"
            assert r.value == value, f"partition {p} offset {r.offset}: value differs"
            assert r.headers == "trace=abc-123,empty=,null=NULL", r.headers
            assert before_ms - 1000 <= r.timestamp <= after_ms + 1000, r.timestamp
        assert_stored_codec(bs, topic, p, codec)


def test_confluent_produce_kcat_consume(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("kc-from-ck")
    create_topic(bs, topic, partitions=3)
    records = make_records(3000, seed=31)
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "acks": "all",
                  "compression.type": "zstd", "linger.ms": 5})
    log = DeliveryLog()
    produce_all(p, records, log, topic)
    log.check()
    where = {i: (part, off) for i, part, off in log.acked}

    got = consume_all(bs, topic)
    by_pos = {(r.partition, r.offset): r for rs in got.values() for r in rs}
    assert len(by_pos) == len(records)
    for i, rec in enumerate(records):
        r = by_pos[where[i]]
        assert r.key == rec["key"], f"record {i}: key differs"
        assert r.value == rec["value"], f"record {i}: value differs"
        assert r.headers == header_csv(rec["headers"]), f"record {i}: {r.headers!r}"


def test_kcat_produce_confluent_consume(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("kc-to-ck")
    create_topic(bs, topic, partitions=2)
    sent = {p: kcat_records(300, seed=40 + p) for p in range(2)}
    for p, recs in sent.items():
        kcat_produce(bs, topic, p, recs, "-z", "lz4", "-H", "a=1", "-H", "b=", "-H", "c")
    got = consume_range(bs, topic, range(2), sum(len(r) for r in sent.values()))
    for p, recs in sent.items():
        assert [m.offset() for m in got[p]] == list(range(len(recs)))
        for m, (key, value) in zip(got[p], recs):
            assert (m.key(), m.value()) == (key, value), f"partition {p} offset {m.offset()}"
            assert m.headers() == [("a", b"1"), ("b", b""), ("c", None)], m.headers()


def test_relative_absolute_and_timestamp_offsets(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("kc-offsets")
    create_topic(bs, topic, partitions=2)
    base = int(time.time() * 1000) - 600_000
    p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 0})
    recs = [{"partition": part, "value": f"{part}-{i}".encode(), "timestamp": base + i * 1000}
            for part in range(2) for i in range(10)]
    log = DeliveryLog()
    produce_all(p, recs, log, topic)
    log.check()

    def read(*args):
        out = kcat(bs, "-C", "-t", topic, "-e", "-f", FORMAT, *args)
        return sorted((r.partition, r.offset, r.value) for r in parse_consumed(out))

    # -o -3: the last three of each partition.
    assert read("-o", "-3") == [(part, o, f"{part}-{o}".encode())
                                for part in range(2) for o in range(7, 10)]
    # An absolute offset on one partition.
    assert read("-p", "1", "-o", "8") == [(1, 8, b"1-8"), (1, 9, b"1-9")]
    # From a timestamp (between records 5 and 6) to the end.
    assert read("-o", f"s@{base + 5500}") == [(part, o, f"{part}-{o}".encode())
                                               for part in range(2) for o in range(6, 10)]
    # Up to a timestamp, exclusive.
    assert read("-o", "beginning", "-o", f"e@{base + 2000}") == [
        (part, o, f"{part}-{o}".encode()) for part in range(2) for o in range(2)]
    # -o end with -e: nothing after the end yet.
    assert read("-o", "end") == []

    # -o end without -e: only records produced after kcat found the end.
    # Produce until kcat has two new records, so its start-up time does not
    # matter; whatever it reads must be new.
    cmd = [KCAT, "-b", bs, "-C", "-t", topic, "-p", "0", "-o", "end", "-c", "2", "-f", FORMAT]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        k = 0
        while proc.poll() is None:
            assert time.monotonic() < deadline, "kcat -o end -c 2 did not see new records"
            produce_all(p, [{"partition": 0, "value": f"new{k}".encode()}], DeliveryLog(), topic)
            k += 1
            try:
                proc.wait(timeout=0.3)
            except subprocess.TimeoutExpired:
                pass
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")
    new = parse_consumed(out)
    assert len(new) == 2
    assert all(r.offset >= 10 and r.value.startswith(b"new") for r in new), new
    assert new[1].offset == new[0].offset + 1


def test_query_offsets_by_timestamp(shared_broker):
    bs = shared_broker.bootstrap
    topic = unique("kc-query")
    create_topic(bs, topic, partitions=2)
    base = int(time.time() * 1000) - 600_000
    p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 0})
    recs = [{"partition": part, "value": b"x", "timestamp": base + i * 1000}
            for part in range(2) for i in range(10)]
    log = DeliveryLog()
    produce_all(p, recs, log, topic)
    log.check()

    def query(*specs: tuple[int, int]) -> dict[int, int]:
        args = []
        for part, ts in specs:
            args += ["-t", f"{topic}:{part}:{ts}"]
        out = kcat(bs, "-Q", *args).decode()
        offsets = {}
        for line in out.splitlines():
            # "<topic> [<partition>] offset <offset>"
            name, part, _word, off = line.split()
            assert name == topic, line
            offsets[int(part.strip("[]"))] = int(off)
        return offsets

    assert query((0, base), (1, base + 3500)) == {0: 0, 1: 4}
    assert query((0, base + 9000)) == {0: 9}
    assert query((1, base - 60_000)) == {1: 0}
    # After the last record: no such offset.
    assert query((0, base + 60_000)) == {0: -1}


def test_log_append_time_topic(shared_broker):
    """kcat sees the broker's append time, typed logappend, on a
    message.timestamp.type=LogAppendTime topic."""
    bs = shared_broker.bootstrap
    topic = unique("kc-lat")
    create_topic(bs, topic, partitions=1, config={"message.timestamp.type": "LogAppendTime"})
    before_ms = int(time.time() * 1000)
    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
    kcat_produce(bs, topic, 0, records, "-z", "zstd")
    after_ms = int(time.time() * 1000)
    out = kcat(bs, "-C", "-t", topic, "-e", "-o", "beginning", "-J")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(m["key"], m["payload"]) for m in lines] == [(k.decode(), v.decode()) for k, v in records]
    for m in lines:
        assert m["tstype"] == "logappend", m
        assert before_ms <= m["ts"] <= after_ms, (m["ts"], before_ms, after_ms)
