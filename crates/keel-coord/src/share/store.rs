//! What share partitions keep across restarts: for each, its start
//! offset and its in-flight records as runs of one state and delivery
//! count (Kafka's `ShareSnapshot`: start offset, state epoch, state
//! batches), in the share log under `__keel_meta/share`.
//!
//! Each change of a share partition writes its whole state (one record,
//! keyed by group, topic id and partition; a tombstone when it goes), so
//! replay keeps the last. A record acquired when the broker stopped
//! comes back available, with the deliveries it had: the acquisition
//! counted, so a crash never hands a record out past the limit.
//!
//! Key: version (i16, 0), group (string), topic id (16 bytes), partition
//! (i32). Value: version (i16, 0), start offset (i64), state epoch (i32),
//! runs (i32 count, then each first offset i64, last offset i64, state
//! i8 in Kafka's codes, delivery count i16).

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::ShareKey;
use crate::codec::{put_str, Reader, RecordError};
use crate::metalog::Table;

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;
/// The most offsets a share partition's persisted state may span.
const MAX_RESTORED_SPAN: i64 = 1 << 24;

/// A run of in-flight records in one state with one delivery count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRun {
    pub first_offset: i64,
    pub last_offset: i64,
    /// Kafka's state code: 0 available, 1 acquired, 2 acknowledged, 4 archived.
    pub state: i8,
    pub delivery_count: i16,
}

/// A share partition's persisted state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareState {
    pub start_offset: i64,
    /// Counts up at each reset of the start offset.
    pub state_epoch: i32,
    pub runs: Vec<StateRun>,
}

/// One write: a share partition's state, or its removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareRecord {
    pub key: ShareKey,
    pub state: Option<ShareState>,
}

/// Every share partition's last written state.
#[derive(Debug, Default)]
pub struct ShareTable {
    pub partitions: HashMap<ShareKey, ShareState>,
}

impl Table for ShareTable {
    type Record = ShareRecord;
    const NAME: &'static str = "share-log";

    fn apply(&mut self, record: ShareRecord) {
        match record.state {
            Some(state) => {
                self.partitions.insert(record.key, state);
            }
            None => {
                self.partitions.remove(&record.key);
            }
        }
    }

    fn records(&self) -> Vec<ShareRecord> {
        self.partitions
            .iter()
            .map(|(key, state)| ShareRecord {
                key: key.clone(),
                state: Some(state.clone()),
            })
            .collect()
    }

    fn encode(record: &ShareRecord) -> (Bytes, Option<Bytes>) {
        let mut key = BytesMut::new();
        key.put_i16(KEY_VERSION);
        put_str(&mut key, &record.key.group);
        key.put_slice(record.key.topic_id.as_bytes());
        key.put_i32(record.key.partition);
        let value = record.state.as_ref().map(|s| {
            let mut v = BytesMut::with_capacity(18 + s.runs.len() * 19);
            v.put_i16(VALUE_VERSION);
            v.put_i64(s.start_offset);
            v.put_i32(s.state_epoch);
            v.put_i32(s.runs.len() as i32);
            for r in &s.runs {
                v.put_i64(r.first_offset);
                v.put_i64(r.last_offset);
                v.put_i8(r.state);
                v.put_i16(r.delivery_count);
            }
            v.freeze()
        });
        (key.freeze(), value)
    }

    fn decode(key: &[u8], value: Option<&[u8]>) -> Result<ShareRecord, RecordError> {
        let mut k = Reader(key);
        if k.i16()? != KEY_VERSION {
            return Err(RecordError("unknown share key version".into()));
        }
        let group = k.string()?;
        k.need(16)?;
        let topic_id = Uuid::from_slice(&k.0[..16]).map_err(|e| RecordError(e.to_string()))?;
        k.skip(16)?;
        let partition = k.i32()?;
        let state = value.map(decode_state).transpose()?;
        Ok(ShareRecord {
            key: ShareKey {
                group,
                topic_id,
                partition,
            },
            state,
        })
    }
}

fn decode_state(value: &[u8]) -> Result<ShareState, RecordError> {
    let mut v = Reader(value);
    if v.i16()? != VALUE_VERSION {
        return Err(RecordError("unknown share value version".into()));
    }
    let start_offset = v.i64()?;
    let state_epoch = v.i32()?;
    let count = v.i32()?;
    let count = usize::try_from(count).map_err(|_| RecordError("negative run count".into()))?;
    // Each run is 19 bytes: a count the value cannot hold is corrupt.
    v.need(count.saturating_mul(19))?;
    let mut runs = Vec::with_capacity(count);
    for _ in 0..count {
        let run = StateRun {
            first_offset: v.i64()?,
            last_offset: v.i64()?,
            state: v.i8()?,
            delivery_count: v.i16()?,
        };
        let after_last = runs.last().map_or(start_offset, |r: &StateRun| r.last_offset + 1);
        if run.first_offset != after_last || run.last_offset < run.first_offset || run.last_offset == i64::MAX
        {
            return Err(RecordError(format!(
                "share state run {}..={} does not follow {after_last}",
                run.first_offset, run.last_offset
            )));
        }
        runs.push(run);
    }
    // In flight is at most the in-flight limit plus a batch: a span past
    // this is a corrupt record, not one to allocate slots for.
    if runs
        .last()
        .is_some_and(|r| r.last_offset - start_offset >= MAX_RESTORED_SPAN)
    {
        return Err(RecordError("share state spans too many offsets".into()));
    }
    Ok(ShareState {
        start_offset,
        state_epoch,
        runs,
    })
}
