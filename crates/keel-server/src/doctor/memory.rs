//! Memory limits: the cgroup the process is in, its limits and usage, and
//! whether Keel's own memory budgets fit under them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use keel_config::BrokerConfig;
use keel_tier::memory::MemoryLimit;

use super::host::{human, Host};
use super::mounts::Mount;
use super::{Finding, Severity};

const AREA: &str = "memory";

/// v1's "no limit" is close to i64::MAX; anything this large is no limit.
const UNLIMITED: u64 = 1 << 60;

/// Share of the memory limit Keel's budgets may take together; the rest is
/// for request buffers, fetch responses being written, indexes and the
/// allocator's slack.
pub const BUDGET_SHARE_PERCENT: u64 = 75;

/// The memory controller's view of the process's cgroup.
#[derive(Debug, Clone)]
pub enum Cgroup {
    V2(V2),
    V1(V1),
    /// No memory cgroup could be read; why.
    Missing(String),
}

#[derive(Debug, Clone)]
pub struct V2 {
    /// The cgroup's directory (host path).
    pub dir: PathBuf,
    /// The tightest `memory.max` and `memory.high` of the cgroup and its
    /// ancestors, with the directory that sets each.
    pub max: Option<(u64, PathBuf)>,
    pub high: Option<(u64, PathBuf)>,
    pub current: Option<u64>,
    pub stat: BTreeMap<String, u64>,
}

#[derive(Debug, Clone)]
pub struct V1 {
    pub dir: PathBuf,
    /// `memory.limit_in_bytes`, or the hierarchy's (`memory.stat`
    /// `hierarchical_memory_limit`) when that is tighter.
    pub limit: Option<u64>,
    pub soft_limit: Option<u64>,
    pub usage: Option<u64>,
    pub stat: BTreeMap<String, u64>,
    pub failcnt: Option<u64>,
    /// The process is also in a v2 hierarchy (a hybrid host).
    pub hybrid: bool,
}

impl Cgroup {
    /// The tightest limit and its name.
    pub fn limit(&self) -> Option<(u64, String)> {
        match self {
            Cgroup::V2(v2) => {
                let max = v2
                    .max
                    .as_ref()
                    .map(|(v, p)| (*v, format!("memory.max ({})", p.display())));
                let high = v2
                    .high
                    .as_ref()
                    .map(|(v, p)| (*v, format!("memory.high ({})", p.display())));
                [max, high].into_iter().flatten().min_by_key(|(v, _)| *v)
            }
            Cgroup::V1(v1) => v1
                .limit
                .map(|v| (v, format!("memory.limit_in_bytes ({})", v1.dir.display()))),
            Cgroup::Missing(_) => None,
        }
    }

    /// The limit the kernel OOM-kills at (v2 `memory.max`, v1's limit).
    fn hard_limit(&self) -> Option<u64> {
        match self {
            Cgroup::V2(v2) => v2.max.as_ref().map(|(v, _)| *v),
            Cgroup::V1(v1) => v1.limit,
            Cgroup::Missing(_) => None,
        }
    }
}

/// Reads the memory cgroup of the host's process.
pub fn read_cgroup(host: &Host, mounts: &[Mount]) -> Cgroup {
    let proc_file = host.proc_pid("cgroup");
    let Ok(text) = host.read(&proc_file) else {
        return Cgroup::Missing(format!("{} is not readable", proc_file.display()));
    };
    let mut v2_path = None;
    let mut v1_path = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2_path = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1_path = Some(path.to_string());
        }
    }
    if let Some(path) = v1_path {
        let mount = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == "memory"));
        let dir = cgroup_dir(mount, "/sys/fs/cgroup/memory", &path);
        if !host.path(&dir).is_dir() {
            return Cgroup::Missing(format!(
                "{} names v1 memory cgroup {path}, but {} is not visible (the cgroup filesystem is not mounted here)",
                proc_file.display(),
                dir.display()
            ));
        }
        return Cgroup::V1(read_v1(host, dir, v2_path.is_some()));
    }
    let Some(path) = v2_path else {
        return Cgroup::Missing(format!("{} names no memory cgroup", proc_file.display()));
    };
    let mount = mounts.iter().find(|m| m.fstype == "cgroup2");
    let dir = cgroup_dir(mount, "/sys/fs/cgroup", &path);
    // The root cgroup has memory.stat but no memory.current or limits.
    let has_memory = ["memory.current", "memory.max", "memory.stat"]
        .iter()
        .any(|f| host.path(dir.join(f)).exists());
    if !has_memory {
        return Cgroup::Missing(format!(
            "{} names v2 cgroup {path}, but {} has no memory files (cgroup filesystem not mounted here, or the memory controller not enabled for it)",
            proc_file.display(),
            dir.display()
        ));
    }
    Cgroup::V2(read_v2(host, dir, mount.map(|m| m.mount_point.clone())))
}

