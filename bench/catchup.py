#!/usr/bin/env python3
"""The catch-up benchmark, Keel and Apache Kafka side by side.

For each broker in turn (never both at once, so they do not share the two
cores): create a memory cgroup limited to --memory, start the broker inside
it, run `keel-bench catchup` (bench/keel-bench, the franz-go client) against
it with the broker's PID and cgroup, stop the broker and remove the cgroup.
Then print a side-by-side table with Keel/Kafka ratios, and write JSON and,
when matplotlib is importable, a PNG of produce and tail latency over time.

The cgroup needs root and a writable cgroup filesystem: v1
(/sys/fs/cgroup/memory/..., memory.limit_in_bytes) or v2 (/sys/fs/cgroup with
the memory controller, memory.max). On v1 the group is made inside the
memory cgroup this script runs in, so outer limits still apply. Without
either, the brokers run unconstrained and the output says so.

Disk profiles (--disk), for the broker's data directory:
  host  (default) a directory under the lab dir (LAB_DIR, default bench/lab)
        on the machine's own disk and filesystem;
  loop  a filesystem of its own (--fs ext4|xfs, default ext4) on a loop
        device over a fresh sparse file under the lab dir, attached with
        `losetup --direct-io=on` so the backing file's page cache cannot
        mask the device; not throttled. Giving --fs without --disk means
        this profile: a filesystem choice needs a filesystem of its own;
  hdd   the loop filesystem, its I/O throttled for the broker's cgroup to
        --hdd-mb-per-s (MB = 10^6 bytes, reads and writes each) and
        --hdd-iops (reads and writes each) to emulate a spinning disk:
        cgroup v1 blkio.throttle.{read,write}_{bps,iops}_device, or v2
        io.max, "MAJ:MIN ..." of the loop device. On cgroup v1 only I/O the
        broker's own threads submit is throttled (its reads, its fsyncs);
        buffered writes that the kernel's flusher threads write back are
        not (v1 has no cgroup writeback), so the throttle is mostly on reads.
A loop or hdd profile is made afresh for each broker run (backing file,
losetup, mkfs, mount) and always torn down after it (stop the broker,
umount, losetup -d, delete the file, remove the cgroups), also on an error,
Ctrl-C or SIGTERM. Where loop devices, mkfs, or (for hdd) blkio/io
throttling are missing, the script says why and exits before starting any
broker; `--fs xfs` installs xfsprogs with apt-get when mkfs.xfs is missing.
The table reports the data disk's reads, writes, await and utilisation per
phase (/sys/dev/block/MAJ:MIN/stat: every process's I/O on that device).

Keel's tiers (--keel-tier capacity|s3; Keel only: Apache Kafka's tiered
storage needs a RemoteStorageManager plugin, none is installed here, so
Kafka runs untiered and the output says so). Keel's fast tier (log.dirs) is
on the host disk; its colder tier is on the profile's disk:
  capacity  keel.tier.capacity.dirs is a directory on the loop/hdd
            filesystem, or with the host profile a directory of its own
            beside the fast tier. With --disk hdd this is the SSD+HDD design:
            the throttle is per device for the broker's cgroup, so it
            applies exactly to the capacity tier's I/O (the mover's writes
            and fsyncs, its read-back, and cold reads of the history), while
            appends and tail reads on the fast tier are not throttled;
  s3        versitygw (tests/s3server.py) on 127.0.0.1 with its objects on
            the profile's disk, in a memory cgroup of its own (--s3-memory,
            so the objects it serves are not just the host's page cache);
            the topic has remote.storage.enable=true. Not with --disk hdd:
            versitygw's disk I/O is outside the broker's cgroup, so the
            throttle would not apply to it.
The topic gets segment.bytes 128 MiB (--segment-bytes; on Kafka too, so
the topics are the same), Keel keel.tier.fast.max.bytes 512 MiB
(--keel-fast-max-bytes), keel.tier.move.bytes.per.sec 0 (unlimited) for
the whole run (--keel-move-bytes-per-sec; the setting is read at start-up)
and an admin endpoint on a free port. keel-bench pauses after the preload
(--pause-after-preload) until /stats shows the topic's bytes released to
the colder tier >= its size - the fast budget - one segment and the fast
tier within its budget (a progress line every 5 s; --tier-stall-s without
progress or --tier-wait-max-s end the run with /stats saved as evidence).
Per phase the table adds Keel's tier counters from /stats: bytes and reads
served from the colder tier, copies, failures, the fast tier's bytes and the
topic's colder-tier bytes at the phase's end. --keel-set KEY=VALUE passes
any other setting to Keel.

Keel always runs with an admin endpoint, and a second table says where its
produce and fetch time went in each phase: per request stage (the append
queue, the write syscall, flushes, reads per tier, ...) the 99th
percentile's histogram bucket and the mean, from /metrics at the phase
boundaries (docs/metrics.md).

After the preload, keel-bench pauses (--pause-after-preload) until the
broker's dirty and under-writeback pages (its memory cgroup's memory.stat,
or the host's /proc/meminfo without one) have stayed under 16 MiB for 3 s,
at most --settle-max-s (default 120; 0 does not wait), for both brokers
alike: the baseline then measures a broker at rest, not the preload's
writeback (on the throttled disk 700 MiB of it, 8 s). With --keel-tier the
tier wait comes first.

Where the backfill consumer runs (to tell the client's CPU from the
broker's): by default inside the keel-bench process, beside the live
producer and the tailing consumer; --backfill-process runs it as a child
process, and --backfill-nice N, --backfill-sched-idle (SCHED_IDLE) and
--backfill-cpus LIST (taskset) run that child deprioritised or pinned;
--backfill-fetch-bytes sets its fetch.max.partition.bytes (default 16 MiB)
and --backfill-receive-buffer its socket receive buffer (SO_RCVBUF, the Java
consumer's receive.buffer.bytes; default the kernel's autotuning).
--broker-cpus and --bench-cpus pin the broker and keel-bench. The settings
apply to both brokers alike, and the output names them. Per phase, the
table has the broker's CPU (/proc/PID/stat utime+stime) and keel-bench's,
in cores, the machine's busy cores (/proc/stat), and the run-queue wait of
the broker's and keel-bench's threads (/proc/PID/task/*/schedstat).
The host's steal (CPU the hypervisor gave to other guests) moves every
latency on a shared VM and comes and goes by the minute, so the table also
gives each phase's quiet seconds (steal under 0.05 cores in that second)
and the produce and tail p99 over those seconds alone; the JSON timeline
has the steal of every second.
--sched-trace SECONDS records the scheduler (`perf sched record -a`) that
long, --sched-trace-delay seconds (default 10) into the baseline and into
the backfill, and bench/schedwait.py charges each wait of a live thread (the
broker's request threads, keel-bench's producer and tail) for a CPU to the
threads that held that CPU meanwhile: the broker's request or bulk threads,
the live clients, the backfill process, kernel threads. Needs perf and root.
bench/catchup_plot.py plots runs from several --json files one above the
other.
--backfill-at 0,0.25,0.5,0.75 runs several backfill readers at once (each
a client of its own), each from that share of the history to its end:
many lagging readers. A table then gives each one's finish and MB/s, and
how many histories the broker read from disk during the backfill (about
one for one reader from 0; 2.5 for the four above, unless the broker
shares their reads).
Broker-side latency: Keel's request stages come from its /metrics at the
phase boundaries; Kafka's from its own JMX request metrics (Kafka's
JmxTool reads RequestMetrics TotalTimeMs/LocalTimeMs p99 at each phase
boundary, a JVM for about a second on the bench CPUs; Kafka's histograms
decay over about five minutes, so a phase's figure still carries some of
the phases before it). A table puts the two side by side per phase.

Defaults (2 GiB cgroup, 4 GiB of history, 2 MB/s live) take about 2.5
minutes for both brokers on a 2-core machine; 8 GiB of history about 3.5. A
benchmark, not a test: it prints numbers and asserts none.

usage: bench/catchup.py [--memory 2GiB] [--history-bytes 4GiB] [--rate 2000]
                        [--record-size 1024] [--keys 100000] [--partitions 1]
                        [--baseline-s 20] [--backfill-max-s 180] [--after-s 20]
                        [--backfill-max-mb-per-s 0] [--backfill-at 0,0.25,...]
                        [--disk host|loop|hdd] [--fs ext4|xfs]
                        [--hdd-mb-per-s 150] [--hdd-iops 300] [--loop-bytes N]
                        [--backfill-process] [--backfill-nice N]
                        [--backfill-sched-idle] [--backfill-cpus LIST]
                        [--backfill-fetch-bytes 16MiB] [--backfill-receive-buffer N]
                        [--broker-cpus LIST] [--bench-cpus LIST]
                        [--sched-trace SECONDS] [--sched-trace-delay 10]
                        [--keel-tier none|capacity|s3] [--keel-fast-max-bytes 512MiB]
                        [--keel-move-bytes-per-sec 0] [--segment-bytes N]
                        [--keel-set KEY=VALUE] [--s3-memory 512MiB] [--settle-max-s 120]
                        [--kafka-heap 1g] [--skip-kafka] [--skip-keel] [--bench-bin PATH]
                        [--json FILE] [--plot FILE]
The keel binary defaults to target/release/keel.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LAB = Path(os.environ.get("LAB_DIR", HERE / "lab"))
sys.path.insert(0, str(HERE))
import schedwait  # noqa: E402
from throughput import free_port, wait_port  # noqa: E402

CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_bytes(s: str) -> int:
    m = re.fullmatch(r"(\d+)\s*(KiB|MiB|GiB|KB|MB|GB|B)?", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a byte count: {s!r}")
    mult = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9,
            "B": 1, None: 1}[m.group(2)]
    return int(m.group(1)) * mult


# ---------------------------------------------------------------- cgroups

def self_cgroup_v1(controller: str) -> str:
    """This process's path in the v1 hierarchy of `controller` ("" = root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if controller in controllers.split(","):
            return rel.lstrip("/")
    return ""


