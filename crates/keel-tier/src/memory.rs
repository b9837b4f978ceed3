//! How much memory the broker may use: the tightest of the host's memory
//! and the limits of the memory cgroup it runs in (v1 `memory.limit_in_bytes`;
//! v2 `memory.max` and `memory.high`). Hosts without cgroups, or with
//! unreadable files, fall back to the host's memory.

use std::path::{Path, PathBuf};

/// The memory limit and where it came from (for the start-up log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    pub limit_bytes: u64,
    pub source: String,
}

/// Share of the limit given to the tail cache by default. The rest is for
/// request buffers, fetch responses being written, indexes and the
/// allocator's slack.
pub const TAIL_CACHE_SHARE_PERCENT: u64 = 25;

impl MemoryLimit {
    /// Reads the limit of this process.
    pub fn detect() -> MemoryLimit {
        let host = read_meminfo_total(Path::new("/proc/meminfo"));
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|text| cgroup_limit(&text, Path::new("/sys/fs/cgroup")));
        choose(host, cgroup)
    }

    /// The default `keel.tail.cache.bytes`.
    pub fn default_tail_cache_bytes(&self) -> u64 {
        self.limit_bytes / 100 * TAIL_CACHE_SHARE_PERCENT
    }

    /// The scan buffer: 4% of the limit, at most
    /// [`crate::scan::SCAN_BUFFER_BYTES`].
    pub fn scan_buffer_bytes(&self) -> u64 {
        (self.limit_bytes / 25).min(crate::scan::SCAN_BUFFER_BYTES)
    }
}

fn choose(host: Option<u64>, cgroup: Option<(u64, String)>) -> MemoryLimit {
    let host_limit = MemoryLimit {
        limit_bytes: host.unwrap_or(1 << 30),
        source: if host.is_some() {
            "host memory (/proc/meminfo)".into()
        } else {
            "an assumed 1 GiB (no /proc/meminfo)".into()
        },
    };
    match cgroup {
        Some((bytes, source)) if bytes < host_limit.limit_bytes => MemoryLimit {
            limit_bytes: bytes,
            source,
        },
        _ => host_limit,
    }
}

fn read_meminfo_total(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The tightest memory limit of the process's cgroup, from the contents of
/// `/proc/self/cgroup` and the cgroup filesystem root.
fn cgroup_limit(proc_cgroup: &str, root: &Path) -> Option<(u64, String)> {
    let mut found: Vec<(u64, String)> = Vec::new();
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2: the unified hierarchy.
            for file in ["memory.max", "memory.high"] {
                let p = root.join(rel).join(file);
                if let Some(v) = read_limit(&p) {
                    found.push((v, format!("cgroup v2 {}", p.display())));
                }
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let p: PathBuf = root.join("memory").join(rel).join("memory.limit_in_bytes");
            if let Some(v) = read_limit(&p) {
                found.push((v, format!("cgroup v1 {}", p.display())));
            }
        }
    }
    found.into_iter().min_by_key(|(v, _)| *v)
}

/// A limit file's value; `max` and v1's "unlimited" sentinel (close to
/// i64::MAX, page-aligned) count as no limit.
fn read_limit(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: u64 = text.trim().parse().ok()?;
    (v < (1u64 << 60)).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn cgroup_v2_takes_the_lower_of_max_and_high() {
        let dir = std::env::temp_dir().join(format!("keel-cg2-{}", std::process::id()));
        write(&dir, "app/memory.max", "2147483648\n");
        write(&dir, "app/memory.high", "1073741824\n");
        let (v, source) = cgroup_limit("0::/app\n", &dir).unwrap();
        assert_eq!(v, 1 << 30);
        assert!(source.contains("memory.high"));
        write(&dir, "app/memory.high", "max\n");
        assert_eq!(cgroup_limit("0::/app\n", &dir).unwrap().0, 2 << 30);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cgroup_v1_memory_controller_and_unlimited() {
        let dir = std::env::temp_dir().join(format!("keel-cg1-{}", std::process::id()));
        write(&dir, "memory/lab/memory.limit_in_bytes", "1610612736\n");
        let text = "12:cpu,cpuacct:/lab\n11:memory:/lab\n";
        assert_eq!(cgroup_limit(text, &dir).unwrap().0, 1536 << 20);
        write(&dir, "memory/lab/memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(cgroup_limit(text, &dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_tighter_limit_wins() {
        let l = choose(Some(24 << 30), Some((1 << 30, "cgroup".into())));
        assert_eq!(l.limit_bytes, 1 << 30);
        assert_eq!(l.default_tail_cache_bytes(), (1u64 << 30) / 100 * 25);
        assert_eq!(l.scan_buffer_bytes(), (1u64 << 30) / 25);
        let l = choose(Some(4 << 30), Some((8 << 30, "cgroup".into())));
        assert_eq!(l.limit_bytes, 4 << 30);
        assert!(MemoryLimit::detect().limit_bytes > 0);
    }
}
