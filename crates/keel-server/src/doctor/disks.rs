//! Each data directory: the mount and filesystem it is on, journaling,
//! O_DIRECT, the block device's I/O scheduler, and free space against the
//! sizes the configuration lets the directory grow to.

use std::path::{Path, PathBuf};

use keel_config::BrokerConfig;

use super::host::{human, selected, Host};
use super::mounts::{lexical_absolute, mount_of, Mount};
use super::{Finding, Severity};

const AREA: &str = "disk";

/// What a directory is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `log.dirs`: the fast tier, where every append lands.
    Log,
    /// `keel.tier.capacity.dirs`: copies written by the mover.
    Capacity,
}

impl Role {
    fn key(self) -> &'static str {
        match self {
            Role::Log => "log.dirs",
            Role::Capacity => "keel.tier.capacity.dirs",
        }
    }
}

/// A data directory as found on the host.
struct Dir {
    role: Role,
    /// As configured.
    configured: PathBuf,
    /// Absolute, symlinks resolved as far as the path exists (host path).
    resolved: PathBuf,
    /// The nearest existing directory at or above it (path under the root).
    existing: PathBuf,
    exists: bool,
}

fn resolve(host: &Host, role: Role, configured: &Path) -> Dir {
    let under_root = host.path(lexical_absolute(configured));
    let mut existing = under_root.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name().map(|n| n.to_os_string()), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let canonical = existing.canonicalize().unwrap_or_else(|_| existing.clone());
    let mut resolved = host.host_path(&canonical);
    for name in rest.iter().rev() {
        resolved.push(name);
    }
    Dir {
        role,
        configured: configured.to_path_buf(),
        resolved,
        exists: rest.is_empty(),
        existing: canonical,
    }
}

pub fn findings(host: &Host, mounts: &[Mount], config: &BrokerConfig) -> Vec<Finding> {
    let mut dirs = vec![resolve(host, Role::Log, &config.data_dir())];
    for d in config.capacity_dirs() {
        dirs.push(resolve(host, Role::Capacity, &d));
    }
    let mut out = Vec::new();
    for dir in &dirs {
        let subject = format!("{} ({})", dir.configured.display(), dir.role.key());
        let mut found = Vec::new();
        match mount_of(mounts, &dir.resolved) {
            Some(mount) => {
                found.push(mount_finding(dir, mount));
                found.extend(filesystem_finding(host, dir, mount));
                found.push(scheduler_finding(host, mount));
            }
            None => found.push(Finding::new(
                Severity::Info,
                AREA,
                "mount",
                format!("no mount in mountinfo holds {}", dir.resolved.display()),
            )),
        }
        found.push(direct_io_finding(dir, config));
        found.extend(space_findings(dir, config));
        out.extend(found.into_iter().map(|f| f.subject(subject.clone())));
    }
    out
}

fn mount_finding(dir: &Dir, mount: &Mount) -> Finding {
    let state = if dir.exists {
        ""
    } else {
        " (does not exist yet: `keel serve` creates it)"
    };
    Finding::new(
        Severity::Info,
        AREA,
        "mount",
        format!(
            "{}{state} is on {} {} mounted at {} (dev {}:{}; options {}; super options {})",
            dir.resolved.display(),
            mount.fstype,
            mount.source,
            mount.mount_point.display(),
            mount.major,
            mount.minor,
            mount.options,
            mount.super_options
        ),
    )
}

fn filesystem_finding(host: &Host, dir: &Dir, mount: &Mount) -> Option<Finding> {
    let f = |sev, text: String| Some(Finding::new(sev, AREA, "filesystem", text));
    match mount.fstype.as_str() {
        "ext4" | "ext3" => Some(ext4_finding(host, dir, mount)),
        "xfs" => f(
            Severity::Ok,
            "XFS: appends are not held behind full journal commits the way ext4's data=ordered \
             holds them; it is where the measured ext4 write stalls went away"
                .into(),
        ),
        "tmpfs" | "ramfs" => f(
            Severity::Info,
            format!(
                "{}: segments live in RAM, count against the memory cgroup (as shmem) and are lost \
                 at reboot; fine for tests, not for data that must survive",
                mount.fstype
            ),
        ),
        "overlay" => f(Severity::Warn, "overlay: the container's writable layer, slow and lost with the container".into())
            .map(|x| x.fix("mount a volume (a host directory or a persistent volume) at the data dir")),
        "nfs" | "nfs4" | "cifs" | "smb3" | "fuse" | "fuse.sshfs" => f(
            Severity::Warn,
            format!("{}: a network or user-space filesystem; fsync and rename semantics and latency are not a local disk's", mount.fstype),
        )
        .map(|x| x.fix("put the data dir on a local disk (XFS, or ext4 with fast_commit)")),
        "btrfs" => f(
            Severity::Info,
            "btrfs: copy-on-write; appended segments fragment and fsync writes metadata trees".into(),
        ),
        other => f(Severity::Info, format!("filesystem {other}")),
    }
}

