#!/usr/bin/env python3
"""Share groups (KIP-932) on Keel and Apache Kafka 4.3.1, same client
(Kafka's KafkaShareConsumer, bench/java/ShareBench.java), same run.

Each broker runs alone (never both at once), started afresh for each of
two phases; the rounds alternate between the brokers.
* Throughput, with the brokers' default record lock (30 s): per round and
  per consumer count (1, 2, 4), a fresh topic (4 partitions) and group.
  The consumers join first and wait until each is at the group's target
  assignment epoch (has been sent its part of the last assignment), then
  read --warmup records produced after that: every share partition exists (Keel starts a new one
  at the log end, as Kafka does with `share.auto.offset.reset` at its
  default, latest, so neither broker needs a group config) and the fresh
  client JVM's JIT is not timed. They stop polling while the timed records
  are produced; the clock runs from letting them go to the last record
  delivered and to the last acknowledgement committed (implicit
  acknowledgement: each poll acknowledges the one before, a final
  commitSync() the last). A parked consumer's outstanding ShareFetch may
  already hold a few records when the clock starts.
* Redelivery, with `group.share.record.lock.duration.ms` at --lock-ms on
  both brokers (and `group.share.min.record.lock.duration.ms`, default
  15000, lowered to allow it): per round two explicit-acknowledgement
  consumers join one group on a one-partition topic; --held records are
  produced in one batch, the consumer that acquires them holds them and is
  stopped with SIGSTOP, and the other, still polling, gets them again once
  their lock runs out. A sample is the time from the lock's expiry to the
  other consumer's poll returning the record. The expiry is the batch's
  append time (the topic has LogAppendTime; the holder's ShareFetch is
  waiting for the batch and acquires it within a wake-up) plus the lock;
  the poll's return is wall-clock ms in the taker's JVM, so a sample
  includes the response's way through that client (the first records
  that JVM decodes).
A benchmark, not a test: it prints numbers, asserts none.

usage: bench/share_groups.py [--records N] [--record-size B] [--partitions P]
                             [--warmup W] [--consumers 1,2,4] [--rounds R]
                             [--lock-ms MS] [--held K] [--redelivery-rounds R]
                             [--keel-bin PATH] [--json FILE]
The keel binary defaults to target/release/keel, else target/debug/keel
(build it with `cargo build --release -p keel-server`).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from throughput import free_port, wait_port  # noqa: E402

LIBS = HERE / "lab" / "kafka-libs"
LOG4J = HERE / "kafka" / "tools-log4j2.properties"
# Both brokers bound the record lock by group.share.min.record.lock.duration.ms
# and ...max... (defaults 15000 and 60000); a short lock needs the lower
# bound lowered, to at most 1000 on Keel.
MIN_LOCK_MS = 1000


def default_keel() -> str:
    release = REPO / "target" / "release" / "keel"
    return str(release if release.exists() else REPO / "target" / "debug" / "keel")


def keel_build(keel: str) -> dict[str, str]:
    """What is measured: the binary may be older or newer than the tree."""
    tree = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                          capture_output=True, text=True).stdout.strip()
    return {"path": keel, "modified": time.ctime(os.path.getmtime(keel)), "tree": tree}


def compile_java() -> Path:
    """ShareBench compiled once for the run (the source launcher would
    compile it again in every JVM, on the cores the brokers use)."""
    out = Path(tempfile.mkdtemp(prefix="share-bench-classes-"))
    subprocess.run(["javac", "-cp", f"{LIBS}/*", "-d", str(out), str(HERE / "java" / "ShareBench.java")],
                   check=True)
    return out


def java(classes: Path, *args: str, heap: str = "512m") -> list[str]:
    return ["java", f"-Xmx{heap}", "-cp", f"{classes}:{LIBS}/*", f"-Dlog4j2.configurationFile={LOG4J}",
            "ShareBench", *args]


def start_kafka(props: dict[str, str]):
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="kafka-share-"))
    env = dict(os.environ, KAFKA_EXTRA_PROPS="\n".join(f"{k}={v}" for k, v in props.items()))
    subprocess.run([str(HERE / "kafka" / "start.sh"), str(port), str(data)], check=True,
                   stdout=subprocess.DEVNULL, env=env)

    def stop():
        subprocess.run([str(HERE / "kafka" / "stop.sh"), str(data)], stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)
    return f"127.0.0.1:{port}", stop


def start_keel(keel: str, sets: dict[str, str]):
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="keel-share-"))
    # The admin endpoint is off: a broker already running here may hold its port.
    sets = {"keel.admin.listen": "", "keel.share.version": "1", **sets}
    log = data / "keel.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([keel, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data / "data"),
                                 *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]],
                                stderr=stderr)
    try:
        wait_port(port)
    except SystemExit:
        proc.kill()
        proc.wait()
        tail = log.read_text()[-2000:]
        shutil.rmtree(data, ignore_errors=True)
        raise SystemExit(f"keel did not start:\n{tail}") from None

    def stop():
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)
    return f"127.0.0.1:{port}", stop


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic].result(30)


def throughput(classes: Path, bootstrap: str, consumers: int, r: int, args) -> dict:
    topic, group = f"share-{consumers}-{r}", f"workers-{consumers}-{r}"
    create_topic(bootstrap, topic, args.partitions)
    done = subprocess.run(java(classes, "throughput", bootstrap, topic, group, str(consumers),
                               str(args.partitions), str(args.records), str(args.record_size), str(args.warmup), "300",
                               heap="1g"),
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"ShareBench throughput failed against {bootstrap}:\n"
                         f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(lines[-1])


class Racers:
    """Two `ShareBench race` consumers of one group, their output lines
    merged in arrival order."""

    def __init__(self, classes: Path, bootstrap: str, topic: str, group: str):
        self.bootstrap = bootstrap
        self.lines: queue.Queue = queue.Queue()
        self.procs = [subprocess.Popen(java(classes, "race", bootstrap, topic, group, "120", heap="256m"),
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                      for _ in range(2)]
        for i, proc in enumerate(self.procs):
            threading.Thread(target=self._read, args=(i, proc), daemon=True).start()

    def _read(self, i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.put((i, line.strip()))
        self.lines.put((i, None))

    def next_line(self, what: str) -> tuple[int, str]:
        """The next line of either consumer, and which one wrote it."""
        try:
            i, line = self.lines.get(timeout=150)
        except queue.Empty:
            raise SystemExit(f"no {what} from ShareBench race against {self.bootstrap} within 150 s") from None
        if line is None:
            raise SystemExit(f"ShareBench race exited before {what} against {self.bootstrap}")
        return i, line

    def close(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()


def race_round(classes: Path, bootstrap: str, r: int, args) -> dict:
    """One redelivery round (see the module docs): the samples in ms, or
    `split` when both consumers got some of the batch first (then neither
    is left to take them again)."""
    topic = f"held-{r}"
    # The broker's append time: the holder's fetch, waiting, acquires the
    # batch as it is appended.
    create_topic(bootstrap, topic, 1, {"message.timestamp.type": "LogAppendTime"})
    racers = Racers(classes, bootstrap, topic, f"holders-{r}")
    try:
        ready = 0
        while ready < 2:
            ready += racers.next_line("READY")[1] == "READY"
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
        for v in range(args.held):
            producer.produce(topic, value=b"%010d" % v + b"x" * (args.record_size - 10), partition=0)
        producer.flush(30)
        holder, line = racers.next_line("HELD")
        while not line.startswith("HELD "):
            holder, line = racers.next_line("HELD")
        racers.procs[holder].send_signal(signal.SIGSTOP)
        held = json.loads(line[len("HELD "):])
        again: dict[int, int] = {}
        while len(again) < len(held["values"]):
            _, line = racers.next_line("AGAIN")
            if line.startswith("HELD "):
                return {"split": True}
            if line.startswith("AGAIN "):
                _, value, at_ms = line.split()
                again[int(value)] = int(at_ms)
    finally:
        racers.close()
    expiry_ms = held["append_ms"] + args.lock_ms
    return {"split": False, "held": len(held["values"]),
            "holder_poll_after_append_ms": held["polled_ms"] - held["append_ms"],
            "samples_ms": [again[v] - expiry_ms for v in held["values"]]}


def throughput_phase(name: str, start, classes: Path, r: int, args, out: dict) -> None:
    """One round of every consumer count on a broker with the default lock."""
    bootstrap, stop = start(lock_ms=None)
    try:
        for n in args.consumers:
            res = throughput(classes, bootstrap, n, r, args)
            print(f"{name} round {r + 1}, {n} consumer(s): {json.dumps(res)}", flush=True)
            out["throughput"][n].append(res)
    finally:
        stop()


def redelivery_phase(name: str, start, classes: Path, rounds: int, args, out: dict) -> None:
    """`rounds` redelivery rounds on a broker with the short lock; a split
    round is run again (at most `rounds` times)."""
    bootstrap, stop = start(lock_ms=args.lock_ms)
    try:
        done, attempt = 0, 0
        while done < rounds and attempt < 2 * rounds:
            res = race_round(classes, bootstrap, attempt, args)
            attempt += 1
            print(f"{name} redelivery: {json.dumps(res)}", flush=True)
            if not res["split"]:
                out["redelivery"].append(res)
                done += 1
    finally:
        stop()


def summary(run: dict) -> dict:
    """Per consumer count the best round, and the median of the rounds'
    acknowledged records/s; the redelivery samples' p50 and max."""
    best = {}
    for n, rows in run["throughput"].items():
        best[f"records_per_s_{n}"] = max(x["records_per_s"] for x in rows)
        best[f"acknowledged_records_per_s_{n}"] = max(x["acknowledged_records_per_s"] for x in rows)
        best[f"acknowledged_records_per_s_{n}_median"] = statistics.median(
            x["acknowledged_records_per_s"] for x in rows)
    samples = [s for x in run["redelivery"] for s in x["samples_ms"]]
    if samples:
        best["redelivery_ms_p50"] = statistics.median(samples)
        best["redelivery_ms_max"] = max(samples)
    return best


