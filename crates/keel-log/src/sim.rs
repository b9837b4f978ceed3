//! [`SimStorage`]: an in-memory filesystem that remembers what was made
//! durable, so a test can cut the power at any point and open what is
//! left, as a machine would find it after a power loss.
//!
//! The model is strict POSIX, stricter than ext4 or XFS in practice:
//! * a file's bytes are durable once it is fsynced; after a power loss, a
//!   file keeps its fsynced bytes plus an arbitrary prefix of what was
//!   appended after them (often none or all of it: writeback is per file),
//!   whose tail may read as zeros (blocks allocated but never written);
//! * a directory's entries (creations, renames, unlinks) are durable once
//!   the directory is fsynced; after a power loss each directory has its
//!   last fsynced entries, and whatever is no longer reachable is gone.
//!
//! Handles opened before a power loss fail with EIO afterwards: the
//! process that held them is dead.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Component, Path};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::storage::{DirEntry, OpenMode, Storage, StoredFile};

#[derive(Debug)]
enum Node {
    File {
        data: Vec<u8>,
        durable: Vec<u8>,
    },
    Dir {
        entries: BTreeMap<String, u64>,
        durable: BTreeMap<String, u64>,
    },
}

#[derive(Debug)]
struct SimFs {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    /// Bumped by every power loss; handles of older generations are dead.
    generation: u64,
}

const ROOT: u64 = 1;

/// An in-memory filesystem with power loss (see the module docs). Paths
/// are absolute. Clones share the filesystem.
#[derive(Debug, Clone)]
pub struct SimStorage {
    fs: Arc<Mutex<SimFs>>,
}

impl Default for SimStorage {
    fn default() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node::Dir {
                entries: BTreeMap::new(),
                durable: BTreeMap::new(),
            },
        );
        SimStorage {
            fs: Arc::new(Mutex::new(SimFs {
                nodes,
                next_ino: ROOT + 1,
                generation: 0,
            })),
        }
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

fn invalid(path: &Path, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {why}", path.display()))
}

/// The names of an absolute path.
fn names(path: &Path) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => out.push(n.to_string_lossy().into_owned()),
            Component::CurDir => {}
            _ => return Err(invalid(path, "sim paths are absolute and plain")),
        }
    }
    if !path.is_absolute() {
        return Err(invalid(path, "sim paths are absolute"));
    }
    Ok(out)
}

impl SimFs {
    fn lookup(&self, path: &Path) -> io::Result<u64> {
        let mut ino = ROOT;
        for name in names(path)? {
            match self.nodes.get(&ino) {
                Some(Node::Dir { entries, .. }) => {
                    ino = *entries.get(&name).ok_or_else(|| not_found(path))?;
                }
                _ => return Err(not_found(path)),
            }
        }
        Ok(ino)
    }

    /// The directory that holds `path`, and the name in it.
    fn parent(&self, path: &Path) -> io::Result<(u64, String)> {
        let mut all = names(path)?;
        let name = all.pop().ok_or_else(|| invalid(path, "no name"))?;
        let mut ino = ROOT;
        for n in all {
            match self.nodes.get(&ino) {
                Some(Node::Dir { entries, .. }) => ino = *entries.get(&n).ok_or_else(|| not_found(path))?,
                _ => return Err(not_found(path)),
            }
        }
        match self.nodes.get(&ino) {
            Some(Node::Dir { .. }) => Ok((ino, name)),
            _ => Err(not_found(path)),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> &mut BTreeMap<String, u64> {
        match self.nodes.get_mut(&dir) {
            Some(Node::Dir { entries, .. }) => entries,
            _ => unreachable!("parent() returns directories"),
        }
    }

    fn new_node(&mut self, node: Node) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, node);
        ino
    }

    fn file(&mut self, ino: u64, path: &Path) -> io::Result<&mut Vec<u8>> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File { data, .. }) => Ok(data),
            _ => Err(not_found(path)),
        }
    }
}

impl SimStorage {
    pub fn new() -> SimStorage {
        SimStorage::default()
    }

    /// Cuts the power: every directory goes back to its fsynced entries,
    /// every file to its fsynced bytes plus a random prefix of the rest
    /// (possibly with a zeroed tail), chosen from `seed`. Open handles die.
    pub fn power_loss(&self, seed: u64) {
        let mut rng = XorShift(seed | 1);
        let mut fs = self.fs.lock();
        fs.generation += 1;
        for node in fs.nodes.values_mut() {
            if let Node::Dir { entries, durable } = node {
                *entries = durable.clone();
            }
        }
        let mut reachable = vec![ROOT];
        let mut seen = std::collections::HashSet::from([ROOT]);
        while let Some(ino) = reachable.pop() {
            if let Some(Node::Dir { entries, .. }) = fs.nodes.get(&ino) {
                for child in entries.values() {
                    if seen.insert(*child) {
                        reachable.push(*child);
                    }
                }
            }
        }
        fs.nodes.retain(|ino, _| seen.contains(ino));
        for node in fs.nodes.values_mut() {
            if let Node::File { data, durable } = node {
                let survived = survivor(durable, data, &mut rng);
                *data = survived.clone();
                *durable = survived;
            }
        }
    }

