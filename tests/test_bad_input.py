"""Malformed and unusual frames on raw sockets. After each, the broker must
still be alive and a fresh confluent-kafka client must produce and consume."""
from __future__ import annotations

import struct
import threading
import time

import pytest
from confluent_kafka import Producer

import kafka_wire as w
from conftest import unique
from kclient import DeliveryLog, consume_range, create_topic, produce_all

CORRUPT_MESSAGE = 2
UNSUPPORTED_VERSION = 35
# What a client needs from us at minimum, with the versions it must accept.
REQUIRED_APIS = {w.PRODUCE: 3, w.FETCH: 4, w.LIST_OFFSETS: 1, w.METADATA: 1, w.API_VERSIONS: 3}


def assert_healthy(b):
    """The broker process is up and serves a fresh client end to end."""
    assert b.alive(), "broker process died:\n" + b.log_tail()
    topic = unique("health")
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "message.timeout.ms": 10000})
    log = DeliveryLog()
    produce_all(p, [{"value": b"still alive", "partition": 0}], log, topic, timeout_s=15)
    log.check()
    got = consume_range(b.bootstrap, topic, [0], 1, timeout_s=15)
    assert got[0][0].value() == b"still alive"


@pytest.fixture(scope="module")
def b(shared_broker):
    return shared_broker


# ------------------------------------------------------------- framing

def test_partial_length_prefix_then_close(b):
    with w.Conn(b.bootstrap) as c:
        c.send(b"\x00\x00")
    assert_healthy(b)


def test_frame_shorter_than_request_header(b):
    # A complete 2-byte frame cannot hold api key + version + correlation id.
    with w.Conn(b.bootstrap) as c:
        c.send(w.i32(2) + b"\x00\x12")
        assert c.closed_by_peer()
    assert_healthy(b)


def test_truncated_frame_then_close(b):
    full = w.api_versions_request(2, 7)
    with w.Conn(b.bootstrap) as c:
        c.send(w.i32(100) + full[4:])  # promises 100 bytes, sends fewer, closes
    assert_healthy(b)


@pytest.mark.parametrize("length", [0x7FFFFFFF, 2_000_000_000, -1, -0x80000000])
def test_huge_or_negative_length_prefix_is_closed(b, length):
    with w.Conn(b.bootstrap) as c:
        c.send(struct.pack(">i", length) + b"\x00\x12\x00\x00\x00\x00\x00\x01")
        assert c.closed_by_peer()
    assert_healthy(b)


def test_unknown_api_key(b):
    # Kafka cannot even parse a header for an unknown key and closes the
    # connection; answering with an error is acceptable too. Hanging is not.
    with w.Conn(b.bootstrap, timeout_s=5) as c:
        c.send(w.frame(w.header_v1(9999, 0, 42) + b"\x00" * 16))
        try:
            cid, _body = c.recv_response()
            assert cid == 42
        except ConnectionError:
            pass
    assert_healthy(b)


def test_a_refused_api_is_logged_once_per_client_and_api(broker):
    """A request for an API Keel does not have (DescribeQuorum, key 55), or
    for a version it does not serve, closes the connection, as Kafka does;
    the broker says so at info with the client id, once per client id and
    API, however often the client tries."""
    if not broker.has_admin:
        pytest.skip("reads Keel's log")
    client = unique("probe")

    def refused(api_key: int, version: int, client_id: str):
        with w.Conn(broker.bootstrap, timeout_s=5) as c:
            c.send(w.frame(w.header_v1(api_key, version, 9, client_id) + b"\x00" * 16))
            assert c.closed_by_peer()

    for _ in range(3):
        refused(55, 0, client)
    refused(w.METADATA, 99, client)
    refused(55, 0, client + "-other")
    assert_healthy(broker)
    lines = [line for line in broker.log_tail(200_000).splitlines() if "does not serve" in line]
    mine = [line for line in lines if f"client_id={client} " in line or f'client_id="{client}"' in line]
    assert len(mine) == 2 and " INFO " in mine[0], lines
    assert any("api=DescribeQuorum" in line for line in mine) and any("Metadata" in line for line in mine), mine
    assert sum(client + "-other" in line for line in lines) == 1, lines


def test_garbage_after_valid_header(b):
    # Metadata v1 header, then a topic array claiming 1,000,000 entries of noise.
    with w.Conn(b.bootstrap, timeout_s=5) as c:
        c.send(w.frame(w.header_v1(w.METADATA, 1, 5) + w.i32(1_000_000) + bytes(range(256)) * 4))
        try:
            cid, _body = c.recv_response()
            assert cid == 5
        except ConnectionError:
            pass
    assert_healthy(b)


def test_pipelined_requests_answer_in_order(b):
    with w.Conn(b.bootstrap) as c:
        c.send(b"".join(w.api_versions_request(v, 100 + v) for v in (0, 1, 2, 3, 0, 3)))
        cids = [c.recv_response()[0] for _ in range(6)]
    assert cids == [100, 101, 102, 103, 100, 103]

# ---------------------------------------------------------- ApiVersions

@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_api_versions_supported(b, version):
    with w.Conn(b.bootstrap) as c:
        c.send(w.api_versions_request(version, 1000 + version))
        cid, body = c.recv_response()   # ApiVersions responses always use header v0
    assert cid == 1000 + version
    err, apis = w.parse_api_versions(body, version)
    assert err == 0
    for key, need in REQUIRED_APIS.items():
        assert key in apis, f"api {key} missing from ApiVersions"
        lo, hi = apis[key]
        assert lo <= need <= hi, f"api {key}: supports {lo}..{hi}, tests need {need}"


