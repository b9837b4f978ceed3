#!/usr/bin/env python3
"""Membership failover of a Keel cluster on etcd: how long after a broker
is killed the others drop it and elect a new controller, and how long a
broker restarted on its data dir takes to be listed again.

Starts one etcd (Debian's etcd-server) and `--brokers` Keel brokers on
loopback, then `--kills` times kills the controller with SIGKILL, times
(from the kill, polling a survivor's /stats every 10 ms) when it is
dropped and when another controller is elected, restarts it and times
until a survivor lists it again. Prints a table (p50, p90, max) and,
with --json, the samples. A benchmark, not a test: it asserts nothing.

What it measures is membership only: partition leadership and data
failover come with later steps of cluster mode (docs/cluster.md).

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
                    "--set", f"keel.cluster.session.timeout.ms={session_ms}"]
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        wait(lambda: not self.cluster()["fenced"], 30, f"broker {self.node} to register")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def cluster(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/stats", timeout=2) as r:
            return json.load(r)["cluster"]

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
    samples = {"dropped": [], "controller": [], "rejoined": []}
    try:
        for b in brokers.values():
            b.start()
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
            t1 = time.monotonic()
            victim.proc = subprocess.Popen(victim.cmd, stdout=open(victim.log, "ab"),
                                           stderr=subprocess.STDOUT)
            rejoined = wait(lambda: controller in
                            [m["node_id"] for m in survivor.cluster()["brokers"]], 60, "the rejoin")
            samples["dropped"].append(dropped - t0)
            samples["controller"].append(elected - t0)
            samples["rejoined"].append(rejoined - t1)
            print(f"kill {i + 1:2}: broker {controller} dropped after {dropped - t0:.2f}s, "
                  f"controller after {elected - t0:.2f}s, restarted one listed after "
                  f"{rejoined - t1:.2f}s", flush=True)
            wait(lambda: not victim.cluster()["fenced"], 30, "the restarted broker's session")
    finally:
        for b in brokers.values():
            b.close()
        etcd.close()
    print(f"\n{args.kills} kills of the controller, {args.brokers} brokers, "
          f"keel.cluster.session.timeout.ms={args.session_ms} (etcd leases count whole seconds)")
    print(f"{'seconds from the kill (restart for rejoin)':44} {'p50':>6} {'p90':>6} {'max':>6}")
    for name, what in [("dropped", "killed broker dropped from Metadata"),
                       ("controller", "new controller elected"),
                       ("rejoined", "restarted broker listed again")]:
        p50, p90, most = summary(samples[name])
        print(f"{what:44} {p50:>6} {p90:>6} {most:>6}")
    if args.json:
        args.json.write_text(json.dumps({"session_ms": args.session_ms, "brokers": args.brokers,
                                         "samples_s": samples}, indent=2))
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
