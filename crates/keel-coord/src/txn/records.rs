//! The records of the transaction log, in the key and value schemas of
//! Kafka's `__transaction_state` topic:
//!
//! * key: `(version 0, transactional id)`;
//! * value version 1 (flexible, written): `(producer id, producer epoch,
//!   timeout ms, status, partitions [(topic, [partition])], last update
//!   ms, start ms)`, with the tagged fields previous producer id (tag 0),
//!   next producer id (1) and client transaction version (2) where they
//!   differ from their defaults (-1, -1, 0);
//! * value version 0 (non-flexible, read): the same without tags;
//! * a record with a null value deletes the transactional id.

use std::collections::BTreeSet;

use bytes::{BufMut, Bytes, BytesMut};

use super::state::{TxnState, TxnStatus, NO_EPOCH};
use crate::codec::{put_compact_str, put_str, put_uvarint, Reader, RecordError};

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 1;

/// One record of the transaction log. `None` is a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnRecord {
    pub transactional_id: String,
    pub value: Option<TxnState>,
}

impl TxnRecord {
    pub fn encode_key(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(KEY_VERSION);
        put_str(&mut b, &self.transactional_id);
        b.freeze()
    }

    pub fn encode_value(&self) -> Option<Bytes> {
        let v = self.value.as_ref()?;
        let mut b = BytesMut::new();
        b.put_i16(VALUE_VERSION);
        b.put_i64(v.producer_id);
        b.put_i16(v.producer_epoch);
        b.put_i32(v.timeout_ms);
        b.put_i8(v.status as i8);
        let mut topics: Vec<(&str, Vec<i32>)> = Vec::new();
        for (topic, partition) in &v.partitions {
            match topics.last_mut() {
                Some((t, ps)) if *t == topic.as_str() => ps.push(*partition),
                _ => topics.push((topic, vec![*partition])),
            }
        }
        put_uvarint(&mut b, topics.len() as u32 + 1);
        for (topic, partitions) in topics {
            put_compact_str(&mut b, topic);
            put_uvarint(&mut b, partitions.len() as u32 + 1);
            for p in partitions {
                b.put_i32(p);
            }
            put_uvarint(&mut b, 0);
        }
        b.put_i64(v.last_update_ms);
        b.put_i64(v.start_ms);
        let tags = [
            (v.previous_producer_id != -1).then(|| v.previous_producer_id.to_be_bytes().to_vec()),
            (v.next_producer_id != -1).then(|| v.next_producer_id.to_be_bytes().to_vec()),
            (v.client_version != 0).then(|| v.client_version.to_be_bytes().to_vec()),
        ];
        put_uvarint(&mut b, tags.iter().flatten().count() as u32);
        for (tag, data) in tags.iter().enumerate() {
            if let Some(data) = data {
                put_uvarint(&mut b, tag as u32);
                put_uvarint(&mut b, data.len() as u32);
                b.put_slice(data);
            }
        }
        Some(b.freeze())
    }

    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<TxnRecord, RecordError> {
        let mut k = Reader(key);
        let version = k.i16()?;
        if version != KEY_VERSION {
            return Err(RecordError(format!("transaction log key version {version}")));
        }
        let transactional_id = k.string()?;
        let value = value.map(decode_value).transpose()?;
        Ok(TxnRecord {
            transactional_id,
            value,
        })
    }
}

