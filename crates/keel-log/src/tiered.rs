//! Segments with a copy in a colder tier (a capacity directory or an object
//! store), and the per-partition manifest that records them.
//!
//! A sealed segment moves through these states, each persisted in the
//! manifest before the step that depends on it:
//!
//! ```text
//! sealed (local only) -> Copying -> Both -> Cold -> Deleting -> (gone)
//!                           \-> Deleting (copy failed or interrupted)
//! ```
//!
//! * `Copying`: the mover is writing the colder copy. Never read. Start-up
//!   turns it into `Deleting`, so a half-written copy is removed and the
//!   segment is copied again under a fresh object name.
//! * `Both`: the copy is complete and verified; the local copy still serves
//!   reads.
//! * `Cold`: the local files are deleted (the manifest says `Cold` first, so
//!   start-up finishes a deletion a crash interrupted); reads of its offsets
//!   go to the colder tier.
//! * `Deleting`: the colder copy is to be deleted (retention, DeleteRecords,
//!   a rolled-back copy, a deleted topic). Never read; forgotten once the
//!   tier confirms the deletion.
//!
//! The manifest file is text, one line per segment, replaced atomically
//! (temp file, fsync, rename, directory fsync). Its layout is in
//! docs/format.md.

use std::io;
use std::path::Path;

use crate::segment::invalid_data;
use crate::storage::{read_file, write_atomically, Storage};
use crate::txnindex::AbortedTxn;

/// The manifest's file name in the partition directory.
pub const TIER_MANIFEST_FILE: &str = "tier-manifest";
const MANIFEST_HEADER: &str = "keel-tier-manifest 2";
/// Version 1 lines have no aborted-transaction field; they read the same.
const MANIFEST_HEADER_V1: &str = "keel-tier-manifest 1";

/// Which colder tier holds a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// A capacity directory (`keel.tier.capacity.dirs`).
    Capacity,
    /// The object store (`keel.tier.remote`).
    Remote,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Capacity => "capacity",
            Tier::Remote => "remote",
        }
    }

    fn parse(s: &str) -> Option<Tier> {
        match s {
            "capacity" => Some(Tier::Capacity),
            "remote" => Some(Tier::Remote),
            _ => None,
        }
    }
}

/// Where a tiered segment is in its lifecycle (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TierState {
    Copying,
    Both,
    Cold,
    Deleting,
}

impl TierState {
    pub fn name(self) -> &'static str {
        match self {
            TierState::Copying => "copying",
            TierState::Both => "both",
            TierState::Cold => "cold",
            TierState::Deleting => "deleting",
        }
    }

    fn parse(s: &str) -> Option<TierState> {
        match s {
            "copying" => Some(TierState::Copying),
            "both" => Some(TierState::Both),
            "cold" => Some(TierState::Cold),
            "deleting" => Some(TierState::Deleting),
            _ => None,
        }
    }
}

/// One segment's colder copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TieredSegment {
    pub base_offset: i64,
    /// One past the last offset in the segment.
    pub next_offset: i64,
    pub size_bytes: u64,
    /// Largest batch max timestamp (-1 if none), and the offset that has it.
    pub max_timestamp_ms: i64,
    pub offset_of_max_timestamp: i64,
    pub tier: Tier,
    pub state: TierState,
    /// The copy's name in its tier, with no local path in it; its files are
    /// `<object>.log`, `<object>.index` and `<object>.timeindex`, and
    /// `<object>.txnindex` if it has aborted transactions.
    pub object: String,
    /// The segment's aborted-transaction index entries, kept in the
    /// manifest so a `read_committed` fetch of a cold segment needs no
    /// read of the colder tier to find them.
    pub aborted: Vec<AbortedTxn>,
}

impl TieredSegment {
    /// True if reads of this segment's offsets go to the colder tier.
    pub fn is_cold(&self) -> bool {
        self.state == TierState::Cold
    }

    fn to_line(&self) -> String {
        let mut line = format!(
            "{} {} {} {} {} {} {} {}",
            self.base_offset,
            self.next_offset,
            self.size_bytes,
            self.max_timestamp_ms,
            self.offset_of_max_timestamp,
            self.tier.name(),
            self.state.name(),
            self.object
        );
        if !self.aborted.is_empty() {
            let entries: Vec<String> = self
                .aborted
                .iter()
                .map(|a| {
                    format!(
                        "{}:{}:{}:{}",
                        a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset
                    )
                })
                .collect();
            line.push_str(&format!(" {ABORTED_FIELD}{}", entries.join(",")));
        }
        line
    }

    fn parse_line(line: &str) -> Option<TieredSegment> {
        let mut f = line.split(' ');
        let seg = TieredSegment {
            base_offset: f.next()?.parse().ok()?,
            next_offset: f.next()?.parse().ok()?,
            size_bytes: f.next()?.parse().ok()?,
            max_timestamp_ms: f.next()?.parse().ok()?,
            offset_of_max_timestamp: f.next()?.parse().ok()?,
            tier: Tier::parse(f.next()?)?,
            state: TierState::parse(f.next()?)?,
            object: f.next()?.to_string(),
            aborted: match f.next() {
                None => Vec::new(),
                Some(field) => parse_aborted(field.strip_prefix(ABORTED_FIELD)?)?,
            },
        };
        let valid = f.next().is_none()
            && seg.base_offset >= 0
            && seg.next_offset > seg.base_offset
            && valid_object_name(&seg.object);
        valid.then_some(seg)
    }
}

