//! A coordinator's table kept, in a cluster, in the partitions of one of
//! Kafka's internal topics: the group coordinator's in
//! `__consumer_offsets`, the transaction coordinator's in
//! `__transaction_state`. Each record concerns one key (a group, a
//! transactional id), and a key falls in one partition (Kafka's
//! `abs(hash(key)) % partitions`, computed by the broker), so a write is
//! split by partition, each partition's part is written to its log, and a
//! partition's records rebuild its keys when another broker takes it over.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use crate::metalog::{decode_records, Entry, Table};

/// Which keys a coordinator holds, or a partition holds: a key (a group,
/// a transactional id) is in one partition.
pub type Owns = std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// A write's entries by partition, each partition's in write order.
pub type ByPartition<R> = BTreeMap<i32, Vec<Entry<R>>>;

/// A [`Table`] whose records are kept in the partitions of an internal
/// topic, by key.
pub trait Partitioned: Table {
    /// The entries of one write by the partition (`partition_of` a key)
    /// they go to, and for each entry the partitions it went to (it is
    /// written once all of them took it). `table` is the state before the
    /// write.
    fn split(
        entries: &[Entry<Self::Record>],
        table: &Self,
        partition_of: &dyn Fn(&str) -> i32,
    ) -> (ByPartition<Self::Record>, Vec<BTreeSet<i32>>);

    /// Applies the part of `entry` that reached the partitions of the
    /// keys `written` says (an entry spread over several partitions, some
    /// of which failed to take it).
    fn apply_written(&mut self, entry: Entry<Self::Record>, written: &dyn Fn(&str) -> bool);

    /// The keys `keep` says, as a table of their own (a partition's, for
    /// its snapshot).
    fn part(&self, keep: &dyn Fn(&str) -> bool) -> Self;

    /// How many keys the table holds.
    fn keys(&self) -> usize;
}

/// Splits entries of plain records by the partition of each record's
/// `key`: for tables that take no transactional writes. A marker (which
/// such a table ignores) goes nowhere.
pub fn split_records<R: Clone>(
    entries: &[Entry<R>],
    key: impl Fn(&R) -> &str,
    partition_of: &dyn Fn(&str) -> i32,
) -> (ByPartition<R>, Vec<BTreeSet<i32>>) {
    let mut out: ByPartition<R> = BTreeMap::new();
    let mut touched = Vec::with_capacity(entries.len());
    for entry in entries {
        let mut parts: BTreeMap<i32, Vec<R>> = BTreeMap::new();
        let records = match entry {
            Entry::Records(r) | Entry::Transactional { records: r, .. } => r.as_slice(),
            Entry::Marker { .. } => &[],
        };
        for r in records {
            parts.entry(partition_of(key(r))).or_default().push(r.clone());
        }
        touched.push(parts.keys().copied().collect());
        for (p, records) in parts {
            let part = match entry {
                Entry::Transactional {
                    producer_id,
                    producer_epoch,
                    ..
                } => Entry::Transactional {
                    producer_id: *producer_id,
                    producer_epoch: *producer_epoch,
                    records,
                },
                _ => Entry::Records(records),
            };
            out.entry(p).or_default().push(part);
        }
    }
    (out, touched)
}

/// Applies the records at or after `from` of a coordinator log's batches
/// (whole record batches, in log order) to `table`: how a partition is
/// loaded. Returns the last offset the batches hold, if any.
pub fn apply_batches<T: Table>(table: &mut T, bytes: Bytes, from: i64) -> Result<Option<i64>, String> {
    let mut last = None;
    for (offset, entry) in decode_records::<T>(bytes)? {
        last = last.max(Some(offset));
        if offset >= from {
            entry.apply_to(table);
        }
    }
    Ok(last)
}
