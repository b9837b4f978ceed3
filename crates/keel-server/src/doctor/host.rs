//! Reading the host: every `/proc` and `/sys` path goes through [`Host`],
//! which puts it under a root directory (`/` on a real host, a fixture tree
//! in tests) and names the process whose cgroup and mounts are read.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct Host {
    /// Where `/proc` and `/sys` are read from (and data dirs looked up).
    pub root: PathBuf,
    /// The process whose `/proc/PID/cgroup` is read; `None`: this one.
    pub pid: Option<u32>,
}

impl Host {
    pub fn real() -> Host {
        Host {
            root: PathBuf::from("/"),
            pid: None,
        }
    }

    /// `abs` (an absolute host path) under the root.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        self.root.join(abs.strip_prefix("/").unwrap_or(abs))
    }

    /// The host path of a path under the root (the inverse of [`Host::path`]).
    pub fn host_path(&self, under_root: &Path) -> PathBuf {
        match under_root.strip_prefix(&self.root) {
            Ok(rel) => Path::new("/").join(rel),
            Err(_) => under_root.to_path_buf(),
        }
    }

    pub fn read(&self, abs: impl AsRef<Path>) -> io::Result<String> {
        std::fs::read_to_string(self.path(abs))
    }

    /// `/proc/self/...` or `/proc/PID/...`.
    pub fn proc_pid(&self, file: &str) -> PathBuf {
        match self.pid {
            Some(pid) => PathBuf::from(format!("/proc/{pid}/{file}")),
            None => PathBuf::from(format!("/proc/self/{file}")),
        }
    }

    /// A one-number file (a sysctl, a cgroup limit); `None` if missing or
    /// not a number (such as `max`).
    pub fn read_u64(&self, abs: impl AsRef<Path>) -> Option<u64> {
        self.read(abs).ok()?.trim().parse().ok()
    }

    /// A `key value` file (`/proc/vmstat`, `memory.stat`, `memory.events`).
    pub fn read_counters(&self, abs: impl AsRef<Path>) -> Option<BTreeMap<String, u64>> {
        self.read(abs).ok().map(|text| parse_counters(&text))
    }

    /// `MemTotal`, `SwapTotal`... of `/proc/meminfo`, in bytes.
    pub fn meminfo_bytes(&self, key: &str) -> Option<u64> {
        let text = self.read("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.split(':').next() == Some(key))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

/// Lines of `name number`; other lines are skipped.
pub fn parse_counters(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.split_whitespace();
            let key = it.next()?;
            let value = it.next()?.parse().ok()?;
            Some((key.to_string(), value))
        })
        .collect()
}

/// The marked choice of a sysfs or debugfs file that lists the choices and
/// marks the one in effect: `[mq-deadline] none` (`open` `[`), or
/// `none voluntary (full) lazy` (`open` `(`).
pub fn selected(text: &str, open: char, close: char) -> Option<&str> {
    let start = text.find(open)? + open.len_utf8();
    let end = start + text[start..].find(close)?;
    Some(&text[start..end])
}

/// Bytes as `1.5 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_go_under_the_root() {
        let host = Host {
            root: PathBuf::from("/tmp/fx"),
            pid: Some(42),
        };
        assert_eq!(host.path("/proc/vmstat"), Path::new("/tmp/fx/proc/vmstat"));
        assert_eq!(host.proc_pid("cgroup"), Path::new("/proc/42/cgroup"));
        assert_eq!(
            host.host_path(Path::new("/tmp/fx/sys/block")),
            Path::new("/sys/block")
        );
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(12), "12 B");
        let c = parse_counters("a 1\nb x\nc 3 4\n\n");
        assert_eq!(c.len(), 2);
        assert_eq!(c["c"], 3);
    }
}
