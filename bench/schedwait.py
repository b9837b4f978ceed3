#!/usr/bin/env python3
"""Who held the CPU while a live thread waited for it.

Records the scheduler with `perf sched record -a` for a few seconds and
replays its switch and wake-up events. A *live* thread is one of the
broker's request threads (every thread of the broker process except its
`keel-bulk`, `keel-cleaner` and `*-log` threads) or a thread of the live
clients' process (keel-bench's producer and tailing consumer). Each time a
live thread is woken, or preempted while runnable, the time until it runs
again is its wait. For every wait over --min-wait-ms, the table charges the
threads that ran on the CPU the waiter then ran on, for the part of the
wait they ran, to their role:

    broker request threads   the broker's live threads (tokio's workers and blocking pool)
    broker bulk threads      keel-bulk (cold reads, large responses), cleaner, deleter, logs
    live clients             keel-bench's own process
    backfill process         another keel-bench process (catchup --backfill-process)
    kernel threads           kworkers, ksoftirqd, jbd2, loop workers, ...
    other                    everything else (perf itself, shells, the hypervisor's
                             guest agents)

Time the CPU was idle during a wait (the wake-up's IPI had not landed yet,
the hypervisor had not run the vCPU, or the thread had queued on a busy
CPU and was then moved to this idle one) is charged to "idle (wake-up
latency)". With the backfill consumer inside keel-bench's process, its
threads count as live clients, their waits included.

usage: bench/schedwait.py record OUT.data SECONDS
       bench/schedwait.py report OUT.data --broker-pid PID --bench-pid PID

`bench/catchup.py --sched-trace SECONDS` runs both, once in the baseline and
once in the backfill, and prints the two side by side. Needs `perf` (the
linux-perf package) and root; a benchmark aid, not a test.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROLES = ("broker request threads", "broker bulk threads", "live clients", "backfill process",
         "kernel threads", "other", "idle (wake-up latency)")

# perf script's default line for the sched tracepoints, with -F pid,tid (tgid/tid).
LINE = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<tgid>\d+)/(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+"
                  r"(?P<t>[\d.]+):\s+sched:(?P<ev>\w+):\s+(?P<rest>.*)$")
FIELD = re.compile(r"(\w+)=(\S+)")


def available() -> str | None:
    """None if perf can record the scheduler here, else why not."""
    if shutil.which("perf") is None:
        return "perf is not installed (apt-get install linux-perf)"
    return None


def record(out: Path, seconds: float) -> subprocess.Popen:
    """Starts `perf sched record` for `seconds` on every CPU; the caller waits."""
    return subprocess.Popen(["perf", "sched", "record", "-a", "-o", str(out), "--", "sleep", str(seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def events(data: Path):
    """(time, cpu, event, fields, tgid, tid, comm) per sched event, in order."""
    cmd = ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,cpu,time,event,trace"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        yield from parse(p.stdout)
        if p.wait() != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {p.stderr.read().strip()}")


def parse(lines):
    """`events` from the lines of `perf script -F comm,pid,tid,cpu,time,event,trace`."""
    for line in lines:
        m = LINE.match(line)
        if m is None:
            continue
        rest = m["rest"]
        if m["ev"] == "sched_switch":
            prev, _, nxt = rest.partition(" ==> ")
            fields = {"prev": dict(FIELD.findall(prev)), "next": dict(FIELD.findall(nxt))}
        else:
            fields = dict(FIELD.findall(rest))
        yield float(m["t"]), int(m["cpu"]), m["ev"], fields, int(m["tgid"]), int(m["tid"]), m["comm"]


class Roles:
    """Maps a thread to its role from the process it belongs to and its name."""

    def __init__(self, broker_pid: int, bench_pid: int):
        self.broker, self.bench = broker_pid, bench_pid
        self.tgid: dict[int, int] = {}
        self.comm: dict[int, str] = {}

    def seen(self, tid: int, tgid: int, comm: str) -> None:
        self.tgid[tid] = tgid
        self.comm[tid] = comm

    def of(self, tid: int) -> str:
        if tid == 0:
            return "idle (wake-up latency)"
        tgid, comm = self.tgid.get(tid), self.comm.get(tid, "")
        if tgid == self.broker:
            bulk = comm.startswith(("keel-bulk", "keel-cleaner", "keel-delete")) or comm.endswith("-log")
            return "broker bulk threads" if bulk else "broker request threads"
        if tgid == self.bench:
            return "live clients"
        if comm.startswith("keel-bench"):
            return "backfill process"
        if self._kernel(comm):
            return "kernel threads"
        return "other"

    @staticmethod
    def _kernel(comm: str) -> bool:
        return comm.startswith(("kworker", "ksoftirqd", "jbd2", "loop", "kswapd", "rcu", "migration",
                                "kcompactd", "kdamond", "khugepaged", "irq/", "cpuhp", "watchdog"))

    def live(self, tid: int) -> bool:
        return self.of(tid) in ("broker request threads", "live clients")


def analyze(data: Path, broker_pid: int, bench_pid: int, min_wait_ms: float = 0.5) -> dict:
    """Replays the recording; returns counts and the time charged per role."""
    return replay(events(data), broker_pid, bench_pid, min_wait_ms)


def replay(evs, broker_pid: int, bench_pid: int, min_wait_ms: float = 0.5) -> dict:
    """`analyze` over events as `events` yields them."""
    roles = Roles(broker_pid, bench_pid)
    on_cpu: dict[int, tuple[int, float]] = {}        # cpu -> (tid, since)
    waiting: dict[int, float] = {}                   # tid -> runnable since
    stretches: dict[int, list[tuple[float, float, int]]] = collections.defaultdict(list)
    waits: list[tuple[float, float, int, int]] = []  # (start, end, cpu, tid)
    first = last = None
    for t, cpu, ev, f, tgid, tid, comm in evs:
        first = t if first is None else first
        last = t
        roles.seen(tid, tgid, comm)
        if ev in ("sched_waking", "sched_wakeup", "sched_wakeup_new"):
            woken = int(f.get("pid", -1))
            if woken > 0:
                waiting.setdefault(woken, t)
        elif ev == "sched_switch":
            prev, nxt = int(f["prev"]["prev_pid"]), int(f["next"]["next_pid"])
            roles.comm.setdefault(nxt, f["next"].get("next_comm", ""))
            if cpu in on_cpu:
                tid0, since = on_cpu[cpu]
                stretches[cpu].append((since, t, tid0))
            on_cpu[cpu] = (nxt, t)
            start = waiting.pop(nxt, None)
            if start is not None and nxt:
                waits.append((start, t, cpu, nxt))
            state = f["prev"].get("prev_state", "")
            if prev and state.startswith("R"):
                waiting[prev] = t  # preempted: runnable, waiting for a CPU again
            else:
                waiting.pop(prev, None)  # asleep: a wake-up seen while it still ran started no wait
    waits = [w for w in waits if roles.live(w[3])]  # roles are known once every thread has run
    charged = collections.Counter()
    others = collections.Counter()  # "other" and "kernel threads" by thread name
    over = [w for w in waits if (w[1] - w[0]) * 1e3 > min_wait_ms]
    ends = {cpu: [e for _, e, _ in runs] for cpu, runs in stretches.items()}
    for start, end, cpu, _ in over:
        runs = stretches[cpu]
        for i in range(bisect.bisect_right(ends.get(cpu, []), start), len(runs)):
            s, e, who = runs[i]
            if s >= end:
                break
            role, held = roles.of(who), min(e, end) - max(s, start)
            charged[role] += held
            if role in ("other", "kernel threads"):
                others[roles.comm.get(who, str(who))] += held
    switch_ins = collections.Counter(roles.of(who) for runs in stretches.values() for _, _, who in runs)
    lengths = sorted((e - s) * 1e3 for s, e, _, _ in waits)
    seconds = (last - first) if first is not None else 0.0

    def pct(q: float) -> float:
        return lengths[min(len(lengths) - 1, int(q * len(lengths)))] if lengths else 0.0

    return {
        "seconds": round(seconds, 3),
        "live_waits": len(waits),
        "live_wait_p99_ms": round(pct(0.99), 3),
        "live_wait_p999_ms": round(pct(0.999), 3),
        "live_waits_over_min": len(over),
        "live_waits_over_1ms": sum(1 for x in lengths if x > 1.0),
        "min_wait_ms": min_wait_ms,
        "charged_ms_per_s": {r: round(charged[r] * 1e3 / seconds, 2) if seconds else 0.0 for r in ROLES},
        "switch_ins_per_s": {r: round(switch_ins[r] / seconds) if seconds else 0 for r in ROLES[:-1]},
        "others_ms_per_s": {c: round(v * 1e3 / seconds, 2) for c, v in others.most_common(5)} if seconds else {},
    }


def table(by_phase: dict[str, dict]) -> str:
    """The phases' results side by side, as a Markdown table."""
    phases = [p for p in by_phase if by_phase[p]]
    if not phases:
        return ""
    min_wait = by_phase[phases[0]]["min_wait_ms"]
    rows = [("seconds recorded", "seconds"), ("live thread waits", "live_waits"),
            ("live wait p99 ms", "live_wait_p99_ms"), ("live wait p999 ms", "live_wait_p999_ms"),
            (f"waits over {min_wait} ms", "live_waits_over_min"), ("waits over 1 ms", "live_waits_over_1ms")]
    out = ["| | " + " | ".join(phases) + " |", "| --- |" + " ---: |" * len(phases)]
    for label, key in rows:
        out.append(f"| {label} | " + " | ".join(str(by_phase[p][key]) for p in phases) + " |")
    out.append(f"| **CPU held while a live thread waited over {min_wait} ms, ms per s:** |"
               + " |" * len(phases))
    for role in ROLES:
        out.append(f"| {role} | " + " | ".join(str(by_phase[p]["charged_ms_per_s"][role]) for p in phases) + " |")
    out.append("| **times a thread got a CPU, per s:** |" + " |" * len(phases))
    for role in ROLES[:-1]:
        out.append(f"| {role} | " + " | ".join(str(by_phase[p]["switch_ins_per_s"][role]) for p in phases) + " |")
    tops = "; ".join(f"{p}: " + ", ".join(f"{c} {v}" for c, v in by_phase[p]["others_ms_per_s"].items())
                     for p in phases if by_phase[p]["others_ms_per_s"])
    return "\n".join(out) + (f"\n\nkernel threads and other, by name (ms per s): {tops}" if tops else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("seconds", type=float)
    rep = sub.add_parser("report")
    rep.add_argument("data", type=Path)
    rep.add_argument("--broker-pid", type=int, required=True)
    rep.add_argument("--bench-pid", type=int, required=True)
    rep.add_argument("--min-wait-ms", type=float, default=0.5)
    rep.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if why := available():
        raise SystemExit(why)
    if args.cmd == "record":
        p = record(args.out, args.seconds)
        if p.wait() != 0:
            raise SystemExit(f"perf sched record failed: {p.stderr.read().strip()}")
        return
    res = analyze(args.data, args.broker_pid, args.bench_pid, args.min_wait_ms)
    print(json.dumps(res, indent=2) if args.json else table({args.data.name: res}))


if __name__ == "__main__":
    sys.exit(main())
