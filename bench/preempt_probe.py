#!/usr/bin/env python3
"""How long a thread that wakes up waits for its CPU, beside what else runs there.

A probe process sleeps 1 ms at a time and records how late each wake-up
is, on one CPU shared with, in turn:

* nothing;
* a busy loop (user space: preempted at once by the waking probe);
* two busy loops (as many competitors as the copier has);
* a socket copier: two processes passing 16 MiB writes and reads through a
  Unix socket pair with an 8 MiB send buffer asked for (the kernel caps it
  at net.core.wmem_max; the header line says what it gave), so each call
  copies up to that much inside the kernel, as a consumer reading large
  fetch responses does.

--slice-us N asks the scheduler for an N µs time slice for the probe
(sched_setattr's sched_runtime, Linux 6.12+; 0 keeps the default): a
waking thread with a shorter slice may preempt the running one sooner.

On a kernel whose preemption model is `none` (see `keel doctor`, area
`kernel`, check `preemption`), a system call is not preempted: the probe
waits for the copier's call to return. The difference between the busy
loop and the copier is what the model costs a live thread whose CPU is
shared with such a process. A benchmark: it prints a table and asserts
nothing.

usage: bench/preempt_probe.py [--cpu 1] [--wakeups 2000] [--slice-us 0] [--json FILE]
"""

import argparse
import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import time

CHUNK = 16 << 20


def busy() -> None:
    while True:
        pass


def copier_pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    return a, b


def copier() -> None:
    a, b = copier_pair()
    if os.fork() == 0:
        a.close()
        buf = bytearray(CHUNK)
        while b.recv_into(buf):
            pass
        os._exit(0)
    b.close()
    data = bytes(CHUNK)
    while True:
        a.sendall(data)


def set_slice(ns: int) -> None:
    """sched_setattr(0, {SCHED_OTHER, sched_runtime=ns}), keeping the nice value."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQII", 56, 0, 0, os.getpriority(os.PRIO_PROCESS, 0),
                                                   0, ns, 0, 0, 0, 0), 56)
    if libc.syscall(314, 0, attr, 0) != 0:  # SYS_sched_setattr on x86_64
        raise OSError(ctypes.get_errno(), "sched_setattr")


def probe(wakeups: int, slice_ns: int) -> list[float]:
    if slice_ns:
        set_slice(slice_ns)
    late = []
    for _ in range(wakeups):
        t0 = time.perf_counter_ns()
        time.sleep(0.001)
        late.append((time.perf_counter_ns() - t0 - 1_000_000) / 1e6)
    return sorted(late)


def percentile(sorted_ms: list[float], p: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(len(sorted_ms) * p))]


def preemption_model() -> str:
    try:
        text = open("/sys/kernel/debug/sched/preempt").read()
        return text[text.index("(") + 1:text.index(")")]
    except (OSError, ValueError):
        version = open("/proc/sys/kernel/version").read().strip()
        return f"not readable here (kernel version {version!r}; `keel doctor` reads the build's)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", type=int, default=1)
    ap.add_argument("--wakeups", type=int, default=2000)
    ap.add_argument("--slice-us", type=int, default=0, help="the probe's time slice (0: the default)")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--role", choices=["busy", "copier", "probe"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "busy":
        busy()
    if args.role == "copier":
        copier()
    if args.role == "probe":
        print(json.dumps(probe(args.wakeups, args.slice_us * 1000)))
        return 0
    # Every process started from here runs on this CPU.
    os.sched_setaffinity(0, {args.cpu})
    me = [sys.executable, os.path.abspath(__file__)]
    neighbours = {"nothing": [], "busy": ["busy"], "2 busy": ["busy", "busy"], "copier": ["copier"]}
    rows = []
    for beside, roles in neighbours.items():
        others = [subprocess.Popen(me + ["--role", r], start_new_session=True) for r in roles]
        if others:
            time.sleep(0.5)
        try:
            out = subprocess.run(me + ["--role", "probe", "--wakeups", str(args.wakeups),
                                       "--slice-us", str(args.slice_us)],
                                 check=True, capture_output=True, text=True).stdout
        finally:
            for other in others:
                os.killpg(other.pid, 9)
                other.wait()
        late = json.loads(out)
        rows.append({"beside": beside, "p50_ms": percentile(late, 0.5), "p90_ms": percentile(late, 0.9),
                     "p99_ms": percentile(late, 0.99), "max_ms": late[-1]})
    a, b = copier_pair()
    # A Unix stream socket's send buffer bounds what is in flight; its
    # receive buffer size is not used.
    buffers = f"copier send buffer {a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >> 10} KiB"
    a.close()
    b.close()
    print(f"wake-up delay of a 1 ms sleeper on CPU {args.cpu}, {args.wakeups} wake-ups each; "
          f"kernel {os.uname().release}, preemption model {preemption_model()}; "
          f"probe slice {f'{args.slice_us} us' if args.slice_us else 'default'}; {buffers}")
    print(f"{'beside':<10}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for r in rows:
        print(f"{r['beside']:<10}{r['p50_ms']:>10.3f}{r['p90_ms']:>10.3f}{r['p99_ms']:>10.3f}{r['max_ms']:>10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": args.cpu, "kernel": os.uname().release, "slice_us": args.slice_us,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