/// The optional last field of a manifest line: the segment's aborted
/// transactions, `producer:first:last:lso` each, comma-separated.
const ABORTED_FIELD: &str = "aborted=";

fn parse_aborted(field: &str) -> Option<Vec<AbortedTxn>> {
    field
        .split(',')
        .map(|entry| {
            let mut n = entry.split(':').map(|v| v.parse::<i64>().ok());
            let a = AbortedTxn {
                producer_id: n.next()??,
                first_offset: n.next()??,
                last_offset: n.next()??,
                last_stable_offset: n.next()??,
            };
            n.next().is_none().then_some(a)
        })
        .collect()
}

/// Object names are relative, slash-separated, with no empty, `.` or `..`
/// parts and no whitespace, so they map to the same place in every tier.
pub fn valid_object_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
}

/// Reads the manifest in `dir`; empty if there is none. A manifest that
/// cannot be parsed is an error: guessing could lose the only copy of data.
pub(crate) fn read_manifest(storage: &dyn Storage, dir: &Path) -> io::Result<Vec<TieredSegment>> {
    let path = dir.join(TIER_MANIFEST_FILE);
    let Some(bytes) = read_file(storage, &path)? else {
        return Ok(Vec::new());
    };
    let text = String::from_utf8(bytes).map_err(|_| invalid_data(format!("{}: not text", path.display())))?;
    let mut lines = text.lines();
    if !matches!(lines.next(), Some(MANIFEST_HEADER | MANIFEST_HEADER_V1)) {
        return Err(invalid_data(format!(
            "{}: not a version 1 or 2 tier manifest",
            path.display()
        )));
    }
    let mut entries = Vec::new();
    for (n, line) in lines.enumerate() {
        let entry = TieredSegment::parse_line(line)
            .ok_or_else(|| invalid_data(format!("{}: bad line {}: {line:?}", path.display(), n + 2)))?;
        entries.push(entry);
    }
    entries.sort_by_key(|e| e.base_offset);
    Ok(entries)
}

/// Replaces the manifest in `dir` atomically and fsyncs the directory.
pub(crate) fn write_manifest(storage: &dyn Storage, dir: &Path, entries: &[TieredSegment]) -> io::Result<()> {
    let mut text = String::from(MANIFEST_HEADER);
    text.push('\n');
    for entry in entries {
        text.push_str(&entry.to_line());
        text.push('\n');
    }
    write_atomically(storage, &dir.join(TIER_MANIFEST_FILE), text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::DiskStorage;
    use std::fs;

    fn entry(base: i64, state: TierState) -> TieredSegment {
        TieredSegment {
            base_offset: base,
            next_offset: base + 10,
            size_bytes: 1234,
            max_timestamp_ms: 1_700_000_000_000,
            offset_of_max_timestamp: base + 9,
            tier: Tier::Remote,
            state,
            object: format!("t-0a1b/0/{base:020}-abc"),
            aborted: Vec::new(),
        }
    }

    #[test]
    fn manifest_round_trips_and_sorts() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_manifest(&DiskStorage, dir.path()).unwrap().is_empty());
        let mut with_aborts = entry(20, TierState::Cold);
        with_aborts.aborted = vec![
            AbortedTxn {
                producer_id: 7,
                first_offset: 3,
                last_offset: 21,
                last_stable_offset: 3,
            },
            AbortedTxn {
                producer_id: 8,
                first_offset: 22,
                last_offset: 25,
                last_stable_offset: 22,
            },
        ];
        let entries = vec![with_aborts, entry(0, TierState::Both)];
        write_manifest(&DiskStorage, dir.path(), &entries).unwrap();
        let back = read_manifest(&DiskStorage, dir.path()).unwrap();
        assert_eq!(back, vec![entries[1].clone(), entries[0].clone()]);
        // A version 1 manifest (no aborted field) still reads.
        fs::write(
            dir.path().join(TIER_MANIFEST_FILE),
            "keel-tier-manifest 1\n0 10 1234 1700000000000 9 remote both t-0a1b/0/00000000000000000000-abc\n",
        )
        .unwrap();
        assert_eq!(
            read_manifest(&DiskStorage, dir.path()).unwrap(),
            vec![entries[1].clone()]
        );
    }

    #[test]
    fn corrupt_manifest_is_an_error_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(TIER_MANIFEST_FILE),
            "keel-tier-manifest 1\n0 10 nope\n",
        )
        .unwrap();
        let err = read_manifest(&DiskStorage, dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        fs::write(dir.path().join(TIER_MANIFEST_FILE), "something else\n").unwrap();
        assert!(read_manifest(&DiskStorage, dir.path()).is_err());
        for bad in ["aborted=1:2:3", "aborted=1:2:3:4:5", "aborted=", "extra"] {
            fs::write(
                dir.path().join(TIER_MANIFEST_FILE),
                format!("keel-tier-manifest 2\n0 10 1234 1 9 remote both t/0/0-a {bad}\n"),
            )
            .unwrap();
            assert!(read_manifest(&DiskStorage, dir.path()).is_err(), "{bad}");
        }
    }

    #[test]
    fn object_names_are_relative_and_plain() {
        assert!(valid_object_name("orders-5f2c/3/00000000000000000042-9a"));
        for bad in ["", "/abs", "a//b", "a/../b", "a/./b", "a b", "a\nb", "a/"] {
            assert!(!valid_object_name(bad), "{bad:?}");
        }
    }
}
