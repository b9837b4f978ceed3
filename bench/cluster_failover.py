#!/usr/bin/env python3
"""Failover of a Keel cluster on etcd: how long after a partition's
leader is killed the cluster drops it, another broker leads the partition
(rebuilding its log from the object store) and a producer's writes are
acknowledged again, and whether anything acknowledged was lost or
written twice.

Starts one etcd (Debian's etcd-server) and `--brokers` Keel brokers on
loopback sharing an object store (a directory), and a topic with one
partition on each broker (1 MiB segments, so sealed segments reach the
object store and WAL objects are collected as it runs). An idempotent
acks=all producer writes numbered records to partition 0 all along.
`--kills` times: SIGKILL the partition's leader, time (from the kill,
polling a survivor's /stats every 10 ms) when it is dropped, when
another broker leads the partition, and when the producer has a write
acknowledged again; then restart the killed broker. At the end every
record of the partition is read back: acknowledged records lost,
duplicated or out of order are counted. Prints a table (p50, p90, max)
and, with --json, the samples. A benchmark, not a test: it asserts
nothing but prints what it found.

With `--target coordinator` a consumer group reads the topic all along,
committing every 100 records, and each kill is of the group's
coordinator instead: timed are when another broker coordinates the group
(its partition of __consumer_offsets rebuilt and loaded) and when the
member's commits are acknowledged again; commits acknowledged before a
kill and missing after it are counted as lost.

With `--target transactions` (two brokers) a transactional producer
commits transactions of 10 records to partition 0 all along, and each
kill is of its transactional id's coordinator, which also leads the
partition (a transaction's markers do not reach other brokers yet):
timed are when the other broker has loaded the id's partition of
__transaction_state and when a transaction commits again. At the end the
partition is read read_committed: every committed transaction's records
must be there once and in order, and no aborted one's.

With `--target compacted` the topic is compacted (`--keys` keys, each
written `--rounds` times with 1 KiB values, from a fresh producer before
every kill, so the history is several times the live set), and the
brokers roll idle segments after 5 s and collect WAL objects every
second. Before each kill of the partition's leader, once the cluster
has been idle for `--settle-s`, the WAL objects still in the object
store are counted; after it, the new leader's rebuild (WAL ranges
replayed, bytes, time) and the records a reader from offset 0 gets
(every key's latest value at least; more when the copies were not
cleaned) are reported per kill.

usage: bench/cluster_failover.py [--kills N] [--brokers B]
                                 [--session-ms MS]
                                 [--target leader|coordinator|transactions|compacted]
                                 [--keys K] [--rounds R] [--settle-s S]
                                 [--json FILE]
The keel binary is KEEL_BIN, else the newer of target/release/keel and
target/debug/keel (what is timed here is not the build's speed).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(cond, timeout_s: float, what: str, interval_s: float = 0.01) -> float:
    """Polls cond() until true; returns the monotonic time it first was."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cond():
                return time.monotonic()
        except OSError:
            pass
        time.sleep(interval_s)
    raise SystemExit(f"timed out after {timeout_s}s waiting for {what}")


def keel_bin() -> Path:
    if os.environ.get("KEEL_BIN"):
        return Path(os.environ["KEEL_BIN"])
    built = [p for p in (REPO / "target" / d / "keel" for d in ("release", "debug")) if p.exists()]
    if not built:
        raise SystemExit("no keel binary: cargo build -p keel-server (or set KEEL_BIN)")
    return max(built, key=lambda p: p.stat().st_mtime)


