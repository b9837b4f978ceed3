//! The records that persist a consumer-protocol group (KIP-848) in the
//! group log, in the key and value schemas of Kafka 4.x's
//! `__consumer_offsets` (values are flexible, version 0):
//!
//! | key version | key                  | value                                              |
//! |-------------|----------------------|----------------------------------------------------|
//! | 3           | group                | group epoch; tag 0: the subscribed topics' hash    |
//! | 5           | group, member        | member metadata; tag 0: classic member metadata    |
//! | 6           | group                | target assignment epoch                            |
//! | 7           | group, member        | the member's target partitions                     |
//! | 8           | group, member        | member epoch, previous epoch, state, partitions    |
//!
//! [`ConsumerGroupView`] is what they hold for one group. A group's state
//! is written as the difference between two views, so a heartbeat that
//! changes nothing persisted writes nothing.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::consumer::Assignment;
use super::records::GroupRecord;
use crate::codec::{put_compact_str, put_str, put_uvarint, Reader, RecordError};

pub const EPOCH_KEY: i16 = 3;
pub const MEMBER_KEY: i16 = 5;
pub const TARGET_EPOCH_KEY: i16 = 6;
pub const TARGET_KEY: i16 = 7;
pub const CURRENT_KEY: i16 = 8;

/// Which record of a group (the member for the per-member ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerKey {
    Epoch,
    Member(String),
    TargetEpoch,
    Target(String),
    Current(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerValue {
    /// The group epoch and the hash of its subscribed topics.
    Epoch {
        epoch: i32,
        metadata_hash: i64,
    },
    Member(MemberMetadata),
    TargetEpoch(i32),
    Target(Assignment),
    Current(CurrentAssignment),
}

/// `ConsumerGroupMemberMetadataValue`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberMetadata {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_names: Vec<String>,
    pub subscribed_regex: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
    /// A classic member's session timeout and strategies.
    pub classic: Option<(i32, Vec<(String, Bytes)>)>,
}

/// `ConsumerGroupCurrentMemberAssignmentValue`. States are Kafka's:
/// 0 Stable, 1 UnrevokedPartitions, 2 UnreleasedPartitions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CurrentAssignment {
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: i8,
    pub assigned: Assignment,
    pub revoking: Assignment,
}

/// Everything the group log holds for one consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsumerGroupView {
    pub epoch: Option<(i32, i64)>,
    pub target_epoch: Option<i32>,
    pub members: BTreeMap<String, MemberMetadata>,
    pub targets: BTreeMap<String, Assignment>,
    pub current: BTreeMap<String, CurrentAssignment>,
}

fn record(group: &str, key: ConsumerKey, value: Option<ConsumerValue>) -> GroupRecord {
    GroupRecord::Consumer {
        group: group.to_string(),
        key,
        value,
    }
}

/// Upserts for what `new` has and `old` has not (or differently), and
/// tombstones for what only `old` has.
fn diff_map<V: PartialEq + Clone>(
    out: &mut Vec<GroupRecord>,
    group: &str,
    old: &BTreeMap<String, V>,
    new: &BTreeMap<String, V>,
    key: fn(String) -> ConsumerKey,
    value: fn(V) -> ConsumerValue,
) {
    for (id, v) in new {
        if old.get(id) != Some(v) {
            out.push(record(group, key(id.clone()), Some(value(v.clone()))));
        }
    }
    for id in old.keys().filter(|id| !new.contains_key(*id)) {
        out.push(record(group, key(id.clone()), None));
    }
}