class MemCgroup:
    """A memory cgroup limited to `limit` bytes; `path` is None when neither
    cgroup v1 nor v2 memory control is usable here (`why` says why). With
    `io_limit` (an IoLimit) the broker's I/O on one device is throttled too:
    a v1 blkio group of the same name, or io.max in the same v2 group."""

    def __init__(self, name: str, limit: int, io_limit: IoLimit | None = None):
        self.limit = limit
        self.io_limit = io_limit
        self.version: str | None = None
        self.path: Path | None = None
        self.blkio: Path | None = None  # v1 only; v2 throttles in `path`
        self.why = ""
        try:
            self._create(name)
            if io_limit is not None:
                self._throttle(name, io_limit)
        except OSError as e:
            self.remove()
            self.path, self.version = None, None
            self.why = f"could not create a memory cgroup: {e}"
            if io_limit is not None:
                raise SystemExit(f"--disk hdd: could not set up the I/O throttle: {e}") from e

    def _create(self, name: str) -> None:
        if os.geteuid() != 0:
            self.why = "not root: memory cgroups need root"
            return
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            if "memory" not in (CGROUP_ROOT / "cgroup.controllers").read_text().split():
                self.why = "cgroup v2 without the memory controller"
                return
            # Only the root may hold both processes and controlled children.
            sub = CGROUP_ROOT / "cgroup.subtree_control"
            if "memory" not in sub.read_text().split():
                sub.write_text("+memory")
            path = CGROUP_ROOT / name
            path.mkdir(exist_ok=True)
            (path / "memory.max").write_text(str(self.limit))
            self.version, self.path = "v2", path
            return
        v1 = CGROUP_ROOT / "memory"
        if not (v1 / "memory.limit_in_bytes").exists():
            self.why = "no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory and no cgroup v2"
            return
        try:
            path = v1 / self_cgroup_v1("memory") / name
            path.mkdir(exist_ok=True)
        except OSError:
            path = v1 / name
            path.mkdir(exist_ok=True)
        (path / "memory.limit_in_bytes").write_text(str(self.limit))
        self.version, self.path = "v1", path

    def _throttle(self, name: str, io: IoLimit) -> None:
        if self.version == "v2":
            sub = CGROUP_ROOT / "cgroup.subtree_control"
            if "io" not in sub.read_text().split():
                sub.write_text("+io")
            (self.path / "io.max").write_text(
                f"{io.dev} rbps={io.bps} wbps={io.bps} riops={io.iops} wiops={io.iops}")
            return
        if self.version != "v1":
            raise OSError(f"no cgroup to throttle in ({self.why})")
        self.blkio = CGROUP_ROOT / "blkio" / self_cgroup_v1("blkio") / name
        self.blkio.mkdir(exist_ok=True)
        for op in ("read", "write"):
            (self.blkio / f"blkio.throttle.{op}_bps_device").write_text(f"{io.dev} {io.bps}")
            (self.blkio / f"blkio.throttle.{op}_iops_device").write_text(f"{io.dev} {io.iops}")

    def join(self) -> None:
        """Puts this (child) process in the group(s) before it execs, so the
        broker and everything it forks start inside."""
        for group in (self.path, self.blkio):
            if group is not None:
                with open(group / "cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))

    def describe(self) -> str:
        if self.path is None:
            return f"no memory cgroup ({self.why}); brokers run without a memory limit"
        text = f"memory cgroup {self.version} {self.path}, limit {self.limit / 2**30:.2f} GiB"
        if self.io_limit is not None:
            where = self.blkio if self.version == "v1" else self.path / "io.max"
            text += f"; I/O on {self.io_limit.dev} throttled to {self.io_limit.bps / 1e6:.0f} MB/s and " \
                    f"{self.io_limit.iops} IOPS each way ({where})"
        return text

    def remove(self) -> None:
        for group in (self.blkio, self.path):
            if group is not None:
                rmdir_cgroup(group)


def rmdir_cgroup(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)  # exiting processes leave the group asynchronously
    print(f"warning: could not remove {path}", file=sys.stderr)


# ---------------------------------------------------------------- disks

class IoLimit:
    """A throttle on one block device: bytes/s and IOPS, each way."""

    def __init__(self, dev: str, bps: int, iops: int):
        self.dev, self.bps, self.iops = dev, bps, iops


def run_root(cmd: list[str], what: str) -> str:
    """Runs a setup command; a failure ends the script with its output."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{what}: `{' '.join(cmd)}` failed: {(p.stderr or p.stdout).strip()}")
    return p.stdout.strip()


def ensure_mkfs(fs: str) -> str:
    """Path of mkfs.<fs>; installs xfsprogs when XFS is asked for and missing."""
    tool = f"mkfs.{fs}"
    if shutil.which(tool):
        return shutil.which(tool)
    if fs == "xfs" and shutil.which("apt-get"):
        print(f"{tool} not found: installing xfsprogs with apt-get", flush=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "xfsprogs"], check=False,
                       stdout=subprocess.DEVNULL)
    if not shutil.which(tool):
        raise SystemExit(f"--fs {fs}: {tool} is not installed and could not be installed "
                         f"({'apt-get install xfsprogs failed' if fs == 'xfs' else 'install its mkfs tool'})")
    return shutil.which(tool)


def preflight_disk(args) -> None:
    """Says why the loop/hdd profile cannot run here, before any broker."""
    if args.disk == "host":
        return
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (losetup, mkfs and mount need root)")
    if not shutil.which("losetup"):
        problems.append("losetup not found (util-linux)")
    if not Path("/dev/loop-control").exists():
        problems.append("no /dev/loop-control: the loop driver is not available")
    if args.fs not in Path("/proc/filesystems").read_text().split():
        problems.append(f"the kernel does not list {args.fs} in /proc/filesystems")
    if args.disk == "hdd":
        v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        if v2 and "io" not in (CGROUP_ROOT / "cgroup.controllers").read_text().split():
            problems.append("cgroup v2 without the io controller (io.max)")
        if not v2 and not (CGROUP_ROOT / "blkio" / "blkio.throttle.read_bps_device").exists():
            problems.append("no cgroup v1 blkio throttling at /sys/fs/cgroup/blkio")
        if not v2 and not (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists():
            problems.append("no memory cgroup to hold the broker")
    if problems:
        raise SystemExit(f"--disk {args.disk} cannot run here: " + "; ".join(problems))
    ensure_mkfs(args.fs)


class LoopDisk:
    """A fresh filesystem on a loop device over a sparse file under the lab
    directory; `mount` is where it is mounted and `dev` its MAJ:MIN."""

    def __init__(self, name: str, size: int, fs: str):
        self.file = LAB / f"{name}.img"
        self.mount = LAB / f"{name}-mnt"
        self.loop = ""
        self.mounted = False
        try:
            self._create(size, fs)
        except BaseException:
            self.remove()
            raise

    def _create(self, size: int, fs: str) -> None:
        self.file.unlink(missing_ok=True)
        with open(self.file, "wb") as f:
            f.truncate(size)  # sparse: blocks are allocated as the broker writes
        self.loop = run_root(["losetup", "--direct-io=on", "--find", "--show", str(self.file)], "losetup")
        dio = Path(f"/sys/block/{Path(self.loop).name}/loop/dio")
        if dio.exists() and dio.read_text().strip() != "1":
            print(f"warning: {self.loop} did not enable direct I/O; the backing file's page cache may "
                  "mask the device", file=sys.stderr)
        mkfs = ensure_mkfs(fs)
        run_root([mkfs, "-q", *(["-f"] if fs == "xfs" else ["-F"]), self.loop], "mkfs")
        self.mount.mkdir(parents=True, exist_ok=True)
        run_root(["mount", "-t", fs, self.loop, str(self.mount)], "mount")
        self.mounted = True
        rdev = os.stat(self.loop).st_rdev
        self.dev = f"{os.major(rdev)}:{os.minor(rdev)}"
        self.fs = fs

    def describe(self) -> str:
        return f"{self.fs} on {self.loop} ({self.dev}, --direct-io=on) over sparse {self.file}"

    def remove(self) -> None:
        if self.mounted:
            for _ in range(50):
                if subprocess.run(["umount", str(self.mount)], capture_output=True).returncode == 0:
                    self.mounted = False
                    break
                time.sleep(0.2)  # a broker that just exited may still hold files
            else:
                print(f"warning: could not umount {self.mount}", file=sys.stderr)
        if self.loop and not self.mounted:
            subprocess.run(["losetup", "-d", self.loop], check=False)
            self.loop = ""
        if not self.mounted:
            self.file.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.mount.rmdir()


def host_dev(path: Path) -> str:
    """MAJ:MIN of the block device holding `path`, for its I/O counters."""
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def lab_for(args, name: str, stack: contextlib.ExitStack) -> tuple[Path, str, MemCgroup, str]:
    """The broker's data parent directory, its device, its cgroup, and a line
    describing the disk; everything is undone by `stack`."""
    if args.disk == "host":
        cg = MemCgroup(f"keel-bench-{name}", args.memory)
        stack.callback(cg.remove)
        return LAB / "catchup", host_dev(LAB), cg, f"host disk ({host_dev(LAB)}), not throttled"
    disk = LoopDisk(f"catchup-{name}", args.loop_bytes or args.history_bytes * 3 // 2 + (4 << 30), args.fs)
    stack.callback(disk.remove)
    io = IoLimit(disk.dev, int(args.hdd_mb_per_s * 1e6), args.hdd_iops) if args.disk == "hdd" else None
    cg = MemCgroup(f"keel-bench-{name}", args.memory, io)
    stack.callback(cg.remove)
    text = disk.describe() + (", throttled" if io else ", not throttled")
    return disk.mount, disk.dev, cg, text


# ---------------------------------------------------------------- Keel's tiers

class KeelTier:
    """Keel's tier settings for one run (--keel-tier capacity|s3): the
    broker's --set options, the topic configs, and the admin endpoint whose
    /stats shows the history moving."""

    def __init__(self, args, kind: str, where: str, sets: dict[str, str], topic_configs: list[str]):
        self.kind, self.where = kind, where
        self.admin = f"127.0.0.1:{free_port()}"
        self.stats_url = f"http://{self.admin}/stats"
        self.fast_max_bytes = args.keel_fast_max_bytes
        self.sets = {"keel.admin.listen": self.admin,
                     "keel.tier.fast.max.bytes": str(args.keel_fast_max_bytes),
                     "keel.tier.move.bytes.per.sec": str(args.keel_move_bytes_per_sec), **sets}
        self.topic_configs = topic_configs
        self.title = kind  # for plots; tiered_lab sets a longer one

    def describe(self) -> str:
        move = (f"{self.sets['keel.tier.move.bytes.per.sec']} B/s"
                if self.sets["keel.tier.move.bytes.per.sec"] != "0" else "unlimited")
        return (f"{self.where}; fast tier budget (keel.tier.fast.max.bytes) "
                f"{self.fast_max_bytes / 2**20:.0f} MiB, mover budget {move}")

    def stats(self) -> dict:
        with urllib.request.urlopen(self.stats_url, timeout=10) as r:
            return json.load(r)

    def wait_moved(self, args, work: Path, log_path: Path) -> dict:
        """After the preload: waits until the history is in the colder tier
        and the fast tier within its budget (the topic's bytes released from
        the fast tier >= its size - the fast budget - one segment), printing
        progress. A stall or a timeout ends the run with the evidence saved."""
        start = time.monotonic()
        last_progress = last_change = start
        last_cold = -1
        while True:
            s = self.stats()
            t = s["tiers"]
            parts = [p["tiers"] for p in s["partitions"] if p["topic"] == "catchup"]
            local = sum(p["local_bytes"] for p in parts)
            cold = sum(p["cold_bytes"] for p in parts)
            want = local + cold - self.fast_max_bytes - args.segment_bytes
            done = cold >= want and t["fast_bytes"] <= self.fast_max_bytes and \
                sum(p["copying"] for p in parts) == 0
            now = time.monotonic()
            if cold != last_cold:
                last_cold, last_change = cold, now
            line = (f"keel: history to the {self.kind} tier: {cold / 1e9:.2f} of >= {max(want, 0) / 1e9:.2f} GB "
                    f"released to it, fast tier {t['fast_bytes'] / 1e9:.2f} GB (budget "
                    f"{self.fast_max_bytes / 1e9:.2f}), {t['copies']} copies ({t['copy_failures']} failed), "
                    f"{now - start:.0f} s")
            if done:
                print(line + ": done", flush=True)
                return {"seconds": now - start, "tiers": t, "topic_local_bytes": local, "topic_cold_bytes": cold}
            if now - last_progress >= 5:
                print(line, flush=True)
                last_progress = now
            if now - last_change > args.tier_stall_s or now - start > args.tier_wait_max_s:
                evidence = work / "keel-tier-stall.json"
                evidence.write_text(json.dumps(s, indent=2) + "\n")
                raise SystemExit(f"keel: the history did not reach the {self.kind} tier ({line}); "
                                 f"/stats saved to {evidence}, log {log_path}; problems logged:\n"
                                 + "\n".join(tier_log_problems(log_path)))
            time.sleep(1)


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tier_log_problems(log_path: Path, limit: int = 20) -> list[str]:
    """Keel's WARN and ERROR lines (the first `limit`), e.g. failed copies."""
    lines = [ANSI.sub("", ln).strip() for ln in log_path.read_text(errors="replace").splitlines()]
    return [ln for ln in lines if " WARN " in ln or " ERROR " in ln][:limit]


def tiered_lab(args, stack: contextlib.ExitStack) -> tuple[Path, str, MemCgroup, str, KeelTier]:
    """Like lab_for, for Keel with --keel-tier: the fast tier (log.dirs)
    always on the host disk; the colder tier on the profile's disk (with a
    loop or hdd profile, the loop device, which is then the one reported and,
    for hdd, the only one throttled), else a directory of its own beside the
    fast tier."""
    fast_parent = LAB / "catchup"
    if args.disk == "host":
        cg = MemCgroup("keel-bench-keel", args.memory)
        stack.callback(cg.remove)
        cold_parent, dev, cold_disk = fast_parent, host_dev(LAB), f"host disk ({host_dev(LAB)}), not throttled"
    else:
        cold_parent, dev, cg, cold_disk = lab_for(args, "keel", stack)
    fast_disk = f"host disk ({host_dev(LAB)}), not throttled"
    if args.keel_tier == "capacity":
        cap = cold_parent / "keel-capacity"
        shutil.rmtree(cap, ignore_errors=True)
        stack.callback(shutil.rmtree, cap, ignore_errors=True)
        tier = KeelTier(args, "capacity", f"capacity dir {cap} on {cold_disk}",
                        {"keel.tier.capacity.dirs": str(cap)}, [])
    else:
        s3 = start_s3(args, cold_parent / "keel-s3", stack)
        tier = KeelTier(args, "s3", f"object store s3://{s3.bucket} (versitygw at {s3.endpoint}, objects in "
                        f"{s3.data_dir} on {cold_disk}, in a memory cgroup of its own limited to "
                        f"{args.s3_memory / 2**20:.0f} MiB)",
                        {"keel.tier.remote": f"s3://{s3.bucket}", "keel.tier.remote.endpoint": s3.endpoint,
                         "keel.tier.remote.region": s3.region, "keel.tier.remote.access.key.id": s3.access_key,
                         "keel.tier.remote.secret.access.key": s3.secret_key},
                        ["remote.storage.enable=true"])
    disk = f"fast tier on {fast_disk}; colder tier: {tier.where}"
    store = "the capacity dir" if args.keel_tier == "capacity" else "S3 (versitygw)"
    tier.title = f"fast tier on the host disk, history in {store} on {short_disk(cold_disk)}"
    return fast_parent, dev, cg, disk, tier


def start_s3(args, base: Path, stack: contextlib.ExitStack):
    """versitygw (tests/s3server.py) with its objects under `base`, moved
    into a memory cgroup of its own (--s3-memory), so that the object files
    it serves are not simply the host's page cache."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from s3server import INSTALL_HINT, S3Server, find_versitygw
    finally:
        sys.path.pop(0)
    if find_versitygw() is None:
        raise SystemExit(f"--keel-tier s3: versitygw not found; install it with {INSTALL_HINT}")
    shutil.rmtree(base, ignore_errors=True)
    stack.callback(shutil.rmtree, base, ignore_errors=True)
    cg = MemCgroup("keel-bench-s3", args.s3_memory)
    stack.callback(cg.remove)
    s3 = S3Server(base, bucket="keel-catchup")
    stack.callback(s3.close)
    s3.start()
    if cg.path is not None:
        (cg.path / "cgroup.procs").write_text(str(s3.proc.pid))
    print(f"keel: versitygw at {s3.endpoint}: {cg.describe()}")
    return s3


def pin(cpus: str | None):
    """preexec_fn part: restrict this (child) process to `cpus` ("0", "0,1", "0-1")."""
    if not cpus:
        return
    chosen = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        chosen.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, chosen)


# ---------------------------------------------------------------- brokers

def bench_cmd(args, bench_bin: Path, bootstrap: str, pid: int, cg: MemCgroup, dev: str,
              out: Path, tier: "KeelTier | None" = None, pause: bool = False) -> list[str]:
    cmd = [str(bench_bin), "catchup", "--bootstrap", bootstrap, "--topic", "catchup",
           "--partitions", str(args.partitions), "--history-bytes", str(args.history_bytes),
           "--record-size", str(args.record_size), "--keys", str(args.keys), "--rate", str(args.rate),
           "--baseline-s", str(args.baseline_s), "--backfill-max-s", str(args.backfill_max_s),
           "--after-s", str(args.after_s), "--backfill-max-mb-per-s", str(args.backfill_max_mb_per_s),
           "--broker-pid", str(pid), "--device", dev, "--json", str(out)]
    if cg.path is not None:
        cmd += ["--cgroup", str(cg.path)]
    if args.backfill_process:
        cmd += ["--backfill-process"]
    if args.backfill_nice:
        cmd += ["--backfill-nice", str(args.backfill_nice)]
    if args.backfill_sched_idle:
        cmd += ["--backfill-sched-idle"]
    if args.backfill_cpus:
        cmd += ["--backfill-cpus", args.backfill_cpus]
    if args.backfill_fetch_bytes:
        cmd += ["--backfill-partition-fetch-bytes", str(args.backfill_fetch_bytes)]
    if args.backfill_at:
        cmd += ["--backfill-at", args.backfill_at]
    if args.backfill_receive_buffer:
        cmd += ["--backfill-receive-buffer-bytes", str(args.backfill_receive_buffer)]
    if args.segment_bytes:
        cmd += ["--topic-config", f"segment.bytes={args.segment_bytes}"]
    if pause:
        cmd += ["--pause-after-preload"]
    if tier is not None:
        cmd += ["--stats-url", tier.stats_url]
        cmd += [a for kv in tier.topic_configs for a in ("--topic-config", kv)]
    return cmd


def run_bench(name: str, cmd: list[str], out: Path, cpus: str | None, settle=None,
              trace: "SchedTrace | None" = None, own: "KafkaJmx | KeelLive | None" = None) -> dict:
    """Runs keel-bench; with `settle` (a function returning a dict), keel-bench
    pauses after the preload (--pause-after-preload), `settle()` runs, and
    its result is stored under "settle" in the returned dict. With `trace`,
    the scheduler is recorded in the baseline and the backfill (the phase
    lines keel-bench prints on stderr) and the result is under "sched_waits".
    With `own` (Kafka's JMX or Keel's admin endpoint), the broker's own
    view of its request latencies per phase is under "broker_metrics"."""
    print(f"\n== {name}: {' '.join(cmd)}" + (f" (pinned to CPUs {cpus})" if cpus else ""), flush=True)
    if settle is None and trace is None and own is None:
        subprocess.run(cmd, check=True, preexec_fn=lambda: pin(cpus))
        return json.loads(out.read_text())
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: pin(cpus))
    preloaded, marker = threading.Event(), []

    def relay() -> None:  # keel-bench's progress lines, the pause marker and the phases
        for line in proc.stderr:
            sys.stderr.write(line)
            if line.startswith("keel-bench: preload done"):
                marker.append(line)
                preloaded.set()
            if trace is not None and line.startswith("keel-bench: phase "):
                trace.phase(line.split()[-1])
            if own is not None and line.startswith("keel-bench: phase "):
                own.phase(line.split()[-1])
        preloaded.set()  # stderr closed: do not wait for a marker that cannot come

    threading.Thread(target=relay, daemon=True).start()
    settled = None
    try:
        if settle is not None:
            preloaded.wait()
            if not marker:
                raise SystemExit(f"{name}: keel-bench exited with {proc.wait()} before the preload ended")
            settled = settle()
            proc.stdin.write("go\n")
            proc.stdin.close()
        if proc.wait() != 0:
            raise SystemExit(f"{name}: keel-bench exited with {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
    res = json.loads(out.read_text())
    if settle is not None:
        res["settle"] = settled
    if trace is not None:
        res["sched_waits"] = trace.report(proc.pid)
    if own is not None:
        res["broker_metrics"] = own.report()
    return res


class KafkaJmx:
    """Kafka's own view of its request latencies, read from the broker's JMX
    (bench/kafka/start.sh with KAFKA_JMX_PORT) with Kafka's JmxTool at each
    phase's start and at the end: the 99th percentile of kafka.network
    RequestMetrics TotalTimeMs of Produce and FetchConsumer, and LocalTimeMs
    of FetchConsumer (a fetch's time without its long-poll wait, which
    TotalTimeMs includes). A phase gets the values read when it ended.
    Kafka's histograms are exponentially decaying samples weighted to the
    last five minutes or so, so a phase's figure still carries some of the
    phases before it. Each reading starts a JVM on the bench CPUs for about
    a second."""

    BEANS = (("produce_total", "Produce", "TotalTimeMs"),
             ("fetch_total", "FetchConsumer", "TotalTimeMs"),
             ("fetch_local", "FetchConsumer", "LocalTimeMs"))

    def __init__(self, port: int, cpus: str | None):
        self.cpus = cpus
        self.cmd = ["java", "-cp", str(LAB / "kafka-libs" / "*"),
                    f"-Dlog4j2.configurationFile={HERE / 'kafka' / 'tools-log4j2.properties'}",
                    "org.apache.kafka.tools.JmxTool",
                    "--jmx-url", f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{port}/jmxrmi",
                    "--attributes", "99thPercentile,Count", "--report-format", "csv", "--one-time", "true"]
        for _, request, metric in self.BEANS:
            self.cmd += ["--object-name", f"kafka.network:type=RequestMetrics,name={metric},request={request}"]
        self.readings: list[tuple[str, threading.Thread, dict]] = []

    def _read(self, into: dict) -> None:
        """JmxTool's csv report: a `time,"<ms>"` line, then one
        `<object name>:<attribute>,"<value>"` line per attribute."""
        try:
            run = subprocess.run(self.cmd, capture_output=True, text=True, timeout=60,
                                 preexec_fn=lambda: pin(self.cpus))
        except subprocess.TimeoutExpired:
            return
        for line in run.stdout.splitlines():
            # The object name has commas of its own: the value is last.
            name, _, value = line.rpartition(",")
            value = value.strip().strip('"')
            for key, request, metric in self.BEANS:
                if f"request={request}" not in name or f"name={metric}" not in name:
                    continue
                for attr, suffix in (("99thPercentile", "p99_ms"), ("Count", "count")):
                    if name.endswith(":" + attr):
                        try:
                            into[f"{key}_{suffix}"] = float(value)
                        except ValueError:
                            pass

    def phase(self, name: str) -> None:
        """A phase starts: read the metrics (in the background)."""
        values: dict = {}
        t = threading.Thread(target=self._read, args=(values,), daemon=True)
        t.start()
        self.readings.append((name, t, values))

    def report(self) -> dict:
        """Per phase: the p99s read when it ended, and the requests counted
        during it."""
        self.phase("end")
        for _, t, _ in self.readings:
            t.join(90)
        out = {}
        for (name, _, start), (_, _, end) in zip(self.readings, self.readings[1:]):
            if not end:
                continue
            res = {k: v for k, v in end.items() if k.endswith("p99_ms")}
            for key, _, _ in self.BEANS:
                if f"{key}_count" in end and f"{key}_count" in start:
                    res[f"{key}_requests"] = int(end[f"{key}_count"] - start[f"{key}_count"])
            out[name] = res
        return out


class KeelLive:
    """Keel's own view of its live path, from its admin endpoint's /stats,
    read only at each phase's start and at the end (a reading costs the
    broker a few ms; one a second shows in its p99): the live latency
    buckets (produce; fetches answered from the tail cache, without their
    long poll; eight buckets to a doubling, so a p99 is within 9 %), from
    whose differences each phase gets its p99 and p999; and the I/O
    governor's ticks of the last five minutes (its budgets over time)."""

    OPS = ("produce", "tail_fetch")

    def __init__(self, admin: str):
        self.stats_url = f"http://{admin}/stats"
        self.readings: list[tuple[str, threading.Thread, dict]] = []

    def _read(self, into: dict) -> None:
        into["wall_s"] = time.time()
        try:
            with urllib.request.urlopen(self.stats_url, timeout=30) as r:
                s = json.load(r)
        except (OSError, ValueError):
            return
        into["buckets"] = {op: s["live_latency"][op]["buckets"] for op in self.OPS}
        governor = s.get("io_governor") or {}
        into["cuts"] = governor.get("cuts", 0)
        into["history"] = governor.get("history") or []

    def phase(self, name: str) -> None:
        values: dict = {}
        t = threading.Thread(target=self._read, args=(values,), daemon=True)
        t.start()
        self.readings.append((name, t, values))

    @staticmethod
    def quantile(buckets: list, q: float):
        total = sum(n for _, n in buckets)
        if not total:
            return None
        seen = 0
        for upper, n in sorted(buckets):
            seen += n
            if seen >= q * total:
                return upper / 1e3
        return sorted(buckets)[-1][0] / 1e3

    def report(self) -> dict:
        """Per phase: each op's p99, p999 and count, the governor's cuts and
        the cold-read budget when cut; and the governor's ticks as a
        timeline (t_s from the baseline's start, as keel-bench's)."""
        self.phase("end")
        for _, t, _ in self.readings:
            t.join(60)
        baseline = next((r["wall_s"] for n, _, r in self.readings if n == "baseline" and r), None)
        ticks = {}
        for _, _, r in self.readings:
            for at_ms, p99_us, b0, b1, b2, u0, u1, u2 in r.get("history") or []:
                ticks[at_ms] = {"wall_s": at_ms / 1e3, "live_p99_ms": p99_us / 1e3,
                                "cold_read_budget": b0, "tier_move_budget": b1, "cleaning_budget": b2,
                                "cold_read_used": u0, "tier_move_used": u1, "cleaning_used": u2}
        timeline = [dict(v, t_s=round(v["wall_s"] - baseline, 2)) for _, v in sorted(ticks.items())] \
            if baseline else []
        out: dict = {"timeline": timeline}
        for (name, _, start), (_, _, end) in zip(self.readings, self.readings[1:]):
            if "buckets" not in start or "buckets" not in end:
                continue
            res: dict = {"cuts": end["cuts"] - start["cuts"]}
            for op in self.OPS:
                before = dict((u, n) for u, n in start["buckets"][op])
                diff = [(u, n - before.get(u, 0)) for u, n in end["buckets"][op] if n > before.get(u, 0)]
                res[f"{op}_p99_ms"] = self.quantile(diff, 0.99)
                res[f"{op}_p999_ms"] = self.quantile(diff, 0.999)
                res[f"{op}_count"] = sum(n for _, n in diff)
            # 0 is unlimited: the lowest and mean of the ticks it was not.
            within = [p for p in ticks.values() if start["wall_s"] <= p["wall_s"] <= end["wall_s"]]
            budgets = [p["cold_read_budget"] for p in within if p["cold_read_budget"]]
            if budgets:
                res["cold_read_budget_min"] = min(budgets)
                res["cold_read_budget_mean"] = sum(budgets) / len(budgets)
            if within:
                res["cold_read_budget_limited_share"] = len(budgets) / len(within)
            out[name] = res
        return out


