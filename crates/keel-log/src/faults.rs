//! [`FaultyStorage`]: wraps a [`Storage`] and injects the faults disks
//! produce, by rule: a slow write, EIO on write or fsync, ENOSPC, EMFILE
//! on open, a short (torn) write, or a crash at a chosen step after which
//! every operation fails (the machine is gone; a test then cuts the power
//! of a [`crate::sim::SimStorage`] and starts over).
//!
//! Rules are text, one per line, so tests and the broker's failpoint
//! endpoint share one syntax:
//!
//! ```text
//! <op> <effect> [path=<substring>] [skip=<n>] [times=<n>]
//! op:     open | write | sync | set_len | rename | remove | create_dir | sync_dir | any
//! effect: eio | enospc | emfile | delay=<ms> | short=<bytes> | crash | panic
//! ```
//!
//! `any` matches every operation that changes something (reads never
//! match). `skip` lets that many matching operations pass first; `times`
//! bounds how often the rule fires (default: always).

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::storage::{DirEntry, OpenMode, Storage, StoredFile};

/// What an operation is, for matching rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    Open,
    Write,
    Sync,
    SetLen,
    Rename,
    Remove,
    CreateDir,
    SyncDir,
    /// Every operation that changes something.
    Any,
}

/// What a matching operation does instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultEffect {
    Eio,
    Enospc,
    Emfile,
    /// Sleeps, then does the operation.
    Delay(Duration),
    /// A write lands only its first bytes, then fails with ENOSPC.
    Short(usize),
    /// This and every later operation fail with EIO.
    Crash,
    /// The calling thread panics (tests of panic isolation).
    Panic,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRule {
    pub op: FaultOp,
    pub effect: FaultEffect,
    pub path_contains: Option<String>,
    pub skip: u64,
    pub times: Option<u64>,
}

impl FaultRule {
    pub fn new(op: FaultOp, effect: FaultEffect) -> FaultRule {
        FaultRule {
            op,
            effect,
            path_contains: None,
            skip: 0,
            times: None,
        }
    }

    pub fn path(mut self, contains: &str) -> FaultRule {
        self.path_contains = Some(contains.to_string());
        self
    }

    pub fn skip(mut self, n: u64) -> FaultRule {
        self.skip = n;
        self
    }

    pub fn times(mut self, n: u64) -> FaultRule {
        self.times = Some(n);
        self
    }

    /// Parses the rule syntax of the module docs.
    pub fn parse(line: &str) -> Result<FaultRule, String> {
        let mut words = line.split_whitespace();
        let op = match words.next() {
            Some("open") => FaultOp::Open,
            Some("write") => FaultOp::Write,
            Some("sync") => FaultOp::Sync,
            Some("set_len") => FaultOp::SetLen,
            Some("rename") => FaultOp::Rename,
            Some("remove") => FaultOp::Remove,
            Some("create_dir") => FaultOp::CreateDir,
            Some("sync_dir") => FaultOp::SyncDir,
            Some("any") => FaultOp::Any,
            other => return Err(format!("unknown operation {other:?}")),
        };
        let number = |v: &str| v.parse::<u64>().map_err(|_| format!("bad number {v:?}"));
        let effect = match words.next().unwrap_or("").split_once('=') {
            None => match line.split_whitespace().nth(1) {
                Some("eio") => FaultEffect::Eio,
                Some("enospc") => FaultEffect::Enospc,
                Some("emfile") => FaultEffect::Emfile,
                Some("crash") => FaultEffect::Crash,
                Some("panic") => FaultEffect::Panic,
                other => return Err(format!("unknown effect {other:?}")),
            },
            Some(("delay", ms)) => FaultEffect::Delay(Duration::from_millis(number(ms)?)),
            Some(("short", n)) => FaultEffect::Short(number(n)? as usize),
            Some((other, _)) => return Err(format!("unknown effect {other:?}")),
        };
        let mut rule = FaultRule::new(op, effect);
        for word in words {
            match word.split_once('=') {
                Some(("path", p)) => rule.path_contains = Some(p.to_string()),
                Some(("skip", n)) => rule.skip = number(n)?,
                Some(("times", n)) => rule.times = Some(number(n)?),
                _ => return Err(format!("unknown option {word:?}")),
            }
        }
        Ok(rule)
    }
}

#[derive(Debug)]
struct RuleState {
    rule: FaultRule,
    matched: u64,
    fired: u64,
}

/// Rules and the crash switch, shared by the storage and its files.
#[derive(Debug, Default)]
struct FaultState {
    rules: Mutex<Vec<RuleState>>,
    crashed: AtomicBool,
    /// Operations that changed something, since creation.
    mutations: AtomicU64,
    /// Faults injected, since creation.
    injected: AtomicU64,
}

