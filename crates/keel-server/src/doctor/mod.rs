//! `keel doctor`: reads the host the way an operator would by hand (cgroup
//! limits, reclaim counters, kernel settings, each data directory's
//! filesystem and disk) and prints findings, each with a severity, what
//! was found (with the numbers) and a fix.
//!
//! Every `/proc` and `/sys` read goes through [`host::Host`], rooted at `/`
//! or, for tests, at a fixture tree (`--root`, hidden, or
//! `KEEL_DOCTOR_ROOT`). See docs/doctor.md for each finding.

pub mod disks;
pub mod host;
pub mod kernel;
pub mod memory;
pub mod mounts;
pub mod reclaim;

use std::path::PathBuf;
use std::time::Duration;

use keel_config::BrokerConfig;
use serde_json::{json, Value};

use crate::config::{gather, ServeArgs};
use host::Host;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// The same configuration as `keel serve` (--config, --set, --data-dir),
    /// so doctor knows the data dirs and Keel's budgets.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Seconds between the two readings of the reclaim counters (0: skip
    /// sampling, show totals since boot).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub sample_secs: u64,
    /// Read this process's cgroup (the broker's) instead of doctor's own.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Read /proc and /sys (and data dirs) under this directory (tests).
    #[arg(long, hide = true, env = "KEEL_DOCTOR_ROOT", value_name = "DIR")]
    pub root: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Ok,
    Info,
    Warn,
    Error,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Error => "error",
        }
    }
}

/// One thing doctor found.
#[derive(Debug, Clone)]
pub struct Finding {
    pub severity: Severity,
    /// memory, reclaim, kernel or disk.
    pub area: &'static str,
    /// A stable name of the check within its area (`budgets`, `ext4_journal`).
    pub check: &'static str,
    /// What it is about when an area has several (a data dir).
    pub subject: Option<String>,
    /// What was found, with the numbers.
    pub found: String,
    /// What to do; empty when nothing needs doing.
    pub fix: String,
}

impl Finding {
    pub fn new(severity: Severity, area: &'static str, check: &'static str, found: String) -> Finding {
        Finding {
            severity,
            area,
            check,
            subject: None,
            found,
            fix: String::new(),
        }
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = fix.into();
        self
    }

    pub fn subject(mut self, subject: String) -> Finding {
        self.subject = Some(subject);
        self
    }

    fn to_json(&self) -> Value {
        json!({
            "severity": self.severity.name(),
            "area": self.area,
            "check": self.check,
            "subject": self.subject,
            "found": self.found,
            "fix": self.fix,
        })
    }
}

/// Everything doctor found, in area order.
#[derive(Debug)]
pub struct Report {
    pub pid: u32,
    pub whose_cgroup: String,
    pub sample_secs: u64,
    pub findings: Vec<Finding>,
}

/// Runs every check against `host`. `sleep` waits between the two reclaim
/// snapshots (tests pass one that does not).
pub fn diagnose(
    host: &Host,
    config: &BrokerConfig,
    sample_secs: u64,
    sleep: impl FnOnce(Duration),
) -> Report {
    let mountinfo = host.read(host.proc_pid("mountinfo")).unwrap_or_default();
    let mounts = mounts::parse_mountinfo(&mountinfo);
    let cgroup = memory::read_cgroup(host, &mounts);
    let mut findings = memory::findings(host, &cgroup, config);
    let before = reclaim::snapshot(host, &cgroup);
    let mut direct_reclaim_seen = false;
    if sample_secs > 0 {
        sleep(Duration::from_secs(sample_secs));
        let after = reclaim::snapshot(host, &cgroup);
        let sampled = reclaim::sampled_findings(
            &before,
            &after,
            sample_secs,
            &cgroup,
            &kernel::min_free_hint(host),
        );
        direct_reclaim_seen = sampled
            .iter()
            .any(|f| f.check == "direct_reclaim" && f.severity == Severity::Warn);
        findings.extend(sampled);
    }
    findings.extend(reclaim::standing_findings(
        host,
        &mounts,
        &before,
        &cgroup,
        sample_secs,
    ));
    findings.extend(kernel::findings(host, &cgroup, direct_reclaim_seen));
    if mounts.is_empty() {
        findings.push(Finding::new(
            Severity::Info,
            "disk",
            "mount",
            format!(
                "{} is not readable: mounts unknown",
                host.proc_pid("mountinfo").display()
            ),
        ));
    }
    findings.extend(disks::findings(host, &mounts, config));
    let pid = host.pid.unwrap_or_else(std::process::id);
    Report {
        pid,
        whose_cgroup: match host.pid {
            Some(p) => format!("process {p} (--pid)"),
            None => format!("keel doctor itself (pid {pid}): run it in the broker's cgroup or pass --pid"),
        },
        sample_secs,
        findings,
    }
}