/// ext4's journal mode and fast commits. `fast_commit` is a filesystem
/// feature, not a mount option (kernels after 5.10 no longer list it in
/// mountinfo), so it is read from the superblock where readable.
fn ext4_finding(host: &Host, dir: &Dir, mount: &Mount) -> Finding {
    let dev = block_name(host, mount);
    let proc_options = dev
        .as_ref()
        .and_then(|d| host.read(format!("/proc/fs/ext4/{d}/options")).ok())
        .unwrap_or_default();
    let proc_option = |name: &str| {
        proc_options
            .split(|c: char| c == ',' || c.is_whitespace())
            .find_map(|o| o.strip_prefix(&format!("{name}=")).map(str::to_string))
    };
    let data = mount
        .option("data")
        .map(str::to_string)
        .or_else(|| proc_option("data"))
        .unwrap_or_else(|| "ordered".into());
    let journal = has_journal(host, dev.as_deref());
    let fast = fast_commit(host, dev.as_deref(), mount, &proc_options);
    let release = host.read("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    let base = format!(
        "ext4 (data={data}{}), fast_commit {}",
        if mount.option("data").is_some() {
            ""
        } else {
            " by default"
        },
        fast.describe()
    );
    if journal == Some(false) {
        return Finding::new(
            Severity::Info,
            AREA,
            "ext4_journal",
            format!("ext4 without a journal ({}): no journal commits to stall writes; after a crash the filesystem needs fsck (Keel CRC-checks its own segments)", dev.as_deref().unwrap_or("?")),
        );
    }
    let stalls = matches!(data.as_str(), "ordered" | "journal") && !matches!(fast, FastCommit::On(_));
    if !stalls {
        return Finding::new(Severity::Ok, AREA, "ext4_journal", base);
    }
    let severity = if dir.role == Role::Log {
        Severity::Warn
    } else {
        Severity::Info
    };
    let device = mount.source.clone();
    Finding::new(
        severity,
        AREA,
        "ext4_journal",
        format!(
            "{base}: a jbd2 journal commit can hold an appending write() for 100 ms to 1.3 s \
             (measured on a Kafka cluster with data=ordered: produce p99 1 s, p999 3 s; p999 \
             800 ms with data=writeback, 500 ms with fast_commit, and steadier still on XFS). \
             Keel holds only that partition behind the stall, but its producers wait"
        ),
    )
    .fix(format!(
        "enable fast commits: umount, `tune2fs -O fast_commit {device}`, mount (Linux 5.10 or \
         later; this kernel is {release}); or mount with data=writeback (Keel recovers its \
         segments by CRC and does not rely on ordered data); or move the data dir to XFS"
    ))
}

/// The kernel's name of the mount's block device (`sdb1`, `dm-0`), from
/// sysfs, else from the mount source.
fn block_name(host: &Host, mount: &Mount) -> Option<String> {
    if mount.major != 0 {
        let uevent = host.read(format!("/sys/dev/block/{}:{}/uevent", mount.major, mount.minor));
        if let Some(name) = uevent.ok().and_then(|u| {
            u.lines()
                .find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string))
        }) {
            return Some(name);
        }
    }
    mount
        .source
        .strip_prefix("/dev/")
        .map(|s| s.rsplit('/').next().unwrap_or(s).to_string())
}

