//! Transaction markers: the control batch that ends a producer's
//! transaction in a partition (Kafka's `EndTransactionMarker`).
//!
//! A marker batch is transactional and control, carries the producer's id
//! and epoch and no sequence, and holds one record: key `(version 0,
//! type)` with type 0 = ABORT and 1 = COMMIT, value `(version 0,
//! coordinator epoch)`.

use crate::batch::{
    BatchHeader, ATTRIBUTES_AT, BATCH_HEADER_LEN, BATCH_OVERHEAD, CONTROL_FLAG, CRC_AT, MAGIC_V2,
    TRANSACTIONAL_FLAG,
};
use crate::records::{put_varlong, records_in, records_section};

const ABORT: i16 = 0;
const COMMIT: i16 = 1;
const VERSION: i16 = 0;

/// What a marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    pub commit: bool,
    /// The epoch of the transaction coordinator that wrote it.
    pub coordinator_epoch: i32,
}

/// A transactional write its coordinator is asked about (a batch of a
/// partition, offsets of a group): its producer, its epoch, and whether
/// its transaction ends with the epoch bumped (transactions v2, KIP-890:
/// the markers carry the next epoch, which the producer's next
/// transaction uses too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnWrite {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub bumped_on_end: bool,
}

impl TxnWrite {
    /// Whether a marker of `producer_id` in `epoch` ends this write's
    /// transaction (or a later one's): under transactions v2 a marker in
    /// the write's own epoch ends the transaction before it, not its own.
    pub fn ended_by(&self, producer_id: i64, epoch: i16) -> bool {
        self.producer_id == producer_id
            && if self.bumped_on_end {
                self.producer_epoch < epoch
            } else {
                self.producer_epoch <= epoch
            }
    }
}

/// One marker batch at offset 0 (the log assigns its offset).
pub fn marker_batch(producer_id: i64, producer_epoch: i16, marker: Marker, timestamp_ms: i64) -> Vec<u8> {
    let kind = if marker.commit { COMMIT } else { ABORT };
    let mut key = VERSION.to_be_bytes().to_vec();
    key.extend_from_slice(&kind.to_be_bytes());
    let mut value = VERSION.to_be_bytes().to_vec();
    value.extend_from_slice(&marker.coordinator_epoch.to_be_bytes());
    let mut record = vec![0u8]; // attributes
    put_varlong(&mut record, 0); // timestamp delta
    put_varlong(&mut record, 0); // offset delta
    for field in [&key, &value] {
        put_varlong(&mut record, field.len() as i64);
        record.extend_from_slice(field);
    }
    put_varlong(&mut record, 0); // headers
    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + record.len() + 2);
    out.extend_from_slice(&0i64.to_be_bytes()); // base offset
    out.extend_from_slice(&[0; 4]); // batch length, below
    out.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    out.push(MAGIC_V2 as u8);
    out.extend_from_slice(&[0; 4]); // crc, below
    out.extend_from_slice(&(TRANSACTIONAL_FLAG | CONTROL_FLAG).to_be_bytes());
    out.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
    out.extend_from_slice(&timestamp_ms.to_be_bytes());
    out.extend_from_slice(&timestamp_ms.to_be_bytes());
    out.extend_from_slice(&producer_id.to_be_bytes());
    out.extend_from_slice(&producer_epoch.to_be_bytes());
    out.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    out.extend_from_slice(&1i32.to_be_bytes()); // records
    put_varlong(&mut out, record.len() as i64);
    out.extend_from_slice(&record);
    let batch_length = (out.len() - BATCH_OVERHEAD) as i32;
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    let crc = crc32c::crc32c(&out[ATTRIBUTES_AT..]);
    out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    out
}

/// The marker a control batch holds. Control batches of other kinds
/// (Kafka's leader-change and snapshot records) are `Ok(None)`.
pub fn read_marker(batch: &[u8], header: &BatchHeader) -> Result<Option<Marker>, String> {
    if !header.is_control() {
        return Err("not a control batch".into());
    }
    let section = records_section(batch, header)?;
    let record = records_in(&section)
        .next()
        .ok_or("a control batch without a record")??;
    let key = record.key.ok_or("a control record without a key")?;
    parse_record(key, record.value)
}

/// The marker of one control record, from its key and value: `Ok(None)`
/// for control records of other kinds.
pub fn parse_record(key: &[u8], value: Option<&[u8]>) -> Result<Option<Marker>, String> {
    let [v0, v1, t0, t1, ..] = key[..] else {
        return Err("a control record key shorter than 4 bytes".into());
    };
    if i16::from_be_bytes([v0, v1]) < 0 {
        return Err("a control record key with a negative version".into());
    }
    let commit = match i16::from_be_bytes([t0, t1]) {
        ABORT => false,
        COMMIT => true,
        _ => return Ok(None),
    };
    let coordinator_epoch = match value {
        Some([_, _, a, b, c, d, ..]) => i32::from_be_bytes([*a, *b, *c, *d]),
        _ => return Err("a transaction marker without its coordinator epoch".into()),
    };
    Ok(Some(Marker {
        commit,
        coordinator_epoch,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::validate_batches;

    #[test]
    fn markers_are_valid_control_batches_and_read_back() {
        for commit in [true, false] {
            let marker = Marker {
                commit,
                coordinator_epoch: 3,
            };
            let batch = marker_batch(42, 7, marker, 1_000);
            let h = validate_batches(&batch).unwrap()[0];
            assert!(h.is_control() && h.is_transactional());
            assert_eq!((h.producer_id, h.producer_epoch, h.base_sequence), (42, 7, -1));
            assert_eq!(h.records_count, 1);
            crate::batch::validate_records(&batch, &h).unwrap();
            assert_eq!(read_marker(&batch, &h), Ok(Some(marker)));
        }
        let plain = crate::testing::BatchBuilder::new(0)
            .record(None, Some(b"v"))
            .build();
        let h = validate_batches(&plain).unwrap()[0];
        assert!(read_marker(&plain, &h).is_err());
    }
}