class SchedTrace:
    """--sched-trace: records the scheduler (bench/schedwait.py) for a few
    seconds in the baseline and in the backfill, starting `delay_s` into
    each phase, and charges the CPU time that kept live threads waiting to
    its owners."""

    PHASES = ("baseline", "backfill")

    def __init__(self, work: Path, name: str, seconds: float, delay_s: float, broker_pid: int):
        self.work, self.name, self.seconds, self.delay_s = work, name, seconds, delay_s
        self.broker_pid = broker_pid
        self.recordings: dict[str, tuple[Path, threading.Thread]] = {}

    def phase(self, phase: str) -> None:
        if phase not in self.PHASES or phase in self.recordings:
            return
        out = self.work / f"sched-{self.name}-{phase}.data"

        def run() -> None:
            time.sleep(self.delay_s)
            p = schedwait.record(out, self.seconds)
            if p.wait() != 0:
                print(f"{self.name}: perf sched record failed: {p.stderr.read().strip()}", file=sys.stderr)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.recordings[phase] = (out, t)

    def report(self, bench_pid: int) -> dict:
        res = {}
        for phase, (out, t) in self.recordings.items():
            t.join()
            if out.exists():
                res[phase] = schedwait.analyze(out, self.broker_pid, bench_pid)
        return res


