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

Defaults (2 GiB cgroup, 4 GiB of history, 2 MB/s live) take about 2.5
minutes for both brokers on a 2-core machine; 8 GiB of history about 3.5. A benchmark, not a test: it prints
numbers and asserts none.

usage: bench/catchup.py [--memory 2GiB] [--history-bytes 4GiB] [--rate 2000]
                        [--record-size 1024] [--keys 100000] [--partitions 1]
                        [--baseline-s 20] [--backfill-max-s 180] [--after-s 20]
                        [--backfill-max-mb-per-s 0]
                        [--kafka-heap 1g] [--skip-kafka] [--skip-keel]
                        [--json FILE] [--plot FILE]
The keel binary defaults to target/release/keel.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LAB = Path(os.environ.get("LAB_DIR", HERE / "lab"))
sys.path.insert(0, str(HERE))
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

class MemCgroup:
    """A memory cgroup limited to `limit` bytes; `path` is None when neither
    cgroup v1 nor v2 memory control is usable here (`why` says why)."""

    def __init__(self, name: str, limit: int):
        self.limit = limit
        self.version: str | None = None
        self.path: Path | None = None
        self.why = ""
        try:
            self._create(name)
        except OSError as e:
            self.path, self.version = None, None
            self.why = f"could not create a memory cgroup: {e}"

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
        parent = v1
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, rel = line.split(":", 2)
            if "memory" in controllers.split(","):
                parent = v1 / rel.lstrip("/")
        try:
            path = parent / name
            path.mkdir(exist_ok=True)
        except OSError:
            path = v1 / name
            path.mkdir(exist_ok=True)
        (path / "memory.limit_in_bytes").write_text(str(self.limit))
        self.version, self.path = "v1", path

    def join(self) -> None:
        """preexec_fn for the broker: put this (child) process in the group
        before it execs, so the broker and everything it forks start inside."""
        if self.path is not None:
            with open(self.path / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def describe(self) -> str:
        if self.path is None:
            return f"no memory cgroup ({self.why}); brokers run without a memory limit"
        return f"memory cgroup {self.version} {self.path}, limit {self.limit / 2**30:.2f} GiB"

    def remove(self) -> None:
        if self.path is None:
            return
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)  # exiting processes leave the group asynchronously
        print(f"warning: could not remove {self.path}", file=sys.stderr)


# ---------------------------------------------------------------- brokers

def bench_cmd(args, bench_bin: Path, bootstrap: str, pid: int, cg: MemCgroup, out: Path) -> list[str]:
    cmd = [str(bench_bin), "catchup", "--bootstrap", bootstrap, "--topic", "catchup",
           "--partitions", str(args.partitions), "--history-bytes", str(args.history_bytes),
           "--record-size", str(args.record_size), "--keys", str(args.keys), "--rate", str(args.rate),
           "--baseline-s", str(args.baseline_s), "--backfill-max-s", str(args.backfill_max_s),
           "--after-s", str(args.after_s), "--backfill-max-mb-per-s", str(args.backfill_max_mb_per_s),
           "--broker-pid", str(pid), "--json", str(out)]
    if cg.path is not None:
        cmd += ["--cgroup", str(cg.path)]
    return cmd