impl Report {
    pub fn to_json(&self) -> Value {
        let count = |s: Severity| self.findings.iter().filter(|f| f.severity == s).count();
        json!({
            "cgroup_of": self.whose_cgroup,
            "pid": self.pid,
            "sample_secs": self.sample_secs,
            "counts": {
                "ok": count(Severity::Ok),
                "info": count(Severity::Info),
                "warn": count(Severity::Warn),
                "error": count(Severity::Error),
            },
            "findings": self.findings.iter().map(Finding::to_json).collect::<Vec<_>>(),
        })
    }

    /// A human listing: one block per finding, fixes indented below.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "keel doctor: cgroup of {}; reclaim sampled over {} s\n\n",
            self.whose_cgroup, self.sample_secs
        );
        let mut area = "";
        for f in &self.findings {
            if f.area != area {
                area = f.area;
                out.push_str(&format!("== {area}\n"));
            }
            let subject = f.subject.as_ref().map(|s| format!(" [{s}]")).unwrap_or_default();
            out.push_str(&format!(
                "{:<5} {}{subject}: {}\n",
                f.severity.name(),
                f.check,
                f.found
            ));
            if !f.fix.is_empty() {
                out.push_str(&format!("      fix: {}\n", f.fix));
            }
        }
        let worst = self
            .findings
            .iter()
            .map(|f| f.severity)
            .max()
            .unwrap_or(Severity::Ok);
        let count = |s: Severity| self.findings.iter().filter(|f| f.severity == s).count();
        out.push_str(&format!(
            "\n{} error, {} warn, {} info, {} ok (worst: {})\n",
            count(Severity::Error),
            count(Severity::Warn),
            count(Severity::Info),
            count(Severity::Ok),
            worst.name()
        ));
        out
    }
}