def report(args, runs: dict, best: dict, build: dict) -> None:
    print(f"\nshare groups, KafkaShareConsumer (Kafka 4.3.1 client); keel {build}")
    print(f"throughput: {args.records} records x {args.record_size} B on {args.partitions} partitions, "
          f"produced after the consumers joined, implicit acknowledgement, best of {args.rounds} rounds")
    print(f"redelivery: {args.held} records held per round, lock {args.lock_ms} ms, "
          f"{len(runs['keel']['redelivery'])} / {len(runs['kafka']['redelivery'])} rounds (keel / kafka); "
          f"ms from the lock's expiry to the other consumer's poll")
    print(f"{'metric':<42}{'keel':>12}{'kafka 4.3.1':>14}{'keel/kafka':>12}")
    for m, k in best["keel"].items():
        a = best["kafka"].get(m, float("nan"))
        ratio = k / a if a and a > 0 else float("nan")
        print(f"{m:<42}{k:>12.1f}{a:>14.1f}{ratio:>12.2f}")
    for name, run in runs.items():
        rows = [x for rows in run["throughput"].values() for x in rows]
        errors: dict[str, int] = {}
        for x in rows:
            for e, n in x["acknowledgement_errors"].items():
                errors[e] = errors.get(e, 0) + n
        print(f"{name} throughput runs: {sum(x['delivered_again'] for x in rows)} records delivered twice, "
              f"{sum(x['failed_acknowledgements'] for x in rows)} acknowledgements failed (expected 0 and 0)"
              + (f": {errors}" if errors else ""))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--record-size", type=int, default=150)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=50_000, help="records read before the timed ones, per run")
    ap.add_argument("--consumers", default="1,2,4", help="consumer counts, comma separated")
    ap.add_argument("--rounds", type=int, default=2, help="throughput rounds (the best is shown)")
    ap.add_argument("--lock-ms", type=int, default=2000, help="record lock in the redelivery runs")
    ap.add_argument("--held", type=int, default=20, help="records held per redelivery round")
    ap.add_argument("--redelivery-rounds", type=int, default=5)
    ap.add_argument("--keel-bin", "--keel", dest="keel", default=default_keel())
    ap.add_argument("--json")
    args = ap.parse_args()
    args.consumers = [int(n) for n in args.consumers.split(",")]
    subprocess.run([str(HERE / "kafka" / "fetch.sh")], check=True, stdout=subprocess.DEVNULL)
    classes = compile_java()
    build = keel_build(args.keel)

    def locks(lock_ms: int | None) -> dict[str, str]:
        if lock_ms is None:
            return {}
        return {"group.share.record.lock.duration.ms": str(lock_ms),
                "group.share.min.record.lock.duration.ms": str(min(lock_ms, MIN_LOCK_MS))}

    def kafka(lock_ms: int | None):
        return start_kafka(locks(lock_ms))

    def keel(lock_ms: int | None):
        return start_keel(args.keel, locks(lock_ms))

    # Rounds alternate between the brokers, so a noisy minute on this
    # shared machine does not fall on one broker only.
    brokers = [("keel", keel), ("kafka", kafka)]
    runs = {name: {"throughput": {n: [] for n in args.consumers}, "redelivery": []} for name, _ in brokers}
    try:
        for r in range(args.rounds):
            for name, start in brokers:
                throughput_phase(name, start, classes, r, args, runs[name])
            held_rounds = len(range(r, args.redelivery_rounds, args.rounds))
            for name, start in brokers:
                if held_rounds:
                    redelivery_phase(name, start, classes, held_rounds, args, runs[name])
    finally:
        shutil.rmtree(classes, ignore_errors=True)
    best = {name: summary(run) for name, run in runs.items()}
    after = keel_build(args.keel)
    if after["modified"] != build["modified"]:
        build["rebuilt_during_run"] = after["modified"]
    report(args, runs, best, build)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "keel_build": build, "runs": runs,
                                                "best": best}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
