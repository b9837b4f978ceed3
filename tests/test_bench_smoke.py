"""Smoke test of the catch-up benchmark client (bench/keel-bench), so the tool
cannot rot: build it with `go build`, run `catchup` for a few seconds against
a broker from the fixtures, and check that the JSON report has every phase
with samples in it; and run bench/catchup.py with each --keel-tier at a tiny
size. A smoke test only: no timing is asserted.

Without `go` the test is skipped, unless CI=true, where it fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import IMPL, REPO, go_build

BENCH_SRC = REPO / "bench" / "keel-bench"


@pytest.fixture(scope="module")
def keel_bench(tmp_path_factory):
    return go_build(tmp_path_factory, BENCH_SRC, "keel-bench")


def run_catchup(keel_bench, broker, tmp_path, *extra: str) -> tuple[dict, object]:
    """Runs a few seconds of `catchup` and returns its JSON report and the
    broker's process (None for an external broker)."""
    report = tmp_path / "catchup.json"
    cmd = [str(keel_bench), "catchup", "--bootstrap", broker.bootstrap,
           "--partitions", "2", "--history-bytes", "2MiB", "--record-size", "512",
           "--keys", "1000", "--rate", "200", "--baseline-s", "2",
           "--backfill-min-s", "1", "--backfill-max-s", "20", "--after-s", "2",
           "--progress-s", "0", "--json", str(report), *extra]
    proc = getattr(broker, "proc", None)
    if proc is not None:
        cmd += ["--broker-pid", str(proc.pid)]
    if getattr(broker, "admin", None):
        cmd += ["--metrics-url", f"http://{broker.admin}/metrics"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"keel-bench failed:\n{run.stdout}\n{run.stderr}"
    assert "tail e2e p99 ms" in run.stdout, run.stdout
    return json.loads(report.read_text()), proc


def test_catchup_reports_three_phases(keel_bench, broker, tmp_path):
    res, proc = run_catchup(keel_bench, broker, tmp_path)
    assert res["produce_errors"] == 0, res.get("first_produce_error")
    phases = {p["name"]: p for p in res["phases"]}
    assert list(phases) == ["baseline", "backfill", "after"]
    for name, p in phases.items():
        assert p["produce"]["count"] > 0, f"no produce acks in phase {name}: {p}"
        assert p["tail"]["count"] > 0, f"no tail records in phase {name}: {p}"
    assert res["backfill"]["bytes"] > 0, res["backfill"]
    assert res["backfill"]["complete"], res["backfill"]
    assert res["backfill"]["records"] == res["backfill"]["target_records"], res["backfill"]
    if proc is not None:
        assert phases["baseline"]["broker"]["rss_bytes_max"] > 0, phases["baseline"]["broker"]
    if getattr(broker, "admin", None):
        # Keel's /metrics: every phase's produces went through a write and
        # the backfill's fetches read something.
        for name, p in phases.items():
            write = p["stages"]["Produce"]["write"]
            assert write["count"] > 0 and write["mean_ms"] >= 0, (name, p["stages"])
            assert 0 < write["p99_ms_at_most"] <= 26_215, (name, write)
        reads = phases["backfill"]["stages"]["Fetch"]
        assert any(reads.get(s, {}).get("count") for s in ("read_cache", "read_local", "read_ahead")), reads


def test_catchup_backfill_in_its_own_process(keel_bench, broker, tmp_path):
    """The child-process backfill (`keel-bench backfill`, niced, small
    fetches) reads the same records and reports its CPU."""
    res, _ = run_catchup(keel_bench, broker, tmp_path, "--backfill-nice", "10",
                         "--backfill-partition-fetch-bytes", "64KiB")
    assert res["config"]["backfill_process"], res["config"]
    assert "own process, nice 10" in res["setup"], res["setup"]
    bf = res["backfill"]
    assert bf["complete"] and bf["records"] == bf["target_records"] > 0, bf
    assert bf["cpu_s"] > 0, bf
    phase = next(p for p in res["phases"] if p["name"] == "backfill")
    assert phase["backfill_bytes"] == bf["bytes"], (phase, bf)


def test_catchup_backfill_readers_at_staggered_offsets(keel_bench, broker, tmp_path):
    """--backfill-at: one reader per share, each a client of its own, each
    reading from that share of every partition's history to its end; the
    backfill's totals are theirs."""
    res, _ = run_catchup(keel_bench, broker, tmp_path, "--backfill-at", "0,0.5")
    assert "2 consumers in the bench process from 0%, 50% of the history" in res["setup"], res["setup"]
    bf = res["backfill"]
    readers = bf["readers"]
    assert [r["at"] for r in readers] == [0, 0.5], readers
    assert len({r["client_id"] for r in readers}) == 2, readers
    for r in readers:
        assert r["complete"] and r["records"] == r["target_records"] > 0, r
    # The reader from half way reads about half of what the one from 0 does.
    first, half = readers[0]["target_records"], readers[1]["target_records"]
    assert 0.4 * first <= half <= 0.6 * first, readers
    assert bf["records"] == first + half and bf["complete"], bf


@pytest.mark.parametrize("tier", ["capacity", "s3"])
def test_catchup_py_with_keel_tier(tier, keel_bench, tmp_path):
    """bench/catchup.py --keel-tier: the history is moved to the colder tier
    before the live phases, and the backfill reads it from there (a 64 KiB
    tail cache, so it cannot come from memory). Keel only, tiny sizes."""
    if IMPL != "keel":
        pytest.skip("Keel's tiers")
    if tier == "s3":
        from s3server import INSTALL_HINT, find_versitygw
        if find_versitygw() is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"versitygw not found (CI=true); install it with {INSTALL_HINT}")
            pytest.skip(f"versitygw not found; install it with {INSTALL_HINT}")
    keel_bin = Path(os.environ.get("KEEL_BIN", REPO / "target" / "debug" / "keel"))
    out = tmp_path / "catchup.json"
    cmd = [sys.executable, str(REPO / "bench" / "catchup.py"), "--skip-kafka", "--keel-bin", str(keel_bin),
           "--bench-bin", str(keel_bench), "--keel-tier", tier, "--history-bytes", "8MiB",
           "--record-size", "512", "--keys", "1000", "--rate", "200", "--segment-bytes", "1MiB",
           "--keel-fast-max-bytes", "2MiB", "--keel-set", "keel.tail.cache.bytes=65536",
           "--keel-set", "keel.tier.check.interval.ms=100", "--baseline-s", "1", "--after-s", "1",
           "--tier-wait-max-s", "60", "--json", str(out), "--plot", str(tmp_path / "catchup.png")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                         env=dict(os.environ, LAB_DIR=str(tmp_path / "lab")))
    assert run.returncode == 0, f"catchup.py failed:\n{run.stdout}\n{run.stderr}"
    assert "colder tier read MB" in run.stdout, run.stdout
    assert "Keel request stages" in run.stdout, run.stdout
    keel = json.loads(out.read_text())["results"]["keel"]
    settled = keel["settle"]
    assert settled["topic_cold_bytes"] >= 4 << 20, settled
    assert settled["tiers"]["copy_failures"] == 0, settled
    # The baseline started once the preload was written back.
    assert settled["written_back"], settled
    assert keel["backfill"]["complete"], keel["backfill"]
    backfill = next(p for p in keel["phases"] if p["name"] == "backfill")
    assert backfill["tiers"]["cold_tier_read_bytes"] > 0, backfill["tiers"]
    assert backfill["tiers"]["read_failures"] == 0, backfill["tiers"]
    # The backfill's fetches of the moved history were served by the tier.
    tier_stage = {"capacity": "read_capacity", "s3": "read_remote"}[tier]
    assert backfill["stages"]["Fetch"][tier_stage]["count"] > 0, backfill["stages"]