/// `keel doctor`. Errors only when it cannot run (bad configuration or
/// root); findings of any severity still exit 0.
pub fn run(args: &DoctorArgs) -> Result<(), String> {
    let map = gather(&args.serve)?;
    let config = BrokerConfig::from_map(&map).map_err(|e| e.to_string())?;
    let host = match &args.root {
        Some(root) => Host {
            root: root
                .canonicalize()
                .map_err(|e| format!("--root {}: {e}", root.display()))?,
            pid: args.pid,
        },
        None => Host {
            pid: args.pid,
            ..Host::real()
        },
    };
    if let Some(pid) = args.pid {
        if !host.path(format!("/proc/{pid}")).is_dir() {
            return Err(format!("--pid {pid}: no such process"));
        }
    }
    let report = diagnose(&host, &config, args.sample_secs, std::thread::sleep);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json()).unwrap_or_default()
        );
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;

    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(entry.path()).unwrap(), &target).unwrap();
            } else if kind.is_dir() {
                copy_tree(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }

    /// A writable copy of a fixture host.
    fn fixture_host(name: &str) -> (tempfile::TempDir, Host) {
        let tmp = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/doctor")
            .join(name);
        copy_tree(&src, tmp.path());
        let host = Host {
            root: tmp.path().canonicalize().unwrap(),
            pid: None,
        };
        (tmp, host)
    }

    fn config() -> BrokerConfig {
        let mut map = BTreeMap::new();
        map.insert("log.dirs".to_string(), "/data/xfs/keel".to_string());
        BrokerConfig::from_map(&map).unwrap()
    }

    /// Adds `by` to counter `key` of a `key value` file under the root.
    fn bump(host: &Host, file: &str, key: &str, by: u64) {
        let path = host.path(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let out: String = text
            .lines()
            .map(|l| match l.split_once(' ') {
                Some((k, v)) if k == key => format!("{k} {}\n", v.parse::<u64>().unwrap() + by),
                _ => format!("{l}\n"),
            })
            .collect();
        assert_ne!(out, text, "{key} not in {file}");
        std::fs::write(path, out).unwrap();
    }

    fn get<'a>(report: &'a Report, area: &str, check: &str) -> &'a Finding {
        let found: Vec<_> = report
            .findings
            .iter()
            .filter(|f| f.area == area && f.check == check)
            .collect();
        assert_eq!(found.len(), 1, "{area}/{check}: {found:#?}");
        found[0]
    }

    const CGROUP: &str = "/sys/fs/cgroup/system.slice/keel.service";

    #[test]
    fn counters_are_read_before_and_after_the_sample() {
        let (_tmp, host) = fixture_host("v2");
        let mut slept = None;
        let report = diagnose(&host, &config(), 5, |d| {
            slept = Some(d);
            bump(&host, "/proc/vmstat", "pgscan_direct", 50);
            bump(&host, "/proc/vmstat", "allocstall_normal", 3);
            bump(&host, "/proc/vmstat", "nr_vmscan_write", 20);
            bump(&host, &format!("{CGROUP}/memory.events"), "high", 5);
        });
        assert_eq!(slept, Some(Duration::from_secs(5)));
        let direct = get(&report, "reclaim", "direct_reclaim");
        assert_eq!(direct.severity, Severity::Warn);
        assert!(
            direct.found.contains("pgscan_direct +50") && direct.found.contains("allocstall +3"),
            "{}",
            direct.found
        );
        assert!(direct.fix.contains("vm.min_free_kbytes=167772"), "{}", direct.fix);
        let written = get(&report, "reclaim", "vmscan_writeback");
        assert_eq!(written.severity, Severity::Warn);
        assert!(written.found.contains("nr_vmscan_write +20"));
        let cgroup = get(&report, "reclaim", "cgroup");
        assert_eq!(cgroup.severity, Severity::Warn);
        assert!(
            cgroup.found.contains("high +5") && cgroup.fix.contains("memory.high"),
            "{cgroup:?}"
        );
        // Direct reclaim seen makes the watermark a warning too.
        assert_eq!(get(&report, "kernel", "min_free_kbytes").severity, Severity::Warn);
    }

    #[test]
    fn an_unchanged_sample_is_ok() {
        let (_tmp, host) = fixture_host("v2");
        let report = diagnose(&host, &config(), 1, |_| {});
        assert_eq!(get(&report, "reclaim", "direct_reclaim").severity, Severity::Ok);
        assert_eq!(get(&report, "reclaim", "vmscan_writeback").severity, Severity::Ok);
        assert_eq!(get(&report, "reclaim", "cgroup").severity, Severity::Ok);
        assert_eq!(get(&report, "kernel", "min_free_kbytes").severity, Severity::Info);
        assert!(report.findings.iter().all(|f| f.check != "sample"));
    }

    #[test]
    fn v1_reclaim_evidence_is_failcnt() {
        let (_tmp, host) = fixture_host("v1");
        let report = diagnose(&host, &config(), 2, |_| {
            std::fs::write(host.path("/sys/fs/cgroup/memory/keel/memory.failcnt"), "20\n").unwrap();
        });
        let cgroup = get(&report, "reclaim", "cgroup");
        assert_eq!(cgroup.severity, Severity::Warn);
        assert!(
            cgroup.found.contains("failcnt +3") && cgroup.found.contains("no pgscan"),
            "{}",
            cgroup.found
        );
    }

    #[test]
    fn only_reclaim_writing_pages_itself_is_vmscan_writeback() {
        let (_tmp, host) = fixture_host("v2");
        let report = diagnose(&host, &config(), 1, |_| {
            bump(&host, "/proc/vmstat", "nr_vmscan_immediate_reclaim", 900);
        });
        let f = get(&report, "reclaim", "vmscan_writeback");
        assert_eq!(f.severity, Severity::Info, "{f:?}");
        assert!(f.found.contains("nr_vmscan_immediate_reclaim +900"));
    }

    #[test]
    fn oom_kills_during_the_sample_are_errors() {
        let (_tmp, host) = fixture_host("v2");
        let mounts = mounts::parse_mountinfo(&host.read("/proc/self/mountinfo").unwrap());
        let cgroup = memory::read_cgroup(&host, &mounts);
        let before = reclaim::snapshot(&host, &cgroup);
        let mut after = before.clone();
        after.cgroup_events.insert("oom_kill".into(), 1);
        let found = reclaim::sampled_findings(&before, &after, 3, &cgroup, "");
        let f = found.iter().find(|f| f.check == "cgroup").unwrap();
        assert_eq!(f.severity, Severity::Error);
    }

    #[test]
    fn the_root_cgroup_has_no_limits() {
        let (_tmp, host) = fixture_host("v2");
        std::fs::write(host.path("/proc/self/cgroup"), "0::/\n").unwrap();
        std::fs::write(host.path("/sys/fs/cgroup/memory.stat"), "anon 1\nfile 2\n").unwrap();
        let report = diagnose(&host, &config(), 0, |_| {});
        let cgroup = get(&report, "memory", "cgroup");
        assert!(
            cgroup
                .found
                .contains("cgroup v2 /sys/fs/cgroup: memory.max max, memory.high max"),
            "{}",
            cgroup.found
        );
        assert!(get(&report, "memory", "budgets")
            .found
            .contains("from host memory"));
    }

    #[test]
    fn pid_reads_another_process_cgroup() {
        let (_tmp, mut host) = fixture_host("v2");
        std::fs::create_dir_all(host.path("/proc/4242")).unwrap();
        std::fs::write(host.path("/proc/4242/cgroup"), "0::/system.slice\n").unwrap();
        host.pid = Some(4242);
        let report = diagnose(&host, &config(), 0, |_| {});
        let cgroup = get(&report, "memory", "cgroup");
        assert!(
            cgroup.found.contains("cgroup v2 /sys/fs/cgroup/system.slice:"),
            "{}",
            cgroup.found
        );
        assert!(cgroup.found.contains("process 4242"));
        assert!(report.whose_cgroup.contains("4242"));
    }
}
