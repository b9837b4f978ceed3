//! Kafka record batch v2 ("magic 2") headers: parsing, validation, the two
//! fields the log rewrites (base offset and partition leader epoch), the
//! LogAppendTime rewrite (attributes, max timestamp, CRC) and a walk over the
//! record timestamps of uncompressed batches.
//!
//! The byte layout is drawn in `docs/format.md`. This module does no I/O and
//! never allocates from a number read off the wire: the only allocation is the
//! `Vec` of headers in [`validate_batches`], bounded by `buf.len() / 61`.

// Parsing code: bad bytes are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::fmt;

/// baseOffset (8) + batchLength (4): the bytes not counted by batchLength.
pub const BATCH_OVERHEAD: usize = 12;
/// Fixed header of a v2 batch, up to and including the records count.
pub const BATCH_HEADER_LEN: usize = 61;
/// The only batch format Keel stores.
pub const MAGIC_V2: i8 = 2;
/// Smallest legal batchLength: a header with no records.
pub const MIN_BATCH_LENGTH: i32 = (BATCH_HEADER_LEN - BATCH_OVERHEAD) as i32;
/// Kafka's "no timestamp" value.
pub const NO_TIMESTAMP: i64 = -1;

pub(crate) const LENGTH_AT: usize = 8;
const PARTITION_LEADER_EPOCH_AT: usize = 12;
const MAGIC_AT: usize = 16;
pub(crate) const CRC_AT: usize = 17;
/// The CRC covers everything from the attributes field to the end of the batch.
pub(crate) const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
pub(crate) const BASE_TIMESTAMP_AT: usize = 27;
pub(crate) const MAX_TIMESTAMP_AT: usize = 35;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
pub(crate) const RECORDS_COUNT_AT: usize = 57;

pub(crate) const COMPRESSION_MASK: i16 = 0x07;
const TIMESTAMP_TYPE_LOG_APPEND: i16 = 0x08;
pub(crate) const TRANSACTIONAL_FLAG: i16 = 0x10;
pub(crate) const CONTROL_FLAG: i16 = 0x20;

/// Why a buffer is not a valid sequence of v2 record batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// The buffer ends inside a batch header or body.
    Truncated,
    /// batchLength is below the 49-byte minimum.
    InvalidLength(i32),
    /// Only magic 2 is supported.
    UnsupportedMagic(i8),
    /// CRC-32C stored in the batch vs. computed over attributes..end.
    CrcMismatch { expected: u32, actual: u32 },
    /// lastOffsetDelta is negative.
    InvalidOffsetDelta(i32),
    /// The records count is negative.
    InvalidRecordCount(i32),
    /// No batch at all.
    Empty,
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::Truncated => write!(f, "record batch truncated"),
            BatchError::InvalidLength(len) => write!(f, "invalid record batch length {len}"),
            BatchError::UnsupportedMagic(m) => write!(f, "unsupported record batch magic {m}"),
            BatchError::CrcMismatch { expected, actual } => write!(
                f,
                "record batch CRC mismatch: stored {expected:#010x}, computed {actual:#010x}"
            ),
            BatchError::InvalidOffsetDelta(d) => write!(f, "invalid last offset delta {d}"),
            BatchError::InvalidRecordCount(n) => write!(f, "invalid records count {n}"),
            BatchError::Empty => write!(f, "no record batch"),
        }
    }
}

impl std::error::Error for BatchError {}

/// The 61-byte header of a v2 record batch, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Bytes after the batchLength field (total size minus [`BATCH_OVERHEAD`]).
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

