//! Kernel settings that shape writeback and reclaim: the `vm.dirty_*`
//! thresholds, `vm.min_free_kbytes`, `vm.swappiness` and transparent huge
//! pages; and the preemption model, which decides how long a waking thread
//! waits behind another's system call.

use std::io::Read;

use super::host::{human, selected, Host};
use super::memory::Cgroup;
use super::{Finding, Severity};

const AREA: &str = "kernel";

fn vm(host: &Host, name: &str) -> Option<u64> {
    host.read_u64(format!("/proc/sys/vm/{name}"))
}

/// A `vm.min_free_kbytes` to suggest: 1% of host memory, never less than
/// the current value.
pub fn min_free_hint(host: &Host) -> String {
    let current = vm(host, "min_free_kbytes").unwrap_or(0);
    match host.meminfo_bytes("MemTotal") {
        Some(total) => {
            let kib = (total / 1024 / 100).max(current);
            format!("e.g. sysctl -w vm.min_free_kbytes={kib}, 1% of host memory; the right value is workload-specific, raise it stepwise while allocstall stays above 0")
        }
        None => "raise it stepwise while allocstall stays above 0".into(),
    }
}

pub fn findings(host: &Host, cgroup: &Cgroup, direct_reclaim_seen: bool) -> Vec<Finding> {
    let mut out = Vec::new();
    out.push(dirty_finding(host, cgroup));
    out.extend(min_free_finding(host, direct_reclaim_seen));
    out.extend(swappiness_finding(host));
    out.extend(thp_findings(host));
    out.push(preemption_finding(host));
    out
}

/// The thresholds in bytes: `*_bytes` when set, else the ratio of host
/// memory (the kernel takes the ratio of dirtyable memory, a bit less).
fn dirty_finding(host: &Host, cgroup: &Cgroup) -> Finding {
    let total = host.meminfo_bytes("MemTotal").unwrap_or(0);
    let threshold = |bytes: &str, ratio: &str| -> Option<(u64, String)> {
        match (vm(host, bytes), vm(host, ratio)) {
            (Some(b), _) if b > 0 => Some((b, format!("vm.{bytes}={b}"))),
            (_, Some(r)) => Some((total / 100 * r, format!("vm.{ratio}={r}"))),
            _ => None,
        }
    };
    let (Some((background, bg_name)), Some((foreground, fg_name))) = (
        threshold("dirty_background_bytes", "dirty_background_ratio"),
        threshold("dirty_bytes", "dirty_ratio"),
    ) else {
        return Finding::new(
            Severity::Info,
            AREA,
            "dirty",
            "/proc/sys/vm/dirty_* are not readable".into(),
        );
    };
    let expire = vm(host, "dirty_expire_centisecs");
    let interval = vm(host, "dirty_writeback_centisecs");
    let show = |v: Option<u64>| v.map_or("?".into(), |v| v.to_string());
    let found = format!(
        "{bg_name} (background writeback from ~{}), {fg_name} (writers throttled from ~{}), \
         vm.dirty_expire_centisecs={}, vm.dirty_writeback_centisecs={}",
        human(background),
        human(foreground),
        show(expire),
        show(interval)
    );
    if interval == Some(0) {
        return Finding::new(
            Severity::Warn,
            AREA,
            "dirty",
            format!("{found}: periodic writeback is off, dirty pages wait for the thresholds or for reclaim"),
        )
        .fix("sysctl -w vm.dirty_writeback_centisecs=500");
    }
    if let (Cgroup::V1(v1), Some(limit)) = (cgroup, cgroup.limit().map(|(v, _)| v)) {
        if background > limit / 10 {
            let suggest = limit / 10;
            return Finding::new(
                Severity::Warn,
                AREA,
                "dirty",
                format!(
                    "{found}: with cgroup v1 these thresholds are host-wide, and background \
                     writeback starts only above {} of dirty data while the cgroup ({}) may hold \
                     {}: its page cache fills with dirty pages that reclaim writes back itself \
                     (vmscan writeback)",
                    human(background),
                    v1.dir.display(),
                    human(limit)
                ),
            )
            .fix(format!(
                "sysctl -w vm.dirty_background_bytes={suggest} (a tenth of the cgroup's limit)"
            ));
        }
    }
    Finding::new(
        Severity::Info,
        AREA,
        "dirty",
        format!(
            "{found}. Dirty-page tuning shapes ordinary writeback; it does not stop reclaim-driven \
             (vmscan) writeback under a cgroup limit, which is what memory.high and \
             vm.min_free_kbytes govern"
        ),
    )
}

