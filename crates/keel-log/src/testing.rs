//! Test helpers: build valid v2 record batches by hand (uncompressed or in
//! any of Kafka's codecs), and decode their records back. Compiled for this crate's tests and, with the
//! `testing` feature, for other crates' tests.

use crate::batch::{BatchHeader, ATTRIBUTES_AT, BATCH_OVERHEAD, COMPRESSION_MASK};
use crate::codec::Codec;

const TRANSACTIONAL_FLAG: i16 = 0x10;
const CONTROL_FLAG: i16 = 0x20;

/// One record of a test batch. `timestamp_delta_ms` is relative to the
/// batch's base timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp_delta_ms: i64,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Builds one magic-2 batch with a correct CRC-32C.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    base_offset: i64,
    base_timestamp_ms: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    attributes: i16,
    records: Vec<TestRecord>,
}

impl BatchBuilder {
    /// A non-idempotent batch (producer id -1) whose base timestamp is
    /// `base_timestamp_ms`.
    pub fn new(base_timestamp_ms: i64) -> Self {
        BatchBuilder {
            base_offset: 0,
            base_timestamp_ms,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            attributes: 0,
            records: Vec::new(),
        }
    }

    pub fn base_offset(mut self, base_offset: i64) -> Self {
        self.base_offset = base_offset;
        self
    }