class Etcd:
    def __init__(self, base: Path):
        self.client, self.peer = free_port(), free_port()
        client, peer = f"http://127.0.0.1:{self.client}", f"http://127.0.0.1:{self.peer}"
        self.endpoint = client
        etcd = shutil.which("etcd")
        if etcd is None:
            raise SystemExit("etcd not found: apt-get install etcd-server (tests/setup.sh does)")
        self.proc = subprocess.Popen(
            [etcd, "--name", "bench", "--data-dir", str(base / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"bench={peer}",
             "--heartbeat-interval", "100", "--election-timeout", "1000"],
            stdout=open(base / "etcd.log", "wb"), stderr=subprocess.STDOUT)

        def healthy():
            with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                return json.load(r).get("health") == "true"
        wait(healthy, 30, "etcd")

    def close(self):
        self.proc.kill()
        self.proc.wait()


class Keel:
    def __init__(self, base: Path, node: int, etcd: Etcd, session_ms: int, brokers: int,
                 extra: dict | None = None):
        self.node = node
        self.port, self.admin = free_port(), free_port()
        self.data = base / f"keel-{node}"
        self.log = base / f"keel-{node}.log"
        self.cmd = [str(keel_bin()), "serve", "--listen", f"127.0.0.1:{self.port}",
                    "--data-dir", str(self.data),
                    "--set", f"node.id={node}",
                    "--set", f"keel.admin.listen=127.0.0.1:{self.admin}",
                    "--set", f"keel.cluster.etcd.endpoints={etcd.endpoint}",
                    "--set", f"keel.cluster.session.timeout.ms={session_ms}",
                    # The coordinators are placed once this many are live.
                    "--set", f"offsets.topic.replication.factor={min(3, brokers)}",
                    "--set", f"transaction.state.log.replication.factor={min(3, brokers)}",
                    "--set", f"keel.tier.remote=file://{base / 'objects'}"]
        for k, v in (extra or {}).items():
            self.cmd += ["--set", f"{k}={v}"]
        self.proc = None

    def start(self, timeout_s: float = 30):
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        wait(lambda: not self.cluster()["fenced"], timeout_s, f"broker {self.node} to register")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def restart(self):
        """Starts the killed broker again and waits for its session."""
        self.start(60)

    def cluster(self) -> dict:
        return self.stats()["cluster"]

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/stats", timeout=2) as r:
            return json.load(r)

    def rebuild_ms(self) -> int | None:
        """How long this broker's last rebuild of a log took, from its log."""
        last = self.rebuild()
        return last and last["elapsed_ms"]

    def rebuild(self, topic: str | None = None) -> dict | None:
        """The numbers of this broker's last rebuild of a log (of `topic`),
        and how many it logged."""
        last, count = None, 0
        for line in self.log.read_text(errors="replace").splitlines():
            if "rebuilt the partition's log from the object store" in line and "elapsed_ms=" in line \
                    and (topic is None or f"topic={topic} " in line):
                count += 1
                last = {k: int(line.split(f"{k}=")[1].split()[0])
                        for k in ("elapsed_ms", "segments", "wal_ranges", "replayed_bytes")}
                last["count"] = count
        return last

    def leader(self, topic: str, partition: int) -> int | None:
        """The partition's leader as this broker's /stats has it."""
        for p in self.stats()["partitions"]:
            if p["topic"] == topic and p["partition"] == partition:
                return p["leader"]
        return None

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def summary(samples: list[float]) -> tuple[str, str, str]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return (f"{statistics.median(ordered):.2f}", f"{p90:.2f}", f"{ordered[-1]:.2f}")


class Writer(threading.Thread):
    """An idempotent acks=all producer of `n-<i>` records to one partition,
    and what it was told."""

    def __init__(self, bootstrap: str, topic: str, partition: int):
        super().__init__(daemon=True)
        from confluent_kafka import Producer
        self.p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2,
                           "message.timeout.ms": 300000, "request.timeout.ms": 5000, "log_level": 0})
        self.topic, self.partition = topic, partition
        self.sent, self.acked, self.errors = 0, [], []
        self.running = True

    def run(self):
        while self.running:
            self.p.produce(self.topic, value=f"n-{self.sent}".encode() + b"." * 500,
                           partition=self.partition, on_delivery=self._delivered)
            self.sent += 1
            self.p.poll(0.002)

    def _delivered(self, e, m):
        if e:
            self.errors.append(str(e))
        else:
            self.acked.append(m.value().rstrip(b"."))


