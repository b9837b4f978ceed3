#!/usr/bin/env python3
"""What Keel's live path costs per acknowledged record: broker CPU time,
context switches, and the request stages' means, for one or more keel
binaries, in alternating rounds on the same machine.

Each round starts the binary on a fresh data directory, warms it up with a
short keel-bench run, then runs `keel-bench catchup` with a tiny history
(no backfill to speak of) and only the live phase: an acks=all producer at
--rate records per second (linger 0, idempotent, so it pipelines up to 5
requests) and a tailing consumer. Around that phase it reads the broker's
CPU time (/proc/PID/stat) and its threads' voluntary and involuntary context
switches (/proc/PID/task/*/status), and afterwards its /metrics.

CPU time and context switches per acknowledged record are counts, and much
steadier on a shared machine than latency; the client's p50/p99 are printed
too, with the host's steal time, which says when a round was disturbed.
A benchmark, not a test: it prints numbers and asserts none.

usage: bench/live_cost.py [--rate 5120] [--seconds 30] [--rounds 3]
                          [--json FILE] LABEL=KEEL_BINARY ...
(default: one binary, current=target/release/keel)
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from catchup import build_bench  # noqa: E402
from throughput import free_port, wait_port  # noqa: E402

STAGES = ("connection", "queue", "write", "publish", "reply", "send", "total")


def broker_counters(pid: int) -> tuple[int, int]:
    """(CPU clock ticks, context switches of all threads) of process `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    switches = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue  # a thread that just ended
        switches += sum(int(n) for n in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", text, re.M))
    return ticks, switches


def scrape(admin: int) -> dict[str, float]:
    """Produce's request count and stage sums and counts from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {"requests": float(re.search(r'keel_requests_total\{api="Produce"\} (\S+)', text).group(1))}
    for kind, stage, value in re.findall(
            r'keel_request_stage_seconds_(sum|count)\{api="Produce",stage="(\w+)"\} (\S+)', text):
        out[f"{kind}:{stage}"] = float(value)
    return out


def stage_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean microseconds per Produce stage between two scrapes."""
    means = {}
    for stage in STAGES:
        n = after.get(f"count:{stage}", 0) - before.get(f"count:{stage}", 0)
        if n > 0:
            means[stage] = (after[f"sum:{stage}"] - before.get(f"sum:{stage}", 0)) / n * 1e6
    return means


def one_round(label: str, binary: Path, bench: Path, args, work: Path) -> dict:
    data = work / f"{label}-data"
    shutil.rmtree(data, ignore_errors=True)
    port, admin = free_port(), free_port()
    log = open(work / f"{label}.log", "w")
    proc = subprocess.Popen([str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
                             "--set", f"keel.admin.listen=127.0.0.1:{admin}"], stdout=log, stderr=log)
    try:
        wait_port(port)
        bootstrap = f"127.0.0.1:{port}"

        def live(topic: str, seconds: float, out: Path) -> dict:
            subprocess.run([str(bench), "catchup", "--bootstrap", bootstrap, "--topic", topic,
                            "--history-bytes", "1MiB", "--rate", str(args.rate), "--baseline-s", str(seconds),
                            "--backfill-max-s", "0.1", "--after-s", "0.1", "--broker-pid", str(proc.pid),
                            "--progress-s", "0", "--json", str(out)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return json.loads(out.read_text())

        live("warm", 5, work / "warm.json")
        before, scraped = broker_counters(proc.pid), scrape(admin)
        result = live("live", args.seconds, work / f"{label}.json")
        after, rescraped = broker_counters(proc.pid), scrape(admin)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    baseline = result["phases"][0]
    acks = baseline["produce"]["count"]
    return {
        "acks": acks,
        "cpu_us_per_ack": (after[0] - before[0]) * 1e4 / acks,
        "switches_per_ack": (after[1] - before[1]) / acks,
        "produce_p50_ms": baseline["produce"]["p50_ms"],
        "produce_p99_ms": baseline["produce"]["p99_ms"],
        "broker_cores": baseline["broker"]["cpu_cores"],
        "bench_cores": baseline["broker"]["bench_cpu_cores"],
        "steal_cores": baseline["broker"]["host"]["steal_cores"],
        # The measured run's requests: its topic creation and 1 MiB
        # preload are a small part of them.
        "produce_stage_us": stage_means(scraped, rescraped),
        "produce_requests": rescraped["requests"] - scraped["requests"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binaries", nargs="*", help="LABEL=PATH of a keel binary")
    ap.add_argument("--rate", type=int, default=5120, help="live records per second (1 KiB each)")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bench-bin", type=Path, help="a keel-bench binary already built (default: go build)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    binaries = [tuple(b.split("=", 1)) for b in args.binaries] or [("current", str(REPO / "target/release/keel"))]
    work = Path(tempfile.mkdtemp(prefix="keel-live-cost-"))
    bench = args.bench_bin or build_bench(work / "keel-bench")
    rounds: dict[str, list[dict]] = {label: [] for label, _ in binaries}
    for i in range(args.rounds):
        for label, path in binaries:
            r = one_round(label, Path(path), bench, args, work)
            rounds[label].append(r)
            print(f"round {i + 1} {label}: {r['cpu_us_per_ack']:.1f} us CPU and {r['switches_per_ack']:.2f} "
                  f"context switches per ack, produce p50/p99 {r['produce_p50_ms']:.2f}/{r['produce_p99_ms']:.2f} ms, "
                  f"steal {r['steal_cores']:.2f} cores", flush=True)
    shutil.rmtree(work, ignore_errors=True)

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[label])

    print(f"\nmedian of {args.rounds} rounds, {args.rate} records/s of 1 KiB, acks=all, {args.seconds:.0f} s each\n")
    labels = [label for label, _ in binaries]
    print("| metric | " + " | ".join(labels) + " |")
    print("| --- |" + " ---: |" * len(labels))
    for key, name in (("cpu_us_per_ack", "broker CPU us per acked record"),
                      ("switches_per_ack", "broker context switches per acked record"),
                      ("produce_p50_ms", "produce p50 ms (client)"), ("produce_p99_ms", "produce p99 ms (client)"),
                      ("broker_cores", "broker CPU cores"), ("bench_cores", "bench CPU cores"),
                      ("steal_cores", "host steal cores")):
        print(f"| {name} | " + " | ".join(f"{med(label, key):.2f}" for label in labels) + " |")
    for label in labels:
        records_per_request = statistics.median(
            r["acks"] / max(r["produce_requests"], 1) for r in rounds[label])
        stages = {s: statistics.median(r["produce_stage_us"].get(s, float("nan")) for r in rounds[label])
                  for s in STAGES}
        print(f"\n{label}: Produce stage means (us): "
              + ", ".join(f"{s} {v:.0f}" for s, v in stages.items())
              + f"; about {records_per_request:.2f} records per request")
    if args.json:
        args.json.write_text(json.dumps({"rate": args.rate, "seconds": args.seconds, "rounds": rounds}, indent=1))
        print(f"JSON written to {args.json}")


if __name__ == "__main__":
    main()