impl FaultState {
    /// The effect to apply to `op` on `path`, if a rule fires.
    fn check(&self, op: FaultOp, path: &Path) -> io::Result<Option<FaultEffect>> {
        if self.crashed.load(Ordering::Acquire) {
            return Err(errno(rustix::io::Errno::IO, "the storage crashed"));
        }
        self.mutations.fetch_add(1, Ordering::Relaxed);
        let mut rules = self.rules.lock();
        for r in rules.iter_mut() {
            let op_matches = r.rule.op == op || r.rule.op == FaultOp::Any;
            let path_matches = r
                .rule
                .path_contains
                .as_deref()
                .is_none_or(|p| path.to_string_lossy().contains(p));
            if !op_matches || !path_matches {
                continue;
            }
            r.matched += 1;
            if r.matched <= r.rule.skip || r.rule.times.is_some_and(|t| r.fired >= t) {
                continue;
            }
            r.fired += 1;
            self.injected.fetch_add(1, Ordering::Relaxed);
            let effect = r.rule.effect;
            drop(rules);
            return self.apply(effect, op, path).map(Some);
        }
        Ok(None)
    }

    /// Applies the effects that need no cooperation from the operation.
    fn apply(&self, effect: FaultEffect, op: FaultOp, path: &Path) -> io::Result<FaultEffect> {
        let what = format!("injected fault on {op:?} of {}", path.display());
        match effect {
            FaultEffect::Eio => Err(errno(rustix::io::Errno::IO, &what)),
            FaultEffect::Enospc => Err(errno(rustix::io::Errno::NOSPC, &what)),
            FaultEffect::Emfile => Err(errno(rustix::io::Errno::MFILE, &what)),
            FaultEffect::Crash => {
                self.crashed.store(true, Ordering::Release);
                Err(errno(rustix::io::Errno::IO, "the storage crashed"))
            }
            FaultEffect::Panic => panic!("{what}: injected panic"),
            FaultEffect::Delay(d) => {
                std::thread::sleep(d);
                Ok(effect)
            }
            FaultEffect::Short(_) => Ok(effect),
        }
    }
}

fn errno(e: rustix::io::Errno, what: &str) -> io::Error {
    let os = io::Error::from_raw_os_error(e.raw_os_error());
    io::Error::new(os.kind(), format!("{what}: {os}"))
}

/// A [`Storage`] that injects faults by rule (see the module docs).
#[derive(Clone)]
pub struct FaultyStorage {
    inner: Arc<dyn Storage>,
    state: Arc<FaultState>,
}

impl fmt::Debug for FaultyStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStorage")
            .field("inner", &self.inner)
            .finish()
    }
}

impl FaultyStorage {
    pub fn new(inner: Arc<dyn Storage>) -> FaultyStorage {
        FaultyStorage {
            inner,
            state: Arc::new(FaultState::default()),
        }
    }

    pub fn add(&self, rule: FaultRule) {
        self.state.rules.lock().push(RuleState {
            rule,
            matched: 0,
            fired: 0,
        });
    }

