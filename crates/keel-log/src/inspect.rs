//! Reading segment files as they are, damage included: what `keel segment
//! dump` prints. Works on the bytes of one `.log`, `.index`, `.timeindex`
//! or `.txnindex` file, Keel's or Apache Kafka's (the formats are the
//! same, `docs/format.md`), and does no I/O.
//!
//! A `.log` is walked batch by batch ([`walk`]). Bytes that cannot be
//! framed as a batch (a bad length or magic, a truncated tail, garbage)
//! become one [`CorruptRegion`], and the walk resyncs on the next position
//! holding a batch whose header parses, fits in the file and whose CRC
//! verifies: a valid CRC-32C over 40+ bytes is what makes a header found by
//! searching trustworthy. A batch whose framing holds but whose CRC does
//! not is listed with `crc_valid` false, as Kafka's DumpLogSegments lists
//! it (`isvalid: false`).
//!
//! Index files are read as Kafka's DumpLogSegments reads them: an entry
//! whose relative offset is 0 after the first ends the index (what a
//! preallocated index not trimmed by a clean shutdown holds past its
//! entries). [`verify_offset_index`] and [`verify_time_index`] check
//! entries against the batches of their `.log`.
//!
//! Nothing here panics on any input, and allocations are bounded by the
//! input's size (decompressed records by the codec's 64 MiB limit).

// Parsing code: bad bytes are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::borrow::Cow;

use crate::batch::{check_crc, BatchHeader, ATTRIBUTES_AT, BATCH_HEADER_LEN, NO_TIMESTAMP};
use crate::index::{OFFSET_ENTRY_LEN, TIME_ENTRY_LEN};
use crate::marker::{read_marker, Marker};
use crate::records::{records_in, records_section, Header};
use crate::txnindex::{self, AbortedTxn};

/// One batch as found in a `.log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoundBatch {
    /// Byte position of the batch's first byte in the file.
    pub position: u64,
    pub header: BatchHeader,
    /// CRC-32C computed over attributes..end (the header's `crc` is the
    /// stored one).
    pub computed_crc: u32,
}

impl FoundBatch {
    pub fn crc_valid(&self) -> bool {
        self.computed_crc == self.header.crc
    }

    /// Size of the whole batch in bytes.
    pub fn len(&self) -> u64 {
        self.header.total_len() as u64
    }

    /// Whether the batch has no records (a batch compaction emptied).
    pub fn is_empty(&self) -> bool {
        self.header.records_count == 0
    }

    /// One past the batch's last byte.
    pub fn end(&self) -> u64 {
        self.position + self.len()
    }
}

/// Bytes of a `.log` that are not a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptRegion {
    pub position: u64,
    pub length: u64,
    pub reason: String,
}

/// What the walk finds next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found<'a> {
    /// A batch and its bytes.
    Batch(FoundBatch, &'a [u8]),
    Corrupt(CorruptRegion),
}

/// The batches and corrupt regions of a `.log` image, in file order.
pub struct Walk<'a> {
    data: &'a [u8],
    at: usize,
}

/// Walks `data`, a whole `.log` file.
pub fn walk(data: &[u8]) -> Walk<'_> {
    Walk { data, at: 0 }
}

impl<'a> Iterator for Walk<'a> {
    type Item = Found<'a>;