class Reader(threading.Thread):
    """A consumer group member reading every partition of `topic`,
    committing synchronously every 100 records; what it committed and
    when a commit was last acknowledged."""

    GROUP = "failover-readers"

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        from confluent_kafka import Consumer
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": self.GROUP,
                           "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0})
        self.topic = topic
        self.committed: dict[int, int] = {}
        self.last_commit = 0.0
        self.running = True

    def run(self):
        self.c.subscribe([self.topic])
        since = 0
        while self.running:
            for m in self.c.consume(100, 0.2):
                if m.error() is None:
                    since += 1
            if since >= 100:
                try:
                    done = self.c.commit(asynchronous=False)
                except Exception:  # noqa: BLE001 (the coordinator moving: committed again later)
                    continue
                for tp in done or []:
                    if tp.error is None and tp.offset >= 0:
                        self.committed[tp.partition] = max(self.committed.get(tp.partition, 0), tp.offset)
                self.last_commit = time.monotonic()
                since = 0
        self.c.close()


def group_coordinator(bootstrap: str) -> tuple[int, dict[int, int]] | None:
    """The readers' coordinator and committed offsets, as a client
    bootstrapped there finds them (None while there is none)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient
    a = AdminClient({"bootstrap.servers": bootstrap})
    try:
        g = a.describe_consumer_groups([Reader.GROUP], request_timeout=2)[Reader.GROUP].result(3)
        listed = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(Reader.GROUP)],
                                               request_timeout=2)[Reader.GROUP].result(3)
    except Exception:  # noqa: BLE001
        return None
    return g.coordinator.id, {tp.partition: tp.offset for tp in listed.topic_partitions}


def read_back(bootstrap: str, topic: str, partition: int, expect: int) -> list[bytes]:
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "failover-check", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, partition, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                if m.error() is None:
                    got.append(m.value().rstrip(b"."))
                elif m.error().code() == KafkaError._PARTITION_EOF and len(got) >= expect:
                    return got
    finally:
        c.close()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--target", choices=["leader", "coordinator", "transactions", "compacted"],
                    default="leader")
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--settle-s", type=float, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.target == "transactions" and args.brokers != 2:
        raise SystemExit("--target transactions needs --brokers 2: the partition and its transactions' "
                         "coordinator must move to the same broker")
    base = Path(tempfile.mkdtemp(prefix="keel-failover-"))
    etcd = Etcd(base)
    extra = {}
    if args.target == "compacted":
        extra = {"keel.cluster.wal.segment.roll.ms": "5000", "keel.cluster.wal.gc.interval.ms": "1000",
                 "log.cleaner.backoff.ms": "1000"}
    brokers = {n: Keel(base, n, etcd, args.session_ms, args.brokers, extra) for n in range(1, args.brokers + 1)}
    samples = {"dropped": [], "leads": [], "acknowledged": [], "rebuild_ms": [],
               "coordinated": [], "committing": [], "txn_coordinated": [], "txn_committing": []}
    commits_lost = 0
    topic = "failover"
    found = {}
    try:
        for b in brokers.values():
            b.start()
        from confluent_kafka.admin import AdminClient, NewTopic
        bootstrap = ",".join(f"127.0.0.1:{b.port}" for b in brokers.values())
        admin = AdminClient({"bootstrap.servers": bootstrap})
        if args.target == "transactions":
            found = transactions(args.kills, brokers, bootstrap, admin, topic, samples)
            return report(args, samples, found)
        if args.target == "compacted":
            found = compacted(args, brokers, bootstrap, admin, topic, base / "objects", samples)
            return report(args, samples, found)
        # The other targets.
        # Partition n-1 on broker n.
        admin.create_topics([NewTopic(topic, num_partitions=len(brokers),
                                      replica_assignment=[[n] for n in brokers],
                                      config={"segment.bytes": "1048576"})])[topic].result(30)
        writer = Writer(bootstrap, topic, 0)
        writer.start()
        wait(lambda: len(writer.acked) > 500, 60, "the first acknowledged writes")
        reader = None
        if args.target == "coordinator":
            reader = Reader(bootstrap, topic)
            reader.start()
            wait(lambda: reader.committed, 60, "the group's first commit")
        for i in range(args.kills):
            time.sleep(2)
            if reader is not None:
                kill_coordinator(i, brokers, reader, samples)
                continue
            leader = next(iter(brokers.values())).leader(topic, 0)
            victim = brokers[leader]
            survivor = next(b for b in brokers.values() if b is not victim)
            acked_before = len(writer.acked)
            t0 = time.monotonic()
            victim.kill()
            dropped = wait(lambda: leader not in
                           [m["node_id"] for m in survivor.cluster()["brokers"]], 60, "the drop")
            leads = wait(lambda: survivor.leader(topic, 0) not in (None, -1, leader), 60, "a new leader")
            acknowledged = wait(lambda: len(writer.acked) > acked_before + 10, 120, "a write acknowledged")
            new = survivor.leader(topic, 0)
            rebuilt = brokers[new].rebuild_ms()
            samples["dropped"].append(dropped - t0)
            samples["leads"].append(leads - t0)
            samples["acknowledged"].append(acknowledged - t0)
            if rebuilt is not None:
                samples["rebuild_ms"].append(rebuilt)
            print(f"kill {i + 1:2}: broker {leader} (leader) killed; dropped after {dropped - t0:.2f}s, "
                  f"broker {new} leads after {leads - t0:.2f}s (log rebuilt in {rebuilt} ms), "
                  f"writes acknowledged again after {acknowledged - t0:.2f}s", flush=True)
            victim.restart()
        time.sleep(1)
        if reader is not None:
            reader.running = False
            reader.join(10)
            commits_lost = sum(1 for n in samples["lost_commits"] if n) if "lost_commits" in samples else 0
        writer.running = False
        writer.join(10)
        writer.p.flush(300)
        got = read_back(bootstrap, topic, 0, len(writer.acked))
        acked = writer.acked
        index = {v: n for n, v in enumerate(got)}
        found = {
            "acknowledged": len(acked),
            "read_back": len(got),
            "lost": sum(1 for v in acked if v not in index),
            "duplicated": len(got) - len(set(got)),
            "out_of_order": sum(1 for a, b in zip(acked, acked[1:])
                                if a in index and b in index and index[a] > index[b]),
            "producer_errors": len(writer.errors),
        }
        if reader is not None:
            found["kills_losing_commits"] = commits_lost
    finally:
        for b in brokers.values():
            b.close()
        etcd.close()
        shutil.rmtree(base, ignore_errors=True)
    report(args, samples, found)


def report(args, samples: dict, found: dict) -> None:
    target = {"leader": "partition 0's leader", "coordinator": "the group's coordinator",
              "transactions": "the transactional id's coordinator",
              "compacted": "a compacted partition's leader"}[args.target]
    print(f"\n{args.kills} kills of {target}, {args.brokers} brokers, "
          f"keel.cluster.session.timeout.ms={args.session_ms} (etcd leases count whole seconds)")
    print(f"{'seconds from the kill':48} {'p50':>6} {'p90':>6} {'max':>6}")
    for name, what in [("dropped", "killed broker dropped from the cluster"),
                       ("leads", "another broker leads the partition"),
                       ("acknowledged", "the producer's writes acknowledged again"),
                       ("coordinated", "another broker coordinates the group"),
                       ("committing", "the member's commits acknowledged again"),
                       ("txn_coordinated", "another broker has the id's transaction log"),
                       ("txn_committing", "a transaction commits again")]:
        if not samples[name]:
            continue
        p50, p90, most = summary(samples[name])
        print(f"{what:48} {p50:>6} {p90:>6} {most:>6}")
    if samples["rebuild_ms"]:
        p50, p90, most = summary([x / 1000 for x in samples["rebuild_ms"]])
        print(f"{'log rebuilt from the object store':48} {p50:>6} {p90:>6} {most:>6}")
    print("records: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    if args.json:
        args.json.write_text(json.dumps({"session_ms": args.session_ms, "brokers": args.brokers,
                                         "target": args.target, "samples_s": samples, "records": found},
                                        indent=2))


def kill_coordinator(i: int, brokers: dict, reader: Reader, samples: dict) -> None:
    """Kills the readers' coordinator and times its failover."""
    anyone = ",".join(f"127.0.0.1:{b.port}" for b in brokers.values())
    found: dict = {}

    def coordinated_now(at: str) -> bool:
        found["state"] = group_coordinator(at)
        return found["state"] is not None
    wait(lambda: coordinated_now(anyone), 60, "the group's coordinator", interval_s=0.05)
    victim_id, _ = found["state"]
    committed = dict(reader.committed)
    victim = brokers[victim_id]
    survivor = next(b for b in brokers.values() if b is not victim)
    t0 = time.monotonic()
    victim.kill()
    dropped = wait(lambda: victim_id not in [m["node_id"] for m in survivor.cluster()["brokers"]],
                   60, "the drop")
    at = f"127.0.0.1:{survivor.port}"
    coordinated = wait(lambda: coordinated_now(at) and found["state"][0] != victim_id, 120,
                       "a new coordinator", interval_s=0.05)
    committing = wait(lambda: reader.last_commit > t0, 120, "a commit acknowledged")
    new, offsets = found["state"]
    lost = sum(1 for p, o in committed.items() if offsets.get(p, -1) < o)
    samples["dropped"].append(dropped - t0)
    samples["coordinated"].append(coordinated - t0)
    samples["committing"].append(committing - t0)
    samples.setdefault("lost_commits", []).append(lost)
    print(f"kill {i + 1:2}: broker {victim_id} (coordinator) killed; dropped after {dropped - t0:.2f}s, "
          f"broker {new} coordinates the group after {coordinated - t0:.2f}s, commits acknowledged "
          f"again after {committing - t0:.2f}s; partitions whose acknowledged commit was lost: {lost}",
          flush=True)
    victim.restart()


