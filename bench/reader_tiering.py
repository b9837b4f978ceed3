#!/usr/bin/env python3
"""Reader-aware tiering: what keeping a lagging group's segments on the fast
tier saves, with the feature off and on in one run.

Keel (a release build, --keel-bin) with a capacity tier beside its data dir,
run twice: keel.tier.reader.window.bytes=0 (off), then the default (1 GiB).
Each run: a topic with segment.bytes 16 MiB and local.retention.ms
--local-retention-s (15 s); a consumer group commits offset 0 at the start;
a producer writes --rate-mb MB/s (1 KiB records) for --seconds (90 s); the
group starts reading from its commit --behind-s (45 s) after the producer
and at the producer's rate, so it stays that far behind, past the local
retention, until the producer stops, then catches up. The table gives the
bytes the group read from the capacity tier (/stats tiers.read_bytes) and
from segments kept for it, the fast tier's largest size (/stats read every
2 s), the group's lag, and the records it read (all of them, in order, or
the run fails).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import free_port, wait_port  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECORD = 1024


def stats(admin: str) -> dict:
    with urllib.request.urlopen(f"http://{admin}/stats", timeout=30) as r:
        return json.load(r)


def run(args, window: int, work: Path) -> dict:
    data, capacity = work / f"data-{window}", work / f"capacity-{window}"
    port, admin = free_port(), f"127.0.0.1:{free_port()}"
    sets = {"keel.admin.listen": admin, "keel.tier.capacity.dirs": str(capacity),
            "keel.tier.check.interval.ms": "200", "keel.tier.move.bytes.per.sec": "0",
            "keel.tail.cache.bytes": str(32 << 20), "keel.tier.reader.window.bytes": str(window)}
    cmd = [str(args.keel_bin), "serve", "--listen", f"127.0.0.1:{port}", "--advertised", f"127.0.0.1:{port}",
           "--data-dir", str(data)] + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    with open(work / f"keel-{window}.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, 30)
        return measure(args, f"127.0.0.1:{port}", admin)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(capacity, ignore_errors=True)


def measure(args, bootstrap: str, admin: str) -> dict:
    topic, group = "history", "lagging"
    a = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, 1, 1, config={"segment.bytes": str(16 << 20),
                                        "local.retention.ms": str(int(args.local_retention_s * 1000))})
    a.create_topics([new])[topic].result(30)
    # Committing as consumers do by default: every 5 s.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": True,
                  "auto.commit.interval.ms": 5000, "fetch.max.bytes": 4 << 20})
    c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    total = int(args.rate_mb * 1e6 * args.seconds / RECORD)
    per_s = args.rate_mb * 1e6 / RECORD
    value = b"x" * RECORD
    peak, stop = {"fast": 0}, threading.Event()

    def sample() -> None:
        while not stop.wait(2):
            try:
                peak["fast"] = max(peak["fast"], stats(admin)["tiers"]["fast_bytes"])
            except OSError:
                pass

    def produce() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "1"})
        start = time.monotonic()
        for i in range(total):
            while True:
                try:
                    p.produce(topic, value=value)
                    break
                except BufferError:
                    p.poll(0.01)
            if i % 1000 == 0:
                p.poll(0)
                ahead = i / per_s - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
        p.flush(60)

    threading.Thread(target=sample, daemon=True).start()
    producer = threading.Thread(target=produce)
    started = time.monotonic()
    producer.start()
    time.sleep(args.behind_s)
    before = stats(admin)["tiers"]
    c.assign([TopicPartition(topic, 0, 0)])
    read, lag_max, reading = 0, 0.0, time.monotonic()
    while read < total:
        for m in c.consume(num_messages=1000, timeout=1):
            assert not m.error(), m.error()
            assert m.offset() == read, (m.offset(), read)
            read += 1
        produced = min(total, (time.monotonic() - started) * per_s)
        lag_max = max(lag_max, (produced - read) / per_s)
        # At the producer's rate while it runs: the group stays behind.
        if producer.is_alive():
            ahead = read / per_s - (time.monotonic() - reading)
            if ahead > 0:
                time.sleep(ahead)
        assert time.monotonic() - started < args.seconds * 4 + 120, f"stalled at {read}"
    c.commit(offsets=[TopicPartition(topic, 0, read)], asynchronous=False)
    c.close()
    producer.join()
    stop.set()
    s = stats(admin)
    [part] = [p for p in s["partitions"] if p["topic"] == topic]
    after = s["tiers"]
    return {"records": read, "bytes": read * RECORD,
            "capacity_read_bytes": after["read_bytes"] - before["read_bytes"],
            "held_read_bytes": part["tiers"]["held_read_bytes"],
            "fast_peak_bytes": peak["fast"], "lag_max_s": lag_max,
            "overrides": after["reader_hold_overrides"], "seconds": time.monotonic() - reading}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel-bin", type=Path, default=REPO / "target" / "release" / "keel")
    ap.add_argument("--rate-mb", type=float, default=8.0)
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--behind-s", type=float, default=45)
    ap.add_argument("--local-retention-s", type=float, default=15)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not args.keel_bin.exists():
        raise SystemExit(f"{args.keel_bin} not found: cargo build --release -p keel-server")
    results = {}
    with tempfile.TemporaryDirectory(prefix="reader-tiering-", dir=REPO / "bench") as tmp:
        for name, window in (("off", 0), ("on", 1 << 30)):
            print(f"== keel.tier.reader.window.bytes={window}", flush=True)
            results[name] = run(args, window, Path(tmp))
            print(json.dumps(results[name]), flush=True)
    mb = lambda b: f"{b / 1e6:,.0f}"  # noqa: E731
    rows = [("records the group read (all, in order)", lambda r: f"{r['records']:,}"),
            ("MB it read from the capacity tier", lambda r: mb(r["capacity_read_bytes"])),
            ("MB it read from segments kept for it", lambda r: mb(r["held_read_bytes"])),
            ("fast tier's largest size, MB", lambda r: mb(r["fast_peak_bytes"])),
            ("the group's largest lag, s", lambda r: f"{r['lag_max_s']:.1f}"),
            ("segments released despite a reader", lambda r: str(r["overrides"]))]
    print(f"\n{args.rate_mb:g} MB/s for {args.seconds:g} s, local.retention.ms {args.local_retention_s:g} s, "
          f"the group {args.behind_s:g} s behind\n")
    print("| | reader-aware tiering off | on |\n| --- | --- | --- |")
    for label, get in rows:
        print(f"| {label} | {get(results['off'])} | {get(results['on'])} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
