#!/usr/bin/env python3
"""Transactional produce throughput and latency of Keel and Apache Kafka,
same client, same run.

Starts each broker in turn on loopback (never both at once), and against it
runs Kafka's ProducerPerformance (the Java client) twice on fresh topics:
once idempotent, once transactional (`--transaction-duration-ms`: a
transaction is committed every that many ms). acks=all for both, as
transactions require. Prints each run, then a table of both brokers, the
Keel/Kafka ratio of the transactional run, and each broker's cost of
transactions (transactional / idempotent). Then reads every transactional
topic back read_committed (confluent-kafka) and reports that the counts
match, so the numbers are of data that was committed, and the
transaction.version each broker finalized (2: the client ran transactions
v2, KIP-890). A benchmark, not a
test: it prints numbers, asserts none.

With `--cluster`, a 3-broker Keel cluster (etcd, versitygw: as
`bench/throughput.py --cluster`) runs too; with `--partitions 3` each
transaction then spans partitions three brokers lead, its coordinator
sending markers to the others and their leaders asking it about the
batches (docs/cluster.md). With `--secured` too, the same cluster again
with its brokers sending each other those requests over a SASL_SSL
inter-broker listener (PLAIN over TLS).

usage: bench/transactions.py [--records N] [--record-size B]
                             [--transaction-duration-ms D] [--partitions P]
                             [--rounds R] [--cluster [--secured]] [--json FILE]
The keel binary defaults to target/release/keel (build it with
`cargo build --release -p keel-server`).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from throughput import HERE, REPO, with_kafka, with_keel, with_keel_cluster

PERF = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                  r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th")
METRICS = ["produce_records_per_s", "produce_mb_per_s", "latency_ms_avg", "latency_ms_p50", "latency_ms_p99"]


def tool(*args: str, timeout_s: float = 900) -> str:
    cmd = ["java", "-Xmx1g", "-cp", str(HERE / "lab" / "kafka-libs" / "*"),
           f"-Dlog4j2.configurationFile={HERE / 'kafka' / 'tools-log4j2.properties'}", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise SystemExit(f"{args[0]} failed:\n{text[-3000:]}")
    return text


def produce(bootstrap: str, topic: str, args, transactional: bool) -> dict:
    tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap, "--create",
         "--if-not-exists", "--topic", topic, "--partitions", str(args.partitions), "--replication-factor", "1")
    extra = ["--transaction-duration-ms", str(args.transaction_duration_ms),
             "--transactional-id", f"{topic}-txn"] if transactional else []
    text = tool("org.apache.kafka.tools.ProducerPerformance", "--bootstrap-server", bootstrap, "--topic", topic,
                "--num-records", str(args.records), "--record-size", str(args.record_size), "--throughput", "-1",
                "--command-property", "acks=all", *extra)
    found = PERF.findall(text)
    if not found:
        raise SystemExit(f"could not parse ProducerPerformance output:\n{text[-3000:]}")
    p = found[-1]
    return {"produce_records_per_s": float(p[1]), "produce_mb_per_s": float(p[2]),
            "latency_ms_avg": float(p[3]), "latency_ms_p50": float(p[5]), "latency_ms_p99": float(p[7])}


def committed_count(bootstrap: str, topic: str, partitions: int) -> int:
    """How many records a read_committed reader finds up to each partition's end."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{time.time_ns()}",
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    n, at_end = 0, set()
    deadline = time.monotonic() + 300
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            for m in c.consume(10000, 0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                else:
                    n += 1
    finally:
        c.close()
    return n


def transaction_version(bootstrap: str) -> int:
    """The transaction.version level the broker finalizes (`kafka-features
    describe`): 2 means the client runs transactions v2 (KIP-890)."""
    text = tool("org.apache.kafka.tools.FeatureCommand", "--bootstrap-server", bootstrap, "describe")
    found = re.search(r"Feature: transaction\.version\s.*?FinalizedVersionLevel: (\d+)", text)
    return int(found.group(1)) if found else 0


def run_broker(bootstrap: str, r: int, args) -> dict:
    plain = produce(bootstrap, f"idem-{r}", args, transactional=False)
    txn = produce(bootstrap, f"txn-{r}", args, transactional=True)
    txn["read_committed_records"] = committed_count(bootstrap, f"txn-{r}", args.partitions)
    txn["transaction_version"] = transaction_version(bootstrap)
    return {"idempotent": plain, "transactional": txn}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--transaction-duration-ms", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keel", default=str(REPO / "target" / "release" / "keel"))
    ap.add_argument("--cluster", action="store_true", help="also a 3-broker Keel cluster")
    ap.add_argument("--secured", action="store_true",
                    help="with --cluster, also the cluster with a SASL_SSL inter-broker listener")
    ap.add_argument("--json")
    args = ap.parse_args()
    subprocess.run([str(HERE / "kafka" / "fetch.sh")], check=True, stdout=subprocess.DEVNULL)
    runners = [("kafka", with_kafka), ("keel", with_keel)]
    if args.cluster:
        runners.append(("keelcluster", with_keel_cluster))
        if args.secured:
            runners.append(("keelclustersasl", lambda a, fn: with_keel_cluster(a, fn, secured=True)))
    runs = {name: [] for name, _ in runners}
    for r in range(args.rounds):
        for name, runner in runners:
            res = runner(args, lambda bs: run_broker(bs, r, args))
            print(f"round {r + 1} {name}: {json.dumps(res)}", flush=True)
            runs[name].append(res)

    def best(name: str, mode: str) -> dict:
        rows = [x[mode] for x in runs[name]]
        return {m: (max if "per_s" in m else min)(x[m] for x in rows) for m in METRICS}

    b = {n: {mode: best(n, mode) for mode in ("idempotent", "transactional")} for n in runs}
    print(f"\n{args.records} records x {args.record_size} B, acks=all, {args.partitions} partition(s), "
          f"a transaction every {args.transaction_duration_ms} ms, best of {args.rounds} rounds")
    names = list(runs)
    header = ["metric"] + [f"{n} {mode}" for n in names for mode in ("idem", "txn")] \
        + [f"{n}/kafka txn" for n in names[1:]] + [f"{n} txn/idem" for n in names]
    print("".join(f"{h:>20}" if i else f"{h:<24}" for i, h in enumerate(header)))

    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    for m in METRICS:
        cells = [b[n][mode][m] for n in names for mode in ("idempotent", "transactional")]
        cells += [ratio(b[n]["transactional"][m], b["kafka"]["transactional"][m]) for n in names[1:]]
        cells += [ratio(b[n]["transactional"][m], b[n]["idempotent"][m]) for n in names]
        print(f"{m:<24}" + "".join(f"{c:>20.2f}" for c in cells))
    for n in runs:
        counts = [x["transactional"]["read_committed_records"] for x in runs[n]]
        levels = sorted({x["transactional"]["transaction_version"] for x in runs[n]})
        print(f"{n}: read_committed records per transactional run: {counts} (of {args.records}); "
              f"transaction.version {levels}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs, "best": b}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