def java_hash_partition(key: str, partitions: int = 50) -> int:
    """Kafka's abs(key.hashCode()) % partitions."""
    h = 0
    units = key.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if h == -(1 << 31) else abs(h) % partitions


class Transactor(threading.Thread):
    """A transactional producer committing transactions of 10 records
    (`<k>-<j>`) to partition 0 of `topic`, one after another: which
    committed, which aborted, which ended unknown (a commit that raised
    may have landed), and when a commit last succeeded."""

    ID = "failover-transactions"

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.committed, self.aborted, self.unknown, self.errors = [], [], [], []
        self.last_commit = 0.0
        self.running = True
        self.p = self.producer()

    def producer(self):
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.ID, "linger.ms": 2,
                      "transaction.timeout.ms": 120000, "log_level": 0})
        p.init_transactions(120)
        return p

    def run(self):
        from confluent_kafka import KafkaException
        k = 0
        while self.running:
            try:
                self.p.begin_transaction()
                for j in range(10):
                    self.p.produce(self.topic, value=f"{k}-{j}".encode(), partition=0)
                self.p.commit_transaction(120)
                self.committed.append(k)
                self.last_commit = time.monotonic()
            except KafkaException as e:
                self.errors.append(str(e.args[0]))
                self.recover(k, e.args[0])
            k += 1

    def recover(self, k: int, err) -> None:
        """After transaction `k` failed with `err`: its commit is retried
        while that may help, else it is aborted; after a fatal error its
        outcome is unknown and a new producer takes over."""
        from confluent_kafka import KafkaException
        while True:
            try:
                if err.retriable():
                    self.p.commit_transaction(120)
                    self.committed.append(k)
                    self.last_commit = time.monotonic()
                elif err.txn_requires_abort():
                    self.p.abort_transaction(120)
                    self.aborted.append(k)
                else:
                    break
                return
            except KafkaException as again:
                err = again.args[0]
                self.errors.append(str(err))
        self.unknown.append(k)
        while True:
            try:
                self.p = self.producer()
                return
            except KafkaException as again:
                self.errors.append(str(again.args[0]))
                time.sleep(1)