def sched_trace(args, work: Path, name: str, broker_pid: int) -> SchedTrace | None:
    return SchedTrace(work, name, args.sched_trace, args.sched_trace_delay, broker_pid) if args.sched_trace else None


def sched_tables(results: dict) -> str:
    """--sched-trace: each broker's baseline and backfill recordings."""
    out = []
    for name, res in results.items():
        if res.get("sched_waits"):
            out.append(f"{name}: who held the CPU while a live thread waited (bench/schedwait.py)\n\n"
                       + schedwait.table(res["sched_waits"]))
    return "\n\n".join(out)


def tail_cache_line(log_path: Path) -> str:
    """Keel's start-up line with the tail cache budget and where the memory
    limit came from (the cgroup, when there is one)."""
    for _ in range(50):
        line = next((ln.strip() for ln in log_path.read_text(errors="replace").splitlines()
                     if "tail cache budget" in ln), "")
        if line:
            return line
        time.sleep(0.1)
    return ""


def broker_preexec(cg: MemCgroup, cpus: str | None):
    def preexec() -> None:
        cg.join()
        pin(cpus)
    return preexec


def run_keel(args, bench_bin: Path, work: Path, adaptive: bool = False) -> dict:
    """One Keel run; `adaptive`: with keel.io.live.latency.target.ms set to
    --keel-live-target-ms (the I/O governor on)."""
    with contextlib.ExitStack() as stack:
        if args.keel_tier == "none":
            parent, dev, cg, disk = lab_for(args, "keel", stack)
            tier = None
        else:
            parent, dev, cg, disk, tier = tiered_lab(args, stack)
        print(f"keel: {cg.describe()}\nkeel: data on {disk}")
        data, log_path = parent / "keel-data", work / "keel.log"
        shutil.rmtree(data, ignore_errors=True)
        stack.callback(shutil.rmtree, data, ignore_errors=True)
        port = free_port()
        cmd = [str(args.keel_bin), "serve", "--listen", f"127.0.0.1:{port}",
               "--advertised", f"127.0.0.1:{port}", "--data-dir", str(data)]
        # The admin endpoint's /metrics gives each phase's request stages.
        sets = {"keel.admin.listen": f"127.0.0.1:{free_port()}"} if tier is None else dict(tier.sets)
        admin = sets["keel.admin.listen"]
        sets.update(kv.split("=", 1) for kv in args.keel_set)
        if adaptive:
            sets["keel.io.live.latency.target.ms"] = str(args.keel_live_target_ms)
        cmd += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=broker_preexec(cg, args.broker_cpus))
        stack.callback(stop_keel, proc)
        wait_port(port, 30)
        print(f"keel: {tail_cache_line(log_path) or 'no tail cache budget line yet in ' + str(log_path)}")
        settle = settle_for(args, "keel", cg, None if tier is None else lambda: tier.wait_moved(args, work, log_path))
        cmd = bench_cmd(args, bench_bin, f"127.0.0.1:{port}", proc.pid, cg, dev, work / "keel.json", tier,
                        pause=settle is not None)
        cmd += ["--metrics-url", f"http://{admin}/metrics"]
        res = run_bench("keel", cmd, work / "keel.json", args.bench_cpus, settle,
                        sched_trace(args, work, "keel", proc.pid), KeelLive(admin))
        res["adaptive_target_ms"] = args.keel_live_target_ms if adaptive else None
        res["tail_cache_log"] = tail_cache_line(log_path)
        res["memory_cgroup"] = cg.describe()
        res["disk"] = disk
        if tier is not None:
            res["tier"] = tier.describe()
            res["tier_title"] = tier.title
            res["tier_log_problems"] = tier_log_problems(log_path)
    return res