/// Whether the filesystem has a journal: jbd2 lists each journal in
/// `/proc/fs/jbd2/<dev>-<inode>`. `None` when that cannot be told.
fn has_journal(host: &Host, dev: Option<&str>) -> Option<bool> {
    let dev = dev?;
    let entries = std::fs::read_dir(host.path("/proc/fs/jbd2")).ok()?;
    let prefix = format!("{dev}-");
    Some(
        entries
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().starts_with(&prefix)),
    )
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum FastCommit {
    On(&'static str),
    Off(&'static str),
    Unknown(String),
}

impl FastCommit {
    fn describe(&self) -> String {
        match self {
            FastCommit::On(how) => format!("on ({how})"),
            FastCommit::Off(how) => format!("off ({how})"),
            FastCommit::Unknown(why) => format!("not confirmed ({why})"),
        }
    }
}

const EXT4_SUPER_MAGIC: u16 = 0xEF53;
const EXT4_FEATURE_COMPAT_FAST_COMMIT: u32 = 0x400;

fn fast_commit(host: &Host, dev: Option<&str>, mount: &Mount, proc_options: &str) -> FastCommit {
    if mount.has_option("fast_commit") || proc_options.split(',').any(|o| o.trim() == "fast_commit") {
        return FastCommit::On("listed in the mount options");
    }
    let Some(dev) = dev else {
        return FastCommit::Unknown("no block device name".into());
    };
    // Fast commits that happened prove the feature is on.
    let commits = host
        .read(format!("/proc/fs/ext4/{dev}/fc_info"))
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_suffix(" commits")
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
        });
    if commits.is_some_and(|n| n > 0) {
        return FastCommit::On("fast commits counted in /proc/fs/ext4/*/fc_info");
    }
    match superblock_compat(host, dev) {
        Ok(compat) if compat & EXT4_FEATURE_COMPAT_FAST_COMMIT != 0 => FastCommit::On("superblock feature"),
        Ok(_) => FastCommit::Off("superblock features"),
        Err(e) => FastCommit::Unknown(format!(
            "superblock of /dev/{dev} not readable: {e}; check `dumpe2fs -h /dev/{dev} | grep features`"
        )),
    }
}

/// `s_feature_compat` of the ext4 superblock at byte 1024 of the device.
fn superblock_compat(host: &Host, dev: &str) -> std::io::Result<u32> {
    use std::io::Read;
    let mut block = [0u8; 2048];
    std::fs::File::open(host.path(format!("/dev/{dev}")))?.read_exact(&mut block)?;
    let sb = &block[1024..];
    let magic = u16::from_le_bytes([sb[0x38], sb[0x39]]);
    if magic != EXT4_SUPER_MAGIC {
        return Err(std::io::Error::other("no ext4 superblock magic"));
    }
    Ok(u32::from_le_bytes([sb[0x5C], sb[0x5D], sb[0x5E], sb[0x5F]]))
}