def transactions(kills: int, brokers: dict, bootstrap: str, admin, topic: str, samples: dict) -> dict:
    """The `--target transactions` run: returns what the read back found."""
    from confluent_kafka.admin import NewTopic
    index = java_hash_partition(Transactor.ID)

    def coordinator() -> int | None:
        for n, b in brokers.items():
            try:
                if index in (b.cluster().get("txn_log") or {}).get("partitions", []):
                    return n
            except OSError:
                continue
        return None
    transactor = Transactor(bootstrap, topic)
    wait(lambda: coordinator() is not None, 60, "the id's coordinator")
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[coordinator()]],
                                  config={"segment.bytes": "1048576"})])[topic].result(30)
    transactor.start()
    wait(lambda: len(transactor.committed) > 20, 60, "the first transactions")
    for i in range(kills):
        time.sleep(2)
        victim_id = coordinator()
        victim = brokers[victim_id]
        survivor_id, survivor = next((n, b) for n, b in brokers.items() if n != victim_id)
        t0 = time.monotonic()
        victim.kill()
        dropped = wait(lambda: victim_id not in [m["node_id"] for m in survivor.cluster()["brokers"]],
                       60, "the drop")
        coordinated = wait(lambda: coordinator() == survivor_id, 120, "the id's new coordinator")
        committing = wait(lambda: transactor.last_commit > t0, 120, "a transaction committed")
        samples["dropped"].append(dropped - t0)
        samples["txn_coordinated"].append(coordinated - t0)
        samples["txn_committing"].append(committing - t0)
        print(f"kill {i + 1:2}: broker {victim_id} (transaction coordinator and leader) killed; dropped after "
              f"{dropped - t0:.2f}s, broker {survivor_id} has the id's transaction log after "
              f"{coordinated - t0:.2f}s, a transaction committed again after {committing - t0:.2f}s",
              flush=True)
        victim.restart()
    time.sleep(1)
    transactor.running = False
    transactor.join(150)
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "failover-check", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True, "log_level": 0})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[str] = []
    deadline, eof = time.monotonic() + 120, False
    try:
        while time.monotonic() < deadline and not eof:
            for m in c.consume(1000, 1.0):
                if m.error() is None:
                    got.append(m.value().decode())
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    eof = True
    finally:
        c.close()
    by_txn: dict[int, list[str]] = {}
    for v in got:
        by_txn.setdefault(int(v.split("-")[0]), []).append(v)
    committed, aborted = set(transactor.committed), set(transactor.aborted)
    return {
        "committed": len(committed),
        "aborted": len(aborted),
        "unknown": len(transactor.unknown),
        "read_committed": len(got),
        "committed_lost": sum(1 for k in committed if by_txn.get(k) != [f"{k}-{j}" for j in range(10)]),
        "aborted_visible": sum(1 for k in aborted if k in by_txn),
        "duplicated": len(got) - len(set(got)),
        "partial": sum(1 for k, vs in by_txn.items() if sorted(vs) != sorted(f"{k}-{j}" for j in range(10))),
        "out_of_order": sum(1 for a, b in zip(got, got[1:])
                            if tuple(map(int, a.split("-"))) > tuple(map(int, b.split("-")))),
        "producer_errors": len(transactor.errors),
    }

