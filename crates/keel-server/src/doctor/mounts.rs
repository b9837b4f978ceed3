//! `/proc/PID/mountinfo`: which mount holds a path, and its options.

use std::path::{Component, Path, PathBuf};

/// One line of mountinfo (see proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub major: u32,
    pub minor: u32,
    /// The directory of the mounted filesystem that appears at `mount_point`
    /// (not `/` for bind mounts and cgroup namespaces).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (`rw,relatime`).
    pub options: String,
    pub fstype: String,
    pub source: String,
    /// Filesystem (superblock) options (`rw,data=ordered`).
    pub super_options: String,
}

impl Mount {
    /// Whether `name` (or `name=...`) is among the mount or super options.
    pub fn has_option(&self, name: &str) -> bool {
        self.option(name).is_some()
    }

    /// The value of `name=value` in the mount or super options; `Some("")`
    /// for a bare `name`.
    pub fn option(&self, name: &str) -> Option<&str> {
        self.options
            .split(',')
            .chain(self.super_options.split(','))
            .find_map(|opt| match opt.split_once('=') {
                Some((k, v)) if k == name => Some(v),
                None if opt == name => Some(""),
                _ => None,
            })
    }
}

/// Mountinfo's text; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let fields: Vec<&str> = left.split(' ').collect();
    if fields.len() < 6 {
        return None;
    }
    let (major, minor) = fields[2].split_once(':')?;
    let mut right = right.split(' ');
    Some(Mount {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        root: PathBuf::from(unescape(fields[3])),
        mount_point: PathBuf::from(unescape(fields[4])),
        options: fields[5].to_string(),
        fstype: right.next()?.to_string(),
        source: unescape(right.next().unwrap_or("")),
        super_options: right.next().unwrap_or("").to_string(),
    })
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let text = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount holding `path` (absolute, already free of symlinks): the
/// longest mount point that is a component-wise prefix of it; of several
/// mounts on the same point, the last (it hides the others).
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    let mut best: Option<&Mount> = None;
    for m in mounts {
        if path.starts_with(&m.mount_point) {
            let deeper =
                best.is_none_or(|b| m.mount_point.components().count() >= b.mount_point.components().count());
            if deeper {
                best = Some(m);
            }
        }
    }
    best
}

/// `path` made absolute and normal without touching the disk (`..` and
/// `.` removed), for paths that do not exist (yet).
pub fn lexical_absolute(path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 27 8:17 / /data rw,noatime - xfs /dev/sdb1 rw,attr2,inode64
51 27 8:33 /keel /srv/my\\040logs rw - ext4 /dev/sdc1 rw,data=writeback
";

    #[test]
    fn longest_prefix_wins_component_wise() {
        let mounts = parse_mountinfo(SAMPLE);
        assert_eq!(mounts.len(), 4);
        assert_eq!(mount_of(&mounts, Path::new("/data/keel")).unwrap().fstype, "xfs");
        // `/database` is not under `/data`.
        assert_eq!(mount_of(&mounts, Path::new("/database")).unwrap().fstype, "ext4");
        let logs = mount_of(&mounts, Path::new("/srv/my logs/a")).unwrap();
        assert_eq!((logs.major, logs.minor), (8, 33));
        assert_eq!(logs.root, Path::new("/keel"));
        assert_eq!(logs.option("data"), Some("writeback"));
        assert!(!logs.has_option("fast_commit"));
        assert_eq!(lexical_absolute(Path::new("/a/./b/../c")), Path::new("/a/c"));
    }
}