impl BatchHeader {
    /// Decodes the header at the start of `buf`. Checks the magic, the
    /// minimum length, and the sign of lastOffsetDelta and records count; does
    /// NOT check that the whole batch is in `buf` nor the CRC (header-only
    /// readers use this; [`validate_batches`] does the full check).
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        if buf.len() < CRC_AT {
            return Err(BatchError::Truncated);
        }
        let magic = buf[MAGIC_AT] as i8;
        if magic != MAGIC_V2 {
            return Err(BatchError::UnsupportedMagic(magic));
        }
        let batch_length = be_i32(buf, LENGTH_AT);
        if batch_length < MIN_BATCH_LENGTH {
            return Err(BatchError::InvalidLength(batch_length));
        }
        if buf.len() < BATCH_HEADER_LEN {
            return Err(BatchError::Truncated);
        }
        let header = BatchHeader {
            base_offset: be_i64(buf, 0),
            batch_length,
            partition_leader_epoch: be_i32(buf, PARTITION_LEADER_EPOCH_AT),
            magic,
            crc: be_i32(buf, CRC_AT) as u32,
            attributes: be_i16(buf, ATTRIBUTES_AT),
            last_offset_delta: be_i32(buf, LAST_OFFSET_DELTA_AT),
            base_timestamp: be_i64(buf, BASE_TIMESTAMP_AT),
            max_timestamp: be_i64(buf, MAX_TIMESTAMP_AT),
            producer_id: be_i64(buf, PRODUCER_ID_AT),
            producer_epoch: be_i16(buf, PRODUCER_EPOCH_AT),
            base_sequence: be_i32(buf, BASE_SEQUENCE_AT),
            records_count: be_i32(buf, RECORDS_COUNT_AT),
        };
        if header.last_offset_delta < 0 {
            return Err(BatchError::InvalidOffsetDelta(header.last_offset_delta));
        }
        if header.records_count < 0 {
            return Err(BatchError::InvalidRecordCount(header.records_count));
        }
        Ok(header)
    }

    /// Size of the whole batch on disk / on the wire, in bytes.
    pub fn total_len(&self) -> usize {
        // batch_length >= MIN_BATCH_LENGTH > 0 is checked by `parse`.
        BATCH_OVERHEAD + self.batch_length as usize
    }

    /// Offset of the batch's last record (compaction may have removed records,
    /// so this is not always base + count - 1).
    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    /// 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
    pub fn compression_codec(&self) -> u8 {
        (self.attributes & COMPRESSION_MASK) as u8
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_FLAG != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_FLAG != 0
    }

    pub fn timestamp_type_is_log_append(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_LOG_APPEND != 0
    }

    /// Sequence number of the last record, wrapping past `i32::MAX` to 0 as
    /// Kafka's `DefaultRecordBatch.incrementSequence` does; -1 stays -1.
    pub fn last_sequence(&self) -> i32 {
        increment_sequence(self.base_sequence, self.last_offset_delta)
    }
}

/// Kafka's `DefaultRecordBatch.incrementSequence`.
pub fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    if sequence < 0 {
        return sequence;
    }
    if sequence > i32::MAX - increment {
        return increment - (i32::MAX - sequence) - 1;
    }
    sequence + increment
}

/// Validates `buf` as a concatenation of whole v2 batches (a Produce
/// request's records field) and returns their headers in order.
pub fn validate_batches(buf: &[u8]) -> Result<Vec<BatchHeader>, BatchError> {
    if buf.is_empty() {
        return Err(BatchError::Empty);
    }
    let mut headers = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        let header = BatchHeader::parse(rest)?;
        let total_len = header.total_len();
        let batch = rest.get(..total_len).ok_or(BatchError::Truncated)?;
        check_crc(batch, &header)?;
        headers.push(header);
        rest = &rest[total_len..];
    }
    Ok(headers)
}

/// Reads a zigzag varint (Kafka's `ByteUtils.readVarlong`) at `pos`,
/// advancing it; `None` if the buffer ends first or the varint is too long.
pub fn get_varlong(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut z: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    None
}

/// Checks the records of an uncompressed batch with [`validate_section`].
/// Compressed batches are not opened: `Ok` without a look (their section
/// must be decompressed and checked by the caller).
pub fn validate_records(batch: &[u8], header: &BatchHeader) -> Result<(), String> {
    if header.compression_codec() != 0 {
        return Ok(());
    }
    let body = batch
        .get(BATCH_HEADER_LEN..header.total_len())
        .ok_or("record batch truncated")?;
    validate_section(body, header)
}

