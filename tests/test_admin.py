"""The admin HTTP endpoint (keel.admin.listen) and `keel stats` against a real
broker, hostile HTTP clients, and the tail cache's promise seen through /stats:
reads at the tail never touch the disk, and a small cache still serves history
correctly from the log files."""
from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from conftest import EXTERNAL_BOOTSTRAP, IMPL, REPO, free_port, unique, wait_until
from kclient import DeliveryLog, consume_range, consumer, create_topic, produce_all

pytestmark = pytest.mark.skipif(IMPL != "keel" or bool(EXTERNAL_BOOTSTRAP),
                                reason="the admin endpoint is keel's own, on a broker the suite starts")

KEEL_BIN = Path(os.environ.get("KEEL_BIN", REPO / "target" / "debug" / "keel"))
# The broker's deadline for a request head to arrive (admin.rs Limits).
HEAD_TIMEOUT_S = 5
# Admin connections the broker serves at once (admin.rs Limits).
ADMIN_CONNECTIONS = 32


# ----------------------------------------------------------------- helpers

def addr(admin: str) -> tuple[str, int]:
    host, port = admin.rsplit(":", 1)
    return host, int(port)


def get(admin: str, path: str, method: str = "GET") -> tuple[int, str, bytes]:
    """(status, content type, body) from Python's own HTTP client."""
    conn = http.client.HTTPConnection(*addr(admin), timeout=10)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        conn.close()


def stats(admin: str) -> dict:
    status, ctype, body = get(admin, "/stats")
    assert (status, ctype) == (200, "application/json"), body
    return json.loads(body)


def partition_stats(admin: str, topic: str, partition: int = 0) -> dict:
    found = [p for p in stats(admin)["partitions"]
             if p["topic"] == topic and p["partition"] == partition]
    assert len(found) == 1, f"{topic}-{partition} not in /stats"
    return found[0]


def recv_all(s: socket.socket) -> bytes:
    """Everything until the server closes (a reset ends it too)."""
    chunks = []
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def raw_exchange(admin: str, data: bytes) -> bytes:
    """Sends raw bytes, half-closes, returns the answer."""
    with socket.create_connection(addr(admin), timeout=HEAD_TIMEOUT_S + 10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        return recv_all(s)


def keel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(KEEL_BIN), *args], capture_output=True, text=True, timeout=60)


def log_bytes(broker, topic: str, partition: int = 0) -> int:
    """Bytes of record batches in the partition's segment files."""
    return sum(f.stat().st_size for f in (broker.data_dir / f"{topic}-{partition}").glob("*.log"))


def make_values(n: int, size: int, seed: int) -> list[bytes]:
    """Distinct, incompressible values: the index, then random bytes."""
    rng = random.Random(seed)
    return [i.to_bytes(4, "big") + rng.randbytes(size - 4) for i in range(n)]


def produce_values(bootstrap: str, topic: str, values: list[bytes], **conf) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "none",
                  "enable.idempotence": True, **conf})
    log = DeliveryLog()
    produce_all(p, ({"key": str(i).encode(), "value": v} for i, v in enumerate(values)), log, topic)
    log.check()
    assert len(log.acked) == len(values)
    for part in {p for _, p, _ in log.acked}:
        offsets = sorted(o for _, p, o in log.acked if p == part)
        assert offsets == list(range(len(offsets))), f"partition {part}"


def check_values(messages, values: list[bytes]) -> None:
    assert [m.offset() for m in messages] == list(range(len(values)))
    for i, m in enumerate(messages):
        assert m.key() == str(i).encode(), f"offset {i}"
        assert m.value() == values[i], f"offset {i}: value differs"


def kafka_still_serves(bootstrap: str) -> None:
    """A fresh topic round-trips 100 records with a real client."""
    topic = unique("alive")
    values = make_values(100, 64, seed=1)
    produce_values(bootstrap, topic, values)
    check_values(consume_range(bootstrap, topic, [0], len(values))[0], values)


# ----------------------------------------------------------------- endpoint

def test_healthz_and_stats(shared_broker):
    admin = shared_broker.admin
    assert get(admin, "/healthz") == (200, "text/plain; charset=utf-8", b"ok\n")
    topic = unique("stats")
    create_topic(shared_broker.bootstrap, topic, partitions=2)
    produce_values(shared_broker.bootstrap, topic, make_values(50, 100, seed=2), partitioner="murmur2")
    st = stats(admin)
    for key in ("budget_bytes", "used_bytes", "cached_batches", "inserted_bytes", "evicted_bytes",
                "evicted_batches", "hit_reads", "hit_bytes", "miss_reads"):
        assert isinstance(st["tail_cache"][key], int), key
    assert st["tail_cache"]["budget_bytes"] > 0
    assert st["tail_cache"]["used_bytes"] <= st["tail_cache"]["budget_bytes"]
    assert set(st["cold_reads"]) >= {"reads", "bytes"}
    mine = [p for p in st["partitions"] if p["topic"] == topic]
    assert [p["partition"] for p in mine] == [0, 1]
    assert sum(p["high_watermark"] for p in mine) == 50
    assert all(p["log_start_offset"] == 0 for p in mine)
    # A query string is ignored; other paths and methods are refused.
    assert get(admin, "/stats?pretty")[0] == 200
    assert get(admin, "/metric")[0] == 404
    assert get(admin, "/")[0] == 404
    assert get(admin, "/stats", method="POST")[0] == 405