impl ConsumerGroupView {
    pub fn apply(&mut self, key: ConsumerKey, value: Option<ConsumerValue>) {
        match (key, value) {
            (ConsumerKey::Epoch, Some(ConsumerValue::Epoch { epoch, metadata_hash })) => {
                self.epoch = Some((epoch, metadata_hash))
            }
            (ConsumerKey::Epoch, _) => self.epoch = None,
            (ConsumerKey::TargetEpoch, Some(ConsumerValue::TargetEpoch(e))) => self.target_epoch = Some(e),
            (ConsumerKey::TargetEpoch, _) => self.target_epoch = None,
            (ConsumerKey::Member(id), Some(ConsumerValue::Member(m))) => {
                self.members.insert(id, m);
            }
            (ConsumerKey::Member(id), _) => {
                self.members.remove(&id);
            }
            (ConsumerKey::Target(id), Some(ConsumerValue::Target(a))) => {
                self.targets.insert(id, a);
            }
            (ConsumerKey::Target(id), _) => {
                self.targets.remove(&id);
            }
            (ConsumerKey::Current(id), Some(ConsumerValue::Current(c))) => {
                self.current.insert(id, c);
            }
            (ConsumerKey::Current(id), _) => {
                self.current.remove(&id);
            }
        }
    }

    /// Nothing is left of the group.
    pub fn is_empty(&self) -> bool {
        self.epoch.is_none()
            && self.target_epoch.is_none()
            && self.members.is_empty()
            && self.targets.is_empty()
            && self.current.is_empty()
    }

    /// The records that turn `old` into `new`: members' current
    /// assignments and targets are tombstoned before their metadata, and
    /// the group epoch last, as Kafka orders a group's deletion.
    pub fn diff(group: &str, old: &ConsumerGroupView, new: &ConsumerGroupView) -> Vec<GroupRecord> {
        let mut out = Vec::new();
        diff_map(
            &mut out,
            group,
            &old.current,
            &new.current,
            ConsumerKey::Current,
            ConsumerValue::Current,
        );
        diff_map(
            &mut out,
            group,
            &old.targets,
            &new.targets,
            ConsumerKey::Target,
            ConsumerValue::Target,
        );
        if old.target_epoch != new.target_epoch {
            let value = new.target_epoch.map(ConsumerValue::TargetEpoch);
            out.push(record(group, ConsumerKey::TargetEpoch, value));
        }
        diff_map(
            &mut out,
            group,
            &old.members,
            &new.members,
            ConsumerKey::Member,
            ConsumerValue::Member,
        );
        if old.epoch != new.epoch {
            let value = new
                .epoch
                .map(|(epoch, metadata_hash)| ConsumerValue::Epoch { epoch, metadata_hash });
            out.push(record(group, ConsumerKey::Epoch, value));
        }
        out
    }
}

fn put_compact_opt_str(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_compact_str(b, s),
        None => put_uvarint(b, 0),
    }
}

fn put_assignment(b: &mut BytesMut, a: &Assignment) {
    put_uvarint(b, a.len() as u32 + 1);
    for (topic, partitions) in a {
        b.put_slice(topic.as_bytes());
        put_uvarint(b, partitions.len() as u32 + 1);
        for p in partitions {
            b.put_i32(*p);
        }
        put_uvarint(b, 0);
    }
}

/// A compact array's length, refused before anything is allocated when it
/// cannot fit in what is left (each element takes at least one byte).
fn compact_len(r: &mut Reader) -> Result<Option<usize>, RecordError> {
    let n = r.uvarint()? as usize;
    if n == 0 {
        return Ok(None);
    }
    r.need(n - 1)?;
    Ok(Some(n - 1))
}

fn compact_opt_str(r: &mut Reader) -> Result<Option<String>, RecordError> {
    match compact_len(r)? {
        None => Ok(None),
        Some(len) => {
            let s = std::str::from_utf8(&r.0[..len])
                .map_err(|_| RecordError("string is not UTF-8".into()))?
                .to_string();
            r.skip(len)?;
            Ok(Some(s))
        }
    }
}

fn compact_str(r: &mut Reader) -> Result<String, RecordError> {
    compact_opt_str(r)?.ok_or_else(|| RecordError("null where a string is required".into()))
}