    /// Every file path with its current length (for test diagnostics).
    pub fn list_files(&self) -> Vec<(String, u64)> {
        let fs = self.fs.lock();
        let mut out = Vec::new();
        let mut stack = vec![(String::new(), ROOT)];
        while let Some((prefix, ino)) = stack.pop() {
            match fs.nodes.get(&ino) {
                Some(Node::Dir { entries, .. }) => {
                    for (name, child) in entries {
                        stack.push((format!("{prefix}/{name}"), *child));
                    }
                }
                Some(Node::File { data, .. }) => out.push((prefix, data.len() as u64)),
                None => {}
            }
        }
        out.sort();
        out
    }
}

/// What survives of a file: its durable bytes, plus, if the current bytes
/// only appended to them, a random prefix of the appended part whose last
/// bytes may have been zeroed.
fn survivor(durable: &[u8], current: &[u8], rng: &mut XorShift) -> Vec<u8> {
    if current.len() <= durable.len() || !current.starts_with(durable) {
        return durable.to_vec();
    }
    let extra = current.len() - durable.len();
    // Writeback is per file: often none or all of a file's unsynced bytes
    // made it, otherwise some prefix.
    let keep = match rng.below(4) {
        0 => 0,
        1 => extra,
        _ => rng.below(extra as u64 + 1) as usize,
    };
    let mut out = current[..durable.len() + keep].to_vec();
    if keep > 0 && rng.below(4) == 0 {
        let zeros = rng.below(keep as u64) as usize + 1;
        let end = out.len();
        out[end - zeros..].fill(0);
    }
    out
}

/// A small deterministic generator, so power losses replay from a seed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

