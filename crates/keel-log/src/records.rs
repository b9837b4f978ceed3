//! The records inside a v2 batch: a reader that walks them (keys, values,
//! offset and timestamp deltas), through the batch's codec when it is
//! compressed, and a builder that writes a batch holding some of them, in
//! the same codec, as the cleaner rewrites batches.
//!
//! Kafka's `DefaultRecord` layout, all integers zigzag varints:
//! `length, attributes (int8), timestampDelta, offsetDelta, keyLength, key,
//! valueLength, value, headerCount, headers`; a length of -1 is null.

// Parsing code: bad bytes are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::borrow::Cow;
use std::io;

use crate::batch::{
    get_varlong, BatchHeader, ATTRIBUTES_AT, BASE_TIMESTAMP_AT, BATCH_HEADER_LEN, BATCH_OVERHEAD,
    COMPRESSION_MASK, CRC_AT, LENGTH_AT, MAX_TIMESTAMP_AT, RECORDS_COUNT_AT,
};
use crate::codec::{Codec, MAX_DECOMPRESSED_BYTES};

/// One record of a batch, borrowed from the batch's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub timestamp_delta: i64,
    pub offset_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// The record's bytes after its length prefix (attributes..headers).
    pub body: &'a [u8],
    /// Where the fields after the offset delta start within `body`.
    key_at: usize,
}

/// One record header: its key and its value (`None`: null).
pub type Header<'a> = (&'a [u8], Option<&'a [u8]>);

impl<'a> Record<'a> {
    /// A record with a null value: Kafka's tombstone.
    pub fn is_tombstone(&self) -> bool {
        self.value.is_none()
    }

    /// The record's headers, in order, as (key, value) pairs. The count is
    /// read off the record, so the `Vec` is bounded by the record's size
    /// (a header takes at least two bytes).
    pub fn headers(&self) -> Result<Vec<Header<'a>>, String> {
        let body = self.body;
        let mut at = self.key_at;
        bytes_field(body, &mut at).ok_or("bad key")?;
        bytes_field(body, &mut at).ok_or("bad value")?;
        let count = get_varlong(body, &mut at).ok_or("bad header count")?;
        let count = usize::try_from(count).map_err(|_| format!("negative header count {count}"))?;
        let mut headers = Vec::with_capacity(count.min(body.len() / 2));
        for i in 0..count {
            let key = bytes_field(body, &mut at)
                .flatten()
                .ok_or_else(|| format!("header {i}: bad key"))?;
            let value = bytes_field(body, &mut at).ok_or_else(|| format!("header {i}: bad value"))?;
            headers.push((key, value));
        }
        Ok(headers)
    }
}

/// Walks the records of a records section (see [`records_section`]).
/// Stops at the first malformed record with an error.
pub struct Records<'a> {
    body: &'a [u8],
    at: usize,
    index: usize,
}

/// The records section of `batch` (the bytes after its header),
/// decompressed when the batch is compressed: at most
/// [`MAX_DECOMPRESSED_BYTES`].
pub fn records_section<'a>(batch: &'a [u8], header: &BatchHeader) -> Result<Cow<'a, [u8]>, String> {
    open_section(batch, header).map_err(|e| e.to_string())
}

/// Why a batch's records section cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SectionError {
    /// The records decompress to more than `limit_bytes`.
    TooLarge { codec: Codec, limit_bytes: usize },
    /// Truncated, an unknown codec, or compressed data that does not decode.
    Unreadable(String),
}

impl std::fmt::Display for SectionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SectionError::TooLarge { codec, limit_bytes } => write!(
                f,
                "{} batch: records decompress to more than {limit_bytes} bytes",
                codec.name()
            ),
            SectionError::Unreadable(why) => f.write_str(why),
        }
    }
}

/// [`records_section`], telling a batch that inflates past
/// [`MAX_DECOMPRESSED_BYTES`] from one that cannot be read.
pub fn open_section<'a>(batch: &'a [u8], header: &BatchHeader) -> Result<Cow<'a, [u8]>, SectionError> {
    let raw = batch
        .get(BATCH_HEADER_LEN..header.total_len())
        .ok_or_else(|| SectionError::Unreadable("record batch truncated".into()))?;
    match codec_of(header).map_err(SectionError::Unreadable)? {
        Codec::None => Ok(Cow::Borrowed(raw)),
        codec => codec
            .decompress(raw, MAX_DECOMPRESSED_BYTES)
            .map(Cow::Owned)
            .map_err(|e| match crate::codec::is_too_large(&e) {
                true => SectionError::TooLarge {
                    codec,
                    limit_bytes: MAX_DECOMPRESSED_BYTES,
                },
                false => SectionError::Unreadable(format!("{} batch: {e}", codec.name())),
            }),
    }
}