    pub fn producer(mut self, producer_id: i64, epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = producer_id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    pub fn transactional(mut self, on: bool) -> Self {
        self.set_flag(TRANSACTIONAL_FLAG, on);
        self
    }

    /// Compresses the records with `codec` (Kafka's framing).
    pub fn compressed(mut self, codec: Codec) -> Self {
        self.attributes = (self.attributes & !COMPRESSION_MASK) | codec as i16;
        self
    }

    pub fn control(mut self, on: bool) -> Self {
        self.set_flag(CONTROL_FLAG, on);
        self
    }

    fn set_flag(&mut self, flag: i16, on: bool) {
        if on {
            self.attributes |= flag;
        } else {
            self.attributes &= !flag;
        }
    }

    /// Adds a record whose timestamp is base + its index (so the batch's max
    /// timestamp is base + count - 1).
    pub fn record(mut self, key: Option<&[u8]>, value: Option<&[u8]>) -> Self {
        let delta = self.records.len() as i64;
        self.records.push(TestRecord {
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            timestamp_delta_ms: delta,
            headers: Vec::new(),
        });
        self
    }

    pub fn push(mut self, record: TestRecord) -> Self {
        self.records.push(record);
        self
    }

    pub fn build(&self) -> Vec<u8> {
        assert!(!self.records.is_empty(), "a batch needs at least one record");
        let mut body = Vec::new();
        for (i, r) in self.records.iter().enumerate() {
            encode_record(&mut body, r, i as i32);
        }
        let codec = Codec::from_id((self.attributes & COMPRESSION_MASK) as u8).expect("a Kafka codec");
        let body = codec.compress(&body).expect("compresses");
        let max_delta = self.records.iter().map(|r| r.timestamp_delta_ms).max();
        let max_timestamp = self.base_timestamp_ms + max_delta.unwrap_or(0);
        let count = self.records.len() as i32;
        let mut out = Vec::with_capacity(61 + body.len());
        out.extend_from_slice(&self.base_offset.to_be_bytes());
        let batch_length = (61 - BATCH_OVERHEAD + body.len()) as i32;
        out.extend_from_slice(&batch_length.to_be_bytes());
        out.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
        out.push(2); // magic
        out.extend_from_slice(&0u32.to_be_bytes()); // crc, filled below
        out.extend_from_slice(&self.attributes.to_be_bytes());
        out.extend_from_slice(&(count - 1).to_be_bytes());
        out.extend_from_slice(&self.base_timestamp_ms.to_be_bytes());
        out.extend_from_slice(&max_timestamp.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.producer_epoch.to_be_bytes());
        out.extend_from_slice(&self.base_sequence.to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&body);
        let crc = crc32c::crc32c(&out[ATTRIBUTES_AT..]);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        out
    }
}

/// A batch of `count` records with small keys and `value_len`-byte values.
pub fn simple_batch(count: usize, value_len: usize, base_timestamp_ms: i64) -> Vec<u8> {
    let mut builder = BatchBuilder::new(base_timestamp_ms);
    for i in 0..count {
        let key = format!("key-{i}");
        let value = vec![b'a' + (i % 26) as u8; value_len];
        builder = builder.record(Some(key.as_bytes()), Some(&value));
    }
    builder.build()
}

fn encode_record(out: &mut Vec<u8>, r: &TestRecord, offset_delta: i32) {
    let mut rec = vec![0u8]; // attributes
    put_varlong(&mut rec, r.timestamp_delta_ms);
    put_varlong(&mut rec, i64::from(offset_delta));
    put_bytes(&mut rec, r.key.as_deref());
    put_bytes(&mut rec, r.value.as_deref());
    put_varlong(&mut rec, r.headers.len() as i64);
    for (k, v) in &r.headers {
        put_bytes(&mut rec, Some(k.as_bytes()));
        put_bytes(&mut rec, v.as_deref());
    }
    put_varlong(out, rec.len() as i64);
    out.extend_from_slice(&rec);
}

fn put_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varlong(out, -1),
        Some(b) => {
            put_varlong(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

use crate::batch::get_varlong;
use crate::records::put_varlong;

fn get_bytes(buf: &[u8], pos: &mut usize) -> Option<Option<Vec<u8>>> {
    let len = get_varlong(buf, pos)?;
    if len < 0 {
        return Some(None);
    }
    let end = pos.checked_add(usize::try_from(len).ok()?)?;
    let bytes = buf.get(*pos..end)?.to_vec();
    *pos = end;
    Some(Some(bytes))
}

/// Decodes the records of one batch (decompressing it); `None` if it is
/// not a valid one.
pub fn decode_records(batch: &[u8]) -> Option<Vec<TestRecord>> {
    let header = BatchHeader::parse(batch).ok()?;
    let section = crate::records::records_section(batch, &header).ok()?;
    let body: &[u8] = &section;
    let mut pos = 0;
    let mut records = Vec::new();
    while pos < body.len() {
        let len = usize::try_from(get_varlong(body, &mut pos)?).ok()?;
        let rec = body.get(pos..pos.checked_add(len)?)?;
        pos += len;
        records.push(decode_record(rec)?);
    }
    Some(records)
}

fn decode_record(rec: &[u8]) -> Option<TestRecord> {
    let mut pos = 1; // attributes
    let timestamp_delta_ms = get_varlong(rec, &mut pos)?;
    let _offset_delta = get_varlong(rec, &mut pos)?;
    let key = get_bytes(rec, &mut pos)?;
    let value = get_bytes(rec, &mut pos)?;
    let header_count = get_varlong(rec, &mut pos)?;
    let mut headers = Vec::new();
    for _ in 0..header_count {
        let k = get_bytes(rec, &mut pos)??;
        let v = get_bytes(rec, &mut pos)?;
        headers.push((String::from_utf8(k).ok()?, v));
    }
    Some(TestRecord {
        key,
        value,
        timestamp_delta_ms,
        headers,
    })
}

/// A seed for randomized tests when `KEEL_TEST_SEED` is not set.
pub fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

/// The seed to use: `KEEL_TEST_SEED` if set, else time-based. Printed so a
/// failure can be replayed.
pub fn test_seed() -> u64 {
    let seed = std::env::var("KEEL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(time_seed);
    eprintln!("seed={seed}");
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let batch = BatchBuilder::new(10)
            .record(Some(b"a"), Some(b"hello"))
            .record(None, None)
            .push(TestRecord {
                key: Some(vec![1; 300]),
                value: Some(vec![2; 70_000]),
                timestamp_delta_ms: -5,
                headers: vec![("h".into(), Some(b"v".to_vec())), ("n".into(), None)],
            })
            .build();
        let records = decode_records(&batch).expect("decodes");
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].value.as_deref(), Some(&b"hello"[..]));
        assert_eq!(records[1].key, None);
        assert_eq!(records[2].timestamp_delta_ms, -5);
        assert_eq!(records[2].value.as_ref().map(Vec::len), Some(70_000));
        assert_eq!(records[2].headers.len(), 2);
    }
}
