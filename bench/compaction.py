#!/usr/bin/env python3
"""Log compaction, Keel and Apache Kafka side by side: the bulk-load-then-
republish shape (background article 003) at a scale that runs in minutes.

For each broker, one at a time (they do not share the two cores):
1. start it with the cleaner off; create a compacted topic; produce N
   records with N unique keys (the bulk load), then the same N keys again
   (the republish); stop it;
2. start it again with the cleaner on and a key map that holds
   `--map-keys` keys per pass (Keel: 16 bytes per key; Kafka: 24 bytes per
   key at its 0.9 load factor, so both get the same keys per pass);
3. meanwhile a live producer (acks=all) and a tailing consumer on another
   topic measure produce and end-to-end latency; "during" is every sample
   sent while a pass ran (by the passes' own start and end times), the
   baseline the `--baseline-s` after no pass has run for `--quiet-s`.

Per pass it reads the broker's own report (Keel's `cleaned` log lines,
Kafka's LogCleaner statistics): bytes reclaimed and the time it took.
Prints the pass tables, map density (keys per MiB of map) and live latency
during cleaning vs baseline, with Keel/Kafka ratios; `--json FILE` keeps
the numbers. A benchmark, not a test: it asserts nothing about them.

usage: bench/compaction.py [--keys N] [--value-size B] [--map-keys K]
                           [--min-dirty-ratio R] [--keel PATH] [--skip-kafka]
The keel binary defaults to target/release/keel; Kafka comes from
bench/kafka/fetch.sh.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from scale import free_port, raise_nofile  # noqa: E402

TOPIC = "compacted"
LIVE = "live"
KEEL_BYTES_PER_KEY = 16
KAFKA_BYTES_PER_KEY = 24
KAFKA_LOAD_FACTOR = 0.9


class Keel:
    name = "keel"

    def __init__(self, binary: str, work: Path, port: int):
        self.binary, self.work, self.port = binary, work, port
        self.data = work / "data"
        self.log_path = work / "keel.log"
        self.proc: subprocess.Popen | None = None

    def start(self, sets: dict[str, str]) -> None:
        cmd = [self.binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data),
               "--set", "keel.admin.listen="]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, preexec_fn=raise_nofile)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(600)

    def passes(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if "keel_broker::cleaner: cleaned" not in line or f"topic={TOPIC} " not in line:
                continue
            f = dict(re.findall(r"(\w+)=(\S+)", line))
            end = datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
            out.append({"end": end, "reclaimed_mb": int(f["reclaimed_bytes"]) / 1e6,
                        "seconds": int(f["took_ms"]) / 1000, "read_mb": int(f["read_bytes"]) / 1e6,
                        "map_keys": int(f["map_keys"])})
        return out


class Kafka:
    name = "kafka"

    def __init__(self, work: Path, port: int):
        self.work, self.port = work, port
        self.data = work / "data"

    def start(self, sets: dict[str, str]) -> None:
        props = "\n".join(f"{k}={v}" for k, v in sets.items())
        env = dict(os.environ, KAFKA_EXTRA_PROPS=props, KAFKA_HEAP=os.environ.get("KAFKA_HEAP", "1g"))
        subprocess.run([str(HERE / "kafka" / "start.sh"), str(self.port), str(self.data)], env=env,
                       stdout=subprocess.DEVNULL, check=True)

    def stop(self) -> None:
        subprocess.run([str(HERE / "kafka" / "stop.sh"), str(self.data)], stdout=subprocess.DEVNULL,
                       timeout=900, check=True)

    def passes(self) -> list[dict]:
        text = (self.data / "server.log").read_text(errors="replace")
        out = []
        pattern = (r"^\[([\d-]+ [\d:,]+)\].*?cleaned log " + TOPIC + r"-0 \(dirty section = \[(\d+), (\d+)\]\)"
                   r".*?of log processed in ([\d.,]+) seconds"
                   r".*?Indexed ([\d.,]+) MB"
                   r".*?Start size: ([\d.,]+) MB \(([\d,]+) messages\)"
                   r".*?End size: ([\d.,]+) MB \(([\d,]+) messages\)")
        for m in re.finditer(pattern, text, re.S | re.M):
            num = lambda s: float(s.replace(",", ""))  # noqa: E731
            # The lab's log4j2 pattern: local time, milliseconds after a comma.
            end = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            # Kafka's "MB" is MiB; its reads are the map's plus the rewrite's.
            out.append({"end": end, "dirty_section": [int(m[2]), int(m[3])], "seconds": num(m[4]),
                        "reclaimed_mb": (num(m[6]) - num(m[8])) * 1.048576,
                        "read_mb": (num(m[5]) + num(m[6])) * 1.048576})
        return out


def create(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(60)


def wait_ready(bootstrap: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
            if md.brokers:
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.2)
    raise SystemExit(f"broker at {bootstrap} did not come up")


def load(bootstrap: str, keys: int, value_size: int) -> float:
    """Bulk load of `keys` unique keys, then the same keys again."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                  "compression.type": "none", "queue.buffering.max.messages": 500_000})
    value = b"v" * value_size
    started = time.monotonic()
    for phase in range(2):
        for i in range(keys):
            while True:
                try:
                    p.produce(TOPIC, key=b"key-%010d" % i, value=value, partition=0)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 10_000 == 0:
                p.poll(0)
    assert p.flush(300) == 0
    return time.monotonic() - started