    fn next(&mut self) -> Option<Found<'a>> {
        let data = self.data;
        let p = self.at;
        if p >= data.len() {
            return None;
        }
        let rest = &data[p..];
        let why = match BatchHeader::parse(rest) {
            Ok(h) if h.total_len() <= rest.len() => {
                let bytes = &rest[..h.total_len()];
                let batch = FoundBatch {
                    position: p as u64,
                    header: h,
                    computed_crc: crc32c::crc32c(&bytes[ATTRIBUTES_AT..]),
                };
                let end = p + h.total_len();
                // A batch with a bad CRC is listed only when its length
                // leads to the end of the file or to another header: then
                // the damage is inside it, not in its framing.
                if batch.crc_valid() || end == data.len() || BatchHeader::parse(&data[end..]).is_ok() {
                    self.at = end;
                    return Some(Found::Batch(batch, bytes));
                }
                format!(
                    "CRC mismatch (stored {:#010x}, computed {:#010x}) and its length ({} bytes) \
                     does not lead to another batch",
                    h.crc,
                    batch.computed_crc,
                    h.total_len()
                )
            }
            Ok(h) => format!(
                "batch of {} bytes runs past the end of the file ({} bytes left)",
                h.total_len(),
                rest.len()
            ),
            Err(e) => e.to_string(),
        };
        let next = next_trustworthy(data, p + 1).unwrap_or(data.len());
        self.at = next;
        let region = &data[p..next];
        let reason = if region.iter().all(|b| *b == 0) {
            "zero bytes (preallocated or never written)".to_string()
        } else if next == data.len() && BatchHeader::parse(rest).is_ok() {
            format!("truncated: {why}")
        } else {
            why
        };
        Some(Found::Corrupt(CorruptRegion {
            position: p as u64,
            length: region.len() as u64,
            reason,
        }))
    }
}

/// The first position at or after `from` holding a batch whose header
/// parses, that fits in `data` and whose CRC verifies.
fn next_trustworthy(data: &[u8], from: usize) -> Option<usize> {
    const MAGIC_AT: usize = 16;
    (from..data.len().saturating_sub(BATCH_HEADER_LEN - 1)).find(|&q| {
        // Cheap filters first: magic 2 and a length that fits.
        if data[q + MAGIC_AT] != 2 {
            return false;
        }
        let rest = &data[q..];
        match BatchHeader::parse(rest) {
            Ok(h) => h.total_len() <= rest.len() && check_crc(rest, &h).is_ok(),
            Err(_) => false,
        }
    })
}

/// Kafka's control record types (`ControlRecordType`).
pub fn control_type_name(kind: i16) -> &'static str {
    match kind {
        0 => "ABORT",
        1 => "COMMIT",
        2 => "LEADER_CHANGE",
        3 => "SNAPSHOT_HEADER",
        4 => "SNAPSHOT_FOOTER",
        5 => "KRAFT_VERSION",
        6 => "KRAFT_VOTERS",
        _ => "UNKNOWN",
    }
}

/// One record of a batch, as the dump shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Index of the record in its batch.
    pub index: usize,
    pub offset: i64,
    /// The record's timestamp (a LogAppendTime batch's max timestamp for
    /// every record, as Kafka reads them), ms.
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<Header<'a>>,
    /// For an uncompressed batch, the record's file position (its length
    /// prefix) and size in bytes; `None` inside a compressed batch, whose
    /// records have no file position.
    pub position: Option<(u64, u64)>,
    /// In a control batch: the control record type (`key` bytes 2..4).
    pub control_type: Option<i16>,
}

/// Calls `f` with each record of `batch` (a whole batch at file position
/// `position`), decompressing it if need be (at most the codec's limit).
/// An error names the first record that could not be read; the records
/// before it were visited.
pub fn visit_records(
    batch: &[u8],
    header: &BatchHeader,
    position: u64,
    mut f: impl FnMut(RecordView<'_>),
) -> Result<(), String> {
    let section = records_section(batch, header)?;
    let uncompressed = matches!(section, Cow::Borrowed(_));
    let mut records = records_in(&section);
    let mut index = 0usize;
    loop {
        let start = records.position();
        let Some(record) = records.next() else { break };
        let record = record?;
        let headers = record.headers().map_err(|why| format!("record {index}: {why}"))?;
        let offset = header
            .base_offset
            .checked_add(record.offset_delta)
            .ok_or_else(|| format!("record {index}: offset delta {} overflows", record.offset_delta))?;
        let timestamp = if header.timestamp_type_is_log_append() {
            header.max_timestamp
        } else {
            header.base_timestamp.saturating_add(record.timestamp_delta)
        };
        let control_type = if header.is_control() {
            match record.key {
                Some([_, _, t0, t1, ..]) => Some(i16::from_be_bytes([*t0, *t1])),
                _ => {
                    return Err(format!(
                        "record {index}: a control record key shorter than 4 bytes"
                    ))
                }
            }
        } else {
            None
        };
        let position = uncompressed.then(|| {
            let file_at = position + (BATCH_HEADER_LEN + start) as u64;
            (file_at, (records.position() - start) as u64)
        });
        f(RecordView {
            index,
            offset,
            timestamp,
            key: record.key,
            value: record.value,
            headers,
            position,
            control_type,
        });
        index += 1;
    }
    if index != header.records_count as usize {
        return Err(format!(
            "the batch holds {index} records but its header says {}",
            header.records_count
        ));
    }
    Ok(())
}

/// An index file's entries, read as Kafka's DumpLogSegments reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntries<T> {
    pub entries: Vec<T>,
    /// Entries after the last one listed: they start with an entry whose
    /// relative offset is 0 (not the first entry), which ends the index.
    pub ignored_entries: usize,
    /// Whether the ignored entries are all zero bytes (an index
    /// preallocated and not trimmed).
    pub ignored_all_zero: bool,
    /// Bytes at the end that do not make a whole entry.
    pub partial_bytes: usize,
}