def test_keel_stats_prints_table_and_json(shared_broker):
    topic = unique("cli")
    values = make_values(300, 200, seed=3)
    produce_values(shared_broker.bootstrap, topic, values)
    check_values(consume_range(shared_broker.bootstrap, topic, [0], len(values))[0], values)

    r = keel("stats", "--admin", shared_broker.admin, "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    [p] = [p for p in st["partitions"] if p["topic"] == topic]
    assert p["high_watermark"] == 300
    assert p["cache_read_bytes"] + p["cold_read_bytes"] >= log_bytes(shared_broker, topic)

    r = keel("stats", "--admin", shared_broker.admin)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tail cache   budget "), r.stdout
    assert "fetched      from cache " in r.stdout, r.stdout
    header = next(line for line in r.stdout.splitlines() if line.startswith("topic"))
    assert header.split() == ["topic", "partition", "log", "start", "high", "watermark",
                              "cache", "read", "cold", "read", "local", "in", "colder", "tier"], header
    [row] = [line for line in r.stdout.splitlines() if line.startswith(topic + " ")]
    assert row.split()[1:4] == ["0", "0", "300"], row


def test_keel_stats_fails_clearly_when_unreachable():
    nowhere = f"127.0.0.1:{free_port()}"
    for args in (["--admin", nowhere], ["--admin", nowhere, "--json"]):
        r = keel("stats", *args)
        assert r.returncode != 0
        assert r.stdout == ""
        assert f"cannot reach the admin endpoint at {nowhere}" in r.stderr, r.stderr


def test_bad_http_requests_are_refused_and_the_broker_serves_on(shared_broker):
    admin = shared_broker.admin
    rng = random.Random(4)
    cases = {
        "garbage with a head terminator": rng.randbytes(300) + b"\r\n\r\n",
        "garbage, then close": rng.randbytes(5000),
        "a Kafka ApiVersions frame": bytes.fromhex("0000001a00120003000000010006") + b"x" * 16,
        "huge header": b"GET /stats HTTP/1.1\r\nX-Pad: " + b"a" * 64 * 1024 + b"\r\n\r\n",
        "headers without end": b"GET /stats HTTP/1.1\r\n" + b"X-A: b\r\n" * 2000,
        "no version": b"GET /stats\r\n\r\n",
        "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    }
    for what, data in cases.items():
        answer = raw_exchange(admin, data)
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), (what, answer[:200])
        assert b"Connection: close\r\n" in answer, what
    assert raw_exchange(admin, b"GET /nothing-here HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert raw_exchange(admin, b"") == b"", "a connection that says nothing gets nothing"
    assert shared_broker.alive()
    assert get(admin, "/healthz")[0] == 200
    kafka_still_serves(shared_broker.bootstrap)


def test_stalled_requests_are_cut_off_and_kafka_is_unaffected(broker):
    admin = broker.admin
    # More stalled clients than the endpoint serves at once, each with half
    # a request head.
    stalled = []
    for _ in range(ADMIN_CONNECTIONS + 8):
        s = socket.create_connection(addr(admin), timeout=HEAD_TIMEOUT_S + 15)
        s.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\n")
        stalled.append(s)
    started = time.monotonic()
    try:
        # Kafka clients are served while the admin endpoint is being held.
        kafka_still_serves(broker.bootstrap)
        answers = [recv_all(s) for s in stalled]  # the socket timeout fails a hang
    finally:
        for s in stalled:
            s.close()
    elapsed = time.monotonic() - started
    timed_out = [a for a in answers if a.startswith(b"HTTP/1.1 408 ")]
    # The first ones time out with 408; those over the limit were closed on
    # accept. Every stalled connection ended.
    assert ADMIN_CONNECTIONS - 1 <= len(timed_out) <= ADMIN_CONNECTIONS, [a[:40] for a in answers]
    assert all(a in timed_out or a == b"" for a in answers), [a[:40] for a in answers]
    assert elapsed < HEAD_TIMEOUT_S + 10, elapsed
    # Slots free up as the server sees the clients' close.
    wait_until(lambda: get(admin, "/healthz") == (200, "text/plain; charset=utf-8", b"ok\n"),
               10, "the admin endpoint to answer again")
    assert broker.alive()


def test_admin_port_taken_fails_startup_naming_the_key(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        admin = f"127.0.0.1:{taken.getsockname()[1]}"
        r = subprocess.run([str(KEEL_BIN), "serve", "--listen", f"127.0.0.1:{free_port()}",
                            "--data-dir", str(tmp_path / "data"), "--set", f"keel.admin.listen={admin}"],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"keel.admin.listen`: cannot listen on {admin}" in r.stderr, r.stderr


def test_empty_admin_listen_disables_the_endpoint(broker_factory):
    b = broker_factory(sets={"keel.admin.listen": ""})
    assert b.admin is None
    # The broker's log reaches its file a little after its port opens.
    wait_until(lambda: "admin endpoint disabled" in b.log_tail(), 10, "the log line")
    kafka_still_serves(b.bootstrap)


# ----------------------------------------------------------------- tail cache

TAIL_RECORDS = 20_000


def test_reads_right_after_produce_come_from_the_cache(shared_broker):
    bootstrap, admin = shared_broker.bootstrap, shared_broker.admin
    topic = unique("tail-after")
    values = make_values(TAIL_RECORDS, 100, seed=6)
    produce_values(bootstrap, topic, values)
    check_values(consume_range(bootstrap, topic, [0], len(values))[0], values)
    p = partition_stats(admin, topic)
    assert p["high_watermark"] == len(values)
    assert p["cold_read_bytes"] == 0, p
    assert p["cache_read_bytes"] >= log_bytes(shared_broker, topic), p


def wait_for_end_of_partition(c) -> None:
    deadline = time.monotonic() + 30
    while not any(m.error() and m.error().code() == KafkaError._PARTITION_EOF
                  for m in c.consume(100, timeout=0.5)):
        assert time.monotonic() < deadline, "no end-of-partition event"


def consume_n(c, n: int, timeout_s: float = 60) -> list:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        assert time.monotonic() < deadline, f"read {len(got)} of {n}"
        for m in c.consume(5000, timeout=0.5):
            if m.error() and m.error().code() != KafkaError._PARTITION_EOF:
                raise KafkaException(m.error())
            if not m.error():
                got.append(m)
    return got


def test_a_consumer_waiting_at_the_end_reads_from_the_cache(shared_broker):
    bootstrap, admin = shared_broker.bootstrap, shared_broker.admin
    topic = unique("tail-waiting")
    create_topic(bootstrap, topic)
    c = consumer(bootstrap, **{"enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        wait_for_end_of_partition(c)  # it has fetched at the (empty) end
        values = make_values(TAIL_RECORDS, 100, seed=5)
        produce_values(bootstrap, topic, values)
        got = consume_n(c, len(values))
    finally:
        c.close()
    check_values(got, values)
    p = partition_stats(admin, topic)
    assert p["high_watermark"] == len(values)
    assert p["cache_read_bytes"] > 0, p
    assert p["cache_read_bytes"] >= log_bytes(shared_broker, topic), p
    # A fetch at the high watermark answers empty and waits for the append;
    # it never plans a file read that a concurrent append could extend.
    assert p["cold_read_bytes"] == 0, p


def test_small_cache_serves_history_from_disk(broker_factory):
    """10 MB through a 1 MiB cache: history comes back byte for byte from the
    log files, the cache stays within its budget, and cache plus cold bytes
    account for everything read."""
    budget = 1 << 20
    b = broker_factory(sets={"keel.tail.cache.bytes": str(budget)})
    topic = unique("history")
    values = make_values(10_000, 1000, seed=7)
    produce_values(b.bootstrap, topic, values, **{"batch.size": 64 * 1024})
    before = stats(b.admin)["tail_cache"]
    assert before["budget_bytes"] == budget
    assert before["used_bytes"] <= budget
    assert before["evicted_bytes"] > 0

    check_values(consume_range(b.bootstrap, topic, [0], len(values))[0], values)

    st = stats(b.admin)
    cache = st["tail_cache"]
    assert cache["used_bytes"] <= cache["budget_bytes"] == budget
    assert cache["inserted_bytes"] >= log_bytes(b, topic)
    p = partition_stats(b.admin, topic)
    assert p["high_watermark"] == len(values)
    total = log_bytes(b, topic)
    assert total > 10_000_000
    assert p["cold_read_bytes"] > total - 2 * budget, p
    assert p["cache_read_bytes"] + p["cold_read_bytes"] >= total, (p, total)
    assert st["cold_reads"]["bytes"] >= p["cold_read_bytes"]