class Live:
    """acks=all produce latency and end-to-end (produce to consume) latency
    on the live topic, at about `rate` records/s: (wall clock at send,
    milliseconds) pairs."""

    def __init__(self, bootstrap: str, rate: int):
        self.bootstrap, self.rate = bootstrap, rate
        self.produce_ms: list[tuple[float, float]] = []
        self.e2e_ms: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._produce), threading.Thread(target=self._consume)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def _produce(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 0})
        interval = 1 / self.rate
        nxt = time.monotonic()
        while not self.stop.is_set():
            sent, wall = time.monotonic(), time.time()

            def done(err, _msg, sent=sent, wall=wall):
                if err is None:
                    self.produce_ms.append((wall, (time.monotonic() - sent) * 1000))
            p.produce(LIVE, value=b"%.6f" % wall, partition=0, on_delivery=done)
            p.poll(0)
            nxt += interval
            time.sleep(max(0.0, nxt - time.monotonic()))
        p.flush(30)

    def _consume(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-unused",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        c.assign([TopicPartition(LIVE, 0, -1)])  # OFFSET_END
        while not self.stop.is_set():
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            sent = float(m.value())
            self.e2e_ms.append((sent, (time.time() - sent) * 1000))
        c.close()


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run(broker, args) -> dict:
    bootstrap = f"127.0.0.1:{broker.port}"
    topic_config = {"cleanup.policy": "compact", "segment.bytes": str(args.segment_bytes),
                    "min.cleanable.dirty.ratio": str(args.min_dirty_ratio)}
    if broker.name == "keel":
        map_bytes = args.map_keys * KEEL_BYTES_PER_KEY
        off = {"log.cleaner.enable": "false"}
        on = {"log.cleaner.dedupe.buffer.size": str(map_bytes), "log.cleaner.backoff.ms": "1000"}
    else:
        map_bytes = int(args.map_keys * KAFKA_BYTES_PER_KEY / KAFKA_LOAD_FACTOR) + 1
        off = {"log.cleaner.enable": "false"}
        on = {"log.cleaner.dedupe.buffer.size": str(map_bytes), "log.cleaner.backoff.ms": "1000"}
    if args.io_limit:
        on["log.cleaner.io.max.bytes.per.second"] = str(args.io_limit)
    broker.start(off)
    wait_ready(bootstrap)
    create(bootstrap, TOPIC, topic_config)
    create(bootstrap, LIVE, {})
    load_s = load(bootstrap, args.keys, args.value_size)
    size_before = dir_bytes(broker.data, TOPIC)
    broker.stop()

    broker.start(on)
    started = time.monotonic()
    wait_ready(bootstrap)
    live = Live(bootstrap, args.live_rate)
    live.start()
    # Samples count from a few seconds after the first acknowledged one: a
    # restarted broker may take a while to lead its partitions again, and
    # that wait is not the cleaner's doing.
    while not live.produce_ms and time.monotonic() - started < 120:
        time.sleep(0.1)
    live_from = time.time() + args.warmup_s
    last_count, last_change = 0, time.monotonic()
    while time.monotonic() - started < args.max_clean_s:
        time.sleep(1)
        n = len(broker.passes())
        if n != last_count:
            last_count, last_change = n, time.monotonic()
        elif time.monotonic() - last_change > args.quiet_s:
            break
    clean_s = time.monotonic() - started
    baseline_from = time.time()
    time.sleep(args.baseline_s)
    live.close()
    passes = broker.passes()
    # "during": samples sent while a pass ran (from each pass's own report).
    running = [(p["end"] - p["seconds"], p["end"]) for p in passes]

    def split(samples):
        during = [ms for t, ms in samples if t >= live_from and any(a <= t <= b for a, b in running)]
        return {"during": during, "baseline": [ms for t, ms in samples if t >= baseline_from]}
    produce, e2e = split(live.produce_ms), split(live.e2e_ms)
    size_after = dir_bytes(broker.data, TOPIC)
    broker.stop()
    return {
        "load_s": load_s, "map_bytes": map_bytes,
        "keys_per_mib": args.map_keys / (map_bytes / (1 << 20)),
        "size_before_mb": size_before / 1e6, "size_after_mb": size_after / 1e6,
        "passes": passes, "clean_s": clean_s,
        "live": {phase: {"produce_p50_ms": pct(produce[phase], 0.5),
                         "produce_p99_ms": pct(produce[phase], 0.99),
                         "e2e_p50_ms": pct(e2e[phase], 0.5),
                         "e2e_p99_ms": pct(e2e[phase], 0.99),
                         "samples": len(produce[phase])}
                 for phase in ("during", "baseline")},
    }


def dir_bytes(data: Path, topic: str) -> int:
    dirs = list(data.rglob(f"{topic}-0"))
    return sum(f.stat().st_size for d in dirs for f in d.glob("*.log"))


def fmt(v, spec=".1f") -> str:
    return "-" if v is None else format(v, spec)


def report(results: dict, args) -> str:
    lines = [f"compaction: {args.keys:,} keys x {args.value_size} B bulk-loaded, then republished; "
             f"map {args.map_keys:,} keys per pass; segment.bytes {args.segment_bytes:,}; "
             f"min.cleanable.dirty.ratio {args.min_dirty_ratio}", ""]
    for name, r in results.items():
        lines.append(f"{name}: {len(r['passes'])} passes in {r['clean_s']:.0f} s, "
                     f"{r['size_before_mb']:.1f} MB -> {r['size_after_mb']:.1f} MB on disk, "
                     f"map {r['map_bytes'] / (1 << 20):.2f} MiB = {r['keys_per_mib']:,.0f} keys/MiB")
        lines.append(f"  {'pass':>4}  {'reclaimed MB':>12}  {'read MB':>8}  {'seconds':>7}")
        for i, p in enumerate(r["passes"], 1):
            lines.append(f"  {i:>4}  {p['reclaimed_mb']:>12.1f}  {p['read_mb']:>8.1f}  {p['seconds']:>7.1f}")
        lines.append("")
    lines.append(f"{'live traffic':<24}" + "".join(f"{n + ' ' + ph:>18}" for n in results
                                                  for ph in ("baseline", "during")))
    for key in ("produce_p50_ms", "produce_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "samples"):
        row = f"{key:<24}"
        for r in results.values():
            for ph in ("baseline", "during"):
                v = r["live"][ph][key]
                row += f"{fmt(v, ',') if key == 'samples' else fmt(v, '.2f'):>18}"
        lines.append(row)
    for name, r in results.items():
        b, d = r["live"]["baseline"], r["live"]["during"]
        if b["produce_p99_ms"] and d["produce_p99_ms"] and b["e2e_p99_ms"] and d["e2e_p99_ms"]:
            lines.append(f"{name}: during/baseline p99 produce {d['produce_p99_ms'] / b['produce_p99_ms']:.2f}x, "
                         f"end-to-end {d['e2e_p99_ms'] / b['e2e_p99_ms']:.2f}x")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--map-keys", type=int, default=250_000, help="keys one pass's map holds")
    ap.add_argument("--segment-bytes", type=int, default=16 << 20)
    ap.add_argument("--min-dirty-ratio", type=float, default=0.3)
    ap.add_argument("--io-limit", type=int, default=0,
                    help="log.cleaner.io.max.bytes.per.second for both (default: each broker's default)")
    ap.add_argument("--live-rate", type=int, default=500)
    ap.add_argument("--quiet-s", type=float, default=20)
    ap.add_argument("--warmup-s", type=float, default=3)
    ap.add_argument("--baseline-s", type=float, default=20)
    ap.add_argument("--max-clean-s", type=float, default=900)
    ap.add_argument("--keel", default=str(REPO / "target" / "release" / "keel"))
    ap.add_argument("--skip-kafka", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    results = {}
    for name in (["kafka"] if not args.skip_kafka else []) + ["keel"]:
        work = Path(tempfile.mkdtemp(prefix=f"compaction-{name}-", dir=os.environ.get("BENCH_DIR")))
        port = free_port()
        broker = Kafka(work, port) if name == "kafka" else Keel(args.keel, work, port)
        print(f"== {name}", flush=True)
        try:
            results[name] = run(broker, args)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    text = report(results, args)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
