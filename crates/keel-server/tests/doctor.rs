//! `keel doctor` against fixture hosts (`tests/fixtures/doctor/{v1,v2}`:
//! minimal /proc and /sys trees), run as the binary with `--root`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor")
        .join(name)
}

/// Copies a fixture tree (symlinks as symlinks) so a test can add data
/// dirs or remove parts of it.
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

/// A copy of fixture `name` with the given data dirs created under it.
fn host(name: &str, dirs: &[&str]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&fixture(name), tmp.path());
    for d in dirs {
        std::fs::create_dir_all(tmp.path().join(d.trim_start_matches('/'))).unwrap();
    }
    tmp
}

fn doctor(root: &Path, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("doctor")
        .arg("--root")
        .arg(root)
        .args(["--json", "--sample-secs", "0"])
        .args(args)
        .env_remove("KEEL_TAIL_CACHE_BYTES")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keel doctor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The findings of `area`/`check`, optionally about a subject containing
/// `subject`.
fn find<'a>(report: &'a Value, area: &str, check: &str, subject: Option<&str>) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["area"] == area && f["check"] == check)
        .filter(|f| subject.is_none_or(|s| f["subject"].as_str().is_some_and(|x| x.contains(s))))
        .collect()
}

fn one<'a>(report: &'a Value, area: &str, check: &str, subject: Option<&str>) -> &'a Value {
    let found = find(report, area, check, subject);
    assert_eq!(
        found.len(),
        1,
        "{area}/{check} {subject:?}: {found:#?}\n{report:#}"
    );
    found[0]
}

fn severity(f: &Value) -> &str {
    f["severity"].as_str().unwrap()
}

#[test]
fn v2_budgets_are_checked_against_memory_high_and_max() {
    let root = host("v2", &["data/ext4/keel"]);
    let args = ["--data-dir", "/data/ext4/keel"];
    // Defaults: the tail cache is a quarter of the 1 GiB memory.high.
    let report = doctor(root.path(), &args);
    let cgroup = one(&report, "memory", "cgroup", None);
    assert!(cgroup["found"]
        .as_str()
        .unwrap()
        .contains("cgroup v2 /sys/fs/cgroup/system.slice/keel.service"));
    assert!(
        cgroup["found"].as_str().unwrap().contains("memory.high 1.0 GiB"),
        "{cgroup}"
    );
    assert_eq!(severity(one(&report, "memory", "budgets", None)), "ok");
    let usage = one(&report, "memory", "usage", None);
    assert!(
        usage["found"]
            .as_str()
            .unwrap()
            .contains("page cache 600.0 MiB, anon 300.0 MiB"),
        "{usage}"
    );

    // 1.5 GiB of tail cache: over memory.high, under memory.max.
    let report = doctor(
        root.path(),
        &[&args[..], &["--set", "keel.tail.cache.bytes=1610612736"]].concat(),
    );
    let budgets = one(&report, "memory", "budgets", None);
    assert_eq!(severity(budgets), "warn", "{budgets}");
    assert!(budgets["found"].as_str().unwrap().contains("memory.high"));
    assert!(budgets["fix"].as_str().unwrap().contains("keel.tail.cache.bytes"));

    // 3 GiB: over memory.max, where the kernel OOM-kills.
    let report = doctor(
        root.path(),
        &[&args[..], &["--set", "keel.tail.cache.bytes=3221225472"]].concat(),
    );
    assert_eq!(severity(one(&report, "memory", "budgets", None)), "error");
}

#[test]
fn ext4_data_ordered_without_fast_commit_is_a_warning() {
    let root = host("v2", &["data/ext4/keel", "data/ext4fc/keel", "data/xfs/cold"]);
    let report = doctor(
        root.path(),
        &[
            "--data-dir",
            "/data/ext4/keel",
            "--set",
            "keel.tier.capacity.dirs=/data/xfs/cold",
        ],
    );
    let journal = one(&report, "disk", "ext4_journal", Some("/data/ext4/keel"));
    assert_eq!(severity(journal), "warn", "{journal}");
    let found = journal["found"].as_str().unwrap();
    assert!(
        found.contains("data=ordered") && found.contains("1.3 s"),
        "{found}"
    );
    assert!(journal["fix"]
        .as_str()
        .unwrap()
        .contains("tune2fs -O fast_commit /dev/sdb"));
    // sdb is rotational with no scheduler.
    let sched = one(&report, "disk", "scheduler", Some("/data/ext4/keel"));
    assert_eq!(severity(sched), "warn", "{sched}");
    assert!(sched["fix"]
        .as_str()
        .unwrap()
        .contains("/sys/block/sdb/queue/scheduler"));
    // The capacity dir on XFS: noted, and its partition's disk found.
    let xfs = one(&report, "disk", "filesystem", Some("/data/xfs/cold"));
    assert!(xfs["found"].as_str().unwrap().starts_with("XFS"), "{xfs}");
    assert!(find(&report, "disk", "ext4_journal", Some("/data/xfs/cold")).is_empty());
    let nvme = one(&report, "disk", "scheduler", Some("/data/xfs/cold"));
    assert_eq!(severity(nvme), "ok");
    assert!(
        nvme["found"]
            .as_str()
            .unwrap()
            .starts_with("nvme0n1 (non-rotational)"),
        "{nvme}"
    );

    // The same kind of filesystem with fast commits on: no warning.
    let report = doctor(root.path(), &["--data-dir", "/data/ext4fc/keel"]);
    let journal = one(&report, "disk", "ext4_journal", Some("/data/ext4fc/keel"));
    assert_eq!(severity(journal), "ok", "{journal}");
    assert!(journal["found"].as_str().unwrap().contains("fast_commit on"));
}