fn compact_bytes(r: &mut Reader) -> Result<Bytes, RecordError> {
    let len = compact_len(r)?.unwrap_or(0);
    let v = Bytes::copy_from_slice(&r.0[..len]);
    r.skip(len)?;
    Ok(v)
}

/// Tagged fields: -> (tag, data) pairs.
fn tagged<'a>(r: &mut Reader<'a>) -> Result<Vec<(u32, &'a [u8])>, RecordError> {
    let n = r.uvarint()?;
    let mut out = Vec::new();
    for _ in 0..n {
        let tag = r.uvarint()?;
        let len = r.uvarint()? as usize;
        r.need(len)?;
        let data = &r.0[..len];
        r.skip(len)?;
        out.push((tag, data));
    }
    Ok(out)
}

fn assignment(r: &mut Reader) -> Result<Assignment, RecordError> {
    let mut out = Assignment::new();
    for _ in 0..compact_len(r)?.unwrap_or(0) {
        r.need(16)?;
        let topic = Uuid::from_slice(&r.0[..16]).map_err(|e| RecordError(e.to_string()))?;
        r.skip(16)?;
        let mut partitions = std::collections::BTreeSet::new();
        for _ in 0..compact_len(r)?.unwrap_or(0) {
            partitions.insert(r.i32()?);
        }
        tagged(r)?;
        out.insert(topic, partitions);
    }
    Ok(out)
}

pub fn encode_key(b: &mut BytesMut, group: &str, key: &ConsumerKey) {
    let (version, member) = match key {
        ConsumerKey::Epoch => (EPOCH_KEY, None),
        ConsumerKey::Member(m) => (MEMBER_KEY, Some(m)),
        ConsumerKey::TargetEpoch => (TARGET_EPOCH_KEY, None),
        ConsumerKey::Target(m) => (TARGET_KEY, Some(m)),
        ConsumerKey::Current(m) => (CURRENT_KEY, Some(m)),
    };
    b.put_i16(version);
    put_str(b, group);
    if let Some(m) = member {
        put_str(b, m);
    }
}

pub fn encode_value(b: &mut BytesMut, value: &ConsumerValue) {
    b.put_i16(0);
    match value {
        ConsumerValue::Epoch { epoch, metadata_hash } => {
            b.put_i32(*epoch);
            // Tag 0: MetadataHash.
            put_uvarint(b, 1);
            put_uvarint(b, 0);
            put_uvarint(b, 8);
            b.put_i64(*metadata_hash);
            return;
        }
        ConsumerValue::Member(m) => {
            put_compact_opt_str(b, m.instance_id.as_deref());
            put_compact_opt_str(b, m.rack_id.as_deref());
            put_compact_str(b, &m.client_id);
            put_compact_str(b, &m.client_host);
            put_uvarint(b, m.subscribed_names.len() as u32 + 1);
            for n in &m.subscribed_names {
                put_compact_str(b, n);
            }
            put_compact_opt_str(b, m.subscribed_regex.as_deref());
            b.put_i32(m.rebalance_timeout_ms);
            put_compact_opt_str(b, m.server_assignor.as_deref());
            if let Some((session_timeout_ms, protocols)) = &m.classic {
                // Tag 0: ClassicMemberMetadata.
                let mut c = BytesMut::new();
                c.put_i32(*session_timeout_ms);
                put_uvarint(&mut c, protocols.len() as u32 + 1);
                for (name, metadata) in protocols {
                    put_compact_str(&mut c, name);
                    put_uvarint(&mut c, metadata.len() as u32 + 1);
                    c.put_slice(metadata);
                    put_uvarint(&mut c, 0);
                }
                put_uvarint(&mut c, 0);
                put_uvarint(b, 1);
                put_uvarint(b, 0);
                put_uvarint(b, c.len() as u32);
                b.put_slice(&c);
                return;
            }
        }
        ConsumerValue::TargetEpoch(e) => b.put_i32(*e),
        ConsumerValue::Target(a) => put_assignment(b, a),
        ConsumerValue::Current(c) => {
            b.put_i32(c.epoch);
            b.put_i32(c.previous_epoch);
            b.put_i8(c.state);
            put_assignment(b, &c.assigned);
            put_assignment(b, &c.revoking);
        }
    }
    put_uvarint(b, 0);
}

