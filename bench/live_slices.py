#!/usr/bin/env python3
"""Gives a running Keel broker's live threads a shorter scheduler time slice.

Every thread of every `keel` process whose name starts with `keel` but is
not a bulk, cleaner or deleter thread (so: the runtime's workers and
blocking threads, and the coordinators' `*-log` threads) gets
sched_setattr's sched_runtime = --slice-us (Linux 6.12+: EEVDF's
per-thread slice; a waking thread with a shorter slice may preempt the
running one sooner). New threads are picked up every 0.3 s until killed.
For experiments beside bench/catchup.py; Keel itself does not set slices
(docs/benchmarks.md, "A live thread's wake-up beside a long system call").

usage: bench/live_slices.py [--slice-us 100]
"""

import argparse
import ctypes
import os
import platform
import struct
import sys
import time

NOT_LIVE = ("keel-bulk", "keel-cleaner", "keel-delete")


def set_slice(libc, tid: int, ns: int) -> bool:
    attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQII", 56, 0, 0, 0, 0, ns, 0, 0, 0, 0), 56)
    return libc.syscall(314, tid, attr, 0) == 0  # SYS_sched_setattr on x86_64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slice-us", type=int, default=100)
    args = ap.parse_args()
    if platform.machine() != "x86_64":
        sys.exit("live_slices.py calls sched_setattr by its x86_64 number (314)")
    libc = ctypes.CDLL(None, use_errno=True)
    done: set[str] = set()
    failed: set[str] = set()
    while True:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if not os.readlink(f"/proc/{pid}/exe").endswith("/keel"):
                    continue
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                if tid in done:
                    continue
                try:
                    comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
                except OSError:
                    continue
                if not comm.startswith("keel") or comm in NOT_LIVE:
                    continue
                if set_slice(libc, int(tid), args.slice_us * 1000):
                    done.add(tid)
                    print(f"live_slices: {comm} {tid}: {args.slice_us} us", flush=True)
                elif tid not in failed:
                    failed.add(tid)
                    print(f"live_slices: {comm} {tid}: sched_setattr failed, errno {ctypes.get_errno()}", flush=True)
        time.sleep(0.3)


if __name__ == "__main__":
    main()