def dirty_bytes(cg: MemCgroup) -> int:
    """Dirty and under-writeback page-cache bytes charged to the broker's
    memory cgroup (the whole host's without one)."""
    if cg.path is not None:
        stat = dict(line.split() for line in (cg.path / "memory.stat").read_text().splitlines())
        keys = ("dirty", "writeback") if cg.version == "v1" else ("file_dirty", "file_writeback")
        return sum(int(stat.get(k, 0)) for k in keys)
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return sum(int(info[k].split()[0]) * 1024 for k in ("Dirty", "Writeback"))


def wait_written_back(args, name: str, cg: MemCgroup) -> dict:
    """Waits, after the preload, until the broker's dirty and under-writeback
    pages have stayed under 16 MiB for 3 s (at most --settle-max-s), so the
    baseline measures a broker at rest rather than the preload's writeback."""
    start, quiet_since, peak = time.monotonic(), None, 0
    while True:
        now, dirty = time.monotonic(), dirty_bytes(cg)
        peak = max(peak, dirty)
        quiet_since = (quiet_since or now) if dirty < 16 << 20 else None
        if quiet_since is not None and now - quiet_since >= 3:
            settled = True
            break
        if now - start >= args.settle_max_s:
            settled = False
            break
        time.sleep(0.25)
    secs = time.monotonic() - start
    print(f"{name}: preload written back in {secs:.1f} s (dirty + writeback at most {peak / 2**20:.0f} MiB)"
          + ("" if settled else f"; still {dirty / 2**20:.0f} MiB after --settle-max-s, going on"), flush=True)
    return {"writeback_seconds": round(secs, 1), "writeback_peak_bytes": peak, "written_back": settled}


