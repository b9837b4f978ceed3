#!/usr/bin/env python3
"""One broker, many partitions: Keel and Apache Kafka with the same topic of
N partitions (default 10,000), the same records in every partition, the
same clients, in the same run (one broker at a time, so they do not share
the two cores).

For each broker: create the topic, produce to every partition, fetch every
partition back, then measure the broker process's RSS and open file
descriptors, and its start-up time after a clean stop (SIGTERM) and after
a crash (SIGKILL): from spawning the process until Metadata lists every
partition and a fetch of the last partition returns its data. Prints a
table with the Keel/Kafka ratios (and JSON with --json). A benchmark, not a
test: it asserts nothing about the numbers.

usage: bench/scale.py [--partitions N] [--records R] [--record-size B]
                      [--keel PATH] [--skip-kafka] [--json FILE]
The keel binary defaults to target/release/keel (`cargo build --release
-p keel-server`). Kafka comes from bench/kafka/fetch.sh. Both brokers get
the highest open-files limit allowed (up to 200,000).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NOFILE = 200_000


def free_port() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 1))  # Kafka's controller
            return port
        except OSError:
            continue
    raise SystemExit("no free port pair")


def raise_nofile() -> None:
    """As high as allowed (containers may cap the hard limit)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = NOFILE if hard == resource.RLIM_INFINITY else min(NOFILE, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, max(limit, hard)))
    except ValueError:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def proc_stats(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_mb": rss_kb / 1024, "open_fds": fds}


class Keel:
    name = "keel"

    def __init__(self, binary: str, data: Path, port: int):
        self.binary, self.data, self.port = binary, data, port
        self.proc: subprocess.Popen | None = None
        self.log = open(data.parent / "keel.log", "ab")

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data),
             "--set", "keel.admin.listen=", "--set", "num.partitions=1"],
            stdout=self.log, stderr=self.log, preexec_fn=raise_nofile)

    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(600)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(60)