impl Storage for SimStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StoredFile>> {
        let mut fs = self.fs.lock();
        let ino = match (fs.lookup(path), mode) {
            (Ok(ino), OpenMode::Create) => {
                fs.file(ino, path)?.clear();
                ino
            }
            (Ok(ino), _) => {
                fs.file(ino, path)?;
                ino
            }
            (Err(_), OpenMode::Create) => {
                let (dir, name) = fs.parent(path)?;
                let ino = fs.new_node(Node::File {
                    data: Vec::new(),
                    durable: Vec::new(),
                });
                fs.entries_mut(dir).insert(name, ino);
                ino
            }
            (Err(e), _) => return Err(e),
        };
        Ok(Arc::new(SimFile {
            fs: Arc::clone(&self.fs),
            ino,
            generation: fs.generation,
            path: path.display().to_string(),
        }))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        let ino = fs.lookup(path)?;
        if matches!(fs.nodes.get(&ino), Some(Node::Dir { .. })) {
            return Err(invalid(path, "is a directory"));
        }
        let (dir, name) = fs.parent(path)?;
        fs.entries_mut(dir).remove(&name);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        let ino = fs.lookup(from)?;
        let (from_dir, from_name) = fs.parent(from)?;
        let (to_dir, to_name) = fs.parent(to)?;
        if let Ok(existing) = fs.lookup(to) {
            if let Some(Node::Dir { entries, .. }) = fs.nodes.get(&existing) {
                if !entries.is_empty() || existing == ino {
                    return Err(invalid(to, "directory exists and is not empty"));
                }
            }
        }
        fs.entries_mut(from_dir).remove(&from_name);
        fs.entries_mut(to_dir).insert(to_name, ino);
        Ok(())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        let mut ino = ROOT;
        for name in names(path)? {
            let next = match fs.nodes.get(&ino) {
                Some(Node::Dir { entries, .. }) => entries.get(&name).copied(),
                _ => return Err(invalid(path, "not a directory")),
            };
            ino = match next {
                Some(child) => child,
                None => {
                    let child = fs.new_node(Node::Dir {
                        entries: BTreeMap::new(),
                        durable: BTreeMap::new(),
                    });
                    fs.entries_mut(ino).insert(name, child);
                    child
                }
            };
        }
        match fs.nodes.get(&ino) {
            Some(Node::Dir { .. }) => Ok(()),
            _ => Err(invalid(path, "not a directory")),
        }
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        fs.lookup(path)?;
        let (dir, name) = fs.parent(path)?;
        fs.entries_mut(dir).remove(&name);
        Ok(())
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let fs = self.fs.lock();
        let ino = fs.lookup(path)?;
        match fs.nodes.get(&ino) {
            Some(Node::Dir { entries, .. }) => Ok(entries
                .iter()
                .map(|(name, child)| DirEntry {
                    name: name.clone(),
                    is_dir: matches!(fs.nodes.get(child), Some(Node::Dir { .. })),
                    modified: None,
                })
                .collect()),
            _ => Err(invalid(path, "not a directory")),
        }
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        let ino = fs.lookup(path)?;
        match fs.nodes.get_mut(&ino) {
            Some(Node::Dir { entries, durable }) => {
                *durable = entries.clone();
                Ok(())
            }
            _ => Err(invalid(path, "not a directory")),
        }
    }

    fn file_len(&self, path: &Path) -> io::Result<Option<u64>> {
        let mut fs = self.fs.lock();
        match fs.lookup(path) {
            Ok(ino) => Ok(Some(fs.file(ino, path)?.len() as u64)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[derive(Debug)]
struct SimFile {
    fs: Arc<Mutex<SimFs>>,
    ino: u64,
    generation: u64,
    path: String,
}

impl SimFile {
    fn with<T>(&self, f: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>) -> T) -> io::Result<T> {
        let mut fs = self.fs.lock();
        if fs.generation != self.generation {
            return Err(io::Error::other(format!(
                "{}: handle from before a power loss",
                self.path
            )));
        }
        match fs.nodes.get_mut(&self.ino) {
            Some(Node::File { data, durable }) => Ok(f(data, durable)),
            _ => Err(io::Error::other(format!("{}: file gone", self.path))),
        }
    }
}

impl StoredFile for SimFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.with(|data, _| {
            let pos = (pos as usize).min(data.len());
            let n = buf.len().min(data.len() - pos);
            buf[..n].copy_from_slice(&data[pos..pos + n]);
            n
        })
    }

    fn read_uncached(&self, pos: u64, len: u64, _direct: bool) -> io::Result<Bytes> {
        self.with(|data, _| {
            let start = (pos as usize).min(data.len());
            let end = pos.saturating_add(len).min(data.len() as u64) as usize;
            Bytes::copy_from_slice(&data[start..end])
        })
    }

    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<usize> {
        self.with(|data, _| {
            let pos = pos as usize;
            if data.len() < pos + buf.len() {
                data.resize(pos + buf.len(), 0);
            }
            data[pos..pos + buf.len()].copy_from_slice(buf);
            buf.len()
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(|data, _| data.resize(len as usize, 0))
    }

    fn len(&self) -> io::Result<u64> {
        self.with(|data, _| data.len() as u64)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with(|data, durable| *durable = data.clone())
    }

    fn drop_cache(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{read_file, write_all_at, write_atomically};

    #[test]
    fn only_fsynced_data_and_entries_survive() {
        let s = SimStorage::new();
        s.create_dir_all(Path::new("/d")).unwrap();
        s.sync_dir(Path::new("/")).unwrap();
        let a = s.open(Path::new("/d/a"), OpenMode::Create).unwrap();
        write_all_at(a.as_ref(), b"durable", 0).unwrap();
        a.sync_data().unwrap();
        s.sync_dir(Path::new("/d")).unwrap();
        write_all_at(a.as_ref(), b"-volatile", 7).unwrap();
        let b = s.open(Path::new("/d/b"), OpenMode::Create).unwrap();
        write_all_at(b.as_ref(), b"never in the dir", 0).unwrap();
        b.sync_data().unwrap();
        s.power_loss(7);
        let a2 = read_file(&s, Path::new("/d/a")).unwrap().unwrap();
        assert!(a2.starts_with(b"durable") && a2.len() <= 16, "{a2:?}");
        assert!(read_file(&s, Path::new("/d/b")).unwrap().is_none());
        assert!(a.len().is_err(), "old handles are dead");
    }

    #[test]
    fn atomic_writes_survive_whole_or_not_at_all() {
        let s = SimStorage::new();
        s.create_dir_all(Path::new("/d")).unwrap();
        s.sync_dir(Path::new("/")).unwrap();
        write_atomically(&s, Path::new("/d/f"), b"v1").unwrap();
        s.power_loss(1);
        assert_eq!(read_file(&s, Path::new("/d/f")).unwrap().unwrap(), b"v1");
        // A rename that was not made durable is undone.
        let t = s.open(Path::new("/d/f.tmp"), OpenMode::Create).unwrap();
        write_all_at(t.as_ref(), b"v2", 0).unwrap();
        t.sync_data().unwrap();
        s.rename(Path::new("/d/f.tmp"), Path::new("/d/f")).unwrap();
        s.power_loss(2);
        assert_eq!(read_file(&s, Path::new("/d/f")).unwrap().unwrap(), b"v1");
        assert!(s.file_len(Path::new("/d/f.tmp")).unwrap().is_none());
    }

    #[test]
    fn unsynced_appends_survive_as_a_prefix() {
        for seed in 0..50 {
            let s = SimStorage::new();
            let f = s.open(Path::new("/f"), OpenMode::Create).unwrap();
            s.sync_dir(Path::new("/")).unwrap();
            write_all_at(f.as_ref(), b"0123", 0).unwrap();
            f.sync_data().unwrap();
            write_all_at(f.as_ref(), b"456789", 4).unwrap();
            s.power_loss(seed);
            let got = read_file(&s, Path::new("/f")).unwrap().unwrap();
            assert!(got.starts_with(b"0123") && got.len() <= 10);
            for (i, b) in got.iter().enumerate().skip(4) {
                assert!(*b == b"0123456789"[i] || *b == 0);
            }
        }
    }
}
