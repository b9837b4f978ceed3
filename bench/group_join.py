#!/usr/bin/env python3
"""Time from three consumers joining a group to all three receiving records,
for Keel and Apache Kafka, with the same client (confluent-kafka), same run.

Each broker runs alone (never both at once). Per round: a fresh group of
three confluent-kafka consumers subscribes at once to a 6-partition topic
that already holds records; the time from subscribe() to the moment the last
of the three has its first record is one sample. Rounds are repeated with
`group.initial.rebalance.delay.ms` at Kafka's default (3000) and at 0 (the
protocol's own cost). A benchmark, not a test: it prints numbers and
asserts none.

usage: bench/group_join.py [--rounds R] [--json FILE]
The keel binary defaults to target/release/keel (build it with
`cargo build --release -p keel-server`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from throughput import free_port, wait_port  # noqa: E402

PARTITIONS = 6
MEMBERS = 3


def start_kafka(delay_ms: int):
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="kafka-join-"))
    env = dict(os.environ, KAFKA_EXTRA_PROPS=f"group.initial.rebalance.delay.ms={delay_ms}")
    subprocess.run([str(HERE / "kafka" / "start.sh"), str(port), str(data)], check=True,
                   stdout=subprocess.DEVNULL, env=env)

    def stop():
        subprocess.run([str(HERE / "kafka" / "stop.sh"), str(data)], stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)
    return f"127.0.0.1:{port}", stop


def start_keel(keel: str, delay_ms: int):
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="keel-join-"))
    proc = subprocess.Popen([keel, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
                             "--set", f"group.initial.rebalance.delay.ms={delay_ms}",
                             "--set", "keel.admin.listen="],
                            stderr=subprocess.DEVNULL)
    wait_port(port)

    def stop():
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)
    return f"127.0.0.1:{port}", stop


def prepare(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for part in range(PARTITIONS):
        for i in range(100):
            p.produce(topic, value=b"x" * 100, partition=part)
    p.flush(30)


def one_round(bootstrap: str, topic: str, group: str) -> float:
    """Seconds from subscribe() to the last member's first record."""
    consumers = [Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                           "auto.offset.reset": "earliest", "enable.auto.commit": False})
                 for _ in range(MEMBERS)]
    # Metadata first, so connection setup is not counted in the join.
    for c in consumers:
        c.list_topics(topic, timeout=30)
    first_record = [None] * MEMBERS
    start = threading.Barrier(MEMBERS + 1)
    t0 = [0.0]

    def run(i: int, c: Consumer):
        start.wait()
        c.subscribe([topic])
        deadline = time.monotonic() + 60
        while first_record[i] is None and time.monotonic() < deadline:
            m = c.poll(0.05)
            if m is not None and not m.error():
                first_record[i] = time.monotonic()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(consumers)]
    for t in threads:
        t.start()
    t0[0] = time.monotonic()
    start.wait()
    for t in threads:
        t.join()
    for c in consumers:
        c.close()
    if any(f is None for f in first_record):
        raise SystemExit("a member received nothing within 60 s")
    return max(first_record) - t0[0]


def measure(name: str, start_fn, delays, rounds: int) -> dict:
    out = {}
    for delay in delays:
        bootstrap, stop = start_fn(delay)
        try:
            topic = f"join-{delay}"
            prepare(bootstrap, topic)
            one_round(bootstrap, topic, "warmup")
            samples = [one_round(bootstrap, topic, f"g-{delay}-{r}") for r in range(rounds)]
        finally:
            stop()
        out[delay] = samples
        print(f"{name:5} delay {delay:4} ms: " + " ".join(f"{s:.3f}" for s in samples), file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keel", default=str(REPO / "target" / "release" / "keel"))
    ap.add_argument("--json")
    args = ap.parse_args()
    delays = [3000, 0]
    keel = measure("keel", lambda d: start_keel(args.keel, d), delays, args.rounds)
    kafka = measure("kafka", start_kafka, delays, args.rounds)
    print(f"three confluent-kafka consumers, {PARTITIONS} partitions: seconds from subscribe() "
          f"to the last member's first record (median of {args.rounds}; min..max)")
    print(f"{'initial delay':>14} | {'Keel':>22} | {'Kafka 4.3.1':>22} | Keel/Kafka")
    rows = []
    for d in delays:
        k, a = keel[d], kafka[d]
        mk, ma = statistics.median(k), statistics.median(a)
        rows.append({"initial_delay_ms": d, "keel_s": k, "kafka_s": a,
                     "keel_median_s": mk, "kafka_median_s": ma, "ratio": mk / ma})
        print(f"{d:>11} ms | {mk:7.3f} ({min(k):.3f}..{max(k):.3f}) | "
              f"{ma:7.3f} ({min(a):.3f}..{max(a):.3f}) | {mk / ma:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