class Kafka:
    name = "kafka"

    def __init__(self, data: Path, port: int):
        self.data, self.port = data, port

    def start(self) -> None:
        env = dict(os.environ, KAFKA_START_TIMEOUT_S="1800", KAFKA_HEAP=os.environ.get("KAFKA_HEAP", "2g"))
        subprocess.Popen([str(HERE / "kafka" / "start.sh"), str(self.port), str(self.data)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=raise_nofile)

    def pid(self) -> int:
        for _ in range(600):
            try:
                return int((self.data / "kafka.pid").read_text())
            except (FileNotFoundError, ValueError):
                time.sleep(0.1)
        raise SystemExit("kafka wrote no pid file")

    def stop(self) -> None:
        subprocess.run([str(HERE / "kafka" / "stop.sh"), str(self.data)], stdout=subprocess.DEVNULL,
                       timeout=900, check=True)

    def kill(self) -> None:
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            time.sleep(0.05)
        (self.data / "kafka.pid").unlink(missing_ok=True)


def ready(bootstrap: str, topic: str, partitions: int, records: int, deadline: float) -> None:
    """Waits until Metadata lists every partition with a leader and the last
    partition's data can be fetched."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(topic, timeout=5)
            t = md.topics.get(topic)
            if t and not t.error and len(t.partitions) == partitions and all(
                    p.leader >= 0 and p.error is None for p in t.partitions.values()):
                break
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.05)
    else:
        raise SystemExit(f"{bootstrap}: metadata of {topic} not ready in time")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "scale-ready", "enable.auto.commit": False,
                  "log_level": 0})
    c.assign([TopicPartition(topic, partitions - 1, 0)])
    got = 0
    while got < records and time.monotonic() < deadline:
        for m in c.consume(records, timeout=1):
            if not m.error():
                got += 1
    c.close()
    if got < records:
        raise SystemExit(f"{bootstrap}: the last partition's data did not come back in time")


def timed_start(broker, bootstrap: str, args) -> float:
    started = time.monotonic()
    broker.start()
    ready(bootstrap, "scale", args.partitions, args.records, started + 1800)
    return time.monotonic() - started


def run(broker, args) -> dict:
    bootstrap = f"127.0.0.1:{broker.port}"
    out: dict = {}
    t = time.monotonic()
    broker.start()
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            break
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.2)
    out["first_start_s"] = time.monotonic() - t
    t = time.monotonic()
    # KRaft refuses more than 10,000 records in one operation: create the
    # topic in steps of 5,000 partitions (the same steps for both brokers).
    step = 5000
    admin.create_topics([NewTopic("scale", min(args.partitions, step), 1)], operation_timeout=600,
                        request_timeout=600)["scale"].result(900)
    for count in range(2 * step, args.partitions + step, step):
        admin.create_partitions([NewPartitions("scale", min(count, args.partitions))], operation_timeout=600,
                                request_timeout=600)["scale"].result(900)
    ready_deadline = time.monotonic() + 900
    while time.monotonic() < ready_deadline:
        md = admin.list_topics("scale", timeout=10)
        if len(md.topics["scale"].partitions) == args.partitions:
            break
        time.sleep(0.2)
    out["create_topic_s"] = time.monotonic() - t

    value = os.urandom(args.record_size)
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 20, "compression.type": "none",
                  "log_level": 0,
                  "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000})
    t = time.monotonic()
    for _r in range(args.records):
        for part in range(args.partitions):
            while True:
                try:
                    p.produce("scale", value=value, partition=part)
                    break
                except BufferError:
                    p.poll(0.05)
        p.poll(0)
    left = p.flush(600)
    if left:
        raise SystemExit(f"{left} records undelivered")
    total = args.records * args.partitions
    out["produce_records_per_s"] = total / (time.monotonic() - t)

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "scale", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 100, "log_level": 0})
    c.assign([TopicPartition("scale", part, 0) for part in range(args.partitions)])
    t = time.monotonic()
    got = 0
    while got < total and time.monotonic() - t < 900:
        for m in c.consume(10_000, timeout=1):
            if not m.error():
                got += 1
    c.close()
    out["fetched_records"] = got
    out["fetch_all_s"] = time.monotonic() - t
    out.update(proc_stats(broker.pid()))

    broker.stop()
    out["clean_restart_s"] = timed_start(broker, bootstrap, args)
    after = proc_stats(broker.pid())
    out["rss_mb_after_restart"], out["open_fds_after_restart"] = after["rss_mb"], after["open_fds"]
    broker.kill()
    out["crash_restart_s"] = timed_start(broker, bootstrap, args)
    broker.stop()
    out["data_mb"] = sum(f.stat().st_size for f in broker.data.rglob("*") if f.is_file()) / 1048576
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--records", type=int, default=10, help="records per partition")
    ap.add_argument("--record-size", type=int, default=1000)
    ap.add_argument("--keel", default=str(REPO / "target" / "release" / "keel"))
    ap.add_argument("--skip-kafka", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    raise_nofile()
    results = {}
    for name in (["kafka"] if not args.skip_kafka else []) + ["keel"]:
        base = Path(tempfile.mkdtemp(prefix=f"scale-{name}-"))
        port = free_port()
        broker = Kafka(base / "data", port) if name == "kafka" else Keel(args.keel, base / "data", port)
        try:
            results[name] = run(broker, args)
        finally:
            try:
                broker.kill()
            except BaseException:  # noqa: BLE001 - already stopped
                pass
            shutil.rmtree(base, ignore_errors=True)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    print(f"\n{args.partitions} partitions x {args.records} records of {args.record_size} B")
    names = list(results)
    print(f"{'metric':<26}" + "".join(f"{n:>12}" for n in names) + ("   keel/kafka" if len(names) == 2 else ""))
    for m in results["keel"]:
        row = f"{m:<26}" + "".join(f"{results[n][m]:>12.1f}" for n in names)
        if len(names) == 2 and results["kafka"][m]:
            row += f"{results['keel'][m] / results['kafka'][m]:>13.2f}"
        print(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