def compacted(args, brokers: dict, bootstrap: str, admin, topic: str, objects: Path, samples: dict) -> dict:
    """The `--target compacted` run: per kill, the WAL objects left when
    idle, the new leader's rebuild, and what a reader from 0 read."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[1]],
                                  config={"cleanup.policy": "compact", "segment.bytes": "1048576",
                                          "min.compaction.lag.ms": "0"})])[topic].result(30)
    latest: dict[bytes, bytes] = {}
    rows = []
    errors = 0

    def read_from_start() -> tuple[int, dict[bytes, bytes]]:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False,
                      "enable.partition.eof": True})
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        n, seen = 0, {}
        try:
            while True:
                m = c.poll(30)
                if m is None:
                    raise SystemExit("no end of the partition in 30 s")
                if m.error() is None:
                    n += 1
                    seen[m.key()] = m.value()
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    return n, seen
        finally:
            c.close()

    for i in range(args.kills):
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        failed = []
        for r in range(args.rounds):
            for k in range(args.keys):
                key, value = b"key-%06d" % k, (b"kill-%d-round-%d-" % (i, r)).ljust(1024, b".")
                p.produce(topic, key=key, value=value, partition=0,
                          on_delivery=lambda e, m: e and failed.append(e))
                latest[key] = value
                p.poll(0)
        p.flush(120)
        errors += len(failed)
        time.sleep(args.settle_s)
        wal = list(objects.rglob("*.wal"))
        wal_mb = sum(f.stat().st_size for f in wal) / (1 << 20)
        leader = next(iter(brokers.values())).leader(topic, 0)
        victim = brokers[leader]
        survivor = next(b for b in brokers.values() if b is not victim)
        rebuilt_before = {n: b.rebuild(topic) for n, b in brokers.items()}
        t0 = time.monotonic()
        victim.kill()
        leads = wait(lambda: survivor.leader(topic, 0) not in (None, -1, leader), 120, "a new leader")
        new = survivor.leader(topic, 0)
        # The view names the leader before its claim and rebuild are done.
        before = (rebuilt_before.get(new) or {}).get("count", 0)
        wait(lambda: ((brokers[new].rebuild(topic) or {}).get("count", 0)) > before, 120, "the rebuild")
        rebuilt = brokers[new].rebuild(topic) or {}
        started = time.monotonic()
        read, seen = read_from_start()
        read_s = time.monotonic() - started
        samples["leads"].append(leads - t0)
        if rebuilt:
            samples["rebuild_ms"].append(rebuilt["elapsed_ms"])
        row = {"kill": i + 1, "wal_objects": len(wal), "wal_mib": round(wal_mb, 1),
               "segments": rebuilt.get("segments"), "wal_ranges": rebuilt.get("wal_ranges"),
               "replayed_mib": round(rebuilt.get("replayed_bytes", 0) / (1 << 20), 1),
               "rebuild_ms": rebuilt.get("elapsed_ms"), "leads_s": round(leads - t0, 2),
               "read_records": read, "read_s": round(read_s, 2),
               "latest_ok": all(seen.get(k) == v for k, v in latest.items())}
        rows.append(row)
        print(f"kill {i + 1}: {len(wal)} WAL objects ({wal_mb:.1f} MiB) left when idle; broker {new} leads "
              f"after {leads - t0:.2f}s, rebuilt from {row['segments']} segments and {row['wal_ranges']} WAL "
              f"ranges ({row['replayed_mib']} MiB replayed) in {row['rebuild_ms']} ms; a reader from 0 got "
              f"{read} records in {read_s:.2f}s (every key's latest: {row['latest_ok']})", flush=True)
        victim.restart()
    print(f"\n{'kill':>4} {'WAL objs':>8} {'WAL MiB':>8} {'segs':>5} {'ranges':>6} {'replay MiB':>10} "
          f"{'rebuild ms':>10} {'read recs':>9} {'read s':>7} {'latest':>6}")
    for r in rows:
        print(f"{r['kill']:>4} {r['wal_objects']:>8} {r['wal_mib']:>8} {r['segments']!s:>5} "
              f"{r['wal_ranges']!s:>6} {r['replayed_mib']:>10} {r['rebuild_ms']!s:>10} "
              f"{r['read_records']:>9} {r['read_s']:>7} {r['latest_ok']!s:>6}")
    samples["compacted"] = rows
    return {"keys": args.keys, "written": args.keys * args.rounds * args.kills, "producer_errors": errors}


if __name__ == "__main__":
    sys.exit(main())