fn min_free_finding(host: &Host, direct_reclaim_seen: bool) -> Option<Finding> {
    let kib = vm(host, "min_free_kbytes")?;
    let share = host
        .meminfo_bytes("MemTotal")
        .map(|t| {
            format!(
                " ({:.2}% of host memory)",
                (kib * 1024) as f64 * 100.0 / t.max(1) as f64
            )
        })
        .unwrap_or_default();
    let found =
        format!("vm.min_free_kbytes={kib}{share}: kswapd wakes when free memory falls near this watermark");
    Some(if direct_reclaim_seen {
        Finding::new(
            Severity::Warn,
            AREA,
            "min_free_kbytes",
            format!("{found}; direct reclaim was seen during the sample, so kswapd starts too late"),
        )
        .fix(min_free_hint(host))
    } else {
        Finding::new(Severity::Info, AREA, "min_free_kbytes", found)
    })
}

fn swappiness_finding(host: &Host) -> Option<Finding> {
    let swappiness = vm(host, "swappiness")?;
    let swap = host.meminfo_bytes("SwapTotal").unwrap_or(0);
    Some(if swap > 0 && swappiness > 10 {
        Finding::new(
            Severity::Warn,
            AREA,
            "swappiness",
            format!(
                "swap is on ({}) with vm.swappiness={swappiness}: under pressure the kernel may swap \
                 out the tail cache (anonymous memory) rather than drop page cache, turning tail \
                 reads into disk reads",
                human(swap)
            ),
        )
        .fix("sysctl -w vm.swappiness=1 (persist in /etc/sysctl.d/)")
    } else {
        Finding::new(
            Severity::Ok,
            AREA,
            "swappiness",
            format!(
                "vm.swappiness={swappiness}, swap {}",
                if swap > 0 { human(swap) } else { "off".into() }
            ),
        )
    })
}

fn thp_findings(host: &Host) -> Vec<Finding> {
    let dir = "/sys/kernel/mm/transparent_hugepage";
    let read = |f: &str| host.read(format!("{dir}/{f}")).ok();
    let (Some(enabled), Some(defrag)) = (read("enabled"), read("defrag")) else {
        return vec![Finding::new(
            Severity::Info,
            AREA,
            "thp",
            format!("{dir} is not readable: transparent huge pages unknown (or not built in)"),
        )];
    };
    let mut out = Vec::new();
    match selected(&enabled, '[', ']') {
        Some("always") => out.push(
            Finding::new(
                Severity::Warn,
                AREA,
                "thp_enabled",
                "transparent_hugepage/enabled=always: every large anonymous mapping, the tail \
                 cache's included, is backed by 2 MiB pages; khugepaged collapses and compaction \
                 add latency spikes and memory use grows in 2 MiB steps"
                    .into(),
            )
            .fix(format!(
                "echo madvise > {dir}/enabled (persist with transparent_hugepage=madvise on the kernel command line)"
            )),
        ),
        Some(mode) => out.push(Finding::new(
            Severity::Ok,
            AREA,
            "thp_enabled",
            format!("transparent_hugepage/enabled={mode}"),
        )),
        None => {}
    }
    match selected(&defrag, '[', ']') {
        Some("always") => out.push(
            Finding::new(
                Severity::Warn,
                AREA,
                "thp_defrag",
                "transparent_hugepage/defrag=always: an allocation that finds no free huge page \
                 stalls in direct compaction"
                    .into(),
            )
            .fix(format!("echo defer+madvise > {dir}/defrag")),
        ),
        Some(mode) => out.push(Finding::new(
            Severity::Ok,
            AREA,
            "thp_defrag",
            format!("transparent_hugepage/defrag={mode}"),
        )),
        None => {}
    }
    out
}

