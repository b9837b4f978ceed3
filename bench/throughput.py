#!/usr/bin/env python3
"""Produce and consume throughput of Keel and Apache Kafka, same clients, same run.

Starts each broker in turn on loopback (never both at once, so they do not
share the two cores), runs Kafka's ProducerPerformance (the Java client) and
a confluent-kafka assign() consumer and kcat (when installed) against it,
and prints a table with the
Keel/Kafka ratio. A benchmark, not a test: it prints numbers, asserts none.

usage: bench/throughput.py [--records N] [--record-size B] [--acks A]
                           [--partitions P] [--rounds R] [--json FILE]
The keel binary defaults to target/release/keel (build it with
`cargo build --release -p keel-server`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"port {port} did not open within {timeout_s}s")


def run_perf(bootstrap: str, topic: str, args) -> dict:
    env = dict(os.environ, RECORDS=str(args.records), RECORD_SIZE=str(args.record_size),
               ACKS=args.acks, PARTITIONS=str(args.partitions), CONSUMER="assign")
    out = subprocess.run([str(HERE / "kafka" / "perf.sh"), bootstrap, topic], env=env,
                         capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise SystemExit(f"perf.sh failed against {bootstrap}:\n{text[-3000:]}")
    prod = re.findall(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                      r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th", text)
    cons = re.findall(r"assign-consumer: (\d+), ([\d.]+), ([\d.]+), ([\d.]+), (\d+)", text)
    if not prod or not cons:
        raise SystemExit(f"could not parse perf output:\n{text[-3000:]}")
    p, c = prod[-1], cons[-1]
    kcat = kcat_consume(bootstrap, topic, args)
    return {**kcat, "produce_records_per_s": float(p[1]), "produce_mb_per_s": float(p[2]),
            "produce_latency_ms_avg": float(p[3]), "produce_latency_ms_p99": float(p[7]),
            "consume_mb_per_s": float(c[3]), "consume_records_per_s": float(c[4])}


def kcat_consume(bootstrap: str, topic: str, args) -> dict:
    """librdkafka at C speed: kcat reads every partition from the beginning
    to the end offsets (no consumer group) and discards the records."""
    if not shutil.which("kcat"):
        return {}
    start = time.monotonic()
    subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q"],
                   stdout=subprocess.DEVNULL, check=True, timeout=600)
    secs = time.monotonic() - start
    mb = args.records * args.record_size / 1048576
    return {"kcat_consume_mb_per_s": mb / secs, "kcat_consume_records_per_s": args.records / secs}


def with_kafka(args, fn):
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
    subprocess.run([str(HERE / "kafka" / "start.sh"), str(port), str(data)], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        return fn(f"127.0.0.1:{port}")
    finally:
        subprocess.run([str(HERE / "kafka" / "stop.sh"), str(data)], stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)


def with_keel(args, fn):
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    # The admin endpoint is off: a broker already running here may hold its port.
    proc = subprocess.Popen([args.keel, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
                             "--set", "keel.admin.listen="],
                            stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        return fn(f"127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--acks", default="1")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keel", default=str(REPO / "target" / "release" / "keel"))
    ap.add_argument("--json")
    args = ap.parse_args()
    results = {"kafka": [], "keel": []}
    for r in range(args.rounds):
        for name, runner in (("kafka", with_kafka), ("keel", with_keel)):
            res = runner(args, lambda bs: run_perf(bs, f"perf-{r}", args))
            print(f"round {r + 1} {name}: {res}", flush=True)
            results[name].append(res)
    best = {k: {m: max(x[m] for x in v) if "per_s" in m else min(x[m] for x in v) for m in v[0]}
            for k, v in results.items()}
    print(f"\n{args.records} records x {args.record_size} B, acks={args.acks}, "
          f"{args.partitions} partition(s), best of {args.rounds} rounds")
    print(f"{'metric':<28}{'kafka':>12}{'keel':>12}{'keel/kafka':>12}")
    for m in best["kafka"]:
        k, e = best["kafka"][m], best["keel"][m]
        print(f"{m:<28}{k:>12.1f}{e:>12.1f}{(e / k if k else float('nan')):>12.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": results, "best": best}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