/// `.index` entry: (relative offset, position), as stored.
pub type OffsetIndexEntry = (i32, i32);
/// `.timeindex` entry: (timestamp ms, relative offset), as stored.
pub type TimeIndexEntry = (i64, i32);

fn read_entries<T>(
    bytes: &[u8],
    entry_len: usize,
    decode: impl Fn(&[u8]) -> T,
    relative_offset: impl Fn(&T) -> i32,
) -> IndexEntries<T> {
    let chunks = bytes.chunks_exact(entry_len);
    let partial_bytes = chunks.remainder().len();
    let mut entries = Vec::with_capacity(bytes.len() / entry_len);
    let mut ignored_entries = 0;
    let mut ignored_at = bytes.len() - partial_bytes;
    for (i, chunk) in chunks.enumerate() {
        let entry = decode(chunk);
        if i > 0 && relative_offset(&entry) == 0 {
            ignored_at = i * entry_len;
            ignored_entries = bytes.len() / entry_len - i;
            break;
        }
        entries.push(entry);
    }
    let whole = bytes.len() - partial_bytes;
    IndexEntries {
        entries,
        ignored_entries,
        ignored_all_zero: bytes[ignored_at..whole].iter().all(|b| *b == 0),
        partial_bytes,
    }
}

/// The entries of a `.index` image.
pub fn read_offset_index(bytes: &[u8]) -> IndexEntries<OffsetIndexEntry> {
    read_entries(bytes, OFFSET_ENTRY_LEN, |c| (be_i32(c, 0), be_i32(c, 4)), |e| e.0)
}

/// The entries of a `.timeindex` image.
pub fn read_time_index(bytes: &[u8]) -> IndexEntries<TimeIndexEntry> {
    read_entries(bytes, TIME_ENTRY_LEN, |c| (be_i64(c, 0), be_i32(c, 8)), |e| e.1)
}

/// One `.txnindex` entry, or why its bytes are not one.
pub type TxnIndexEntry = Result<AbortedTxn, String>;

/// The entries of a `.txnindex` image, and the bytes of a partial last
/// entry (Kafka ignores them).
pub fn read_txn_index(bytes: &[u8]) -> (Vec<TxnIndexEntry>, usize) {
    let chunks = bytes.chunks_exact(txnindex::ENTRY_LEN);
    let partial = chunks.remainder().len();
    (chunks.map(txnindex::decode_entry).collect(), partial)
}

/// What index verification needs of one batch of the `.log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSpan {
    pub position: u64,
    pub base_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub transactional: bool,
    /// The transaction marker of a control batch (None for data batches,
    /// other control records, and markers that do not parse).
    pub marker: Option<Marker>,
}

