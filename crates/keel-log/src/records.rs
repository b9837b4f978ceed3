//! The records inside an uncompressed v2 batch: a reader that walks them
//! (keys, values, offset and timestamp deltas).
//!
//! Kafka's `DefaultRecord` layout, all integers zigzag varints:
//! `length, attributes (int8), timestampDelta, offsetDelta, keyLength, key,
//! valueLength, value, headerCount, headers`; a length of -1 is null.

// Parsing code: bad bytes are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use crate::batch::{get_varlong, BatchHeader, BATCH_HEADER_LEN};

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

impl Record<'_> {
    /// A record with a null value: Kafka's tombstone.
    pub fn is_tombstone(&self) -> bool {
        self.value.is_none()
    }
}

/// Walks the records of an uncompressed batch (`batch` is the whole batch,
/// header included). Stops at the first malformed record with an error.
pub struct Records<'a> {
    body: &'a [u8],
    at: usize,
    index: usize,
}

/// The records of `batch`; `None` for a compressed batch (its records are
/// readable only through the codec) or one shorter than its header says.
pub fn records<'a>(batch: &'a [u8], header: &BatchHeader) -> Option<Records<'a>> {
    if header.compression_codec() != 0 {
        return None;
    }
    let body = batch.get(BATCH_HEADER_LEN..header.total_len())?;
    Some(Records {
        body,
        at: 0,
        index: 0,
    })
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

/// The index of the first record without a key in an uncompressed batch
/// (Kafka refuses those on compacted topics). `None` when every record has
/// a key, or for a compressed batch.
pub fn first_keyless_record(batch: &[u8], header: &BatchHeader) -> Option<usize> {
    records(batch, header)?
        .enumerate()
        .find(|(_, r)| r.as_ref().is_ok_and(|r| r.key.is_none()))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::validate_batches;
    use crate::testing::BatchBuilder;

    #[test]
    fn reads_keys_values_and_tombstones() {
        let batch = BatchBuilder::new(0)
            .record(Some(b"a"), Some(b"1"))
            .record(None, Some(b"2"))
            .record(Some(b"c"), None)
            .build();
        let h = validate_batches(&batch).unwrap()[0];
        let all: Vec<Record> = records(&batch, &h).unwrap().map(Result::unwrap).collect();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].key, Some(&b"a"[..]));
        assert_eq!(all[1].key, None);
        assert!(all[2].is_tombstone());
        assert_eq!(all[2].offset_delta, 2);
        assert_eq!(first_keyless_record(&batch, &h), Some(1));
    }
}