fn decode_value(value: &[u8]) -> Result<TxnState, RecordError> {
    let mut r = Reader(value);
    let version = r.i16()?;
    if !(0..=VALUE_VERSION).contains(&version) {
        return Err(RecordError(format!("transaction log value version {version}")));
    }
    let flexible = version >= 1;
    let producer_id = r.i64()?;
    let producer_epoch = r.i16()?;
    let timeout_ms = r.i32()?;
    let status =
        TxnStatus::from_id(r.i8()?).ok_or_else(|| RecordError("unknown transaction status".into()))?;
    let mut partitions = BTreeSet::new();
    // Lengths: i32 (-1: null) before flexible versions, varint + 1 (0:
    // null) in them.
    let count = |r: &mut Reader| -> Result<usize, RecordError> {
        Ok(if flexible {
            (r.uvarint()? as usize).saturating_sub(1)
        } else {
            r.i32()?.max(0) as usize
        })
    };
    for _ in 0..count(&mut r)? {
        let topic = if flexible {
            r.compact_string()?
        } else {
            r.string()?
        };
        for _ in 0..count(&mut r)? {
            partitions.insert((topic.clone(), r.i32()?));
        }
        if flexible {
            read_tags(&mut r, |_, _| Ok(()))?;
        }
    }
    let last_update_ms = r.i64()?;
    let start_ms = r.i64()?;
    let mut state = TxnState {
        producer_id,
        producer_epoch,
        timeout_ms,
        status,
        partitions,
        last_update_ms,
        start_ms,
        previous_producer_id: -1,
        next_producer_id: -1,
        client_version: 0,
        // Not in the log, as in Kafka (see the field).
        last_producer_epoch: NO_EPOCH,
    };
    if flexible {
        read_tags(&mut r, |tag, data| {
            let mut d = Reader(data);
            match tag {
                0 => state.previous_producer_id = d.i64()?,
                1 => state.next_producer_id = d.i64()?,
                2 => state.client_version = d.i16()?,
                _ => {}
            }
            Ok(())
        })?;
    }
    Ok(state)
}

/// Reads a flexible struct's tagged fields, handing each to `field`
/// (which ignores the tags it does not know).
fn read_tags(
    r: &mut Reader,
    mut field: impl FnMut(u32, &[u8]) -> Result<(), RecordError>,
) -> Result<(), RecordError> {
    for _ in 0..r.uvarint()? {
        let tag = r.uvarint()?;
        let len = r.uvarint()? as usize;
        let data = r.0.get(..len).ok_or_else(|| RecordError("truncated".into()))?;
        field(tag, data)?;
        r.skip(len)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let state = TxnState {
            producer_id: 9,
            producer_epoch: 3,
            timeout_ms: 60_000,
            status: TxnStatus::Ongoing,
            partitions: [("a".to_string(), 0), ("a".to_string(), 2), ("b".to_string(), 1)]
                .into_iter()
                .collect(),
            last_update_ms: 5,
            start_ms: 4,
            previous_producer_id: 3,
            next_producer_id: -1,
            client_version: 2,
            last_producer_epoch: -1,
        };
        let r = TxnRecord {
            transactional_id: "tx".into(),
            value: Some(state),
        };
        let back = TxnRecord::decode(&r.encode_key(), r.encode_value().as_deref()).unwrap();
        assert_eq!(back, r);
        let tomb = TxnRecord {
            transactional_id: "tx".into(),
            value: None,
        };
        assert_eq!(TxnRecord::decode(&tomb.encode_key(), None).unwrap(), tomb);
        assert!(TxnRecord::decode(&r.encode_key(), Some(&[0, 0, 1])).is_err());
        for cut in 0..r.encode_value().unwrap().len() {
            let value = r.encode_value().unwrap();
            assert!(TxnRecord::decode(&r.encode_key(), Some(&value[..cut])).is_err());
        }
    }

    /// Version 0, as Kafka (and Keel before transactions v2) wrote it.
    #[test]
    fn version_0_values_are_read() {
        let mut v = BytesMut::new();
        v.put_i16(0);
        v.put_i64(9);
        v.put_i16(3);
        v.put_i32(60_000);
        v.put_i8(TxnStatus::Ongoing as i8);
        v.put_i32(1);
        put_str(&mut v, "a");
        v.put_i32(2);
        v.put_i32(0);
        v.put_i32(2);
        v.put_i64(5);
        v.put_i64(4);
        let key = TxnRecord {
            transactional_id: "tx".into(),
            value: None,
        }
        .encode_key();
        let back = TxnRecord::decode(&key, Some(&v)).unwrap().value.unwrap();
        assert_eq!(back.partitions.len(), 2);
        assert_eq!(
            (
                back.producer_epoch,
                back.previous_producer_id,
                back.next_producer_id,
                back.client_version
            ),
            (3, -1, -1, 0)
        );
    }
}
