//! The aborted-transaction index: Kafka's `.txnindex` file per segment.
//!
//! Each entry names one transaction that was aborted by a marker in this
//! segment: its producer, the offset of its first batch (which may lie in
//! an earlier segment), the offset of its ABORT marker, and the last stable
//! offset when the marker was written. A `read_committed` fetch gets the
//! entries overlapping what it reads, so the client can drop the aborted
//! records (the broker never rewrites them).
//!
//! The entries live in memory with their segment. The file is written
//! whole and atomically when the segment is sealed, at clean shutdown, and
//! when an entry is restored into a sealed segment; the active segment's
//! entries after the recovery point are rebuilt at start-up by the caller
//! replaying the log's transaction markers (see
//! [`crate::PartitionLog::add_aborted_txn`]).

use std::io;
use std::path::Path;

use crate::segment::{segment_path, TXN_INDEX_SUFFIX};
use crate::storage::{read_file, remove_if_exists, write_atomically, Storage};

/// Kafka's entry version.
const VERSION: i16 = 0;
/// version 2, producer id 8, first offset 8, last offset 8, last stable
/// offset 8.
pub const ENTRY_LEN: usize = 34;

/// One aborted transaction of one producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    /// The offset of the transaction's first batch in this partition.
    pub first_offset: i64,
    /// The offset of its ABORT marker.
    pub last_offset: i64,
    /// The partition's last stable offset when the marker was written.
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&VERSION.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.first_offset.to_be_bytes());
        out.extend_from_slice(&self.last_offset.to_be_bytes());
        out.extend_from_slice(&self.last_stable_offset.to_be_bytes());
    }
}

/// The file image of `entries`.
pub fn encode(entries: &[AbortedTxn]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_LEN);
    for e in entries {
        e.encode(&mut out);
    }
    out
}

/// Decodes a `.txnindex` image. A partial last entry (a torn write by
/// another writer) is ignored, as Kafka does; an unknown version is an
/// error.
pub fn decode(bytes: &[u8]) -> Result<Vec<AbortedTxn>, String> {
    let mut out = Vec::with_capacity(bytes.len() / ENTRY_LEN);
    for e in bytes.chunks_exact(ENTRY_LEN) {
        out.push(decode_entry(e)?);
    }
    Ok(out)
}

/// Decodes one entry (the first [`ENTRY_LEN`] bytes of `e`); an unknown
/// version or a short slice is an error.
pub fn decode_entry(e: &[u8]) -> Result<AbortedTxn, String> {
    let e = e
        .get(..ENTRY_LEN)
        .ok_or_else(|| format!("an aborted-transaction entry of {} bytes", e.len()))?;
    let version = i16::from_be_bytes([e[0], e[1]]);
    if version != VERSION {
        return Err(format!(
            "aborted-transaction entry version {version} is not {VERSION}"
        ));
    }
    let at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&e[i..i + 8]);
        i64::from_be_bytes(b)
    };
    Ok(AbortedTxn {
        producer_id: at(2),
        first_offset: at(10),
        last_offset: at(18),
        last_stable_offset: at(26),
    })
}

/// Writes the segment's `.txnindex` (atomically), or removes it when there
/// is no entry, as Kafka leaves no file for a segment without aborts.
pub(crate) fn write(
    storage: &dyn Storage,
    dir: &Path,
    base_offset: i64,
    entries: &[AbortedTxn],
) -> io::Result<()> {
    let path = segment_path(dir, base_offset, TXN_INDEX_SUFFIX);
    if entries.is_empty() {
        return remove_if_exists(storage, &path);
    }
    write_atomically(storage, &path, &encode(entries))
}

/// Reads the segment's `.txnindex`: no file is no entry. A file that does
/// not decode is reported and ignored (its aborts become visible to
/// `read_committed` readers, which is logged loudly).
pub(crate) fn read(storage: &dyn Storage, dir: &Path, base_offset: i64) -> io::Result<Vec<AbortedTxn>> {
    let path = segment_path(dir, base_offset, TXN_INDEX_SUFFIX);
    let Some(bytes) = read_file(storage, &path)? else {
        return Ok(Vec::new());
    };
    match decode(&bytes) {
        Ok(entries) => Ok(entries),
        Err(why) => {
            tracing::error!(file = %path.display(), %why, "ignoring an aborted-transaction index");
            Ok(Vec::new())
        }
    }
}

/// Entries of `entries` a read of `[from_offset, upper_offset)` must see:
/// the transactions still open at `from_offset` or starting before
/// `upper_offset` (Kafka's `TransactionIndex.collectAbortedTxns`).
pub fn overlapping(
    entries: impl Iterator<Item = AbortedTxn>,
    from_offset: i64,
    upper_offset: i64,
) -> Vec<AbortedTxn> {
    let mut out: Vec<AbortedTxn> = entries
        .filter(|e| e.last_offset >= from_offset && e.first_offset < upper_offset)
        .collect();
    out.sort_by_key(|e| (e.first_offset, e.last_offset));
    out.dedup_by_key(|e| e.last_offset);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_in_kafkas_layout() {
        let e = AbortedTxn {
            producer_id: 7,
            first_offset: 10,
            last_offset: 20,
            last_stable_offset: 10,
        };
        let bytes = encode(&[e, e]);
        assert_eq!(bytes.len(), 2 * ENTRY_LEN);
        assert_eq!(&bytes[..2], &[0, 0]);
        assert_eq!(&bytes[2..10], &7i64.to_be_bytes());
        assert_eq!(decode(&bytes).unwrap(), vec![e, e]);
        assert_eq!(
            decode(&bytes[..ENTRY_LEN + 5]).unwrap(),
            vec![e],
            "torn tail ignored"
        );
        let mut bad = bytes.clone();
        bad[1] = 9;
        assert!(decode(&bad).is_err());
    }

    #[test]
    fn overlapping_matches_kafkas_rule() {
        let e = |first, last| AbortedTxn {
            producer_id: 1,
            first_offset: first,
            last_offset: last,
            last_stable_offset: first,
        };
        let all = [e(0, 5), e(3, 9), e(10, 12), e(20, 30)];
        let got = overlapping(all.into_iter(), 6, 20);
        assert_eq!(got, vec![e(3, 9), e(10, 12)]);
        assert_eq!(overlapping(all.into_iter(), 31, 40), vec![]);
        // The same abort seen twice (restored beside its file) counts once.
        assert_eq!(overlapping([e(3, 9), e(3, 9)].into_iter(), 0, 100).len(), 1);
    }
}
