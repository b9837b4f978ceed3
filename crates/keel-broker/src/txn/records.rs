//! The records of the transaction log, in the key and value schemas of
//! Kafka's `__transaction_state` topic (version 0, non-flexible):
//!
//! * key: `(version 0, transactional id)`;
//! * value: `(version 0, producer id, producer epoch, timeout ms, status,
//!   partitions [(topic, [partition])], last update ms, start ms)`;
//! * a record with a null value deletes the transactional id.

use std::collections::BTreeSet;

use bytes::{BufMut, Bytes, BytesMut};

use super::state::{TxnState, TxnStatus};
use crate::groups::records::{put_str, Reader, RecordError};

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;

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
        b.put_i32(topics.len() as i32);
        for (topic, partitions) in topics {
            put_str(&mut b, topic);
            b.put_i32(partitions.len() as i32);
            for p in partitions {
                b.put_i32(p);
            }
        }
        b.put_i64(v.last_update_ms);
        b.put_i64(v.start_ms);
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
    if version != VALUE_VERSION {
        return Err(RecordError(format!("transaction log value version {version}")));
    }
    let producer_id = r.i64()?;
    let producer_epoch = r.i16()?;
    let timeout_ms = r.i32()?;
    let status =
        TxnStatus::from_id(r.i8()?).ok_or_else(|| RecordError("unknown transaction status".into()))?;
    let mut partitions = BTreeSet::new();
    for _ in 0..r.i32()?.max(0) {
        let topic = r.string()?;
        for _ in 0..r.i32()?.max(0) {
            partitions.insert((topic.clone(), r.i32()?));
        }
    }
    let last_update_ms = r.i64()?;
    let start_ms = r.i64()?;
    Ok(TxnState {
        producer_id,
        producer_epoch,
        timeout_ms,
        status,
        partitions,
        last_update_ms,
        start_ms,
    })
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
    }
}