/// The codec a batch's attributes name, or why they name none.
pub fn codec_of(header: &BatchHeader) -> Result<Codec, String> {
    Codec::from_id(header.compression_codec())
        .ok_or_else(|| format!("unknown compression codec {}", header.compression_codec()))
}

/// The records of a records section.
pub fn records_in(section: &[u8]) -> Records<'_> {
    Records {
        body: section,
        at: 0,
        index: 0,
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.body.len() {
            return None;
        }
        let index = self.index;
        self.index += 1;
        let result = self.read_one().map_err(|why| format!("record {index}: {why}"));
        if result.is_err() {
            self.at = self.body.len();
        }
        Some(result)
    }
}

impl<'a> Records<'a> {
    /// Where the next record (its length prefix) starts in the records
    /// section: for an uncompressed batch, its file position minus the
    /// batch's position and header length.
    pub fn position(&self) -> usize {
        self.at
    }

    fn read_one(&mut self) -> Result<Record<'a>, String> {
        let len = get_varlong(self.body, &mut self.at).ok_or("bad length")?;
        let len = usize::try_from(len).map_err(|_| format!("negative length {len}"))?;
        let end = self
            .at
            .checked_add(len)
            .filter(|e| *e <= self.body.len())
            .ok_or_else(|| format!("length {len} runs past the batch"))?;
        let body = &self.body[self.at..end];
        self.at = end;
        if body.is_empty() {
            return Err("empty".into());
        }
        let mut at = 1; // attributes
        let timestamp_delta = get_varlong(body, &mut at).ok_or("bad timestamp delta")?;
        let offset_delta = get_varlong(body, &mut at).ok_or("bad offset delta")?;
        let key_at = at;
        let key = bytes_field(body, &mut at).ok_or("bad key")?;
        let value = bytes_field(body, &mut at).ok_or("bad value")?;
        Ok(Record {
            timestamp_delta,
            offset_delta,
            key,
            value,
            body,
            key_at,
        })
    }
}

/// A varint-length-prefixed byte string (-1 = null).
fn bytes_field<'a>(buf: &'a [u8], at: &mut usize) -> Option<Option<&'a [u8]>> {
    let len = get_varlong(buf, at)?;
    if len == -1 {
        return Some(None);
    }
    let len = usize::try_from(len).ok()?;
    let end = at.checked_add(len).filter(|e| *e <= buf.len())?;
    let field = &buf[*at..end];
    *at = end;
    Some(Some(field))
}

/// Appends `value` as a zigzag varlong.
pub(crate) fn put_varlong(out: &mut Vec<u8>, value: i64) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Writes `record` into `out` with its timestamp delta re-based by
/// `rebase` (the old base timestamp minus the new one), length prefix
/// included.
pub(crate) fn write_record(out: &mut Vec<u8>, record: &Record<'_>, rebase: i64) {
    let mut body = Vec::with_capacity(record.body.len() + 10);
    body.push(record.body[0]);
    put_varlong(&mut body, record.timestamp_delta.saturating_add(rebase));
    put_varlong(&mut body, record.offset_delta);
    body.extend_from_slice(&record.body[record.key_at..]);
    put_varlong(out, body.len() as i64);
    out.extend_from_slice(&body);
}

/// Batch attribute bit: the base timestamp holds the delete horizon
/// (KIP-534): tombstones in the batch may go once it has passed.
pub const DELETE_HORIZON_FLAG: i16 = 0x40;

