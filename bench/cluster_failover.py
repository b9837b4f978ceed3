#!/usr/bin/env python3
"""Failover of a Keel cluster on etcd: how long after a broker is killed
the others drop it, elect a new controller and take its partition's
leader away, and how long a broker restarted on its data dir takes to be
listed again, lead its partition again and acknowledge a write.

Starts one etcd (Debian's etcd-server) and `--brokers` Keel brokers on
loopback and a topic with one partition on each broker, then `--kills`
times kills the controller with SIGKILL, times (from the kill, polling a
survivor's /stats every 10 ms) when it is dropped, when another
controller is elected and when its partition has no leader, restarts it
and times (from the restart) until a survivor lists it, names it the
partition's leader again, and a produce (acks=all, through a client that
knows only a survivor) to that partition is acknowledged. Prints a table
(p50, p90, max) and, with --json, the samples. A benchmark, not a test:
it asserts nothing.

Until acknowledged records are durable in the object store, a partition
is led only by the broker holding it (docs/cluster.md): a killed leader's
partition waits for it, so what this measures is how fast the cluster
notices and hands it back.

usage: bench/cluster_failover.py [--kills N] [--brokers B]
                                 [--session-ms MS] [--json FILE]
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
    def __init__(self, base: Path, node: int, etcd: Etcd, session_ms: int):
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
                    "--set", f"keel.tier.remote=file://{base / 'objects'}"]
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        wait(lambda: not self.cluster()["fenced"], 30, f"broker {self.node} to register")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def cluster(self) -> dict:
        return self.stats()["cluster"]

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/stats", timeout=2) as r:
            return json.load(r)

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="keel-failover-"))
    etcd = Etcd(base)
    brokers = {n: Keel(base, n, etcd, args.session_ms) for n in range(1, args.brokers + 1)}
    samples = {"dropped": [], "controller": [], "leaderless": [], "rejoined": [], "leads": [],
               "acknowledged": []}
    topic = "failover"
    try:
        for b in brokers.values():
            b.start()
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic
        first = next(iter(brokers.values()))
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{first.port}"})
        # Partition n-1 on broker n.
        admin.create_topics([NewTopic(topic, num_partitions=len(brokers),
                                      replica_assignment=[[n] for n in brokers])])[topic].result(30)
        for i in range(args.kills):
            controller = next(iter(brokers.values())).cluster()["controller"]["node_id"]
            victim = brokers[controller]
            survivor = next(b for b in brokers.values() if b is not victim)
            t0 = time.monotonic()
            victim.kill()
            dropped = wait(lambda: controller not in
                           [m["node_id"] for m in survivor.cluster()["brokers"]], 60, "the drop")
            elected = wait(lambda: (survivor.cluster()["controller"] or {}).get("node_id")
                           not in (None, controller), 60, "a new controller")
            mine = controller - 1
            leaderless = wait(lambda: survivor.leader(topic, mine) == -1, 60, "no leader")
            t1 = time.monotonic()
            victim.proc = subprocess.Popen(victim.cmd, stdout=open(victim.log, "ab"),
                                           stderr=subprocess.STDOUT)
            rejoined = wait(lambda: controller in
                            [m["node_id"] for m in survivor.cluster()["brokers"]], 60, "the rejoin")
            leads = wait(lambda: survivor.leader(topic, mine) == controller, 60, "its lead again")
            producer = Producer({"bootstrap.servers": f"127.0.0.1:{survivor.port}", "acks": "all",
                                 "enable.idempotence": True, "message.timeout.ms": 60000,
                                 "log_level": 0})
            acked = []
            producer.produce(topic, value=b"after a kill", partition=mine,
                             on_delivery=lambda e, m: acked.append(e))
            producer.flush(60)
            acknowledged = time.monotonic()
            if acked != [None]:
                raise SystemExit(f"the write after kill {i + 1} failed: {acked}")
            samples["dropped"].append(dropped - t0)
            samples["controller"].append(elected - t0)
            samples["leaderless"].append(leaderless - t0)
            samples["rejoined"].append(rejoined - t1)
            samples["leads"].append(leads - t1)
            samples["acknowledged"].append(acknowledged - t1)
            print(f"kill {i + 1:2}: broker {controller} dropped after {dropped - t0:.2f}s, "
                  f"controller after {elected - t0:.2f}s, its partition leaderless after "
                  f"{leaderless - t0:.2f}s; restarted, listed after {rejoined - t1:.2f}s, leads "
                  f"again after {leads - t1:.2f}s, a write acknowledged after "
                  f"{acknowledged - t1:.2f}s", flush=True)
            wait(lambda: not victim.cluster()["fenced"], 30, "the restarted broker's session")
    finally:
        for b in brokers.values():
            b.close()
        etcd.close()
    print(f"\n{args.kills} kills of the controller, {args.brokers} brokers, "
          f"keel.cluster.session.timeout.ms={args.session_ms} (etcd leases count whole seconds)")
    print(f"{'seconds from the kill (from the restart below)':48} {'p50':>6} {'p90':>6} {'max':>6}")
    for name, what in [("dropped", "killed broker dropped from Metadata"),
                       ("controller", "new controller elected"),
                       ("leaderless", "its partition without a leader"),
                       ("rejoined", "restarted broker listed again"),
                       ("leads", "restarted broker leads its partition"),
                       ("acknowledged", "a write to it acknowledged")]:
        p50, p90, most = summary(samples[name])
        print(f"{what:48} {p50:>6} {p90:>6} {most:>6}")
    if args.json:
        args.json.write_text(json.dumps({"session_ms": args.session_ms, "brokers": args.brokers,
                                         "samples_s": samples}, indent=2))
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