def test_api_versions_too_new_gets_v0_error_with_versions(b):
    """KIP-511: unknown ApiVersions version -> v0-format body, UNSUPPORTED_VERSION,
    and at least the ApiVersions range so the client can retry with a version
    we know. (Apache Kafka 4.3 lists only ApiVersions itself, 0..4, here.)"""
    with w.Conn(b.bootstrap) as c:
        c.send(w.api_versions_request(99, 77))
        cid, body = c.recv_response()
        assert cid == 77
        err, apis = w.parse_api_versions(body, 0)
        assert err == UNSUPPORTED_VERSION
        assert w.API_VERSIONS in apis and apis[w.API_VERSIONS][1] >= 3
        # The connection stays usable: retry at v3 on the same socket.
        c.send(w.api_versions_request(3, 78))
        cid, body = c.recv_response()
        assert cid == 78 and w.parse_api_versions(body, 3)[0] == 0
    assert_healthy(b)

# --------------------------------------------------------------- Produce

def _topic_with_one_partition(b) -> str:
    t = unique("wire")
    create_topic(b.bootstrap, t, partitions=1)
    return t


def test_hand_built_batch_is_accepted_and_readable(b):
    """Sanity check of kafka_wire's encoder: a correct batch is stored and a
    real client reads it back."""
    t = _topic_with_one_partition(b)
    recs = [(b"k1", b"v1"), (None, b"v2"), (b"k3", None)]
    with w.Conn(b.bootstrap) as c:
        c.send(w.produce_request(7, 9, t, 0, w.record_batch(recs)))
        cid, body = c.recv_response()
    assert cid == 9
    assert w.parse_produce(body, 7) == [(t, 0, 0, 0)]
    got = consume_range(b.bootstrap, t, [0], 3)
    assert [(m.key(), m.value()) for m in got[0]] == recs


@pytest.mark.parametrize("where", ["crc-field", "payload", "last-byte"])
def test_produce_corrupt_crc_is_rejected(b, where):
    t = _topic_with_one_partition(b)
    batch = bytearray(w.record_batch([(b"k", b"value-%d" % i) for i in range(5)]))
    pos = {"crc-field": w.BATCH_CRC_OFFSET + 1, "payload": len(batch) - 12,
           "last-byte": len(batch) - 1}[where]
    batch[pos] ^= 0x5A
    with w.Conn(b.bootstrap) as c:
        c.send(w.produce_request(7, 11, t, 0, bytes(batch)))
        cid, body = c.recv_response()
    assert cid == 11
    [(name, part, err, _base)] = w.parse_produce(body, 7)
    assert (name, part, err) == (t, 0, CORRUPT_MESSAGE)
    # Nothing was appended: the partition is still empty...
    with w.Conn(b.bootstrap) as c:
        c.send(w.fetch_request_v4(12, t, 0, 0, max_wait_ms=0))
        _cid, body = c.recv_response()
    [(_n, _p, ferr, hw, _records)] = w.parse_fetch_v4(body)
    assert (ferr, hw) == (0, 0)
    assert_healthy(b)


@pytest.mark.parametrize("version", [3, 5, 7])
def test_produce_versions(b, version):
    t = _topic_with_one_partition(b)
    with w.Conn(b.bootstrap) as c:
        for i in range(3):
            c.send(w.produce_request(version, 20 + i, t, 0, w.record_batch([(None, b"x%d" % i)] * 2)))
            cid, body = c.recv_response()
            assert cid == 20 + i
            assert w.parse_produce(body, version) == [(t, 0, 0, 2 * i)]


def test_produce_to_unknown_partition(b):
    t = _topic_with_one_partition(b)
    with w.Conn(b.bootstrap) as c:
        c.send(w.produce_request(7, 30, t, 5, w.record_batch([(None, b"x")])))
        _cid, body = c.recv_response()
    [(_n, part, err, _base)] = w.parse_produce(body, 7)
    assert (part, err) == (5, 3)  # UNKNOWN_TOPIC_OR_PARTITION

# ----------------------------------------------------------- Fetch long poll

def test_fetch_long_poll_waits_then_wakes_on_produce(b):
    t = _topic_with_one_partition(b)
    # Nothing to read: the broker holds the fetch for about max_wait.
    with w.Conn(b.bootstrap) as c:
        start = time.monotonic()
        c.send(w.fetch_request_v4(40, t, 0, 0, max_wait_ms=800))
        _cid, body = c.recv_response()
        waited = time.monotonic() - start
    [(_n, _p, err, hw, records)] = w.parse_fetch_v4(body)
    assert (err, hw) == (0, 0) and not records
    assert 0.6 <= waited <= 5, f"empty fetch with max_wait 800 ms returned after {waited:.2f}s"

    # A produce arriving during the wait completes the fetch early.
    result = {}

    def fetch():
        with w.Conn(b.bootstrap, timeout_s=20) as c:
            s = time.monotonic()
            c.send(w.fetch_request_v4(41, t, 0, 0, max_wait_ms=10_000))
            result["body"] = c.recv_response()[1]
            result["secs"] = time.monotonic() - s

    th = threading.Thread(target=fetch)
    th.start()
    time.sleep(0.3)  # let the fetch park first; correctness does not depend on it
    with w.Conn(b.bootstrap) as c:
        c.send(w.produce_request(7, 42, t, 0, w.record_batch([(None, b"wake")])))
        assert w.parse_produce(c.recv_response()[1], 7)[0][2] == 0
    th.join(20)
    assert not th.is_alive()
    [(_n, _p, err, hw, records)] = w.parse_fetch_v4(result["body"])
    assert err == 0 and hw == 1 and records and b"wake" in records
    assert result["secs"] < 5, f"parked fetch took {result['secs']:.2f}s to see new data"