/// Reads the rest of a key of `version` (3, 5, 6, 7 or 8) and its value.
pub(crate) fn decode(
    version: i16,
    key: &mut Reader,
    value: Option<&[u8]>,
) -> Result<GroupRecord, RecordError> {
    let group = key.string()?;
    let key = match version {
        EPOCH_KEY => ConsumerKey::Epoch,
        MEMBER_KEY => ConsumerKey::Member(key.string()?),
        TARGET_EPOCH_KEY => ConsumerKey::TargetEpoch,
        TARGET_KEY => ConsumerKey::Target(key.string()?),
        CURRENT_KEY => ConsumerKey::Current(key.string()?),
        other => return Err(RecordError(format!("unknown key version {other}"))),
    };
    let Some(value) = value else {
        return Ok(record(&group, key, None));
    };
    let mut r = Reader(value);
    let v = r.i16()?;
    if v != 0 {
        return Err(RecordError(format!("consumer group value version {v}")));
    }
    let value = match &key {
        ConsumerKey::Epoch => {
            let epoch = r.i32()?;
            let mut metadata_hash = 0;
            for (tag, data) in tagged(&mut r)? {
                if tag == 0 {
                    metadata_hash = Reader(data).i64()?;
                }
            }
            ConsumerValue::Epoch { epoch, metadata_hash }
        }
        ConsumerKey::Member(_) => ConsumerValue::Member(member_metadata(&mut r)?),
        ConsumerKey::TargetEpoch => {
            let e = r.i32()?;
            tagged(&mut r)?;
            ConsumerValue::TargetEpoch(e)
        }
        ConsumerKey::Target(_) => {
            let a = assignment(&mut r)?;
            tagged(&mut r)?;
            ConsumerValue::Target(a)
        }
        ConsumerKey::Current(_) => ConsumerValue::Current(current_assignment(&mut r)?),
    };
    Ok(record(&group, key, Some(value)))
}

/// A `ConsumerGroupMemberMetadataValue` after its version, tagged fields
/// included.
fn member_metadata(r: &mut Reader) -> Result<MemberMetadata, RecordError> {
    let instance_id = compact_opt_str(r)?;
    let rack_id = compact_opt_str(r)?;
    let client_id = compact_str(r)?;
    let client_host = compact_str(r)?;
    let mut subscribed_names = Vec::new();
    for _ in 0..compact_len(r)?.unwrap_or(0) {
        subscribed_names.push(compact_str(r)?);
    }
    let subscribed_regex = compact_opt_str(r)?;
    let rebalance_timeout_ms = r.i32()?;
    let server_assignor = compact_opt_str(r)?;
    let mut classic = None;
    for (tag, data) in tagged(r)? {
        if tag == 0 {
            classic = Some(classic_member_metadata(data)?);
        }
    }
    Ok(MemberMetadata {
        instance_id,
        rack_id,
        client_id,
        client_host,
        subscribed_names,
        subscribed_regex,
        rebalance_timeout_ms,
        server_assignor,
        classic,
    })
}

/// A member metadata value's tag 0 (ClassicMemberMetadata): the classic
/// member's session timeout and its strategies' names and metadata.
fn classic_member_metadata(data: &[u8]) -> Result<(i32, Vec<(String, Bytes)>), RecordError> {
    let mut c = Reader(data);
    let session_timeout_ms = c.i32()?;
    let mut protocols = Vec::new();
    for _ in 0..compact_len(&mut c)?.unwrap_or(0) {
        let name = compact_str(&mut c)?;
        let metadata = compact_bytes(&mut c)?;
        tagged(&mut c)?;
        protocols.push((name, metadata));
    }
    Ok((session_timeout_ms, protocols))
}