def settle_for(args, name: str, cg: MemCgroup, first=None):
    """The pause after the preload: `first` (the tier move), then the
    writeback wait; None when there is nothing to wait for."""
    if first is None and args.settle_max_s <= 0:
        return None

    def settle() -> dict:
        out = first() if first is not None else {}
        if args.settle_max_s > 0:
            out = dict(out or {}, **wait_written_back(args, name, cg))
        return out
    return settle


def stop_keel(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_kafka(args, bench_bin: Path, work: Path) -> dict:
    with contextlib.ExitStack() as stack:
        parent, dev, cg, disk = lab_for(args, "kafka", stack)
        print(f"kafka: {cg.describe()}\nkafka: data on {disk}")
        data = parent / "kafka-data"
        shutil.rmtree(data, ignore_errors=True)
        stack.callback(shutil.rmtree, data, ignore_errors=True)
        port, jmx_port = free_port(), free_port()
        env = dict(os.environ, KAFKA_HEAP=args.kafka_heap, LAB_DIR=str(LAB), KAFKA_JMX_PORT=str(jmx_port))
        # Registered first, so it also runs when start.sh fails half-way.
        stack.callback(lambda: subprocess.run([str(HERE / "kafka" / "stop.sh"), str(data)], check=False,
                                              timeout=180))
        subprocess.run([str(HERE / "kafka" / "start.sh"), str(port), str(data)], check=True, env=env,
                       preexec_fn=broker_preexec(cg, args.broker_cpus), timeout=300)
        pid = int((data / "kafka.pid").read_text())
        settle = settle_for(args, "kafka", cg)
        jmx = KafkaJmx(jmx_port, args.bench_cpus)
        res = run_bench("kafka", bench_cmd(args, bench_bin, f"127.0.0.1:{port}", pid, cg, dev,
                                           work / "kafka.json", pause=settle is not None),
                        work / "kafka.json", args.bench_cpus, settle, sched_trace(args, work, "kafka", pid),
                        jmx)
        res["memory_cgroup"] = cg.describe()
        res["disk"] = disk
        res["kafka_heap"] = args.kafka_heap
    return res


def build_bench(out: Path) -> Path:
    if not shutil.which("go"):
        raise SystemExit("`go` not found: keel-bench (bench/keel-bench) is built with Go")
    subprocess.run(["go", "build", "-o", str(out), "."], cwd=HERE / "keel-bench", check=True)
    return out


# ---------------------------------------------------------------- report

ROWS = [  # (label, value of one phase's JSON or None)
    ("produce p50 ms", lambda p: p["produce"]["p50_ms"]),
    ("produce p99 ms", lambda p: p["produce"]["p99_ms"]),
    ("produce p999 ms", lambda p: p["produce"]["p999_ms"]),
    ("produce max ms", lambda p: p["produce"]["max_ms"]),
    ("tail e2e p50 ms", lambda p: p["tail"]["p50_ms"]),
    ("tail e2e p99 ms", lambda p: p["tail"]["p99_ms"]),
    ("tail e2e max ms", lambda p: p["tail"]["max_ms"]),
    ("tail max lag (records)", lambda p: p["tail"]["max_lag_records"]),
    ("backfill MB/s", lambda p: p["backfill_mb_per_s"] if p["name"] == "backfill" else None),
    ("broker disk read MB", lambda p: mb(p["broker"]["disk_read_bytes"], 1e6)),
    ("page cache MiB (max)", lambda p: mb(p["broker"]["page_cache_bytes_max"], 2**20)),
    ("broker RSS MiB (max)", lambda p: mb(p["broker"]["rss_bytes_max"], 2**20)),
    ("broker CPU cores", lambda p: p["broker"].get("cpu_cores")),
    ("bench CPU cores", lambda p: p["broker"].get("bench_cpu_cores")),
    ("host busy cores", lambda p: (p["broker"].get("host") or {}).get("busy_cores")),
    ("host irq+softirq cores", lambda p: (p["broker"].get("host") or {}).get("irq_softirq_cores")),
    ("host steal cores", lambda p: (p["broker"].get("host") or {}).get("steal_cores")),
    # The phase's quiet seconds alone (keel-bench: host steal under 0.05 cores).
    ("quiet seconds", lambda p: (p.get("quiet") or {}).get("seconds")),
    ("quiet produce p99 ms", lambda p: quiet(p, "produce")),
    ("quiet tail e2e p99 ms", lambda p: quiet(p, "tail")),
    ("broker busiest thread cores", lambda p: p["broker"].get("busiest_thread_cores")),
    ("broker run-queue wait ms/s", lambda p: p["broker"].get("runq_ms_per_s")),
    ("bench run-queue wait ms/s", lambda p: p["broker"].get("bench_runq_ms_per_s")),
    ("backfill process CPU cores", lambda p: p.get("backfill_process_cpu_cores")),
    ("disk read MB/s", lambda p: dev(p, lambda d: d["read_mb"] / p["seconds"])),
    ("disk write MB/s", lambda p: dev(p, lambda d: d["write_mb"] / p["seconds"])),
    ("disk read await ms", lambda p: dev(p, lambda d: d["read_await_ms"])),
    ("disk write await ms", lambda p: dev(p, lambda d: d["write_await_ms"])),
    ("disk util %", lambda p: dev(p, lambda d: d["util_pct"])),
    # Keel's tiers (--keel-tier; /stats at the phase boundaries).
    ("colder tier read MB", lambda p: tiers(p, lambda t: t["cold_tier_read_bytes"] / 1e6)),
    ("colder tier reads", lambda p: tiers(p, lambda t: t["cold_tier_reads"])),
    ("tier copies", lambda p: tiers(p, lambda t: t["copies"])),
    ("tier copy+read failures", lambda p: tiers(p, lambda t: t["copy_failures"] + t["read_failures"])),
    ("fast tier MB (end)", lambda p: tiers(p, lambda t: t["fast_bytes_end"] / 1e6)),
    ("topic in colder tier MB (end)", lambda p: tiers(p, lambda t: t["topic_cold_bytes_end"] / 1e6)),
]


def quiet(phase: dict, what: str):
    q = phase.get("quiet")
    if not q or not q["seconds"] or not q[what]["count"]:
        return None
    return q[what]["p99_ms"]


def tiers(phase: dict, get):
    t = phase.get("tiers")
    return None if t is None else get(t)


def dev(phase: dict, get):
    d = phase["broker"].get("device")
    return None if d is None or not phase["seconds"] else get(d)


def mb(v, unit):
    return None if v is None else v / unit


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


RUNS = {"kafka": "Kafka 4.3.1", "keel": "Keel", "keel_adaptive": "Keel adaptive"}


def side_by_side(results: dict) -> str:
    names = [n for n in RUNS if n in results]
    keels = [n for n in names if n != "kafka"] if "kafka" in names else []
    head = "| phase | metric | " + " | ".join(RUNS[n] for n in names)
    head += "".join(f" | {RUNS[n]} / Kafka" for n in keels)
    lines = [head + " |", "|" + " --- |" * (head.count("|"))]
    for i, phase in enumerate(("baseline", "backfill", "after")):
        for label, get in ROWS:
            vals = [get(results[n]["phases"][i]) for n in names]
            if all(v is None for v in vals):
                continue
            row = f"| {phase} | {label} | " + " | ".join(fmt(v) for v in vals)
            k = vals[0]
            for r in vals[1:1 + len(keels)]:
                # No ratio to a value that prints as zero.
                row += " | " + (f"{r / k:.2f}" if k and abs(k) >= 0.005 and r is not None else "-")
            lines.append(row + " |")
    return "\n".join(lines)


def readers_table(results: dict) -> str:
    """With --backfill-at: each backfill reader's finish and throughput,
    and what the broker read from disk during the backfill against the
    history (one reader from 0 reads it about once; readers at 0, 25, 50
    and 75 % read 2.5 histories between them unless the broker shares
    their reads)."""
    names = [n for n in RUNS if n in results and results[n]["backfill"].get("readers")]
    if not names:
        return ""
    lines = ["Backfill readers:", "",
             "| broker | reader from | MB | done after s | MB/s |", "| --- | --- | --- | --- | --- |"]
    for n in names:
        for r in results[n]["backfill"]["readers"]:
            state = "" if r["complete"] else " (INCOMPLETE)"
            lines.append(f"| {n} | {r['at'] * 100:.0f} % | {r['bytes'] / 1e6:,.0f} | {r['seconds']:.1f}{state} | "
                         f"{r['bytes'] / 1e6 / max(r['seconds'], 1e-9):.1f} |")
    lines.append("")
    for n in names:
        history = results[n]["config"]["history_bytes"]
        phase = results[n]["phases"][1]
        read = phase["broker"].get("disk_read_bytes")
        device = dev(phase, lambda d: d["read_mb"] * 1e6)
        ratio = lambda b: "-" if b is None or not history else f"{b / history:.2f}"
        lines.append(f"{n}: during the backfill the broker read {ratio(read)} histories from disk "
                     f"(the device: {ratio(device)})")
    return "\n".join(lines)


STAGES = ("socket", "receive", "connection", "decode", "validate", "queue", "lock", "roll", "write", "flush", "publish", "reply", "wait", "read_cache",
          "read_ahead", "read_local", "read_capacity", "read_remote", "encode", "send", "total")


def stage_table(results: dict) -> str:
    """Where Keel's produce and fetch time went, per phase (its /metrics
    stage histograms): the 99th percentile's bucket (histogram buckets
    double, so it is an upper bound within 2x) and the mean, in ms."""
    phases = (results.get("keel") or results.get("keel_adaptive") or {}).get("phases") or []
    if not any(p.get("stages") for p in phases):
        return ""
    names = [p["name"] for p in phases]
    head = "| API | stage | " + " | ".join(f"{n} p99 <= / mean ms" for n in names) + " |"
    lines = ["Keel request stages (/metrics):", "", head, "|" + " --- |" * (head.count("|") - 1)]
    for api in ("Produce", "Fetch"):
        for stage in STAGES:
            cells = [(p.get("stages") or {}).get(api, {}).get(stage) for p in phases]
            if all(c is None for c in cells):
                continue
            lines.append(f"| {api} | {stage} | " + " | ".join(
                "-" if c is None else f"{fmt(c['p99_ms_at_most'])} / {fmt(c['mean_ms'])}" for c in cells) + " |")
    return "\n".join(lines)


def broker_side_table(results: dict) -> str:
    """The live path's latency as each broker sees it, per phase. Keel: its
    live latency histograms (/stats; produce, and fetches answered from the
    tail cache without their long poll; buckets 9 % apart) and its Produce
    and Fetch `total` stages (doubling buckets, an upper bound within 2x;
    fetches of every kind); with the I/O governor on, its cuts and the
    cold-read budget. Kafka: RequestMetrics p99 from JMX (Produce
    TotalTimeMs; FetchConsumer LocalTimeMs, and TotalTimeMs, which includes
    the wait; every consumer fetch, the backfill's too). The last column is
    the backfill phase's value against the baseline's."""
    kafka = results.get("kafka") or {}
    jmx = kafka.get("broker_metrics") or {}
    keels = [n for n in ("keel", "keel_adaptive") if n in results]
    phases = [p["name"] for p in (results[keels[0]]["phases"] if keels else kafka.get("phases") or [])]
    if not jmx and not keels:
        return ""
    rows = []
    for n in keels:
        res, label = results[n], RUNS[n]
        live = res.get("broker_metrics") or {}
        stage = lambda name, api, st, res=res: next(  # noqa: E731
            ((p.get("stages") or {}).get(api, {}).get(st, {}).get("p99_ms_at_most")
             for p in res["phases"] if p["name"] == name), None)
        rows += [
            (f"{label} produce p99 ms", lambda ph, live=live: (live.get(ph) or {}).get("produce_p99_ms")),
            (f"{label} produce p999 ms", lambda ph, live=live: (live.get(ph) or {}).get("produce_p999_ms")),
            (f"{label} tail fetch p99 ms (no wait)", lambda ph, live=live: (live.get(ph) or {}).get("tail_fetch_p99_ms")),
            (f"{label} Produce total stage p99 <= ms", lambda ph, stage=stage: stage(ph, "Produce", "total")),
            (f"{label} Fetch total stage p99 <= ms (no wait)", lambda ph, stage=stage: stage(ph, "Fetch", "total")),
        ]
        if res.get("adaptive_target_ms") is not None:
            rows += [
                (f"{label} governor cuts (target {res['adaptive_target_ms']} ms)",
                 lambda ph, live=live: (live.get(ph) or {}).get("cuts")),
                (f"{label} cold-read budget MB/s when cut, lowest", lambda ph, live=live: mb((live.get(ph) or {}).get("cold_read_budget_min"), 1e6)),
                (f"{label} cold-read budget MB/s when cut, mean", lambda ph, live=live: mb((live.get(ph) or {}).get("cold_read_budget_mean"), 1e6)),
                (f"{label} share of seconds the cold-read budget was cut",
                 lambda ph, live=live: (live.get(ph) or {}).get("cold_read_budget_limited_share")),
            ]
    rows += [
        ("Kafka Produce TotalTimeMs p99 ms", lambda ph: (jmx.get(ph) or {}).get("produce_total_p99_ms")),
        ("Kafka FetchConsumer LocalTimeMs p99 ms", lambda ph: (jmx.get(ph) or {}).get("fetch_local_p99_ms")),
        ("Kafka FetchConsumer TotalTimeMs p99 ms (with wait)", lambda ph: (jmx.get(ph) or {}).get("fetch_total_p99_ms")),
    ]
    head = "| broker-side | " + " | ".join(phases) + " | backfill / baseline |"
    lines = ["The live path as each broker sees it:", "", head, "|" + " --- |" * (head.count("|") - 1)]
    for label, get in rows:
        cells = [get(ph) for ph in phases]
        if all(c is None for c in cells):
            continue
        by = dict(zip(phases, cells))
        base, during = by.get("baseline"), by.get("backfill")
        ratio = f"{during / base:.2f}" if base and during is not None and "p99" in label else "-"
        lines.append(f"| {label} | " + " | ".join("-" if c is None else fmt(c) for c in cells) + f" | {ratio} |")
    return "\n".join(lines)


def setup_line(args, results: dict) -> str:
    """Where the clients ran: the same for both brokers, named in the output."""
    first = next(iter(results.values()), {})
    text = first.get("setup", "")
    if args.broker_cpus:
        text += f"; broker pinned to CPUs {args.broker_cpus}"
    if args.bench_cpus:
        text += f"; keel-bench pinned to CPUs {args.bench_cpus}"
    return text


def short_disk(text: str) -> str:
    """"ext4 on /dev/loop0 (...) over sparse FILE, throttled" -> "ext4 on a loop device, throttled"."""
    fs, on, rest = text.partition(" on /dev/loop")
    return f"{fs} on a loop device, {rest.rpartition(', ')[2]}" if on else text


def tier_lines(args, results: dict) -> list[str]:
    """What was tiered, and how the history got there; Kafka is never tiered."""
    if args.keel_tier == "none":
        return []
    seg = f"segment.bytes {args.segment_bytes / 2**20:.0f} MiB on both brokers"
    lines = []
    if "kafka" in results:
        lines.append("kafka: untiered (Apache Kafka's tiered storage needs a RemoteStorageManager plugin; "
                     f"none is installed here), all history in its log dir; {seg}")
    keel = results.get("keel") or results.get("keel_adaptive")
    if keel is not None:
        st = keel["settle"]
        t = st["tiers"]
        lines.append(f"keel: tiered: {keel['tier']}; {seg}")
        lines.append(f"keel: before the live phases: {st['topic_cold_bytes'] / 1e6:,.0f} MB of the topic released "
                     f"to the colder tier, {st['topic_local_bytes'] / 1e6:,.0f} MB left on the fast tier "
                     f"(fast tier {t['fast_bytes'] / 1e6:,.0f} MB), {t['copies']} copies of "
                     f"{t['copied_bytes'] / 1e6:,.0f} MB ({t['copy_failures']} failed); waited "
                     f"{st['seconds']:.0f} s after the preload")
        for ln in keel.get("tier_log_problems") or []:
            lines.append(f"keel: log: {ln}")
    return lines


def plot(results: dict, path: Path) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    fig, axes = plt.subplots(len(results), 1, figsize=(10, 3.5 * len(results)), squeeze=False,
                             sharey=True)
    for ax, (name, res) in zip(axes[:, 0], results.items()):
        t = [p["t_s"] for p in res["timeline"]]
        ax.plot(t, [p["produce_p99_ms"] for p in res["timeline"]], label="produce p99 (per s)")
        ax.plot(t, [p["tail_p99_ms"] for p in res["timeline"]], label="tail e2e p99 (per s)")
        ax.axvspan(res["backfill_start_s"], res["backfill_end_s"], color="orange", alpha=0.2, label="backfill")
        ax.set_yscale("log")
        live = res.get("broker_metrics") or {}
        timeline = live.get("timeline")
        if timeline and res.get("adaptive_target_ms") is not None:
            twin = ax.twinx()
            twin.plot([p["t_s"] for p in timeline],
                      [p["cold_read_budget"] / 1e6 if p["cold_read_budget"] else float("nan") for p in timeline],
                      color="green", label="cold-read budget MB/s (gaps: unlimited)")
            twin.plot([p["t_s"] for p in timeline], [p["cold_read_used"] / 1e6 for p in timeline],
                      color="green", linestyle=":", label="cold reads MB/s")
            twin.set_ylabel("MB/s")
            twin.legend(loc="upper left")
        where = res.get("tier_title") or short_disk(res.get("disk", "host disk"))
        ax.set_title(f"{name}: latency over time ({where})", fontsize=9)
        ax.set_xlabel("seconds since the live producer started")
        ax.set_ylabel("ms")
        ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return f"plot written to {path}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memory", type=parse_bytes, default=parse_bytes("2GiB"),
                    help="memory cgroup limit per broker (default 2GiB: Kafka's 1 GiB heap plus 1 GiB)")
    ap.add_argument("--history-bytes", type=parse_bytes, default=parse_bytes("4GiB"))
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--keys", type=int, default=100000)
    ap.add_argument("--rate", type=int, default=2000, help="live records per second")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--baseline-s", type=float, default=20)
    ap.add_argument("--backfill-max-s", type=float, default=180)
    ap.add_argument("--after-s", type=float, default=20)
    ap.add_argument("--backfill-max-mb-per-s", type=float, default=0,
                    help="pace the backfill consumer (client side); 0: unpaced")
    ap.add_argument("--disk", choices=("host", "loop", "hdd"), default=None,
                    help="where the data dir lives (see above; default host, or loop with --fs)")
    ap.add_argument("--fs", choices=("ext4", "xfs"), default=None,
                    help="filesystem of the loop/hdd profiles (default ext4)")
    ap.add_argument("--hdd-mb-per-s", type=float, default=150, help="--disk hdd: MB/s each way")
    ap.add_argument("--hdd-iops", type=int, default=300, help="--disk hdd: IOPS each way")
    ap.add_argument("--loop-bytes", type=parse_bytes, default=0,
                    help="size of the sparse backing file (default 1.5 x history + 4 GiB)")
    ap.add_argument("--backfill-at", default="",
                    help="several backfill readers at once, each from this share of the history: "
                         "e.g. 0,0.25,0.5,0.75 (many lagging readers; default one reader from 0)")
    ap.add_argument("--backfill-process", action="store_true",
                    help="run the backfill consumer as a process of its own")
    ap.add_argument("--backfill-nice", type=int, default=0, help="nice value of the backfill process")
    ap.add_argument("--backfill-sched-idle", action="store_true",
                    help="run the backfill process with SCHED_IDLE")
    ap.add_argument("--backfill-cpus", help="pin the backfill process (taskset -c LIST)")
    ap.add_argument("--backfill-fetch-bytes", type=parse_bytes, default=0,
                    help="backfill fetch.max.partition.bytes (keel-bench default 16MiB; fetch.max.bytes is 4x)")
    ap.add_argument("--backfill-receive-buffer", type=parse_bytes, default=0,
                    help="backfill consumer's SO_RCVBUF, the Java consumer's receive.buffer.bytes "
                         "(64KiB there); default: the OS's autotuning")
    ap.add_argument("--broker-cpus", help="pin the broker to these CPUs (e.g. 0)")
    ap.add_argument("--bench-cpus", help="pin keel-bench (and a backfill process, unless --backfill-cpus)")
    ap.add_argument("--keel-tier", choices=("none", "capacity", "s3"), default="none",
                    help="Keel only: move the history to a capacity dir or an S3 object store (versitygw) "
                         "before the live phases; Kafka runs untiered")
    ap.add_argument("--keel-fast-max-bytes", type=parse_bytes, default=parse_bytes("512MiB"),
                    help="--keel-tier: keel.tier.fast.max.bytes (default 512MiB)")
    ap.add_argument("--keel-move-bytes-per-sec", type=parse_bytes, default=0,
                    help="--keel-tier: keel.tier.move.bytes.per.sec for the whole run (default 0: unlimited)")
    ap.add_argument("--segment-bytes", type=parse_bytes, default=None,
                    help="the topic's segment.bytes on both brokers (default 128MiB with --keel-tier, "
                         "else the brokers' default)")
    ap.add_argument("--tier-wait-max-s", type=float, default=1800,
                    help="--keel-tier: give up if the history has not moved after this long")
    ap.add_argument("--tier-stall-s", type=float, default=300,
                    help="--keel-tier: give up if no bytes move for this long")
    ap.add_argument("--s3-memory", type=parse_bytes, default=parse_bytes("512MiB"),
                    help="--keel-tier s3: memory cgroup limit of versitygw (its page cache)")
    ap.add_argument("--keel-adaptive", choices=("off", "on", "both"), default="off",
                    help="Keel's I/O governor: off (static budgets), on (keel.io.live.latency.target.ms "
                         "= --keel-live-target-ms), or both, one run after the other")
    ap.add_argument("--keel-live-target-ms", type=float, default=1.0,
                    help="the I/O governor's live latency target with --keel-adaptive on|both")
    ap.add_argument("--keel-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Keel setting (repeatable), e.g. keel.tail.cache.bytes=65536")
    ap.add_argument("--settle-max-s", type=float, default=120,
                    help="after the preload, wait (at most this long) until the broker's dirty and "
                         "under-writeback pages stay under 16 MiB for 3 s before the baseline; 0: do not wait")
    ap.add_argument("--sched-trace", type=float, default=0, metavar="SECONDS",
                    help="record the scheduler (perf sched) this long in the baseline and in the backfill, "
                         "and charge live threads' waits for a CPU to who held it (bench/schedwait.py)")
    ap.add_argument("--sched-trace-delay", type=float, default=10, metavar="SECONDS",
                    help="--sched-trace: start recording this long into each phase")
    ap.add_argument("--kafka-heap", default="1g")
    ap.add_argument("--keel-bin", type=Path, default=REPO / "target" / "release" / "keel")
    ap.add_argument("--bench-bin", type=Path, help="a keel-bench binary already built (default: go build)")
    ap.add_argument("--skip-kafka", action="store_true")
    ap.add_argument("--skip-keel", action="store_true")
    ap.add_argument("--json", type=Path, help="write both brokers' results here")
    ap.add_argument("--plot", type=Path, default=LAB / "catchup.png", help="PNG of latency over time")
    args = ap.parse_args()
    if args.disk is None:
        args.disk = "loop" if args.fs else "host"
    args.fs = args.fs or "ext4"
    if args.segment_bytes is None:
        args.segment_bytes = parse_bytes("128MiB") if args.keel_tier != "none" else 0
    if args.keel_tier == "s3" and args.disk == "hdd":
        raise SystemExit("--keel-tier s3 --disk hdd: not supported: versitygw does the object store's disk "
                         "I/O outside the broker's cgroup, so the broker's throttle would not apply to it")
    if any("=" not in kv for kv in args.keel_set):
        raise SystemExit("--keel-set: want KEY=VALUE")
    preflight_disk(args)
    if args.sched_trace and (why := schedwait.available()):
        raise SystemExit(f"--sched-trace: {why}")
    if args.sched_trace and args.sched_trace_delay + args.sched_trace > args.baseline_s:
        raise SystemExit("--sched-trace: --sched-trace-delay plus --sched-trace must fit in --baseline-s "
                         f"({args.sched_trace_delay:g} + {args.sched_trace:g} > {args.baseline_s:g})")
    # SIGTERM unwinds like Ctrl-C, so every broker, mount and cgroup is undone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = LAB / "catchup"
    work.mkdir(parents=True, exist_ok=True)
    bench_bin = args.bench_bin or build_bench(LAB / "keel-bench")
    results: dict = {}
    if not args.skip_kafka:
        results["kafka"] = run_kafka(args, bench_bin, work)
    if not args.skip_keel:
        if not args.keel_bin.exists():
            raise SystemExit(f"{args.keel_bin} not found: cargo build --release -p keel-server")
        if args.keel_adaptive in ("off", "both"):
            results["keel"] = run_keel(args, bench_bin, work)
        if args.keel_adaptive in ("on", "both"):
            results["keel_adaptive"] = run_keel(args, bench_bin, work, adaptive=True)

    print(f"\nmachine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"setup: {setup_line(args, results)}")
    for name, res in results.items():
        print(f"{name}: {res['memory_cgroup']}")
        print(f"{name}: data on {res['disk']}")
        b = res["backfill"]
        print(f"{name}: backfill {b['records']}/{b['target_records']} records, {b['bytes'] / 1e6:.0f} MB "
              f"in {b['seconds']:.1f} s{'' if b['complete'] else ' (INCOMPLETE)'}; "
              f"preload {res['preload']['bytes'] / 1e6:.0f} MB in {res['preload']['seconds']:.1f} s; "
              f"produce errors {res['produce_errors']}")
        st = res.get("settle") or {}
        if "writeback_seconds" in st:
            print(f"{name}: the preload was written back {st['writeback_seconds']:.1f} s after it ended "
                  f"(dirty + writeback peak {st['writeback_peak_bytes'] / 2**20:.0f} MiB)"
                  + ("" if st["written_back"] else ", NOT within --settle-max-s"))
    if "keel" in results:
        print(f"keel: {results['keel'].get('tail_cache_log') or 'tail cache line not found'}")
    for line in tier_lines(args, results):
        print(line)
    print()
    print(side_by_side(results))
    readers = readers_table(results)
    if readers:
        print()
        print(readers)
    stages = stage_table(results)
    if stages:
        print()
        print(stages)
    broker_side = broker_side_table(results)
    if broker_side:
        print()
        print(broker_side)
    waits = sched_tables(results)
    if waits:
        print()
        print(waits)
    print(plot(results, args.plot))
    if args.json:
        args.json.write_text(json.dumps({"machine": {"host": platform.node(), "cores": os.cpu_count(),
                                                     "platform": platform.platform()},
                                         "args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=2) + "\n")
        print(f"JSON written to {args.json}")


if __name__ == "__main__":
    main()