impl BatchSpan {
    /// The span of `batch`, whose bytes are `bytes`.
    pub fn new(batch: &FoundBatch, bytes: &[u8]) -> BatchSpan {
        let h = &batch.header;
        BatchSpan {
            position: batch.position,
            base_offset: h.base_offset,
            last_offset: h.last_offset(),
            max_timestamp: h.max_timestamp,
            producer_id: h.producer_id,
            transactional: h.is_transactional(),
            marker: if h.is_control() {
                read_marker(bytes, h).ok().flatten()
            } else {
                None
            },
        }
    }
}

/// An index entry that disagrees with the log or with the entry before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexMismatch {
    /// The entry's number in the index file (0-based).
    pub entry: usize,
    pub reason: String,
}

/// Checks `.index` entries against the batches of their `.log` (in file
/// order) for a segment at `base_offset`: entries strictly increasing in
/// both fields, each position the start of a batch, and that batch's last
/// offset the indexed offset (Kafka indexes a batch by its last offset).
pub fn verify_offset_index(
    entries: &[OffsetIndexEntry],
    base_offset: i64,
    batches: &[BatchSpan],
) -> Vec<IndexMismatch> {
    let mut out = Vec::new();
    let mut previous: Option<OffsetIndexEntry> = None;
    for (i, &(relative, position)) in entries.iter().enumerate() {
        let mut fail = |reason: String| out.push(IndexMismatch { entry: i, reason });
        let offset = base_offset.saturating_add(i64::from(relative));
        if let Some((prev_rel, prev_pos)) = previous {
            if relative <= prev_rel || position <= prev_pos {
                fail(format!(
                    "entry (offset {offset}, position {position}) does not increase on the one \
                     before (offset {}, position {prev_pos})",
                    base_offset.saturating_add(i64::from(prev_rel))
                ));
            }
        }
        previous = Some((relative, position));
        let found = u64::try_from(position)
            .ok()
            .and_then(|p| batches.binary_search_by_key(&p, |b| b.position).ok());
        match found.map(|k| batches[k]) {
            None => fail(format!("position {position} is not the start of a batch")),
            Some(b) if b.last_offset == offset => {}
            Some(b) if (b.base_offset..=b.last_offset).contains(&offset) => fail(format!(
                "offset {offset} is in the batch at position {position} but that batch's last \
                 offset is {} (an entry names a batch's last offset)",
                b.last_offset
            )),
            Some(b) => fail(format!(
                "offset {offset} is not in the batch at position {position} (offsets {}..={})",
                b.base_offset, b.last_offset
            )),
        }
    }
    out
}

/// Checks `.timeindex` entries against the batches of their `.log` (in
/// file order) for a segment at `base_offset`. As Keel and Kafka write
/// them, an entry is (the segment's max timestamp so far, the last offset
/// of the batch that set it), so: timestamps strictly increasing, offsets
/// not decreasing, each offset the last offset of a batch whose max
/// timestamp is the entry's, and no earlier batch with a larger one.
pub fn verify_time_index(
    entries: &[TimeIndexEntry],
    base_offset: i64,
    batches: &[BatchSpan],
) -> Vec<IndexMismatch> {
    // The segment's max timestamp up to and including each batch.
    let mut max_so_far = Vec::with_capacity(batches.len());
    let mut max = NO_TIMESTAMP;
    for b in batches {
        max = max.max(b.max_timestamp);
        max_so_far.push(max);
    }
    let mut by_last_offset: Vec<usize> = (0..batches.len()).collect();
    by_last_offset.sort_by_key(|&k| batches[k].last_offset);
    let mut out = Vec::new();
    let mut previous: Option<TimeIndexEntry> = None;
    for (i, &(timestamp, relative)) in entries.iter().enumerate() {
        let mut fail = |reason: String| out.push(IndexMismatch { entry: i, reason });
        let offset = base_offset.saturating_add(i64::from(relative));
        if let Some((prev_ts, prev_rel)) = previous {
            if timestamp <= prev_ts || relative < prev_rel {
                fail(format!(
                    "entry (timestamp {timestamp}, offset {offset}) does not increase on the one \
                     before (timestamp {prev_ts}, offset {})",
                    base_offset.saturating_add(i64::from(prev_rel))
                ));
            }
        }
        previous = Some((timestamp, relative));
        let found = by_last_offset
            .binary_search_by_key(&offset, |&k| batches[k].last_offset)
            .ok()
            .map(|j| by_last_offset[j]);
        let Some(k) = found else {
            match batches
                .iter()
                .find(|b| (b.base_offset..=b.last_offset).contains(&offset))
            {
                Some(b) => fail(format!(
                    "offset {offset} is inside the batch at position {} (offsets {}..={}), \
                     not its last offset",
                    b.position, b.base_offset, b.last_offset
                )),
                None => fail(format!("offset {offset} is not in the log")),
            }
            continue;
        };
        let b = batches[k];
        if b.max_timestamp != timestamp {
            fail(format!(
                "timestamp {timestamp}, but the batch at position {} (last offset {offset}) has \
                 max timestamp {}",
                b.position, b.max_timestamp
            ));
        } else if max_so_far[k] != timestamp {
            fail(format!(
                "timestamp {timestamp} is not the segment's max timestamp up to offset {offset} \
                 ({})",
                max_so_far[k]
            ));
        }
    }
    out
}