def run_bench(name: str, cmd: list[str], out: Path) -> dict:
    print(f"\n== {name}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


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


def run_keel(args, bench_bin: Path, work: Path) -> dict:
    cg = MemCgroup("keel-bench-keel", args.memory)
    print(f"keel: {cg.describe()}")
    data, log_path = work / "keel-data", work / "keel.log"
    shutil.rmtree(data, ignore_errors=True)
    port = free_port()
    cmd = [str(args.keel_bin), "serve", "--listen", f"127.0.0.1:{port}",
           "--advertised", f"127.0.0.1:{port}", "--data-dir", str(data), "--set", "keel.admin.listen="]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=cg.join)
    try:
        wait_port(port, 30)
        print(f"keel: {tail_cache_line(log_path) or 'no tail cache budget line yet in ' + str(log_path)}")
        res = run_bench("keel", bench_cmd(args, bench_bin, f"127.0.0.1:{port}", proc.pid, cg,
                                          work / "keel.json"), work / "keel.json")
        res["tail_cache_log"] = tail_cache_line(log_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        cg.remove()
        shutil.rmtree(data, ignore_errors=True)
    res["memory_cgroup"] = cg.describe()
    return res


def run_kafka(args, bench_bin: Path, work: Path) -> dict:
    cg = MemCgroup("keel-bench-kafka", args.memory)
    print(f"kafka: {cg.describe()}")
    data = work / "kafka-data"
    shutil.rmtree(data, ignore_errors=True)
    port = free_port()
    env = dict(os.environ, KAFKA_HEAP=args.kafka_heap)
    subprocess.run([str(HERE / "kafka" / "start.sh"), str(port), str(data)], check=True, env=env,
                   preexec_fn=cg.join, timeout=300)
    try:
        pid = int((data / "kafka.pid").read_text())
        res = run_bench("kafka", bench_cmd(args, bench_bin, f"127.0.0.1:{port}", pid, cg,
                                           work / "kafka.json"), work / "kafka.json")
    finally:
        subprocess.run([str(HERE / "kafka" / "stop.sh"), str(data)], check=False, timeout=180)
        cg.remove()
        shutil.rmtree(data, ignore_errors=True)
    res["memory_cgroup"] = cg.describe()
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
]


def mb(v, unit):
    return None if v is None else v / unit


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


def side_by_side(results: dict) -> str:
    names = [n for n in ("kafka", "keel") if n in results]
    head = "| phase | metric | " + " | ".join({"kafka": "Kafka 4.3.1", "keel": "Keel"}[n] for n in names)
    if len(names) == 2:
        head += " | Keel / Kafka"
    lines = [head + " |", "|" + " --- |" * (head.count("|"))]
    for i, phase in enumerate(("baseline", "backfill", "after")):
        for label, get in ROWS:
            vals = [get(results[n]["phases"][i]) for n in names]
            if all(v is None for v in vals):
                continue
            row = f"| {phase} | {label} | " + " | ".join(fmt(v) for v in vals)
            if len(names) == 2:
                k, r = vals[0], vals[1]
                row += " | " + (f"{r / k:.2f}" if k and r is not None else "-")
            lines.append(row + " |")
    return "\n".join(lines)


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
        ax.set_title(f"{name}: latency over time")
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
    ap.add_argument("--kafka-heap", default="1g")
    ap.add_argument("--keel-bin", type=Path, default=REPO / "target" / "release" / "keel")
    ap.add_argument("--skip-kafka", action="store_true")
    ap.add_argument("--skip-keel", action="store_true")
    ap.add_argument("--json", type=Path, help="write both brokers' results here")
    ap.add_argument("--plot", type=Path, default=LAB / "catchup.png", help="PNG of latency over time")
    args = ap.parse_args()

    work = LAB / "catchup"
    work.mkdir(parents=True, exist_ok=True)
    bench_bin = build_bench(LAB / "keel-bench")
    results: dict = {}
    if not args.skip_kafka:
        results["kafka"] = run_kafka(args, bench_bin, work)
    if not args.skip_keel:
        if not args.keel_bin.exists():
            raise SystemExit(f"{args.keel_bin} not found: cargo build --release -p keel-server")
        results["keel"] = run_keel(args, bench_bin, work)

    print(f"\nmachine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}")
    for name, res in results.items():
        print(f"{name}: {res['memory_cgroup']}")
        b = res["backfill"]
        print(f"{name}: backfill {b['records']}/{b['target_records']} records, {b['bytes'] / 1e6:.0f} MB "
              f"in {b['seconds']:.1f} s{'' if b['complete'] else ' (INCOMPLETE)'}; "
              f"preload {res['preload']['bytes'] / 1e6:.0f} MB in {res['preload']['seconds']:.1f} s; "
              f"produce errors {res['produce_errors']}")
    if "keel" in results:
        print(f"keel: {results['keel'].get('tail_cache_log') or 'tail cache line not found'}")
    print()
    print(side_by_side(results))
    print(plot(results, args.plot))
    if args.json:
        args.json.write_text(json.dumps({"machine": {"host": platform.node(), "cores": os.cpu_count(),
                                                     "platform": platform.platform()},
                                         "args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=2) + "\n")
        print(f"JSON written to {args.json}")


if __name__ == "__main__":
    main()