#[test]
fn v2_kernel_settings_and_reclaim_history() {
    let root = host("v2", &[]);
    let report = doctor(root.path(), &["--data-dir", "/data/xfs/keel"]);
    let thp = one(&report, "kernel", "thp_enabled", None);
    assert_eq!(severity(thp), "warn");
    assert!(thp["fix"].as_str().unwrap().contains("madvise"));
    assert_eq!(severity(one(&report, "kernel", "thp_defrag", None)), "ok");
    assert_eq!(severity(one(&report, "kernel", "swappiness", None)), "ok");
    let preemption = one(&report, "kernel", "preemption", None);
    assert_eq!(severity(preemption), "ok");
    assert_eq!(
        preemption["found"],
        "kernel preemption model voluntary (/sys/kernel/debug/sched/preempt)"
    );
    // Sampling off: totals only, the cgroup's memory.high history noted.
    assert_eq!(severity(one(&report, "reclaim", "sample", None)), "info");
    assert!(one(&report, "reclaim", "cgroup_history", None)["found"]
        .as_str()
        .unwrap()
        .contains("high 42"));
    assert!(find(&report, "reclaim", "direct_reclaim", None).is_empty());
    let trace = one(&report, "reclaim", "tracepoint", None);
    assert!(
        trace["found"]
            .as_str()
            .unwrap()
            .contains("/sys/kernel/tracing/events/writeback/writeback_start (present)"),
        "{trace}"
    );
    // The directory does not exist under the root: not probed, still placed.
    let direct = one(&report, "disk", "direct_io", Some("/data/xfs/keel"));
    assert!(direct["found"].as_str().unwrap().contains("does not exist yet"));
    assert!(one(&report, "disk", "mount", Some("/data/xfs/keel"))["found"]
        .as_str()
        .unwrap()
        .contains("xfs /dev/nvme0n1p1"));
}

#[test]
fn v1_host() {
    let root = host("v1", &["data/wb/keel", "data/loop/cold"]);
    let report = doctor(
        root.path(),
        &[
            "--data-dir",
            "/data/wb/keel",
            "--set",
            "keel.tier.capacity.dirs=/data/loop/cold",
        ],
    );
    let cgroup = one(&report, "memory", "cgroup", None);
    let found = cgroup["found"].as_str().unwrap();
    assert!(
        found.contains("cgroup v1 memory /sys/fs/cgroup/memory/keel")
            && found.contains("limit_in_bytes 1.5 GiB"),
        "{found}"
    );
    assert!(found.contains("soft_limit_in_bytes unlimited") && !found.contains("hybrid"));
    let usage = one(&report, "memory", "usage", None);
    assert!(
        usage["found"]
            .as_str()
            .unwrap()
            .contains("page cache 1000.0 MiB, anon 300.0 MiB"),
        "{usage}"
    );
    // A quarter of 1.5 GiB and the rest fit under 75% of it.
    assert_eq!(severity(one(&report, "memory", "budgets", None)), "ok");
    // Host-wide dirty thresholds (10% of 64 GiB) above the cgroup's limit.
    let dirty = one(&report, "kernel", "dirty", None);
    assert_eq!(severity(dirty), "warn", "{dirty}");
    assert!(dirty["fix"]
        .as_str()
        .unwrap()
        .contains("vm.dirty_background_bytes=161061273"));
    assert_eq!(severity(one(&report, "kernel", "swappiness", None)), "warn");
    assert_eq!(severity(one(&report, "kernel", "thp_enabled", None)), "ok");
    assert_eq!(severity(one(&report, "kernel", "thp_defrag", None)), "warn");
    // A kernel built with no preemption, read from /boot/config-RELEASE.
    let preemption = one(&report, "kernel", "preemption", None);
    assert_eq!(severity(preemption), "info");
    assert!(
        preemption["found"]
            .as_str()
            .unwrap()
            .starts_with("kernel preemption model none (/boot/config-4.19.0-fixture)"),
        "{preemption}"
    );
    assert!(preemption["fix"]
        .as_str()
        .unwrap()
        .contains("off the broker's CPUs"));
    // data=writeback: no journal warning.
    let journal = one(&report, "disk", "ext4_journal", Some("/data/wb/keel"));
    assert_eq!(severity(journal), "ok", "{journal}");
    assert!(journal["found"].as_str().unwrap().contains("data=writeback"));
    let sched = one(&report, "disk", "scheduler", Some("/data/wb/keel"));
    assert!(sched["found"].as_str().unwrap().contains("I/O scheduler bfq"));
    // The capacity dir on a loop device: its backing file named; the
    // journal finding there is informational (no appends land there).
    let loop_sched = one(&report, "disk", "scheduler", Some("/data/loop/cold"));
    assert!(
        loop_sched["found"]
            .as_str()
            .unwrap()
            .contains("backed by /var/lib/images/keel.img"),
        "{loop_sched}"
    );
    assert_eq!(
        severity(one(&report, "disk", "ext4_journal", Some("/data/loop/cold"))),
        "info"
    );
    let trace = one(&report, "reclaim", "tracepoint", None);
    assert!(trace["found"].as_str().unwrap().contains("not mounted"));
}