/// Checks `.txnindex` entries against the batches of their `.log`. Each
/// entry is an aborted transaction whose ABORT marker is in this segment:
/// entries run in marker order, the batch at an entry's last offset is an
/// ABORT marker of its producer, and every ABORT marker whose transaction
/// has records in the segment has an entry. The first offset may lie in an earlier segment, or be gone
/// (compaction drops aborted records); a batch that does hold it is the
/// producer's first transactional batch of the transaction. Entries that
/// do not decode are skipped (the dump reports them).
pub fn verify_txn_index(entries: &[TxnIndexEntry], batches: &[BatchSpan]) -> Vec<IndexMismatch> {
    let holding = |offset: i64| {
        let k = batches.partition_point(|b| b.last_offset < offset);
        batches
            .get(k)
            .filter(|b| (b.base_offset..=b.last_offset).contains(&offset))
    };
    let mut out = Vec::new();
    let mut previous: Option<i64> = None;
    for (i, entry) in entries.iter().enumerate() {
        let Ok(t) = entry else { continue };
        let mut fail = |reason: String| out.push(IndexMismatch { entry: i, reason });
        if previous.is_some_and(|p| t.last_offset <= p) {
            fail(format!(
                "last offset {} does not increase on the entry before ({})",
                t.last_offset,
                previous.unwrap_or_default()
            ));
        }
        previous = Some(t.last_offset);
        if t.first_offset > t.last_offset {
            fail(format!(
                "first offset {} is after its last offset {}",
                t.first_offset, t.last_offset
            ));
        }
        match holding(t.last_offset) {
            None => fail(format!(
                "its ABORT marker at offset {} is not in the log",
                t.last_offset
            )),
            Some(b) => match b.marker {
                Some(m) if !m.commit && b.producer_id == t.producer_id => {}
                Some(m) if !m.commit => fail(format!(
                    "offset {} is an ABORT marker of producer {}, not {}",
                    t.last_offset, b.producer_id, t.producer_id
                )),
                Some(_) => fail(format!(
                    "offset {} is a COMMIT marker, not an ABORT",
                    t.last_offset
                )),
                None => fail(format!("offset {} is not a transaction marker", t.last_offset)),
            },
        }
        if let Some(b) = holding(t.first_offset) {
            if b.base_offset != t.first_offset || !b.transactional || b.marker.is_some() {
                fail(format!(
                    "first offset {} is not the start of a transactional batch",
                    t.first_offset
                ));
            } else if b.producer_id != t.producer_id {
                fail(format!(
                    "first offset {} is a batch of producer {}, not {}",
                    t.first_offset, b.producer_id, t.producer_id
                ));
            }
        }
    }
    // An ABORT marker needs an entry while this segment still holds records
    // of its transaction. Kafka's cleaner keeps a marker (until its delete
    // horizon) after dropping the aborted records, and writes no entry for
    // it then; a transaction begun in an earlier segment is not checked.
    let indexed: Vec<i64> = entries
        .iter()
        .filter_map(|e| e.as_ref().ok())
        .map(|t| t.last_offset)
        .collect();
    let mut with_records = std::collections::HashSet::new();
    for b in batches {
        let Some(marker) = b.marker else {
            if b.transactional {
                with_records.insert(b.producer_id);
            }
            continue;
        };
        let had_records = with_records.remove(&b.producer_id);
        if had_records && !marker.commit && !indexed.contains(&b.base_offset) {
            out.push(IndexMismatch {
                entry: entries.len(),
                reason: format!(
                    "the ABORT marker at offset {} (producer {}) has no entry",
                    b.base_offset, b.producer_id
                ),
            });
        }
    }
    out
}