/// Checks a batch's records section (decompressed when the batch is
/// compressed) as Kafka's `DefaultRecordBatch` iterator reads it: exactly
/// `records_count` records filling the section, with Kafka's messages when
/// they do not, each record's fields within its length, and offset deltas
/// 0, 1, 2, ... (what offsets consumers compute; Kafka stores an
/// uncompressed batch whose deltas are out of order as sent, and fails a
/// compressed one in its codec with UNKNOWN_SERVER_ERROR). The walk stops at the first fault, so its
/// cost is bounded by the section, whatever the header claims.
pub fn validate_section(section: &[u8], header: &BatchHeader) -> Result<(), String> {
    let declared = i64::from(header.records_count);
    let mut pos = 0usize;
    let mut count = 0i64;
    while pos < section.len() {
        if count == declared {
            return Err("Incorrect declared batch size, records still remaining in file".into());
        }
        let len = get_varlong(section, &mut pos).ok_or_else(|| format!("record {count}: bad length"))?;
        let len = usize::try_from(len).map_err(|_| format!("record {count}: negative length {len}"))?;
        let end = pos.checked_add(len).filter(|e| *e <= section.len());
        let end = end.ok_or_else(|| format!("record {count}: length {len} runs past the batch"))?;
        let record = &section[pos..end];
        check_record_fields(record, count).map_err(|why| format!("record {count}: {why}"))?;
        pos = end;
        count += 1;
    }
    if count < declared {
        return Err("Incorrect declared batch size, premature EOF reached".into());
    }
    Ok(())
}

/// One record's body: attributes, timestamp delta, offset delta (must be
/// `index`), key, value and headers, ending exactly at its end.
fn check_record_fields(record: &[u8], index: i64) -> Result<(), String> {
    let mut at = 1; // attributes
    if record.is_empty() {
        return Err("empty".into());
    }
    get_varlong(record, &mut at).ok_or("bad timestamp delta")?;
    let offset_delta = get_varlong(record, &mut at).ok_or("bad offset delta")?;
    if offset_delta != index {
        return Err(format!("offset delta {offset_delta}, expected {index}"));
    }
    skip_bytes(record, &mut at).ok_or("bad key")?;
    skip_bytes(record, &mut at).ok_or("bad value")?;
    let headers = get_varlong(record, &mut at).ok_or("bad header count")?;
    if headers < 0 {
        return Err(format!("negative header count {headers}"));
    }
    for _ in 0..headers {
        let key_len = get_varlong(record, &mut at).ok_or("bad header key")?;
        if key_len < 0 {
            return Err("null header key".into());
        }
        at = at
            .checked_add(key_len as usize)
            .filter(|a| *a <= record.len())
            .ok_or("bad header key")?;
        skip_bytes(record, &mut at).ok_or("bad header value")?;
    }
    if at != record.len() {
        return Err(format!("{} bytes left after its fields", record.len() - at));
    }
    Ok(())
}

/// Skips a varint-length-prefixed byte string (-1 = null).
fn skip_bytes(buf: &[u8], at: &mut usize) -> Option<()> {
    let len = get_varlong(buf, at)?;
    if len < -1 {
        return None;
    }
    if len > 0 {
        *at = at
            .checked_add(usize::try_from(len).ok()?)
            .filter(|a| *a <= buf.len())?;
    }
    Some(())
}

/// The first record of an uncompressed CreateTime batch whose timestamp is
/// at least `target_ms`, as `(offset, timestamp)`. `None` for a compressed
/// batch (its records are not readable without the codec), for a
/// LogAppendTime batch (every record's timestamp is the batch's max
/// timestamp, so the caller's batch-level answer is exact), or when no
/// record qualifies or the records are malformed.
pub fn first_record_at_or_after(batch: &[u8], header: &BatchHeader, target_ms: i64) -> Option<(i64, i64)> {
    if header.timestamp_type_is_log_append() {
        return None;
    }
    RecordTimestamps::new(batch, header)?
        .find(|r| r.timestamp_ms >= target_ms)
        .and_then(|r| Some((header.base_offset.checked_add(r.offset_delta)?, r.timestamp_ms)))
}

/// One record's position and CreateTime timestamp, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordTimestamp {
    /// Index of the record in its batch (Kafka's `batch_index`).
    pub index: i32,
    pub offset_delta: i64,
    pub timestamp_ms: i64,
}

/// The records of an uncompressed batch with their timestamps, in order.
/// Stops early at the first malformed record: the batch CRC was checked,
/// but the record framing inside it is the producer's.
pub struct RecordTimestamps<'a> {
    records: &'a [u8],
    pos: usize,
    index: i32,
    base_timestamp_ms: i64,
}

impl<'a> RecordTimestamps<'a> {
    /// `None` for a compressed batch or one shorter than its header says.
    pub fn new(batch: &'a [u8], header: &BatchHeader) -> Option<RecordTimestamps<'a>> {
        if header.compression_codec() != 0 {
            return None;
        }
        Some(RecordTimestamps {
            records: batch.get(BATCH_HEADER_LEN..header.total_len())?,
            pos: 0,
            index: 0,
            base_timestamp_ms: header.base_timestamp,
        })
    }
}

impl Iterator for RecordTimestamps<'_> {
    type Item = RecordTimestamp;