/// The directory of cgroup `path` under its hierarchy's mount: the mount
/// shows its `root` at its mount point (a cgroup namespace or a container
/// mounts a subtree).
fn cgroup_dir(mount: Option<&Mount>, default_mount: &str, path: &str) -> PathBuf {
    let (mount_point, root) = match mount {
        Some(m) => (m.mount_point.clone(), m.root.clone()),
        None => (PathBuf::from(default_mount), PathBuf::from("/")),
    };
    let path = Path::new(path);
    let rel = path
        .strip_prefix(&root)
        .or_else(|_| path.strip_prefix("/"))
        .unwrap_or(path);
    if rel.as_os_str().is_empty() {
        mount_point
    } else {
        mount_point.join(rel)
    }
}

fn limit_file(host: &Host, path: &Path) -> Option<u64> {
    host.read_u64(path).filter(|v| *v < UNLIMITED)
}

fn read_v2(host: &Host, dir: PathBuf, mount_point: Option<PathBuf>) -> V2 {
    let top = mount_point.unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
    let mut max: Option<(u64, PathBuf)> = None;
    let mut high: Option<(u64, PathBuf)> = None;
    let mut at = dir.clone();
    // Ancestors' limits bind too (a Kubernetes pod's limit sits on the
    // pod's cgroup, above the container's).
    loop {
        for (file, slot) in [("memory.max", &mut max), ("memory.high", &mut high)] {
            if let Some(v) = limit_file(host, &at.join(file)) {
                if slot.as_ref().is_none_or(|(old, _)| v < *old) {
                    *slot = Some((v, at.clone()));
                }
            }
        }
        if at == top || !at.starts_with(&top) || !at.pop() {
            break;
        }
    }
    V2 {
        current: host.read_u64(dir.join("memory.current")),
        stat: host.read_counters(dir.join("memory.stat")).unwrap_or_default(),
        dir,
        max,
        high,
    }
}

fn read_v1(host: &Host, dir: PathBuf, hybrid: bool) -> V1 {
    let stat = host.read_counters(dir.join("memory.stat")).unwrap_or_default();
    let own = limit_file(host, &dir.join("memory.limit_in_bytes"));
    let hierarchical = stat
        .get("hierarchical_memory_limit")
        .copied()
        .filter(|v| *v < UNLIMITED);
    V1 {
        limit: [own, hierarchical].into_iter().flatten().min(),
        soft_limit: limit_file(host, &dir.join("memory.soft_limit_in_bytes")),
        usage: host.read_u64(dir.join("memory.usage_in_bytes")),
        failcnt: host.read_u64(dir.join("memory.failcnt")),
        stat,
        dir,
        hybrid,
    }
}

/// One of Keel's memory budgets: what it is, its bytes, and the key that
/// sets it.
#[derive(Debug, Clone)]
pub struct Budget {
    pub name: &'static str,
    pub bytes: u64,
    /// Empty for a budget derived from the limit alone.
    pub key: &'static str,
}