    /// Parses and adds rules, one per line (blank lines and `#` comments
    /// are ignored). Nothing is added if a line is bad.
    pub fn add_text(&self, text: &str) -> Result<usize, String> {
        let rules = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(FaultRule::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let n = rules.len();
        rules.into_iter().for_each(|r| self.add(r));
        Ok(n)
    }

    /// Removes every rule and un-crashes the storage.
    pub fn clear(&self) {
        self.state.rules.lock().clear();
        self.state.crashed.store(false, Ordering::Release);
    }

    /// The rules, as text, with how often each matched and fired.
    pub fn describe(&self) -> Vec<String> {
        self.state
            .rules
            .lock()
            .iter()
            .map(|r| format!("{:?} matched={} fired={}", r.rule, r.matched, r.fired))
            .collect()
    }

    pub fn crashed(&self) -> bool {
        self.state.crashed.load(Ordering::Acquire)
    }

    /// Operations that changed something so far.
    pub fn mutations(&self) -> u64 {
        self.state.mutations.load(Ordering::Relaxed)
    }

    pub fn injected(&self) -> u64 {
        self.state.injected.load(Ordering::Relaxed)
    }

    /// Namespace operations: a short-write rule has nothing to cut, so
    /// only the error and delay effects apply.
    fn check(&self, op: FaultOp, path: &Path) -> io::Result<()> {
        self.state.check(op, path).map(drop)
    }

    fn reads(&self) -> io::Result<()> {
        if self.state.crashed.load(Ordering::Acquire) {
            return Err(errno(rustix::io::Errno::IO, "the storage crashed"));
        }
        Ok(())
    }
}

impl Storage for FaultyStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StoredFile>> {
        match mode {
            OpenMode::Read => self.reads()?,
            _ => self.check(FaultOp::Open, path)?,
        }
        // Reads can run out of descriptors too.
        if mode == OpenMode::Read {
            self.state.check_read_open(path)?;
        }
        let inner = self.inner.open(path, mode)?;
        Ok(Arc::new(FaultyFile {
            inner,
            path: path.to_path_buf(),
            state: Arc::clone(&self.state),
        }))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.check(FaultOp::Remove, path)?;
        self.inner.remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(FaultOp::Rename, to)?;
        self.inner.rename(from, to)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.check(FaultOp::CreateDir, path)?;
        self.inner.create_dir_all(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.check(FaultOp::Remove, path)?;
        self.inner.remove_dir_all(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        self.reads()?;
        self.inner.read_dir(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.check(FaultOp::SyncDir, path)?;
        self.inner.sync_dir(path)
    }

    fn file_len(&self, path: &Path) -> io::Result<Option<u64>> {
        self.reads()?;
        self.inner.file_len(path)
    }
}

impl FaultState {
    /// An `open ... emfile` rule also applies to read-only opens (any
    /// open needs a descriptor); other effects only to opens for writing.
    fn check_read_open(&self, path: &Path) -> io::Result<()> {
        let mut rules = self.rules.lock();
        for r in rules.iter_mut() {
            let applies = r.rule.op == FaultOp::Open
                && r.rule.effect == FaultEffect::Emfile
                && r.rule
                    .path_contains
                    .as_deref()
                    .is_none_or(|p| path.to_string_lossy().contains(p));
            if !applies {
                continue;
            }
            r.matched += 1;
            if r.matched <= r.rule.skip || r.rule.times.is_some_and(|t| r.fired >= t) {
                continue;
            }
            r.fired += 1;
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(errno(rustix::io::Errno::MFILE, "injected fault on open"));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct FaultyFile {
    inner: Arc<dyn StoredFile>,
    path: PathBuf,
    state: Arc<FaultState>,
}

impl FaultyFile {
    fn reads(&self) -> io::Result<()> {
        if self.state.crashed.load(Ordering::Acquire) {
            return Err(errno(rustix::io::Errno::IO, "the storage crashed"));
        }
        Ok(())
    }
}

impl StoredFile for FaultyFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.reads()?;
        self.inner.read_at(buf, pos)
    }

    fn read_uncached(&self, pos: u64, len: u64, direct: bool) -> io::Result<Bytes> {
        self.reads()?;
        self.inner.read_uncached(pos, len, direct)
    }

    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<usize> {
        if let Some(FaultEffect::Short(keep)) = self.state.check(FaultOp::Write, &self.path)? {
            let keep = keep.min(buf.len());
            if keep > 0 {
                crate::storage::write_all_at(self.inner.as_ref(), &buf[..keep], pos)?;
            }
            return Err(errno(
                rustix::io::Errno::NOSPC,
                &format!("injected short write of {keep} bytes to {}", self.path.display()),
            ));
        }
        self.inner.write_at(buf, pos)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.state.check(FaultOp::SetLen, &self.path)?;
        self.inner.set_len(len)
    }

    fn len(&self) -> io::Result<u64> {
        self.reads()?;
        self.inner.len()
    }

    fn sync_data(&self) -> io::Result<()> {
        self.state.check(FaultOp::Sync, &self.path)?;
        self.inner.sync_data()
    }

    fn drop_cache(&self) {
        self.inner.drop_cache();
    }

    fn std_file(&self) -> Option<&File> {
        self.inner.std_file()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{write_all_at, DiskStorage};

    #[test]
    fn rules_parse() {
        let r = FaultRule::parse("sync eio path=t-0/ skip=2 times=1").unwrap();
        assert_eq!(
            r,
            FaultRule::new(FaultOp::Sync, FaultEffect::Eio)
                .path("t-0/")
                .skip(2)
                .times(1)
        );
        assert_eq!(
            FaultRule::parse("write delay=1000").unwrap().effect,
            FaultEffect::Delay(Duration::from_secs(1))
        );
        assert_eq!(
            FaultRule::parse("write short=10").unwrap().effect,
            FaultEffect::Short(10)
        );
        assert!(FaultRule::parse("fly eio").is_err());
        assert!(FaultRule::parse("write melt").is_err());
        assert!(FaultRule::parse("write eio when=now").is_err());
    }

    #[test]
    fn faults_fire_as_told_and_crash_stops_everything() {
        // Names a temporary directory's random part cannot contain, so the
        // path= filters match only the file meant.
        let dir = tempfile::tempdir().unwrap();
        let s = FaultyStorage::new(DiskStorage::shared());
        s.add_text("sync eio path=f-a skip=1 times=1\nwrite short=3 path=f-b\nopen emfile path=f-c")
            .unwrap();
        let a = s.open(&dir.path().join("f-a"), OpenMode::Create).unwrap();
        a.sync_data().unwrap();
        let err = a.sync_data().unwrap_err();
        assert_eq!(err.raw_os_error(), None, "wrapped, but the kind is kept");
        assert!(err.to_string().contains("injected"), "{err}");
        a.sync_data().unwrap();
        let b = s.open(&dir.path().join("f-b"), OpenMode::Create).unwrap();
        assert!(write_all_at(b.as_ref(), b"abcdef", 0).is_err());
        assert_eq!(b.len().unwrap(), 3, "the torn write left 3 bytes");
        let c = s.open(&dir.path().join("f-c"), OpenMode::Create).unwrap_err();
        assert!(c.to_string().contains("Too many open files"), "{c}");
        s.add(FaultRule::new(FaultOp::Any, FaultEffect::Crash));
        assert!(s.remove_file(&dir.path().join("f-a")).is_err());
        assert!(s.crashed());
        assert!(a.len().is_err(), "reads fail after the crash too");
        s.clear();
        assert!(a.len().is_ok());
    }
}
