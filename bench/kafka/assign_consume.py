#!/usr/bin/env python3
"""Consumer throughput without consumer groups: confluent-kafka, assign() every
partition of TOPIC from offset 0, read until COUNT records or a 60 s deadline,
print MB/s and records/s in a ConsumerPerformance-like line.

usage: assign_consume.py BOOTSTRAP TOPIC COUNT
env:   ASSIGN_CONFIG  extra librdkafka settings as a JSON object
       (e.g. {"security.protocol": "ssl", "ssl.ca.location": "ca.pem"})
"""
import json
import os
import sys
import time

from confluent_kafka import Consumer, TopicPartition


def main() -> int:
    bootstrap, topic, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "unused-assign-only",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "fetch.max.bytes": 52428800,
        "max.partition.fetch.bytes": 1048576,
        **json.loads(os.environ.get("ASSIGN_CONFIG") or "{}"),
    })
    md = c.list_topics(topic, timeout=10)
    parts = sorted(md.topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    got = nbytes = 0
    start = time.monotonic()
    deadline = start + 60
    while got < want and time.monotonic() < deadline:
        for m in c.consume(10000, timeout=1.0):
            if m.error():
                raise SystemExit(f"consume error: {m.error()}")
            got += 1
            nbytes += len(m.value() or b"") + len(m.key() or b"")
    secs = time.monotonic() - start
    c.close()
    mb = nbytes / 1048576
    print("assign-consumer: records, MB, seconds, MB/s, records/s")
    print(f"assign-consumer: {got}, {mb:.1f}, {secs:.2f}, {mb / secs:.1f}, {got / secs:.0f}")
    return 0 if got >= want else 1


if __name__ == "__main__":
    sys.exit(main())