/// Keel's memory budgets under `config`, for a broker whose memory limit is
/// `limit` (defaults are shares of it, as the broker computes them).
pub fn budgets(config: &BrokerConfig, limit: &MemoryLimit) -> Vec<Budget> {
    let num = |key: &str| u64::try_from(config.num(key)).unwrap_or(0);
    let tail = match u64::try_from(config.num("keel.tail.cache.bytes")) {
        Ok(explicit) => explicit,
        Err(_) => limit.default_tail_cache_bytes(),
    };
    let mut out = vec![
        Budget {
            name: "tail cache",
            bytes: tail,
            key: "keel.tail.cache.bytes",
        },
        Budget {
            name: "scan buffer",
            bytes: u64::try_from(config.num("keel.scan.buffer.bytes"))
                .unwrap_or_else(|_| limit.scan_buffer_bytes()),
            key: "keel.scan.buffer.bytes",
        },
        Budget {
            name: "cold reads in flight (max.concurrent x fetch.max.bytes)",
            bytes: num("keel.cold.read.max.concurrent").saturating_mul(num("fetch.max.bytes")),
            key: "keel.cold.read.max.concurrent",
        },
    ];
    if config.get("log.cleaner.enable") == "true" {
        out.push(Budget {
            name: "cleaner key map",
            bytes: num("log.cleaner.dedupe.buffer.size"),
            key: "log.cleaner.dedupe.buffer.size",
        });
        out.push(Budget {
            name: "cleaner I/O buffers (io.buffer.size x threads)",
            bytes: num("log.cleaner.io.buffer.size").saturating_mul(num("log.cleaner.threads")),
            key: "log.cleaner.io.buffer.size",
        });
    }
    out
}

/// The limit Keel would size its defaults from: the tighter of host memory
/// and the cgroup's limit (as `keel_tier::memory::MemoryLimit::detect`).
pub fn effective_limit(host: &Host, cgroup: &Cgroup) -> MemoryLimit {
    let host_bytes = host.meminfo_bytes("MemTotal");
    let host_limit = MemoryLimit {
        limit_bytes: host_bytes.unwrap_or(1 << 30),
        source: if host_bytes.is_some() {
            "host memory (MemTotal)".into()
        } else {
            "an assumed 1 GiB (no /proc/meminfo)".into()
        },
    };
    match cgroup.limit() {
        Some((bytes, source)) if bytes < host_limit.limit_bytes => MemoryLimit {
            limit_bytes: bytes,
            source,
        },
        _ => host_limit,
    }
}

pub fn findings(host: &Host, cgroup: &Cgroup, config: &BrokerConfig) -> Vec<Finding> {
    let mut out = vec![cgroup_finding(host, cgroup)];
    out.extend(usage_finding(cgroup));
    let limit = effective_limit(host, cgroup);
    out.push(budget_finding(cgroup, &limit, &budgets(config, &limit)));
    out
}

fn whose(host: &Host) -> String {
    match host.pid {
        Some(pid) => format!("process {pid}'s cgroup"),
        None => "the cgroup of `keel doctor` itself: what counts is the broker's, so run doctor \
                 the way the broker runs (same systemd unit or container) or pass --pid <broker pid>"
            .into(),
    }
}

fn cgroup_finding(host: &Host, cgroup: &Cgroup) -> Finding {
    let whose = whose(host);
    match cgroup {
        Cgroup::Missing(reason) => Finding::new(
            Severity::Info,
            AREA,
            "cgroup",
            format!("no memory cgroup readable: {reason}. Read for {whose}."),
        )
        .fix(
            "Keel then sizes its default budgets from host memory; inside a container with a \
             memory limit, set keel.tail.cache.bytes explicitly (or mount /sys/fs/cgroup read-only)",
        ),
        Cgroup::V2(v2) => {
            let limit = |l: &Option<(u64, PathBuf)>| match l {
                Some((v, p)) if *p == v2.dir => human(*v),
                Some((v, p)) => format!("{} (set on ancestor {})", human(*v), p.display()),
                None => "max".into(),
            };
            Finding::new(
                Severity::Info,
                AREA,
                "cgroup",
                format!(
                    "cgroup v2 {}: memory.max {}, memory.high {}. Read for {whose}.",
                    v2.dir.display(),
                    limit(&v2.max),
                    limit(&v2.high)
                ),
            )
        }
        Cgroup::V1(v1) => {
            let lim = |v: Option<u64>| v.map_or("unlimited".to_string(), human);
            let hybrid = if v1.hybrid {
                " (hybrid host: the memory controller is on v1, the unified v2 hierarchy has none)"
            } else {
                ""
            };
            Finding::new(
                Severity::Info,
                AREA,
                "cgroup",
                format!(
                    "cgroup v1 memory {}{hybrid}: limit_in_bytes {}, soft_limit_in_bytes {}, \
                     failcnt {} (times usage hit the limit). v1 has no memory.high: reclaim \
                     starts at the limit itself. Read for {whose}.",
                    v1.dir.display(),
                    lim(v1.limit),
                    lim(v1.soft_limit),
                    v1.failcnt.map_or("?".to_string(), |n| n.to_string())
                ),
            )
        }
    }
}