/// The segment base offset a file name states: its stem, 20 decimal
/// digits in Keel's and Kafka's naming (any run of digits is taken).
pub fn base_offset_from_name(file_name: &str) -> Option<i64> {
    let stem = file_name.split('.').next()?;
    if stem.is_empty() || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

fn be_i32(buf: &[u8], at: usize) -> i32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    i32::from_be_bytes(b)
}

fn be_i64(buf: &[u8], at: usize) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    i64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{test_seed, BatchBuilder, TestRecord};
    use rand::{Rng, SeedableRng};

    /// Three batches at offsets 0..3, 3..5, 5; the second one lz4.
    fn segment() -> (Vec<u8>, Vec<usize>) {
        let batches = [
            BatchBuilder::new(1_000)
                .record(Some(b"a"), Some(b"1"))
                .record(None, Some(b"2"))
                .record(Some(b"c"), None)
                .build(),
            BatchBuilder::new(2_000)
                .base_offset(3)
                .producer(7, 1, 0)
                .push(TestRecord {
                    key: Some(b"k".to_vec()),
                    value: Some(b"v".to_vec()),
                    timestamp_delta_ms: 0,
                    headers: vec![("h1".into(), Some(b"x".to_vec())), ("h2".into(), None)],
                })
                .record(Some(b"d"), Some(b"4"))
                .compressed(crate::codec::Codec::Lz4)
                .build(),
            BatchBuilder::new(1_500)
                .base_offset(5)
                .record(Some(b"e"), Some(b"5"))
                .build(),
        ];
        let mut starts = Vec::new();
        let mut data = Vec::new();
        for b in &batches {
            starts.push(data.len());
            data.extend_from_slice(b);
        }
        (data, starts)
    }

    /// The walk as (kind, position, length): 'B' a sound batch, 'X' one
    /// whose CRC fails, 'C' a corrupt region.
    fn shape(data: &[u8]) -> Vec<(char, u64, u64)> {
        walk(data)
            .map(|f| match f {
                Found::Batch(b, _) => (if b.crc_valid() { 'B' } else { 'X' }, b.position, b.len()),
                Found::Corrupt(r) => ('C', r.position, r.length),
            })
            .collect()
    }

    fn reasons(data: &[u8]) -> Vec<String> {
        walk(data)
            .filter_map(|f| match f {
                Found::Corrupt(r) => Some(r.reason),
                Found::Batch(..) => None,
            })
            .collect()
    }

    #[test]
    fn a_sound_segment_is_all_batches() {
        let (data, s) = segment();
        let len = |i: usize| (s.get(i + 1).copied().unwrap_or(data.len()) - s[i]) as u64;
        assert_eq!(
            shape(&data),
            vec![
                ('B', 0, len(0)),
                ('B', s[1] as u64, len(1)),
                ('B', s[2] as u64, len(2))
            ]
        );
        assert!(shape(&[]).is_empty());
        assert_eq!(shape(&[1, 2, 3]), vec![('C', 0, 3)]);
    }

    #[test]
    fn a_flipped_byte_fails_its_batch_only() {
        let (mut data, s) = segment();
        data[s[1] + 70] ^= 0x10; // inside the lz4 records
        let got = shape(&data);
        assert_eq!(got.iter().map(|g| g.0).collect::<String>(), "BXB");
        assert_eq!(got[2].1, s[2] as u64);
    }

    #[test]
    fn a_bad_length_is_a_region_up_to_the_next_batch() {
        let (mut data, s) = segment();
        data[s[1] + 8..s[1] + 12].copy_from_slice(&5_000i32.to_be_bytes());
        let got = shape(&data);
        assert_eq!(
            got,
            vec![
                ('B', 0, s[1] as u64),
                ('C', s[1] as u64, (s[2] - s[1]) as u64),
                ('B', s[2] as u64, (data.len() - s[2]) as u64)
            ]
        );
        assert!(
            reasons(&data)[0].contains("runs past the end"),
            "{:?}",
            reasons(&data)
        );
    }

    #[test]
    fn a_truncated_tail_and_zeros_are_regions() {
        let (data, s) = segment();
        let cut = &data[..s[2] + 30];
        assert_eq!(shape(cut).last(), Some(&('C', s[2] as u64, 30)));
        let cut = &data[..s[2] - 5]; // the lz4 batch, header whole
        assert_eq!(
            shape(cut).last(),
            Some(&('C', s[1] as u64, (s[2] - 5 - s[1]) as u64))
        );
        assert!(reasons(cut)[0].starts_with("truncated"), "{:?}", reasons(cut));
        let mut zeros = data.clone();
        zeros.extend_from_slice(&[0; 100]);
        assert_eq!(shape(&zeros).last(), Some(&('C', data.len() as u64, 100)));
        assert!(reasons(&zeros)[0].starts_with("zero bytes"));
    }

    #[test]
    fn garbage_in_the_middle_is_skipped_to_the_next_batch() {
        let (data, s) = segment();
        let mut bad = data[..s[1]].to_vec();
        bad.extend_from_slice(&[0x02; 37]);
        bad.extend_from_slice(&data[s[1]..]);
        let got = shape(&bad);
        assert_eq!(got.iter().map(|g| g.0).collect::<String>(), "BCBB");
        assert_eq!(got[1], ('C', s[1] as u64, 37));
    }

    #[test]
    fn records_are_listed_with_positions_headers_and_control_types() {
        let (data, _) = segment();
        let mut seen = Vec::new();
        for f in walk(&data) {
            let Found::Batch(b, bytes) = f else {
                panic!("{f:?}")
            };
            visit_records(bytes, &b.header, b.position, |r| {
                seen.push((r.offset, r.key.map(<[u8]>::to_vec), r.headers.len(), r.position));
            })
            .unwrap();
        }
        assert_eq!(seen.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
        assert_eq!(seen[3].2, 2, "headers of the first lz4 record");
        assert_eq!(seen[3].3, None, "compressed records have no file position");
        assert_eq!(seen[0].3.map(|p| p.0), Some(61));
        assert_eq!(seen[5].3.map(|p| p.0 + p.1), Some(data.len() as u64));
        assert_eq!(seen[1].1, None);

        let marker = crate::marker::marker_batch(
            9,
            0,
            crate::marker::Marker {
                commit: false,
                coordinator_epoch: 0,
            },
            5,
        );
        let h = BatchHeader::parse(&marker).unwrap();
        let mut kinds = Vec::new();
        visit_records(&marker, &h, 0, |r| kinds.push(r.control_type)).unwrap();
        assert_eq!(kinds, [Some(0)]);
        assert_eq!(control_type_name(0), "ABORT");
    }

    #[test]
    fn index_files_end_at_the_first_zero_entry_after_the_first() {
        let mut img = Vec::new();
        for (rel, pos) in [(0i32, 0i32), (4, 120), (9, 300)] {
            img.extend_from_slice(&rel.to_be_bytes());
            img.extend_from_slice(&pos.to_be_bytes());
        }
        img.extend_from_slice(&[0; 8 * 5]);
        let e = read_offset_index(&img);
        assert_eq!(e.entries, vec![(0, 0), (4, 120), (9, 300)]);
        assert_eq!(
            (e.ignored_entries, e.ignored_all_zero, e.partial_bytes),
            (5, true, 0)
        );
        img.push(1);
        assert_eq!(read_offset_index(&img).partial_bytes, 1);
        let t = read_time_index(&[0u8; 12 * 3]);
        assert_eq!((t.entries.len(), t.ignored_entries), (1, 2));
    }

    #[test]
    fn index_checks_find_entries_that_disagree_with_the_log() {
        let (data, s) = segment();
        let spans: Vec<BatchSpan> = walk(&data)
            .filter_map(|f| match f {
                Found::Batch(b, bytes) => Some(BatchSpan::new(&b, bytes)),
                Found::Corrupt(_) => None,
            })
            .collect();
        let good = [(4, s[1] as i32), (5, s[2] as i32)];
        assert_eq!(verify_offset_index(&good, 0, &spans), vec![]);
        let wrong_offset = [(3, s[1] as i32), (5, s[2] as i32 + 1)];
        let m = verify_offset_index(&wrong_offset, 0, &spans);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(m[0].reason.contains("last offset is 4"), "{m:?}");
        assert!(m[1].reason.contains("not the start of a batch"), "{m:?}");
        assert_eq!(
            verify_offset_index(&[(5, s[2] as i32), (4, s[1] as i32)], 0, &spans).len(),
            1
        );

        // Max timestamps: 1002, 2001, 1500 → entries (2001, 4) only.
        assert_eq!(verify_time_index(&[(1002, 2), (2001, 4)], 0, &spans), vec![]);
        let m = verify_time_index(&[(1002, 2), (1500, 5)], 0, &spans);
        assert!(m[0].reason.contains("not the segment's max"), "{m:?}");
        let m = verify_time_index(&[(2001, 3), (2002, 9)], 0, &spans);
        assert!(m[0].reason.contains("not its last offset"), "{m:?}");
        assert!(m[1].reason.contains("not in the log"), "{m:?}");
        let m = verify_time_index(&[(2000, 4)], 0, &spans);
        assert!(m[0].reason.contains("has max timestamp 2001"), "{m:?}");
    }

    #[test]
    fn base_offsets_come_from_file_names() {
        assert_eq!(base_offset_from_name("00000000000000001234.log"), Some(1234));
        assert_eq!(base_offset_from_name("x.log"), None);
        assert_eq!(base_offset_from_name(".log"), None);
    }

    /// Random damage (flips, cuts, garbage, spliced copies) never panics,
    /// and the walk always accounts for every byte exactly once, in order.
    #[test]
    fn random_damage_never_panics_and_covers_the_file() {
        let seed = test_seed();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let (data, _) = segment();
        for round in 0..3_000 {
            let mut bad = data.clone();
            for _ in 0..rng.gen_range(1..4) {
                match rng.gen_range(0..4) {
                    0 => {
                        let at = rng.gen_range(0..bad.len());
                        bad[at] = rng.gen();
                    }
                    1 => bad.truncate(rng.gen_range(0..=bad.len())),
                    2 => {
                        let at = rng.gen_range(0..=bad.len());
                        let junk: Vec<u8> = (0..rng.gen_range(1..80)).map(|_| rng.gen()).collect();
                        bad.splice(at..at, junk);
                    }
                    _ => {
                        let from = rng.gen_range(0..data.len());
                        let to = rng.gen_range(from..=data.len());
                        let at = rng.gen_range(0..=bad.len());
                        bad.splice(at..at, data[from..to].iter().copied());
                    }
                }
                if bad.is_empty() {
                    break;
                }
            }
            let mut next = 0u64;
            for f in walk(&bad) {
                let (at, len) = match &f {
                    Found::Batch(b, bytes) => {
                        let _ = visit_records(bytes, &b.header, b.position, |_| {});
                        (b.position, b.len())
                    }
                    Found::Corrupt(r) => (r.position, r.length),
                };
                assert_eq!(at, next, "seed {seed} round {round}: gap or overlap");
                assert!(len > 0, "seed {seed} round {round}: empty item");
                next = at + len;
            }
            assert_eq!(next, bad.len() as u64, "seed {seed} round {round}");
            let _ = read_offset_index(&bad);
            let _ = read_time_index(&bad);
            let _ = read_txn_index(&bad);
        }
    }
}