fn scheduler_finding(host: &Host, mount: &Mount) -> Finding {
    let f = |sev, text: String| Finding::new(sev, AREA, "scheduler", text);
    if mount.major == 0 {
        return f(
            Severity::Info,
            format!("{} has no block device of its own (virtual, network or multi-device filesystem): no I/O scheduler applies", mount.fstype),
        );
    }
    let link = host.path(format!("/sys/dev/block/{}:{}", mount.major, mount.minor));
    let Ok(mut disk) = link.canonicalize() else {
        return f(
            Severity::Info,
            format!("{} is not in sysfs: I/O scheduler unknown", link.display()),
        );
    };
    // A partition's queue is its disk's.
    if disk.join("partition").exists() {
        disk.pop();
    }
    let name = disk
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.starts_with("loop") {
        let backing = std::fs::read_to_string(disk.join("loop/backing_file")).unwrap_or_default();
        return f(
            Severity::Info,
            format!(
                "loop device {name}{}: its own queue is a pass-through; the scheduler and limits that matter are those of the disk holding the backing file",
                if backing.trim().is_empty() { String::new() } else { format!(" backed by {}", backing.trim()) }
            ),
        );
    }
    let Ok(text) = std::fs::read_to_string(disk.join("queue/scheduler")) else {
        return f(
            Severity::Info,
            format!("{name} has no queue/scheduler (stacked or virtual device)"),
        );
    };
    let scheduler = selected(&text, '[', ']').unwrap_or(text.trim()).to_string();
    let rotational = std::fs::read_to_string(disk.join("queue/rotational"))
        .map(|r| r.trim() == "1")
        .unwrap_or(false);
    let slaves: Vec<String> = std::fs::read_dir(disk.join("slaves"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let stacked = if slaves.is_empty() {
        String::new()
    } else {
        format!(", on top of {}", slaves.join(", "))
    };
    let kind = if rotational {
        "rotational"
    } else {
        "non-rotational"
    };
    let found = format!("{name} ({kind}{stacked}): I/O scheduler {scheduler}");
    if rotational && scheduler == "none" {
        f(Severity::Warn, format!("{found}: a spinning disk without a scheduler serves a backfill's reads and the appends' writes in arrival order"))
            .fix(format!("echo mq-deadline > /sys/block/{name}/queue/scheduler (or bfq), persisted with a udev rule"))
    } else {
        f(Severity::Ok, found)
    }
}

fn direct_io_finding(dir: &Dir, config: &BrokerConfig) -> Finding {
    let f = |sev, text: String| Finding::new(sev, AREA, "direct_io", text);
    if !dir.exists {
        return f(
            Severity::Info,
            "the directory does not exist yet: O_DIRECT not probed".into(),
        );
    }
    let probe = dir
        .existing
        .join(format!(".keel_doctor_direct_io_probe.{}", std::process::id()));
    match keel_log::probe_direct_io_at(&probe) {
        Ok(()) => f(
            Severity::Ok,
            "O_DIRECT works (a 4 KiB block written, read back with O_DIRECT, removed): reads of history bypass the page cache".into(),
        ),
        Err(e) if dir.role == Role::Log && config.get("keel.io.direct") == "on" => f(
            Severity::Error,
            format!("O_DIRECT does not work here ({e}) and keel.io.direct=on: the broker refuses to start"),
        )
        .fix("set keel.io.direct=auto (reads then use pread + posix_fadvise(DONTNEED)), or use a filesystem with O_DIRECT"),
        Err(e) => f(
            Severity::Info,
            format!("O_DIRECT does not work here ({e}): Keel falls back to pread + posix_fadvise(DONTNEED), so history still leaves the page cache after each read"),
        ),
    }
}

/// Bytes under the directory (its files and its partition directories'
/// files) and how many partition directories (`topic-N`) it holds.
fn usage(dir: &Path) -> (u64, u64) {
    let mut bytes = 0;
    let mut partitions = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    for entry in entries.filter_map(Result::ok) {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() {
            bytes += meta.len();
        } else if meta.is_dir() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_partition = name.rsplit_once('-').is_some_and(|(topic, n)| {
                !topic.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
            });
            partitions += u64::from(is_partition);
            if let Ok(files) = std::fs::read_dir(entry.path()) {
                bytes += files
                    .filter_map(Result::ok)
                    .filter_map(|f| f.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum::<u64>();
            }
        }
    }
    (bytes, partitions)
}

fn space_findings(dir: &Dir, config: &BrokerConfig) -> Vec<Finding> {
    let f = |sev, text: String| Finding::new(sev, AREA, "space", text);
    let stat = match rustix::fs::statvfs(&dir.existing) {
        Ok(s) => s,
        Err(e) => {
            return vec![f(
                Severity::Info,
                format!("statvfs {}: {e}", dir.existing.display()),
            )]
        }
    };
    let total = stat.f_blocks.saturating_mul(stat.f_frsize);
    let avail = stat.f_bavail.saturating_mul(stat.f_frsize);
    let (used, partitions) = if dir.exists { usage(&dir.existing) } else { (0, 0) };
    let found = format!(
        "{} free of {} ({}% free); Keel's files here: {} in {partitions} partition dir(s)",
        human(avail),
        human(total),
        avail.saturating_mul(100) / total.max(1),
        human(used)
    );
    let segment = u64::try_from(config.num("log.segment.bytes")).unwrap_or(0);
    // One verdict for the space check; the budgets are a check of their own.
    let verdict = if dir.role == Role::Log && avail < segment.saturating_mul(2) {
        f(Severity::Error, format!("{found}: less than two segments (log.segment.bytes={segment}) free; a roll or a compaction pass fails with ENOSPC"))
            .fix("free space on the filesystem, or lower log.segment.bytes")
    } else if total > 0 && avail < total / 10 {
        f(Severity::Warn, format!("{found}: under 10% free")).fix(match dir.role {
            Role::Log => "lower log.retention.bytes / retention.ms or keel.tier.fast.max.bytes, or add space",
            Role::Capacity => "lower log.retention.bytes / retention.ms, or add space to the capacity tier",
        })
    } else {
        f(Severity::Ok, found)
    };
    let mut out = vec![verdict];
    if dir.role == Role::Log {
        out.extend(budget_space_findings(config, total, avail, used, partitions));
    }
    out
}

/// The sizes the config lets the fast tier grow to, against the disk.
fn budget_space_findings(
    config: &BrokerConfig,
    total: u64,
    avail: u64,
    used: u64,
    partitions: u64,
) -> Vec<Finding> {
    let f = |sev, text: String| Finding::new(sev, AREA, "space_budget", text);
    let room = avail.saturating_add(used);
    let mut out = Vec::new();
    let fast_max = config.num("keel.tier.fast.max.bytes");
    if let Ok(fast_max) = u64::try_from(fast_max) {
        if fast_max > room {
            out.push(
                f(
                    Severity::Warn,
                    format!(
                        "keel.tier.fast.max.bytes={fast_max} ({}) exceeds what this filesystem can hold for Keel ({} free + {} already Keel's): the disk fills before the fast tier's budget moves segments out",
                        human(fast_max),
                        human(avail),
                        human(used)
                    ),
                )
                .fix(format!("set keel.tier.fast.max.bytes to at most {} (90% of that)", room / 10 * 9)),
            );
        }
    }
    let retention = config.num("log.retention.bytes");
    match u64::try_from(retention) {
        Ok(per_partition) if partitions > 0 => {
            let segment = u64::try_from(config.num("log.segment.bytes")).unwrap_or(0);
            // Retention deletes whole segments, so a partition holds up to
            // one segment more than retention.bytes.
            let most = per_partition.saturating_add(segment).saturating_mul(partitions);
            if most > room && fast_max < 0 {
                out.push(
                    f(
                        Severity::Warn,
                        format!(
                            "log.retention.bytes={per_partition} x {partitions} partitions (+ one segment each) = {} exceeds {} ({} free + {} Keel's) of a {} filesystem",
                            human(most),
                            human(room),
                            human(avail),
                            human(used),
                            human(total)
                        ),
                    )
                    .fix(format!(
                        "lower log.retention.bytes to at most {} per partition, or set keel.tier.fast.max.bytes with a capacity tier",
                        (room / 10 * 9 / partitions).saturating_sub(segment)
                    )),
                );
            }
        }
        Ok(_) => {}
        Err(_) if fast_max < 0 => out.push(f(
            Severity::Info,
            "log.retention.bytes=-1 and keel.tier.fast.max.bytes=-1: only retention.ms bounds how much this directory holds".into(),
        )),
        Err(_) => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(source: &str, super_options: &str) -> Mount {
        Mount {
            major: 0,
            minor: 0,
            root: PathBuf::from("/"),
            mount_point: PathBuf::from("/data"),
            options: "rw".into(),
            fstype: "ext4".into(),
            source: source.into(),
            super_options: super_options.into(),
        }
    }

    /// A device file holding an ext4 superblock with `compat` features.
    fn device(root: &Path, name: &str, compat: u32) {
        let mut block = vec![0u8; 4096];
        block[1024 + 0x38..1024 + 0x3A].copy_from_slice(&EXT4_SUPER_MAGIC.to_le_bytes());
        block[1024 + 0x5C..1024 + 0x60].copy_from_slice(&compat.to_le_bytes());
        std::fs::create_dir_all(root.join("dev")).unwrap();
        std::fs::write(root.join("dev").join(name), block).unwrap();
    }

    #[test]
    fn fast_commit_is_read_from_the_superblock() {
        let tmp = tempfile::tempdir().unwrap();
        let host = Host {
            root: tmp.path().to_path_buf(),
            pid: None,
        };
        let m = mount("/dev/sdx", "rw");
        assert!(matches!(
            fast_commit(&host, Some("sdx"), &m, ""),
            FastCommit::Unknown(_)
        ));
        device(tmp.path(), "sdx", 0x4 | EXT4_FEATURE_COMPAT_FAST_COMMIT);
        assert_eq!(
            fast_commit(&host, Some("sdx"), &m, ""),
            FastCommit::On("superblock feature")
        );
        device(tmp.path(), "sdx", 0x4);
        assert_eq!(
            fast_commit(&host, Some("sdx"), &m, ""),
            FastCommit::Off("superblock features")
        );
        // Kernels that listed it as a mount option.
        let listed = mount("/dev/sdx", "rw,fast_commit");
        assert!(matches!(
            fast_commit(&host, Some("sdx"), &listed, ""),
            FastCommit::On(_)
        ));
        std::fs::write(tmp.path().join("dev/sdx"), [0u8; 2048]).unwrap();
        assert!(matches!(
            fast_commit(&host, Some("sdx"), &m, ""),
            FastCommit::Unknown(_)
        ));
        assert_eq!(block_name(&host, &m).as_deref(), Some("sdx"));
        assert_eq!(
            block_name(&host, &mount("/dev/mapper/vg-data", "")).as_deref(),
            Some("vg-data")
        );
    }
}