/// Writes a batch that keeps `original`'s offsets (base offset and last
/// offset delta), producer fields and leader epoch, holding only `kept`
/// (records of `original`, in order). With `horizon`, the batch is marked
/// with that delete horizon (its base timestamp, the record timestamp
/// deltas re-based to it). The records are compressed with the batch's own
/// codec. An empty `kept` gives Kafka's empty batch: header only,
/// uncompressed, base and max timestamp the original max timestamp.
pub(crate) fn rebuild_batch(
    original: &[u8],
    header: &BatchHeader,
    kept: &[Record<'_>],
    horizon: Option<i64>,
) -> io::Result<Vec<u8>> {
    let codec = codec_of(header).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let log_append = header.timestamp_type_is_log_append();
    let mut attributes = header.attributes;
    let mut base_timestamp = header.base_timestamp;
    let mut max_timestamp = header.max_timestamp;
    let mut rebase = 0i64;
    if kept.is_empty() {
        base_timestamp = header.max_timestamp;
        attributes &= !COMPRESSION_MASK;
    } else {
        if !log_append {
            max_timestamp = kept
                .iter()
                .map(|r| header.base_timestamp.saturating_add(r.timestamp_delta))
                .max()
                .unwrap_or(header.max_timestamp);
        }
        if let Some(horizon) = horizon {
            attributes |= DELETE_HORIZON_FLAG;
            rebase = header.base_timestamp.saturating_sub(horizon);
            base_timestamp = horizon;
        }
    }
    let mut out = Vec::with_capacity(original.len());
    out.extend_from_slice(&original[..BATCH_HEADER_LEN]);
    if codec == Codec::None || kept.is_empty() {
        for r in kept {
            write_record(&mut out, r, rebase);
        }
    } else {
        let mut section = Vec::with_capacity(kept.iter().map(|r| r.body.len() + 5).sum());
        for r in kept {
            write_record(&mut section, r, rebase);
        }
        out.extend_from_slice(&codec.compress(&section)?);
    }
    let batch_length = (out.len() - BATCH_OVERHEAD) as i32;
    out[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&batch_length.to_be_bytes());
    out[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    out[BASE_TIMESTAMP_AT..BASE_TIMESTAMP_AT + 8].copy_from_slice(&base_timestamp.to_be_bytes());
    out[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&max_timestamp.to_be_bytes());
    out[RECORDS_COUNT_AT..RECORDS_COUNT_AT + 4].copy_from_slice(&(kept.len() as i32).to_be_bytes());
    let crc = crc32c::crc32c(&out[ATTRIBUTES_AT..]);
    out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// `batch` with its records in `target`'s codec, compressed at `level`
/// (see [`Codec::compress_at`]): Kafka's recompression of a batch whose
/// codec is not its topic's `compression.type`. The records are checked
/// as they are unpacked (count, fields, offset deltas), as Kafka's
/// `LogValidator` does when it opens a batch; offsets, producer fields,
/// timestamps and records stay as they are, and the codec bits, length and
/// CRC are rewritten.
pub fn recompress_batch(
    batch: &[u8],
    header: &BatchHeader,
    target: Codec,
    level: Option<i32>,
) -> Result<Vec<u8>, String> {
    let section = records_section(batch, header)?;
    recompress_section(batch, header, &section, target, level)
}

/// [`recompress_batch`] from the batch's records section, already
/// decompressed by the caller (see [`open_section`]), so that a batch is
/// decompressed once however many checks read it.
pub fn recompress_section(
    batch: &[u8],
    header: &BatchHeader,
    section: &[u8],
    target: Codec,
    level: Option<i32>,
) -> Result<Vec<u8>, String> {
    let attributes = (header.attributes & !COMPRESSION_MASK) | target as i16;
    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + section.len());
    out.extend_from_slice(&batch[..BATCH_HEADER_LEN]);
    out[ATTRIBUTES_AT..ATTRIBUTES_AT + 2]
        .copy_from_slice(&(header.attributes & !COMPRESSION_MASK).to_be_bytes());
    out.extend_from_slice(section);
    let plain_length = (out.len() - BATCH_OVERHEAD) as i32;
    out[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&plain_length.to_be_bytes());
    let plain = BatchHeader::parse(&out).map_err(|e| e.to_string())?;
    crate::batch::validate_records(&out, &plain)?;
    if target != Codec::None {
        let body = target
            .compress_at(section, level)
            .map_err(|e| format!("{} compression: {e}", target.name()))?;
        out.truncate(BATCH_HEADER_LEN);
        out.extend_from_slice(&body);
    }
    let batch_length = (out.len() - BATCH_OVERHEAD) as i32;
    out[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&batch_length.to_be_bytes());
    out[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    let crc = crc32c::crc32c(&out[ATTRIBUTES_AT..]);
    out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// The delete horizon a batch carries, if any (KIP-534).
pub fn delete_horizon(header: &BatchHeader) -> Option<i64> {
    (header.attributes & DELETE_HORIZON_FLAG != 0).then_some(header.base_timestamp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::validate_batches;
    use crate::testing::BatchBuilder;

    /// Every record of an uncompressed `batch`.
    fn records_of<'a>(batch: &'a [u8], h: &BatchHeader) -> Vec<Record<'a>> {
        let body = &batch[BATCH_HEADER_LEN..h.total_len()];
        records_in(body).map(Result::unwrap).collect()
    }

    #[test]
    fn reads_keys_values_and_tombstones() {
        let batch = BatchBuilder::new(0)
            .record(Some(b"a"), Some(b"1"))
            .record(None, Some(b"2"))
            .record(Some(b"c"), None)
            .build();
        let h = validate_batches(&batch).unwrap()[0];
        let all = records_of(&batch, &h);
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].key, Some(&b"a"[..]));
        assert_eq!(all[1].key, None);
        assert!(all[2].is_tombstone());
        assert_eq!(all[2].offset_delta, 2);
    }

    #[test]
    fn compressed_batches_are_read_through_their_codec() {
        for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            let batch = BatchBuilder::new(0)
                .record(Some(b"a"), Some(b"1"))
                .record(None, Some(b"2"))
                .compressed(codec)
                .build();
            let h = validate_batches(&batch).unwrap()[0];
            assert_eq!(h.compression_codec(), codec as u8);
            let section = records_section(&batch, &h).unwrap();
            let all: Vec<Record> = records_in(&section).map(Result::unwrap).collect();
            assert_eq!(all[0].value, Some(&b"1"[..]), "{}", codec.name());
            assert_eq!(all[1].key, None, "{}", codec.name());
        }
        // Damage inside the compressed bytes (CRC made right again) is an
        // error, as is a codec id Kafka does not define.
        let mut batch = BatchBuilder::new(0)
            .record(Some(b"a"), Some(b"1"))
            .compressed(Codec::Zstd)
            .build();
        batch[BATCH_HEADER_LEN] ^= 0xff; // the zstd frame's magic
        let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
        batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        let h = validate_batches(&batch).unwrap()[0];
        assert!(records_section(&batch, &h).unwrap_err().contains("zstd"));
        batch[ATTRIBUTES_AT + 1] |= 0x07;
        let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
        batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        let h = validate_batches(&batch).unwrap()[0];
        assert_eq!(
            records_section(&batch, &h).unwrap_err(),
            "unknown compression codec 7"
        );
    }

    #[test]
    fn recompression_changes_only_the_codec_length_and_crc() {
        let codecs = [Codec::None, Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd];
        for from in codecs {
            for to in codecs {
                let batch = BatchBuilder::new(7_000)
                    .base_offset(42)
                    .producer(9, 2, 17)
                    .transactional(true)
                    .record(Some(b"k1"), Some(b"v1"))
                    .record(None, Some(b"v2"))
                    .record(Some(b"k3"), None)
                    .compressed(from)
                    .build();
                let h = validate_batches(&batch).unwrap()[0];
                let level = to.level_range().map(|r| *r.start());
                let out = recompress_batch(&batch, &h, to, level).unwrap();
                // validate_batches checks the new CRC and, when the result
                // is uncompressed, its records.
                let nh = validate_batches(&out).unwrap()[0];
                let case = format!("{} -> {}", from.name(), to.name());
                assert_eq!(nh.compression_codec(), to as u8, "{case}");
                assert_eq!(
                    nh.attributes & !COMPRESSION_MASK,
                    h.attributes & !COMPRESSION_MASK,
                    "{case}"
                );
                assert_eq!(
                    (
                        nh.base_offset,
                        nh.producer_id,
                        nh.producer_epoch,
                        nh.base_sequence
                    ),
                    (42, 9, 2, 17),
                    "{case}"
                );
                assert_eq!(
                    (nh.base_timestamp, nh.max_timestamp, nh.records_count),
                    (h.base_timestamp, h.max_timestamp, 3)
                );
                assert_eq!(
                    records_section(&out, &nh).unwrap(),
                    records_section(&batch, &h).unwrap(),
                    "{case}"
                );
            }
        }
    }

    #[test]
    fn recompression_refuses_records_that_do_not_match_the_header() {
        let mut batch = BatchBuilder::new(0)
            .record(Some(b"a"), Some(b"1"))
            .record(Some(b"b"), Some(b"2"))
            .compressed(Codec::Gzip)
            .build();
        // The header claims one record more than the compressed section holds.
        batch[RECORDS_COUNT_AT..RECORDS_COUNT_AT + 4].copy_from_slice(&3i32.to_be_bytes());
        batch[23..27].copy_from_slice(&2i32.to_be_bytes()); // last offset delta
        let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
        batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        let h = validate_batches(&batch).unwrap()[0];
        let why = recompress_batch(&batch, &h, Codec::Zstd, None).unwrap_err();
        assert_eq!(why, "Incorrect declared batch size, premature EOF reached");
    }

    #[test]
    fn a_rebuilt_compressed_batch_keeps_its_codec_and_an_empty_one_drops_it() {
        let batch = BatchBuilder::new(5_000)
            .base_offset(10)
            .record(Some(b"a"), Some(b"1"))
            .record(Some(b"b"), Some(b"2"))
            .record(Some(b"c"), Some(b"3"))
            .compressed(Codec::Lz4)
            .build();
        let h = validate_batches(&batch).unwrap()[0];
        let section = records_section(&batch, &h).unwrap();
        let all: Vec<Record> = records_in(&section).map(Result::unwrap).collect();
        let out = rebuild_batch(&batch, &h, &[all[0], all[2]], None).unwrap();
        let nh = validate_batches(&out).unwrap()[0];
        assert_eq!(nh.compression_codec(), Codec::Lz4 as u8);
        assert_eq!((nh.base_offset, nh.last_offset(), nh.records_count), (10, 12, 2));
        let section = records_section(&out, &nh).unwrap();
        let kept: Vec<Record> = records_in(&section).map(Result::unwrap).collect();
        assert_eq!(
            kept.iter().map(|r| (r.offset_delta, r.key)).collect::<Vec<_>>(),
            [(0, Some(&b"a"[..])), (2, Some(&b"c"[..]))]
        );
        let empty = rebuild_batch(&batch, &h, &[], None).unwrap();
        let eh = validate_batches(&empty).unwrap()[0];
        assert_eq!(
            (eh.compression_codec(), eh.records_count, eh.total_len()),
            (0, 0, 61)
        );
    }

    #[test]
    fn varlongs_round_trip() {
        for v in [0i64, 1, -1, 63, -64, 64, 300, -300, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            put_varlong(&mut out, v);
            let mut at = 0;
            assert_eq!(get_varlong(&out, &mut at), Some(v));
            assert_eq!(at, out.len());
        }
    }

    #[test]
    fn rebuilt_batches_keep_offsets_and_timestamps() {
        let batch = BatchBuilder::new(1_000)
            .base_offset(40)
            .producer(7, 1, 3)
            .record(Some(b"a"), Some(b"1"))
            .record(Some(b"b"), None)
            .record(Some(b"c"), Some(b"3"))
            .build();
        let h = validate_batches(&batch).unwrap()[0];
        let all = records_of(&batch, &h);
        let kept = [all[1]];
        let out = rebuild_batch(&batch, &h, &kept, Some(90_000)).unwrap();
        let nh = validate_batches(&out).unwrap()[0];
        assert_eq!((nh.base_offset, nh.last_offset(), nh.records_count), (40, 42, 1));
        assert_eq!((nh.producer_id, nh.base_sequence), (7, 3));
        assert_eq!(delete_horizon(&nh), Some(90_000));
        assert_eq!(nh.max_timestamp, 1_001);
        let r = records_of(&out, &nh);
        assert_eq!(r[0].offset_delta, 1);
        assert_eq!(
            nh.base_timestamp + r[0].timestamp_delta,
            1_001,
            "the record keeps its timestamp"
        );
        assert!(r[0].is_tombstone());
        let empty = rebuild_batch(&batch, &h, &[], None).unwrap();
        let eh = validate_batches(&empty).unwrap()[0];
        assert_eq!(
            (eh.records_count, eh.last_offset(), eh.base_timestamp),
            (0, 42, 1_002)
        );
        assert!(records_of(&empty, &eh).is_empty());
    }
}