    fn next(&mut self) -> Option<RecordTimestamp> {
        let mut pos = self.pos;
        let len = usize::try_from(get_varlong(self.records, &mut pos)?).ok()?;
        let body = self.records.get(pos..pos.checked_add(len)?)?;
        let mut at = 1; // attributes byte, unused
        let timestamp_ms = self.base_timestamp_ms.checked_add(get_varlong(body, &mut at)?)?;
        let offset_delta = get_varlong(body, &mut at)?;
        let record = RecordTimestamp {
            index: self.index,
            offset_delta,
            timestamp_ms,
        };
        self.pos = pos + len;
        self.index = self.index.checked_add(1)?;
        Some(record)
    }
}

/// Checks the CRC-32C of one whole batch whose header is `header`.
pub fn check_crc(batch: &[u8], header: &BatchHeader) -> Result<(), BatchError> {
    let covered = batch
        .get(ATTRIBUTES_AT..header.total_len())
        .ok_or(BatchError::Truncated)?;
    let actual = crc32c::crc32c(covered);
    if actual != header.crc {
        return Err(BatchError::CrcMismatch {
            expected: header.crc,
            actual,
        });
    }
    Ok(())
}

/// Rewrites the baseOffset field. The CRC does not cover it, so the batch
/// stays valid.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    assert!(batch.len() >= BATCH_HEADER_LEN, "not a batch header");
    batch[..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Rewrites the partitionLeaderEpoch field (not covered by the CRC either).
pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
    assert!(batch.len() >= BATCH_HEADER_LEN, "not a batch header");
    batch[PARTITION_LEADER_EPOCH_AT..PARTITION_LEADER_EPOCH_AT + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Kafka's `setMaxTimestamp(LOG_APPEND_TIME, log_append_time_ms)` on one
/// whole batch: sets the timestamp-type attribute bit and the max
/// timestamp, and recomputes the CRC, which covers both. `header` is
/// updated to match. Record-level timestamps stay as produced; readers take
/// the max timestamp as every record's timestamp in such a batch.
pub fn set_log_append_time(batch: &mut [u8], header: &mut BatchHeader, log_append_time_ms: i64) {
    let end = header.total_len();
    assert!(batch.len() >= end, "not a whole batch");
    header.attributes |= TIMESTAMP_TYPE_LOG_APPEND;
    header.max_timestamp = log_append_time_ms;
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&header.attributes.to_be_bytes());
    batch[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&log_append_time_ms.to_be_bytes());
    header.crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..end]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&header.crc.to_be_bytes());
}

/// Copies N bytes at `at`. Callers check the length first, so the slice
/// index cannot fail on valid use; it is an in-memory invariant.
fn array_at<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

fn be_i16(buf: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(array_at(buf, at))
}

fn be_i32(buf: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(array_at(buf, at))
}

