#!/usr/bin/env python3
"""acks=all produce latency with nothing else running: one record at a
time (linger.ms=0, idempotent, confluent-kafka), the time from produce()
to its acknowledgement, against one Keel node, a 3-broker Keel cluster
(etcd, versitygw: each record in a WAL object in the object store and
committed in etcd before it is acknowledged, docs/cluster.md) and Apache
Kafka (one broker), each started in turn. Prints p50, p99 and max. A
benchmark, not a test: it asserts nothing.

usage: bench/produce_latency.py [--records N] [--keel PATH]
The keel binary defaults to target/release/keel.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402 (beside this file)
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


def latencies(bootstrap: str, records: int) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("latency", 3, 1)])["latency"].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "enable.idempotence": True})
    for i in range(50):  # warm up: metadata, producer id, leaders
        p.produce("latency", b"w", partition=i % 3)
        p.flush(30)
    out = []
    for i in range(records):
        start = time.perf_counter()
        p.produce("latency", b"x" * 100, partition=i % 3)
        p.flush(30)
        out.append((time.perf_counter() - start) * 1000)
    out.sort()
    return f"p50 {out[len(out) // 2]:7.2f} ms   p99 {out[int(len(out) * 0.99)]:7.2f} ms   max {out[-1]:7.2f} ms"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=600)
    ap.add_argument("--keel", default=str(throughput.REPO / "target" / "release" / "keel"))
    args = ap.parse_args()
    for name, runner in (("keel, one node", throughput.with_keel),
                         ("keel, 3-broker cluster", throughput.with_keel_cluster),
                         ("apache kafka, one broker", throughput.with_kafka)):
        print(f"{name:<26} {runner(args, lambda bs: latencies(bs, args.records))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
