//! Reclaim evidence: kernel and cgroup counters read twice, `--sample-secs`
//! apart. The verdict is a pure function of the two snapshots
//! ([`sampled_findings`]), so tests feed it counters directly.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::host::Host;
use super::memory::Cgroup;
use super::mounts::Mount;
use super::{Finding, Severity};

const AREA: &str = "reclaim";

/// Counters at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// `/proc/vmstat`; empty when unreadable.
    pub vmstat: BTreeMap<String, u64>,
    /// The cgroup's `memory.stat`.
    pub cgroup_stat: BTreeMap<String, u64>,
    /// v2 `memory.events`.
    pub cgroup_events: BTreeMap<String, u64>,
    /// v1 `memory.failcnt`.
    pub failcnt: Option<u64>,
}

pub fn snapshot(host: &Host, cgroup: &Cgroup) -> Snapshot {
    let mut s = Snapshot {
        vmstat: host.read_counters("/proc/vmstat").unwrap_or_default(),
        ..Snapshot::default()
    };
    match cgroup {
        Cgroup::V2(v2) => {
            s.cgroup_stat = host.read_counters(v2.dir.join("memory.stat")).unwrap_or_default();
            s.cgroup_events = host
                .read_counters(v2.dir.join("memory.events"))
                .unwrap_or_default();
        }
        Cgroup::V1(v1) => {
            s.cgroup_stat = host.read_counters(v1.dir.join("memory.stat")).unwrap_or_default();
            s.failcnt = host.read_u64(v1.dir.join("memory.failcnt"));
        }
        Cgroup::Missing(_) => {}
    }
    s
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, key: &str) -> u64 {
    after
        .get(key)
        .copied()
        .unwrap_or(0)
        .saturating_sub(before.get(key).copied().unwrap_or(0))
}

/// Sum of the deltas of every key starting with `prefix` (`allocstall_dma`,
/// `allocstall_normal`...; older kernels have one `allocstall`).
fn delta_prefix(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, prefix: &str) -> u64 {
    after
        .keys()
        .filter(|k| k.starts_with(prefix))
        .map(|k| delta(before, after, k))
        .sum()
}

/// What changed between two snapshots `secs` apart. `min_free_hint` is the
/// `vm.min_free_kbytes` to suggest when direct reclaim was seen.
pub fn sampled_findings(
    before: &Snapshot,
    after: &Snapshot,
    secs: u64,
    cgroup: &Cgroup,
    min_free_hint: &str,
) -> Vec<Finding> {
    let mut out = Vec::new();
    if after.vmstat.is_empty() {
        out.push(Finding::new(
            Severity::Info,
            AREA,
            "host",
            "/proc/vmstat is not readable: no host reclaim counters".to_string(),
        ));
    } else {
        out.extend(host_findings(before, after, secs, min_free_hint));
    }
    out.extend(cgroup_findings(before, after, secs, cgroup));
    out
}