def test_schedwait_charges_a_live_threads_wait_to_who_held_its_cpu():
    """bench/schedwait.py's replay of `perf script` lines (no perf needed):
    a broker request thread woken while the backfill process holds its CPU
    waits 3 ms, all charged to the backfill process; a live client
    preempted by a kworker waits 1.5 ms, charged to kernel threads; a live
    client's short wait is counted but charged to nobody; a bulk thread's wait is not a
    live wait; a wake-up of a thread still on its CPU starts no wait."""
    sys.path.insert(0, str(REPO / "bench"))
    import schedwait

    def line(comm, tgid, tid, cpu, t, ev, rest):
        return f"{comm:>16} {tgid}/{tid} [{cpu:03d}] {t:.6f}: {'sched:' + ev + ':':>24} {rest}\n"

    def switch(comm, tgid, tid, cpu, t, state, nxt_comm, nxt):
        return line(comm, tgid, tid, cpu, t, "sched_switch",
                    f"prev_comm={comm} prev_pid={tid} prev_prio=120 prev_state={state} ==> "
                    f"next_comm={nxt_comm} next_pid={nxt} next_prio=120")

    def waking(comm, tgid, tid, cpu, t, woken_comm, woken):
        return line(comm, tgid, tid, cpu, t, "sched_waking",
                    f"comm={woken_comm} pid={woken} prio=120 target_cpu={cpu:03d}")

    broker, bench, backfill = 100, 200, 300
    lines = [
        switch("swapper/0", 0, 0, 0, 0.999, "R", "keel-bench", 301),
        waking("keel-bench", backfill, 301, 0, 1.000, "keel", 101),          # broker thread woken
        switch("keel-bench", backfill, 301, 0, 1.003, "R", "keel", 101),      # ... runs 3 ms later
        waking("keel", broker, 101, 0, 1.0035, "keel", 101),                 # still on its CPU: no wait
        waking("keel", broker, 101, 0, 1.004, "keel-bulk", 105),
        switch("swapper/1", 0, 0, 1, 1.0045, "R", "keel-bulk", 105),        # a bulk thread's wait
        waking("keel", broker, 101, 0, 1.005, "keel-bench", 201),
        switch("keel-bulk", broker, 105, 1, 1.0052, "S", "keel-bench", 201),  # live client, 0.2 ms
        switch("keel-bench", bench, 201, 1, 1.0070, "R", "kworker/1:1", 50),  # preempted ...
        switch("kworker/1:1", 50, 50, 1, 1.0085, "S", "keel-bench", 201),     # ... for 1.5 ms
        switch("keel", broker, 101, 0, 1.010, "S", "swapper/0", 0),
        waking("swapper/0", 0, 0, 0, 1.0105, "keel", 101),
        switch("swapper/0", 0, 0, 0, 1.0106, "R", "keel", 101),              # 0.1 ms, not 7
        switch("keel-bench", bench, 201, 1, 1.011, "S", "swapper/1", 0),
        line("perf", 999, 999, 0, 1.012, "sched_stat_runtime", "comm=perf pid=999 runtime=1 [ns]"),
    ]
    res = schedwait.replay(schedwait.parse(lines), broker, bench)
    assert res["live_waits"] == 4, res
    assert res["live_waits_over_min"] == 2 and res["live_waits_over_1ms"] == 2, res
    per_s = res["charged_ms_per_s"]
    seconds = 1.012 - 0.999
    assert per_s["backfill process"] == pytest.approx(3.0 / seconds, rel=0.01), res
    assert per_s["kernel threads"] == pytest.approx(1.5 / seconds, rel=0.01), res
    assert sum(per_s.values()) == pytest.approx(4.5 / seconds, rel=0.01), res
    assert list(res["others_ms_per_s"]) == ["kworker/1:1"], res
    table = schedwait.table({"backfill": res})
    assert "| backfill process | " in table


def test_preempt_probe_measures_each_neighbour_and_leaves_none_running(tmp_path):
    """bench/preempt_probe.py: a row per neighbour of the probe (nothing, a
    busy loop, two, a socket copier), and the neighbours it started are gone
    when it returns (a busy loop left behind would take a CPU from every
    test after it)."""
    out = tmp_path / "probe.json"
    cpu = sorted(os.sched_getaffinity(0))[-1]
    run = subprocess.run([sys.executable, str(REPO / "bench" / "preempt_probe.py"), "--cpu", str(cpu),
                          "--wakeups", "50", "--json", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["beside"] for r in rows] == ["nothing", "busy", "2 busy", "copier"], rows
    assert all(0 <= r["p50_ms"] <= r["p99_ms"] <= r["max_ms"] for r in rows), rows
    left = subprocess.run(["pgrep", "-f", "preempt_probe.py --role"], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"neighbours left running: {left.stdout}"