/// Usage split into page cache (file) and anonymous memory.
fn usage_finding(cgroup: &Cgroup) -> Option<Finding> {
    let (usage, file, anon, names) = match cgroup {
        Cgroup::V2(v2) => (
            v2.current?,
            v2.stat.get("file").copied(),
            v2.stat.get("anon").copied(),
            "memory.current; memory.stat file/anon",
        ),
        Cgroup::V1(v1) => {
            let get = |k: &str| {
                v1.stat
                    .get(&format!("total_{k}"))
                    .or_else(|| v1.stat.get(k))
                    .copied()
            };
            (
                v1.usage?,
                get("cache"),
                get("rss"),
                "memory.usage_in_bytes; memory.stat (total_)cache/rss",
            )
        }
        Cgroup::Missing(_) => return None,
    };
    let split = match (file, anon) {
        (Some(f), Some(a)) => format!(": page cache {}, anon {}", human(f), human(a)),
        _ => String::new(),
    };
    let mut finding = Finding::new(
        Severity::Info,
        AREA,
        "usage",
        format!("usage {}{split} ({names})", human(usage)),
    );
    if let Some((limit, name)) = cgroup.limit() {
        let percent = usage.saturating_mul(100) / limit.max(1);
        finding.found.push_str(&format!("; {percent}% of {name}"));
        if percent >= 90 {
            finding.severity = Severity::Warn;
            finding.fix = format!(
                "the cgroup is at {percent}% of its limit: the kernel reclaims its page cache \
                 (and then throttles or OOM-kills) at the limit; raise {name} or lower Keel's \
                 budgets (keel.tail.cache.bytes)"
            );
        }
    }
    Some(finding)
}

fn budget_finding(cgroup: &Cgroup, limit: &MemoryLimit, budgets: &[Budget]) -> Finding {
    let total: u64 = budgets.iter().map(|b| b.bytes).sum();
    let list = budgets
        .iter()
        .map(|b| format!("{} {}", b.name, human(b.bytes)))
        .collect::<Vec<_>>()
        .join(", ");
    let found = format!(
        "Keel's budgets total {} ({list}) against a limit of {} from {}",
        human(total),
        human(limit.limit_bytes),
        limit.source
    );
    let allowed = limit.limit_bytes / 100 * BUDGET_SHARE_PERCENT;
    // The largest configurable budget is the one to name.
    let biggest = budgets
        .iter()
        .filter(|b| !b.key.is_empty())
        .max_by_key(|b| b.bytes)
        .map_or("keel.tail.cache.bytes", |b| b.key);
    let others: u64 = budgets
        .iter()
        .filter(|b| b.key != "keel.tail.cache.bytes")
        .map(|b| b.bytes)
        .sum();
    let suggest_tail = allowed.saturating_sub(others);
    let fix = format!(
        "lower {biggest}{} (e.g. --set keel.tail.cache.bytes={suggest_tail}, which leaves {}% of the limit for \
         request buffers, fetch responses and indexes), or raise the cgroup's limit",
        if biggest == "keel.tail.cache.bytes" { "" } else { " or keel.tail.cache.bytes" },
        100 - BUDGET_SHARE_PERCENT
    );
    let over_hard = cgroup.hard_limit().is_some_and(|hard| total > hard);
    if over_hard {
        Finding::new(
            Severity::Error,
            AREA,
            "budgets",
            format!("{found}: more than the hard limit, where the kernel OOM-kills"),
        )
        .fix(fix)
    } else if total > limit.limit_bytes {
        Finding::new(
            Severity::Warn,
            AREA,
            "budgets",
            format!(
                "{found}: more than the limit; at memory.high the kernel reclaims and throttles the broker"
            ),
        )
        .fix(fix)
    } else if total > allowed {
        Finding::new(
            Severity::Warn,
            AREA,
            "budgets",
            format!("{found}: less than {}% headroom", 100 - BUDGET_SHARE_PERCENT),
        )
        .fix(fix)
    } else {
        Finding::new(
            Severity::Ok,
            AREA,
            "budgets",
            format!("{found}: they fit with headroom"),
        )
    }
}