/// A `ConsumerGroupCurrentMemberAssignmentValue` after its version, tagged
/// fields included.
fn current_assignment(r: &mut Reader) -> Result<CurrentAssignment, RecordError> {
    let epoch = r.i32()?;
    let previous_epoch = r.i32()?;
    let state = r.i8()?;
    let assigned = assignment(r)?;
    let revoking = assignment(r)?;
    tagged(r)?;
    Ok(CurrentAssignment {
        epoch,
        previous_epoch,
        state,
        assigned,
        revoking,
    })
}

/// FNV-1a over the subscribed topics' names, ids and partition counts:
/// the group epoch moves when it changes (across restarts too).
pub fn metadata_hash(topics: &super::consumer::Topics) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (name, info) in topics {
        eat(name.as_bytes());
        eat(info.id.as_bytes());
        eat(&info.partitions.to_be_bytes());
    }
    h as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> ConsumerGroupView {
        let a = Assignment::from([(Uuid::from_u128(5), [0, 2].into())]);
        ConsumerGroupView {
            epoch: Some((7, -99)),
            target_epoch: Some(7),
            members: BTreeMap::from([
                (
                    "m1".to_string(),
                    MemberMetadata {
                        instance_id: Some("i".into()),
                        client_id: "c".into(),
                        client_host: "/127.0.0.1".into(),
                        subscribed_names: vec!["t".into()],
                        rebalance_timeout_ms: 30_000,
                        server_assignor: Some("range".into()),
                        ..MemberMetadata::default()
                    },
                ),
                (
                    "m2".to_string(),
                    MemberMetadata {
                        subscribed_regex: Some("t.*".into()),
                        classic: Some((6_000, vec![("range".into(), Bytes::from_static(b"sub"))])),
                        ..MemberMetadata::default()
                    },
                ),
            ]),
            targets: BTreeMap::from([("m1".to_string(), a.clone())]),
            current: BTreeMap::from([(
                "m1".to_string(),
                CurrentAssignment {
                    epoch: 7,
                    previous_epoch: 6,
                    state: 1,
                    assigned: a.clone(),
                    revoking: a,
                },
            )]),
        }
    }

    fn round_trip(records: Vec<GroupRecord>) -> ConsumerGroupView {
        let mut out = ConsumerGroupView::default();
        for r in records {
            let (key, value) = (r.encode_key(), r.encode_value());
            match GroupRecord::decode(&key, value.as_deref()).unwrap() {
                GroupRecord::Consumer { key, value, .. } => out.apply(key, value),
                other => panic!("{other:?}"),
            }
        }
        out
    }

    #[test]
    fn a_group_is_written_as_differences_and_read_back_whole() {
        let full = view();
        let written = ConsumerGroupView::diff("g", &ConsumerGroupView::default(), &full);
        assert_eq!(written.len(), 6);
        assert_eq!(round_trip(written), full);
        assert!(ConsumerGroupView::diff("g", &full, &full).is_empty());
        let mut moved = full.clone();
        moved.current.get_mut("m1").unwrap().state = 0;
        assert_eq!(ConsumerGroupView::diff("g", &full, &moved).len(), 1);
        let gone = ConsumerGroupView::diff("g", &full, &ConsumerGroupView::default());
        assert!(gone
            .iter()
            .all(|r| matches!(r, GroupRecord::Consumer { value: None, .. })));
        assert!(matches!(
            gone.last(),
            Some(GroupRecord::Consumer {
                key: ConsumerKey::Epoch,
                ..
            })
        ));
    }

    #[test]
    fn truncated_values_are_errors() {
        for r in ConsumerGroupView::diff("g", &ConsumerGroupView::default(), &view()) {
            let (key, value) = (r.encode_key(), r.encode_value().unwrap());
            for n in 0..value.len() {
                assert!(
                    GroupRecord::decode(&key, Some(&value[..n])).is_err(),
                    "{r:?} at {n}"
                );
            }
        }
    }
}