/// The kernel's preemption model (`none`, `voluntary`, `full`, `lazy`,
/// `rt`) and where it was read: the scheduler's debugfs file where it is
/// readable (root, debugfs mounted); else a `PREEMPT_DYNAMIC` kernel's
/// `preempt=` boot parameter; else the build's configuration
/// (`/boot/config-RELEASE` or `/proc/config.gz`); else what `uname -v`
/// says of a kernel built with one model.
fn preemption_model(host: &Host) -> Option<(String, String)> {
    let debugfs = "/sys/kernel/debug/sched/preempt";
    if let Some(model) = host
        .read(debugfs)
        .ok()
        .and_then(|t| selected(&t, '(', ')').map(String::from))
    {
        return Some((model, debugfs.into()));
    }
    let version = host.read("/proc/sys/kernel/version").unwrap_or_default();
    let built = |flag: &str| version.split_whitespace().any(|w| w == flag);
    if built("PREEMPT_RT") {
        return Some(("rt".into(), "uname -v: PREEMPT_RT".into()));
    }
    if built("PREEMPT_DYNAMIC") {
        let cmdline = host.read("/proc/cmdline").unwrap_or_default();
        // The kernel applies the last one; what follows `--` is init's.
        if let Some(model) = cmdline
            .split_whitespace()
            .take_while(|w| *w != "--")
            .filter_map(|w| w.strip_prefix("preempt="))
            .last()
        {
            return Some((model.into(), "preempt= on the kernel command line".into()));
        }
    }
    if let Some((model, file)) = build_config_model(host) {
        let how = if built("PREEMPT_DYNAMIC") {
            format!("{file}: the build's default, unless changed at run time on this PREEMPT_DYNAMIC kernel")
        } else {
            file
        };
        return Some((model.into(), how));
    }
    if built("PREEMPT_LAZY") {
        return Some(("lazy".into(), "uname -v: PREEMPT_LAZY".into()));
    }
    if built("PREEMPT") && !built("PREEMPT_DYNAMIC") {
        return Some(("full".into(), "uname -v: PREEMPT".into()));
    }
    None
}

/// The model a kernel was built with, from its configuration.
fn build_config_model(host: &Host) -> Option<(&'static str, String)> {
    let release = host.read("/proc/sys/kernel/osrelease").unwrap_or_default();
    let boot = format!("/boot/config-{}", release.trim());
    let (text, file) = match host.read(&boot) {
        Ok(text) => (text, boot),
        Err(_) => {
            let gz = std::fs::File::open(host.path("/proc/config.gz")).ok()?;
            let mut text = String::new();
            flate2::read::GzDecoder::new(gz).read_to_string(&mut text).ok()?;
            (text, "/proc/config.gz".to_string())
        }
    };
    let set = |key: &str| text.lines().any(|l| l.trim() == format!("{key}=y"));
    let model = [
        ("CONFIG_PREEMPT_RT", "rt"),
        ("CONFIG_PREEMPT_LAZY", "lazy"),
        ("CONFIG_PREEMPT", "full"),
        ("CONFIG_PREEMPT_VOLUNTARY", "voluntary"),
        ("CONFIG_PREEMPT_NONE", "none"),
    ]
    .into_iter()
    .find(|(key, _)| set(key))?
    .1;
    Some((model, file))
}

fn preemption_finding(host: &Host) -> Finding {
    let Some((model, source)) = preemption_model(host) else {
        return Finding::new(
            Severity::Info,
            AREA,
            "preemption",
            "the kernel's preemption model is unknown (no readable /sys/kernel/debug/sched/preempt, \
             build configuration or uname -v marker)"
                .into(),
        );
    };
    if model != "none" {
        return Finding::new(
            Severity::Ok,
            AREA,
            "preemption",
            format!("kernel preemption model {model} ({source})"),
        );
    }
    Finding::new(
        Severity::Info,
        AREA,
        "preemption",
        format!(
            "kernel preemption model none ({source}): a thread inside a system call keeps its CPU \
             until the call returns, whatever waits. Keel's own bulk threads write at most 256 KiB \
             a call, but a consumer or other process on the broker's CPUs that copies megabytes \
             per read delays the request threads that wake beside it by milliseconds \
             (docs/doctor.md, check `preemption`, has the measurement)"
        ),
    )
    .fix(
        "keep clients and other busy processes off the broker's CPUs (taskset, cpusets); on a \
         PREEMPT_DYNAMIC kernel, preempt=voluntary or preempt=full on the kernel command line lets \
         such a call be preempted",
    )
}