#[test]
fn v1_tmpfs_has_no_block_device() {
    let root = host("v1", &["data/tmp/keel"]);
    let report = doctor(root.path(), &["--data-dir", "/data/tmp/keel"]);
    let fs = one(&report, "disk", "filesystem", Some("/data/tmp/keel"));
    assert!(fs["found"].as_str().unwrap().starts_with("tmpfs"));
    assert_eq!(severity(fs), "info");
    let sched = one(&report, "disk", "scheduler", Some("/data/tmp/keel"));
    assert!(
        sched["found"].as_str().unwrap().contains("no block device"),
        "{sched}"
    );
}

#[test]
fn a_container_without_the_cgroup_filesystem_gets_an_info() {
    let root = host("v2", &[]);
    std::fs::remove_dir_all(root.path().join("sys/fs/cgroup")).unwrap();
    let report = doctor(root.path(), &["--data-dir", "/data/xfs/keel"]);
    let cgroup = one(&report, "memory", "cgroup", None);
    assert_eq!(severity(cgroup), "info");
    assert!(
        cgroup["found"]
            .as_str()
            .unwrap()
            .contains("no memory cgroup readable"),
        "{cgroup}"
    );
    assert!(cgroup["fix"].as_str().unwrap().contains("keel.tail.cache.bytes"));
    // Budgets then measured against host memory (16 GiB).
    assert!(one(&report, "memory", "budgets", None)["found"]
        .as_str()
        .unwrap()
        .contains("16.0 GiB from host memory"));

    // Nothing at all under the root: still a report, never a panic.
    let empty = tempfile::tempdir().unwrap();
    let report = doctor(empty.path(), &["--data-dir", "/data"]);
    assert!(one(&report, "memory", "cgroup", None)["found"]
        .as_str()
        .unwrap()
        .contains("not readable"));
    assert!(!find(&report, "disk", "mount", None).is_empty());
    assert!(!find(&report, "kernel", "thp", None).is_empty());
}

#[test]
fn bad_configuration_is_the_only_failure() {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["doctor", "--sample-secs", "0", "--set", "no.such.key=1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no.such.key"));
}

/// A PREEMPT_DYNAMIC kernel whose scheduler debugfs file is not readable
/// (not root, or debugfs not mounted): `preempt=` on the command line, else
/// the default its build configuration names (`/proc/config.gz`).
#[test]
fn the_preemption_model_of_a_dynamic_kernel_without_debugfs() {
    use std::io::Write;
    let root = host("v2", &[]);
    std::fs::remove_file(root.path().join("sys/kernel/debug/sched/preempt")).unwrap();
    let cmdline = root.path().join("proc/cmdline");
    // The kernel applies the last preempt=.
    std::fs::write(
        &cmdline,
        "BOOT_IMAGE=/boot/vmlinuz ro preempt=none preempt=full quiet -- preempt=lazy\n",
    )
    .unwrap();
    let report = doctor(root.path(), &[]);
    assert_eq!(
        one(&report, "kernel", "preemption", None)["found"],
        "kernel preemption model full (preempt= on the kernel command line)"
    );
    // No preempt=, no build configuration: unknown, said so.
    std::fs::write(&cmdline, "BOOT_IMAGE=/boot/vmlinuz ro quiet\n").unwrap();
    let report = doctor(root.path(), &[]);
    let unknown = one(&report, "kernel", "preemption", None);
    assert_eq!(severity(unknown), "info");
    assert!(
        unknown["found"].as_str().unwrap().contains("unknown"),
        "{unknown}"
    );
    // The build's default, from /proc/config.gz.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"CONFIG_PREEMPT_BUILD=y\nCONFIG_PREEMPT_NONE=y\n# CONFIG_PREEMPT is not set\nCONFIG_PREEMPT_DYNAMIC=y\n")
        .unwrap();
    std::fs::write(root.path().join("proc/config.gz"), gz.finish().unwrap()).unwrap();
    let report = doctor(root.path(), &[]);
    let none = one(&report, "kernel", "preemption", None);
    assert_eq!(severity(none), "info");
    assert!(
        none["found"]
            .as_str()
            .unwrap()
            .starts_with("kernel preemption model none (/proc/config.gz: the build's default, unless changed at run time on this PREEMPT_DYNAMIC kernel)"),
        "{none}"
    );
}