fn be_i64(buf: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(array_at(buf, at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::BatchBuilder;
    use rand::{Rng, RngCore, SeedableRng};

    fn sample() -> Vec<u8> {
        BatchBuilder::new(1_000)
            .producer(7, 3, 40)
            .record(Some(b"k1"), Some(b"value-1"))
            .record(None, Some(b"v2"))
            .record(Some(b"k3"), None)
            .build()
    }

    #[test]
    fn parses_valid_batch() {
        let batch = sample();
        let headers = validate_batches(&batch).expect("valid");
        assert_eq!(headers.len(), 1);
        let h = headers[0];
        assert_eq!(h.total_len(), batch.len());
        assert_eq!(h.magic, 2);
        assert_eq!(h.records_count, 3);
        assert_eq!(h.last_offset_delta, 2);
        assert_eq!(h.producer_id, 7);
        assert_eq!(h.producer_epoch, 3);
        assert_eq!(h.base_sequence, 40);
        assert_eq!(h.last_sequence(), 42);
        assert_eq!(h.base_timestamp, 1_000);
        assert_eq!(h.max_timestamp, 1_002);
        assert_eq!(h.compression_codec(), 0);
        assert!(!h.is_transactional() && !h.is_control());
        assert!(!h.timestamp_type_is_log_append());
    }

    #[test]
    fn parses_concatenated_batches() {
        let mut buf = sample();
        buf.extend_from_slice(&BatchBuilder::new(5).record(None, Some(b"x")).build());
        let headers = validate_batches(&buf).expect("valid");
        assert_eq!(headers.len(), 2);
        assert_eq!(headers[1].records_count, 1);
    }

    #[test]
    fn detects_crc_mismatch_anywhere_covered() {
        let batch = sample();
        for at in ATTRIBUTES_AT..batch.len() {
            let mut bad = batch.clone();
            bad[at] ^= 0x40;
            match validate_batches(&bad) {
                Err(BatchError::CrcMismatch { .. })
                | Err(BatchError::InvalidOffsetDelta(_))
                | Err(BatchError::InvalidRecordCount(_)) => {}
                other => panic!("flip at {at}: {other:?}"),
            }
        }
    }

    #[test]
    fn rewritten_fields_keep_crc_valid() {
        let mut batch = sample();
        set_base_offset(&mut batch, 123_456);
        set_partition_leader_epoch(&mut batch, 9);
        let h = validate_batches(&batch).expect("still valid")[0];
        assert_eq!(h.base_offset, 123_456);
        assert_eq!(h.last_offset(), 123_458);
        assert_eq!(h.partition_leader_epoch, 9);
    }

    #[test]
    fn detects_truncation() {
        let batch = sample();
        for len in 1..batch.len() {
            assert_eq!(validate_batches(&batch[..len]), Err(BatchError::Truncated));
        }
        let mut two = batch.clone();
        two.extend_from_slice(&batch[..30]);
        assert_eq!(validate_batches(&two), Err(BatchError::Truncated));
        assert_eq!(validate_batches(&[]), Err(BatchError::Empty));
    }

    #[test]
    fn rejects_bad_magic() {
        for magic in [0u8, 1, 3, 0xff] {
            let mut batch = sample();
            batch[MAGIC_AT] = magic;
            assert_eq!(
                validate_batches(&batch),
                Err(BatchError::UnsupportedMagic(magic as i8))
            );
        }
    }

    #[test]
    fn rejects_bad_lengths() {
        for len in [-1i32, i32::MIN, 0, 48] {
            let mut batch = sample();
            batch[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&len.to_be_bytes());
            assert_eq!(validate_batches(&batch), Err(BatchError::InvalidLength(len)));
        }
        let mut huge = sample();
        huge[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(validate_batches(&huge), Err(BatchError::Truncated));
    }

    #[test]
    fn records_are_checked_like_kafka_reads_them() {
        let batch = sample();
        let h = BatchHeader::parse(&batch).unwrap();
        assert_eq!(validate_records(&batch, &h), Ok(()));
        // A count the records do not match.
        let mut lying = h;
        lying.records_count = 2;
        assert_eq!(
            validate_records(&batch, &lying).unwrap_err(),
            "Incorrect declared batch size, records still remaining in file"
        );
        lying.records_count = 4;
        assert_eq!(
            validate_records(&batch, &lying).unwrap_err(),
            "Incorrect declared batch size, premature EOF reached"
        );
        // A record length that runs past the batch, anywhere.
        for at in BATCH_HEADER_LEN..batch.len() {
            let mut bad = batch.clone();
            bad[at] = 0x7f;
            let _ = validate_records(&bad, &h); // never panics
        }
        let mut bad = batch.clone();
        bad[BATCH_HEADER_LEN] = 0x7e; // first record claims 63 bytes
        assert!(validate_records(&bad, &h).is_err());
    }

    #[test]
    fn sequence_wraps_like_kafka() {
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
        assert_eq!(increment_sequence(-1, 5), -1);
        assert_eq!(increment_sequence(10, 0), 10);
    }

    #[test]
    fn never_panics_on_random_bytes() {
        let seed = crate::testing::test_seed();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let valid = sample();
        for _ in 0..20_000 {
            let len = rng.gen_range(0..200);
            let mut buf = vec![0u8; len];
            rng.fill_bytes(&mut buf);
            if rng.gen_bool(0.5) && len >= 17 {
                // Make the interesting paths reachable: valid magic and a
                // plausible length, or a mutated valid batch.
                buf[MAGIC_AT] = 2;
                if rng.gen_bool(0.5) {
                    buf = valid.clone();
                    let at = rng.gen_range(0..buf.len());
                    buf[at] = rng.gen();
                    buf.truncate(rng.gen_range(0..=buf.len()));
                }
            }
            let _ = validate_batches(&buf);
            let _ = BatchHeader::parse(&buf);
        }
    }
}

#[cfg(test)]
mod timestamp_tests {
    use super::*;
    use crate::testing::{BatchBuilder, TestRecord};

    #[test]
    fn finds_the_exact_record_in_uncompressed_batches() {
        let mut b = BatchBuilder::new(1000).base_offset(50);
        for i in 0..5u8 {
            b = b.record(Some(&[i]), Some(b"v"));
        }
        let bytes = b.build();
        let h = BatchHeader::parse(&bytes).unwrap();
        // Record i has timestamp 1000 + i.
        assert_eq!(first_record_at_or_after(&bytes, &h, 0), Some((50, 1000)));
        assert_eq!(first_record_at_or_after(&bytes, &h, 1003), Some((53, 1003)));
        assert_eq!(first_record_at_or_after(&bytes, &h, 1005), None);
        assert_eq!(first_record_at_or_after(&bytes[..70], &h, 1003), None);
    }

    #[test]
    fn record_timestamps_follow_the_deltas() {
        let bytes = BatchBuilder::new(5_000)
            .push(TestRecord {
                key: None,
                value: Some(b"a".to_vec()),
                timestamp_delta_ms: 7,
                headers: Vec::new(),
            })
            .push(TestRecord {
                key: None,
                value: None,
                timestamp_delta_ms: -3,
                headers: Vec::new(),
            })
            .build();
        let h = BatchHeader::parse(&bytes).unwrap();
        let got: Vec<_> = RecordTimestamps::new(&bytes, &h).unwrap().collect();
        assert_eq!(
            got,
            vec![
                RecordTimestamp {
                    index: 0,
                    offset_delta: 0,
                    timestamp_ms: 5_007
                },
                RecordTimestamp {
                    index: 1,
                    offset_delta: 1,
                    timestamp_ms: 4_997
                },
            ]
        );
        // A truncated record ends the walk instead of panicking.
        let mut short = bytes.clone();
        short.truncate(bytes.len() - 2);
        assert_eq!(RecordTimestamps::new(&short, &h).map(Iterator::count), None);
        let mut cut = h;
        cut.batch_length -= 2;
        assert_eq!(RecordTimestamps::new(&short, &cut).unwrap().count(), 1);
    }

    #[test]
    fn log_append_time_rewrite_keeps_the_batch_valid() {
        for codec_bits in [0i16, 4] {
            let mut bytes = BatchBuilder::new(1_000)
                .producer(9, 1, 100)
                .record(Some(b"k"), Some(b"v1"))
                .record(None, Some(b"v2"))
                .build();
            // A codec in the attributes (the records are opaque here) must
            // survive the rewrite; re-sign the batch after setting it.
            bytes[ATTRIBUTES_AT + 1] |= codec_bits as u8;
            let crc = crc32c::crc32c(&bytes[ATTRIBUTES_AT..]);
            bytes[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
            let before = bytes.clone();
            let mut h = validate_batches(&bytes).unwrap()[0];

            set_log_append_time(&mut bytes, &mut h, 1_795_000_000_123);

            let reparsed = validate_batches(&bytes).expect("CRC valid after the rewrite")[0];
            assert_eq!(reparsed, h, "returned header matches the bytes");
            assert!(h.timestamp_type_is_log_append());
            assert_eq!(h.max_timestamp, 1_795_000_000_123);
            assert_eq!(h.base_timestamp, 1_000);
            assert_eq!(h.compression_codec(), codec_bits as u8);
            assert_eq!((h.producer_id, h.base_sequence, h.records_count), (9, 100, 2));
            // Only attributes, max timestamp and CRC changed.
            for (at, (a, b)) in before.iter().zip(&bytes).enumerate() {
                let rewritten = (CRC_AT..CRC_AT + 4).contains(&at)
                    || (ATTRIBUTES_AT..ATTRIBUTES_AT + 2).contains(&at)
                    || (MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8).contains(&at);
                assert!(rewritten || a == b, "byte {at} changed");
            }
            // Timestamp lookups answer at batch level for such a batch.
            assert_eq!(first_record_at_or_after(&bytes, &h, 0), None);
        }
    }
}