fn host_findings(before: &Snapshot, after: &Snapshot, secs: u64, min_free_hint: &str) -> Vec<Finding> {
    let d = |k: &str| delta(&before.vmstat, &after.vmstat, k);
    let mut out = Vec::new();
    let (scan_direct, steal_direct) = (d("pgscan_direct"), d("pgsteal_direct"));
    let stalls = delta_prefix(&before.vmstat, &after.vmstat, "allocstall");
    let numbers = format!(
        "pgscan_direct +{scan_direct}, pgsteal_direct +{steal_direct}, allocstall +{stalls} in {secs} s"
    );
    out.push(if scan_direct > 0 || stalls > 0 {
        Finding::new(
            Severity::Warn,
            AREA,
            "direct_reclaim",
            format!("processes stalled reclaiming memory themselves (direct reclaim): {numbers}"),
        )
        .fix(format!(
            "raise vm.min_free_kbytes so kswapd starts reclaiming earlier ({min_free_hint}; \
             persist it in /etc/sysctl.d/); and if the broker's cgroup sets memory.high or a \
             limit close to its usage, raise it or lower keel.tail.cache.bytes"
        ))
    } else {
        Finding::new(
            Severity::Ok,
            AREA,
            "direct_reclaim",
            format!("no direct reclaim: {numbers}"),
        )
    });
    let (scan_kswapd, steal_kswapd) = (d("pgscan_kswapd"), d("pgsteal_kswapd"));
    if scan_kswapd > 0 {
        out.push(Finding::new(
            Severity::Info,
            AREA,
            "kswapd",
            format!("kswapd reclaimed in the background: pgscan_kswapd +{scan_kswapd}, pgsteal_kswapd +{steal_kswapd} in {secs} s"),
        ));
    }
    let (written, immediate) = (d("nr_vmscan_write"), d("nr_vmscan_immediate_reclaim"));
    let numbers = format!("nr_vmscan_write +{written}, nr_vmscan_immediate_reclaim +{immediate} in {secs} s");
    // Only nr_vmscan_write is reclaim writing pages itself; immediate
    // reclaim counts pages reclaim found already under writeback.
    out.push(if written > 0 {
        Finding::new(
            Severity::Warn,
            AREA,
            "vmscan_writeback",
            format!("reclaim met dirty pages and wrote them back itself (writeback reason vmscan, not periodic/background): {numbers}"),
        )
        .fix(
            "memory pressure reaches dirty page cache before the flusher does: raise or remove \
             memory.high (or the pod's memory limit) for the broker's cgroup, raise \
             vm.min_free_kbytes, and lower vm.dirty_background_bytes so background writeback \
             starts sooner",
        )
    } else if immediate > 0 {
        Finding::new(
            Severity::Info,
            AREA,
            "vmscan_writeback",
            format!("no vmscan-tagged writeback, but reclaim met pages already under writeback and marked them for reclaim when it ends: {numbers}"),
        )
    } else {
        Finding::new(Severity::Ok, AREA, "vmscan_writeback", format!("no vmscan-tagged writeback: {numbers}"))
    });
    let refaults = d("workingset_refault_file");
    if refaults > 0 {
        out.push(Finding::new(
            Severity::Info,
            AREA,
            "refaults",
            format!(
                "workingset_refault_file +{refaults} in {secs} s: page-cache pages read again soon after \
                 being evicted (host-wide). Keel serves tail reads from its own cache, so these are \
                 other readers' or Keel's index pages"
            ),
        ));
    }
    out
}

fn cgroup_findings(before: &Snapshot, after: &Snapshot, secs: u64, cgroup: &Cgroup) -> Vec<Finding> {
    match cgroup {
        Cgroup::V2(_) => v2_findings(before, after, secs),
        Cgroup::V1(_) => {
            let failed = after
                .failcnt
                .unwrap_or(0)
                .saturating_sub(before.failcnt.unwrap_or(0));
            let majfault = delta(&before.cgroup_stat, &after.cgroup_stat, "pgmajfault");
            let found = format!(
                "cgroup v1: memory.failcnt +{failed}, pgmajfault +{majfault} in {secs} s (v1's \
                 memory.stat has no pgscan/pgsteal and there is no memory.events: failcnt, the \
                 times usage hit the limit, is the reclaim evidence v1 gives)"
            );
            vec![if failed > 0 {
                Finding::new(Severity::Warn, AREA, "cgroup", found).fix(
                    "the cgroup hits memory.limit_in_bytes and reclaims its own page cache: raise \
                     the limit or lower keel.tail.cache.bytes",
                )
            } else {
                Finding::new(Severity::Ok, AREA, "cgroup", found)
            }]
        }
        Cgroup::Missing(_) => Vec::new(),
    }
}

fn v2_findings(before: &Snapshot, after: &Snapshot, secs: u64) -> Vec<Finding> {
    let e = |k: &str| delta(&before.cgroup_events, &after.cgroup_events, k);
    let s = |k: &str| delta(&before.cgroup_stat, &after.cgroup_stat, k);
    let (high, max, oom, oom_kill) = (e("high"), e("max"), e("oom"), e("oom_kill"));
    let events = format!("memory.events high +{high}, max +{max}, oom +{oom}, oom_kill +{oom_kill}");
    let stat = format!(
        "memory.stat pgscan +{}, pgsteal +{}, pgscan_direct +{}, pgscan_kswapd +{}, workingset_refault_file +{}",
        s("pgscan"),
        s("pgsteal"),
        s("pgscan_direct"),
        s("pgscan_kswapd"),
        s("workingset_refault_file")
    );
    let found = format!("cgroup v2 in {secs} s: {events}; {stat}");
    let fix = "raise or remove memory.high for the broker's cgroup (systemd MemoryHigh=; on \
               Kubernetes no memory limit on dedicated nodes, or one well above Keel's budgets), \
               or lower keel.tail.cache.bytes so Keel stays under it";
    let finding = if oom > 0 || oom_kill > 0 {
        Finding::new(
            Severity::Error,
            AREA,
            "cgroup",
            format!("{found}: the cgroup ran out of memory"),
        )
        .fix(fix)
    } else if high > 0 || max > 0 {
        Finding::new(
            Severity::Warn,
            AREA,
            "cgroup",
            format!("{found}: the kernel reclaimed (and throttled) the cgroup at its limit even if the host had memory free"),
        )
        .fix(fix)
    } else if s("pgscan_direct") > 0 {
        Finding::new(
            Severity::Warn,
            AREA,
            "cgroup",
            format!("{found}: tasks in the cgroup reclaimed directly"),
        )
        .fix(fix)
    } else {
        Finding::new(Severity::Ok, AREA, "cgroup", found)
    };
    vec![finding]
}

