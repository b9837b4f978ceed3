//! The field encodings of coordinator records, as Kafka's generated
//! record classes write them (`__consumer_offsets`,
//! `__transaction_state`): big-endian integers, `i16`-length strings,
//! `i32`-length bytes, and flexible versions' varints and compact strings.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// A record that does not parse: the log is corrupt or was written by a
/// newer version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError(pub String);

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "log record: {}", self.0)
    }
}

pub fn put_str(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

/// An unsigned varint (flexible versions' lengths and tags).
pub fn put_uvarint(b: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

/// A compact (flexible versions') string.
pub fn put_compact_str(b: &mut BytesMut, s: &str) {
    put_uvarint(b, s.len() as u32 + 1);
    b.put_slice(s.as_bytes());
}

pub fn put_opt_str(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_str(b, s),
        None => b.put_i16(-1),
    }
}

pub fn put_bytes(b: &mut BytesMut, v: &[u8]) {
    b.put_i32(v.len() as i32);
    b.put_slice(v);
}

/// Reads the fields of a record's key or value, refusing truncation.
pub struct Reader<'a>(pub &'a [u8]);

impl Reader<'_> {
    pub fn need(&self, n: usize) -> Result<(), RecordError> {
        if self.0.len() < n {
            return Err(RecordError("truncated".into()));
        }
        Ok(())
    }

    pub fn i8(&mut self) -> Result<i8, RecordError> {
        self.need(1)?;
        Ok(self.0.get_i8())
    }

    pub fn i16(&mut self) -> Result<i16, RecordError> {
        self.need(2)?;
        Ok(self.0.get_i16())
    }

    pub fn i32(&mut self) -> Result<i32, RecordError> {
        self.need(4)?;
        Ok(self.0.get_i32())
    }

    pub fn i64(&mut self) -> Result<i64, RecordError> {
        self.need(8)?;
        Ok(self.0.get_i64())
    }

    pub fn opt_string(&mut self) -> Result<Option<String>, RecordError> {
        let len = self.i16()?;
        if len < 0 {
            return Ok(None);
        }
        let len = len as usize;
        self.need(len)?;
        let s = std::str::from_utf8(&self.0[..len])
            .map_err(|_| RecordError("string is not UTF-8".into()))?
            .to_string();
        self.0.advance(len);
        Ok(Some(s))
    }

    pub fn string(&mut self) -> Result<String, RecordError> {
        self.opt_string()?
            .ok_or_else(|| RecordError("null where a string is required".into()))
    }

    /// An unsigned varint (flexible versions' lengths and tags).
    pub fn uvarint(&mut self) -> Result<u32, RecordError> {
        let mut value: u32 = 0;
        for shift in (0..35).step_by(7) {
            let byte = self.i8()? as u8;
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(RecordError("varint longer than 5 bytes".into()))
    }

    /// Skips `n` bytes.
    pub fn skip(&mut self, n: usize) -> Result<(), RecordError> {
        self.need(n)?;
        self.0.advance(n);
        Ok(())
    }

    /// A compact (flexible versions') string: its length + 1 as a varint.
    pub fn compact_string(&mut self) -> Result<String, RecordError> {
        let len = (self.uvarint()? as usize)
            .checked_sub(1)
            .ok_or_else(|| RecordError("null where a string is required".into()))?;
        self.need(len)?;
        let s = std::str::from_utf8(&self.0[..len])
            .map_err(|_| RecordError("string is not UTF-8".into()))?
            .to_string();
        self.0.advance(len);
        Ok(s)
    }

    pub fn bytes(&mut self) -> Result<Bytes, RecordError> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(Bytes::new());
        }
        let len = len as usize;
        self.need(len)?;
        let v = Bytes::copy_from_slice(&self.0[..len]);
        self.0.advance(len);
        Ok(v)
    }
}
