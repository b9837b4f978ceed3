#!/usr/bin/env python3
"""Page-cache footprint of the data files, and where a backfill's bytes come
from, for Keel and Apache Kafka on the same workload, same run.

Per broker (one at a time): produce `--mb` MB to one partition with
confluent-kafka, wait `--settle` seconds, measure how much of the segment
files sits in the page cache (mmap + mincore over every `.log` file), read
the whole topic from offset 0 with a confluent-kafka consumer, measure
again. For Keel it also reads the broker's counters (admin endpoint
`/stats`): bytes served from the tail cache and from disk. A benchmark, not
a test: it prints numbers and asserts none.

usage: bench/pagecache_backfill.py [--mb 200] [--record-size 200]
                                  [--tail-cache-bytes B] [--skip-kafka] [--json FILE]
The keel binary defaults to target/release/keel.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))
from pagecache import segment_residency  # noqa: E402
from throughput import free_port, wait_port  # noqa: E402

TOPIC = "backfill"


def produce(bootstrap: str, mb: int, size: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the future resolves
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                  "queue.buffering.max.kbytes": 1 << 20})
    n = mb * 1_000_000 // size
    value = b"v" * size
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value=value)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    p.flush(120)
    return n


def backfill(bootstrap: str, n: int) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "backfill", "enable.auto.commit": False,
                  "fetch.max.bytes": 8 << 20, "max.partition.fetch.bytes": 8 << 20})
    c.assign([TopicPartition(TOPIC, 0, 0)])
    started, seen = time.monotonic(), 0
    while seen < n:
        msgs = c.consume(10000, 5)
        seen += sum(1 for m in msgs if not m.error())
    c.close()
    return time.monotonic() - started


def run(name: str, bootstrap: str, data_dir: Path, args, stats_url: str | None) -> dict:
    n = produce(bootstrap, args.mb, args.record_size)
    time.sleep(args.settle)
    r0, total = segment_residency(data_dir)
    before = fetch_stats(stats_url)
    secs = backfill(bootstrap, n)
    r1, total = segment_residency(data_dir)
    after = fetch_stats(stats_url)
    row = {"broker": name, "records": n, "segment_bytes": total,
           "resident_after_produce": r0, "resident_after_backfill": r1,
           "backfill_s": secs, "backfill_mb_s": total / 1e6 / secs}
    if before and after:
        for key, path in [("from_tail_cache", ("tail_cache", "hit_bytes")),
                          ("from_disk", ("cold_reads", "bytes"))]:
            row[key] = after[path[0]][path[1]] - before[path[0]][path[1]]
    print(f"{name}: {row}", file=sys.stderr)
    return row


def fetch_stats(url: str | None) -> dict | None:
    if not url:
        return None
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def with_keel(args) -> dict:
    port, admin = free_port(), free_port()
    data = Path(tempfile.mkdtemp(prefix="keel-pc-", dir=args.dir))
    proc = subprocess.Popen([args.keel, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
                             "--set", f"keel.admin.listen=127.0.0.1:{admin}"]
                            + (["--set", f"keel.tail.cache.bytes={args.tail_cache_bytes}"]
                               if args.tail_cache_bytes is not None else []),
                            stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        return run("keel", f"127.0.0.1:{port}", data, args, f"http://127.0.0.1:{admin}/stats")
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(data, ignore_errors=True)


def with_kafka(args) -> dict:
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="kafka-pc-", dir=args.dir))
    subprocess.run([str(HERE / "kafka" / "start.sh"), str(port), str(data)], check=True, stdout=subprocess.DEVNULL)
    try:
        return run("kafka", f"127.0.0.1:{port}", data / "logs", args, None)
    finally:
        subprocess.run([str(HERE / "kafka" / "stop.sh"), str(data)], stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--record-size", type=int, default=200)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between produce and the first measurement")
    ap.add_argument("--keel", default=str(REPO / "target" / "release" / "keel"))
    ap.add_argument("--tail-cache-bytes", type=int, default=None,
                    help="keel.tail.cache.bytes for Keel (default: Keel's own sizing)")
    ap.add_argument("--skip-kafka", action="store_true")
    ap.add_argument("--dir", default=None, help="where the data dirs go (default: system temp)")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [with_keel(args)] + ([] if args.skip_kafka else [with_kafka(args)])
    mib = 1 << 20
    print(f"{args.mb} MB in {args.record_size}-byte records, one partition; page cache = resident bytes of "
          f"the segment files (mincore)")
    print(f"{'broker':6} | {'segments MiB':>12} | {'cached after produce':>21} | {'cached after backfill':>22} | "
          f"{'from tail cache MiB':>19} | {'from disk MiB':>13} | {'backfill MB/s':>13}")
    for r in rows:
        pct = lambda b: f"{b / mib:7.1f} ({100 * b / max(r['segment_bytes'], 1):3.0f}%)"
        tail = f"{r['from_tail_cache'] / mib:19.1f}" if "from_tail_cache" in r else f"{'-':>19}"
        disk = f"{r['from_disk'] / mib:13.1f}" if "from_disk" in r else f"{'-':>13}"
        print(f"{r['broker']:6} | {r['segment_bytes'] / mib:12.1f} | {pct(r['resident_after_produce']):>21} | "
              f"{pct(r['resident_after_backfill']):>22} | {tail} | {disk} | {r['backfill_mb_s']:13.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