/// Findings that need no sampling: totals since boot or since the cgroup
/// was created, and where the writeback tracepoints are.
pub fn standing_findings(
    host: &Host,
    mounts: &[Mount],
    now: &Snapshot,
    cgroup: &Cgroup,
    secs: u64,
) -> Vec<Finding> {
    let mut out = Vec::new();
    if secs == 0 {
        out.push(Finding::new(
            Severity::Info,
            AREA,
            "sample",
            "sampling skipped (--sample-secs 0): only totals since boot are shown".to_string(),
        ));
        let v = |k: &str| now.vmstat.get(k).copied().unwrap_or(0);
        let stalls: u64 = now
            .vmstat
            .iter()
            .filter(|(k, _)| k.starts_with("allocstall"))
            .map(|(_, v)| v)
            .sum();
        if !now.vmstat.is_empty() {
            out.push(Finding::new(
                Severity::Info,
                AREA,
                "since_boot",
                format!(
                    "since boot: pgscan_direct {}, allocstall {stalls}, nr_vmscan_write {}, pgscan_kswapd {}",
                    v("pgscan_direct"),
                    v("nr_vmscan_write"),
                    v("pgscan_kswapd")
                ),
            ));
        }
    }
    if let Cgroup::V2(_) = cgroup {
        let e = |k: &str| now.cgroup_events.get(k).copied().unwrap_or(0);
        if e("high") > 0 || e("max") > 0 || e("oom_kill") > 0 {
            out.push(Finding::new(
                Severity::Info,
                AREA,
                "cgroup_history",
                format!(
                    "since the cgroup was created: memory.events high {}, max {}, oom_kill {} \
                     (sample over a busy period to see whether it is still happening)",
                    e("high"),
                    e("max"),
                    e("oom_kill")
                ),
            ));
        }
    }
    out.push(tracepoint_finding(host, mounts));
    out
}

/// Where the writeback tracepoints (whose `reason` says vmscan, periodic,
/// background...) are; doctor never enables tracing itself.
fn tracepoint_finding(host: &Host, mounts: &[Mount]) -> Finding {
    let tracefs: Option<PathBuf> = mounts
        .iter()
        .find(|m| m.fstype == "tracefs")
        .map(|m| m.mount_point.clone())
        .or_else(|| {
            mounts
                .iter()
                .find(|m| m.fstype == "debugfs")
                .map(|m| m.mount_point.join("tracing"))
        });
    match tracefs {
        Some(dir) => {
            let event = dir.join("events/writeback/writeback_start");
            let present = host.path(&event).exists();
            Finding::new(
                Severity::Info,
                AREA,
                "tracepoint",
                format!(
                    "tracefs at {}: the writeback tracepoints {} ({}); each event's reason \
                     field says vmscan, periodic or background",
                    dir.display(),
                    event.display(),
                    if present { "present" } else { "not visible to this user" }
                ),
            )
            .fix(format!(
                "to see writeback reasons live (as root): echo 1 > {}/enable; cat {}/trace_pipe; echo 0 > {}/enable",
                event.display(),
                dir.display(),
                event.display()
            ))
        }
        None => Finding::new(
            Severity::Info,
            AREA,
            "tracepoint",
            "tracefs is not mounted: the writeback tracepoints (writeback:writeback_start, reason=vmscan) are not reachable; nr_vmscan_write above counts the same pages".to_string(),
        )
        .fix("mount -t tracefs nodev /sys/kernel/tracing (as root) to trace writeback reasons"),
    }
}
