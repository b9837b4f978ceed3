#!/usr/bin/env python3
"""Writes the Apache Kafka segment fixture of `keel segment dump`'s tests
(crates/keel-server/tests/fixtures/kafka-segment/).

Starts Apache Kafka 4.3.1 (bench/kafka/start.sh, jars from
bench/kafka/fetch.sh) on 127.0.0.1 in a temporary directory, creates a
one-partition topic with `index.interval.bytes=1` (so the offset and time
indexes get an entry per batch but the first) and a segment.ms long
enough that one segment holds everything, and produces with
confluent-kafka:

* one batch per codec (none, gzip, snappy, lz4, zstd), three records each,
  with keys and headers, the gzip one null-keyed on its second record;
  the codecs other than none through an idempotent producer;
* one transaction of two records that is committed, then one of two
  records that is aborted (so the segment holds a COMMIT and an ABORT
  control batch, and the `.txnindex` one entry).

Every record carries an explicit timestamp (1_700_000_000_000 + its
number), so the time index is the same on every run. Kafka is then stopped
cleanly (SIGTERM; it trims its index files at shutdown) and the segment's
`.log`, `.index`, `.timeindex` and `.txnindex` are copied out.

Usage (from the repository root):

    python3 tests/tools/make_kafka_segment_fixture.py [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

from conftest import free_port  # noqa: E402

DEFAULT_OUT = REPO / "crates" / "keel-server" / "tests" / "fixtures" / "kafka-segment"
TOPIC = "dump-fixture"
BASE_TS_MS = 1_700_000_000_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
TIMEOUT_S = 30
# The markers carry the broker's clock, years after BASE_TS_MS: without a
# long segment.ms the first marker would roll a new segment.
SEGMENT_MS = str(1000 * 365 * 24 * 3600 * 1000)


class Numbering:
    """Hands out record numbers; a record's timestamp is BASE_TS_MS + its number."""

    def __init__(self) -> None:
        self.n = 0

    def take(self) -> int:
        self.n += 1
        return self.n - 1


def produce_batch(p: Producer, numbers: Numbering, codec: str, count: int) -> None:
    """`count` records that librdkafka sends as one batch (one flush)."""
    for i in range(count):
        n = numbers.take()
        key = None if (codec == "gzip" and i == 1) else b"key-%d" % n
        headers = [("codec", codec.encode()), ("n", b"%d" % n)] if i != 2 else None
        p.produce(TOPIC, value=(b"value-%d-" % n) + codec.encode() * 4, key=key, partition=0,
                  timestamp=BASE_TS_MS + n, headers=headers)
    remaining = p.flush(TIMEOUT_S)
    assert remaining == 0, f"{remaining} records not delivered"


def wait_for_log_end(bootstrap: str, end: int) -> None:
    """Waits until the partition's high watermark is `end`: the markers
    are written by the coordinator after EndTxn is answered."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "dump-fixture-probe"})
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            _low, high = c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=TIMEOUT_S)
            if high == end:
                return
            assert time.monotonic() < deadline, f"high watermark {high}, expected {end}"
            time.sleep(0.1)
    finally:
        c.close()


def produce(bootstrap: str) -> int:
    """Produces everything; returns the log end offset it leads to."""
    numbers = Numbering()
    common = {"bootstrap.servers": bootstrap, "linger.ms": 1000, "batch.num.messages": 100}
    for codec in CODECS:
        idempotent = codec != "none"
        p = Producer({**common, "compression.type": codec, "enable.idempotence": idempotent})
        produce_batch(p, numbers, codec, 3)
    txn = Producer({**common, "transactional.id": "dump-fixture-txn"})
    txn.init_transactions(TIMEOUT_S)
    for commit in (True, False):
        txn.begin_transaction()
        for _ in range(2):
            n = numbers.take()
            txn.produce(TOPIC, value=b"txn-%d" % n, key=b"txn-key-%d" % n, partition=0,
                        timestamp=BASE_TS_MS + n)
        assert txn.flush(TIMEOUT_S) == 0, "transactional records not delivered"
        if commit:
            txn.commit_transaction(TIMEOUT_S)
        else:
            txn.abort_transaction(TIMEOUT_S)
    return numbers.n + 2  # the COMMIT and ABORT markers take an offset each


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kafka-fixture-") as tmp:
        data = Path(tmp) / "kafka"
        port = free_port()
        start = REPO / "bench" / "kafka" / "start.sh"
        stop = REPO / "bench" / "kafka" / "stop.sh"
        subprocess.run([str(start), str(port), str(data)], check=True, env={**os.environ, "KAFKA_HEAP": "512m"})
        try:
            bootstrap = f"127.0.0.1:{port}"
            admin = AdminClient({"bootstrap.servers": bootstrap})
            topic = NewTopic(TOPIC, num_partitions=1, replication_factor=1,
                             config={"index.interval.bytes": "1", "segment.ms": SEGMENT_MS})
            admin.create_topics([topic])[TOPIC].result(TIMEOUT_S)
            wait_for_log_end(bootstrap, produce(bootstrap))
        finally:
            subprocess.run([str(stop), str(data)], check=True)
        partition = data / "logs" / f"{TOPIC}-0"
        print("partition directory:", sorted(f.name for f in partition.iterdir()))
        args.out.mkdir(parents=True, exist_ok=True)
        for suffix in ("log", "index", "timeindex", "txnindex"):
            src = partition / f"{0:020d}.{suffix}"
            if src.exists():
                shutil.copyfile(src, args.out / src.name)
                print(f"{src.name}: {src.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
