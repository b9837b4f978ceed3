//! The records of the group log, in the key and value schemas of Kafka's
//! `__consumer_offsets` topic (non-flexible versions):
//!
//! * offset commit: key v1 `(group, topic, partition)`, value v3
//!   `(offset, leader epoch, metadata, commit timestamp)`;
//! * group metadata: key v2 `(group)`, value v3 (protocol type,
//!   generation, protocol, leader, state timestamp, members);
//! * a record with a null value deletes its key (a tombstone);
//! * consumer-protocol groups: keys 3 and 5 to 8 ([`super::consumer_records`]).
//!
//! Also the one piece of the consumer protocol the coordinator reads: the
//! topics in a member's subscription.

use bytes::{BufMut, Bytes, BytesMut};

use super::consumer_records::{self, ConsumerKey, ConsumerValue};
use crate::codec::{put_bytes, put_opt_str, put_str, Reader, RecordError};

const OFFSET_KEY_VERSION: i16 = 1;
const GROUP_KEY_VERSION: i16 = 2;
const OFFSET_VALUE_VERSION: i16 = 3;
const GROUP_VALUE_VERSION: i16 = 3;

/// A committed offset of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
}

/// A group as persisted when its assignment is agreed or it becomes empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMetadata {
    pub group: String,
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub current_state_timestamp_ms: i64,
    pub members: Vec<MemberMetadata>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMetadata {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// One record of the group log. `None` values are tombstones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRecord {
    Offset {
        group: String,
        topic: String,
        partition: i32,
        value: Option<CommittedOffset>,
    },
    Group {
        group: String,
        value: Option<GroupMetadata>,
    },
    /// One record of a consumer-protocol group ([`super::consumer_records`]).
    Consumer {
        group: String,
        key: ConsumerKey,
        value: Option<ConsumerValue>,
    },
}

impl GroupRecord {
    /// The group the record belongs to.
    pub fn group(&self) -> &str {
        match self {
            GroupRecord::Offset { group, .. }
            | GroupRecord::Group { group, .. }
            | GroupRecord::Consumer { group, .. } => group,
        }
    }

    pub fn encode_key(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            GroupRecord::Offset {
                group,
                topic,
                partition,
                ..
            } => {
                b.put_i16(OFFSET_KEY_VERSION);
                put_str(&mut b, group);
                put_str(&mut b, topic);
                b.put_i32(*partition);
            }
            GroupRecord::Group { group, .. } => {
                b.put_i16(GROUP_KEY_VERSION);
                put_str(&mut b, group);
            }
            GroupRecord::Consumer { group, key, .. } => consumer_records::encode_key(&mut b, group, key),
        }
        b.freeze()
    }

    pub fn encode_value(&self) -> Option<Bytes> {
        let mut b = BytesMut::new();
        match self {
            GroupRecord::Offset { value, .. } => {
                let v = value.as_ref()?;
                b.put_i16(OFFSET_VALUE_VERSION);
                b.put_i64(v.offset);
                b.put_i32(v.leader_epoch);
                put_str(&mut b, &v.metadata);
                b.put_i64(v.commit_timestamp_ms);
            }
            GroupRecord::Group { value, .. } => {
                let v = value.as_ref()?;
                b.put_i16(GROUP_VALUE_VERSION);
                put_str(&mut b, &v.protocol_type);
                b.put_i32(v.generation);
                put_opt_str(&mut b, v.protocol.as_deref());
                put_opt_str(&mut b, v.leader.as_deref());
                b.put_i64(v.current_state_timestamp_ms);
                b.put_i32(v.members.len() as i32);
                for m in &v.members {
                    put_str(&mut b, &m.member_id);
                    put_opt_str(&mut b, m.instance_id.as_deref());
                    put_str(&mut b, &m.client_id);
                    put_str(&mut b, &m.client_host);
                    b.put_i32(m.rebalance_timeout_ms);
                    b.put_i32(m.session_timeout_ms);
                    put_bytes(&mut b, &m.subscription);
                    put_bytes(&mut b, &m.assignment);
                }
            }
            GroupRecord::Consumer { value, .. } => consumer_records::encode_value(&mut b, value.as_ref()?),
        }
        Some(b.freeze())
    }

    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<GroupRecord, RecordError> {
        let mut k = Reader(key);
        match k.i16()? {
            0 | OFFSET_KEY_VERSION => {
                let group = k.string()?;
                let topic = k.string()?;
                let partition = k.i32()?;
                let value = value.map(decode_offset_value).transpose()?;
                Ok(GroupRecord::Offset {
                    group,
                    topic,
                    partition,
                    value,
                })
            }
            GROUP_KEY_VERSION => {
                let group = k.string()?;
                let value = value.map(|v| decode_group_value(&group, v)).transpose()?;
                Ok(GroupRecord::Group { group, value })
            }
            version @ (consumer_records::EPOCH_KEY
            | consumer_records::MEMBER_KEY
            | consumer_records::TARGET_EPOCH_KEY
            | consumer_records::TARGET_KEY
            | consumer_records::CURRENT_KEY) => consumer_records::decode(version, &mut k, value),
            other => Err(RecordError(format!("unknown key version {other}"))),
        }
    }
}

fn decode_offset_value(value: &[u8]) -> Result<CommittedOffset, RecordError> {
    let mut r = Reader(value);
    let version = r.i16()?;
    if !(0..=3).contains(&version) {
        return Err(RecordError(format!("offset value version {version}")));
    }
    let offset = r.i64()?;
    let leader_epoch = if version >= 3 { r.i32()? } else { -1 };
    let metadata = r.string()?;
    let commit_timestamp_ms = r.i64()?;
    Ok(CommittedOffset {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp_ms,
    })
}

fn decode_group_value(group: &str, value: &[u8]) -> Result<GroupMetadata, RecordError> {
    let mut r = Reader(value);
    let version = r.i16()?;
    if !(0..=3).contains(&version) {
        return Err(RecordError(format!("group value version {version}")));
    }
    let protocol_type = r.string()?;
    let generation = r.i32()?;
    let protocol = r.opt_string()?;
    let leader = r.opt_string()?;
    let current_state_timestamp_ms = if version >= 2 { r.i64()? } else { -1 };
    let count = r.i32()?;
    let mut members = Vec::new();
    for _ in 0..count.max(0) {
        let member_id = r.string()?;
        let instance_id = if version >= 3 { r.opt_string()? } else { None };
        let client_id = r.string()?;
        let client_host = r.string()?;
        let rebalance_timeout_ms = if version >= 1 { r.i32()? } else { -1 };
        let session_timeout_ms = r.i32()?;
        let subscription = r.bytes()?;
        let assignment = r.bytes()?;
        members.push(MemberMetadata {
            member_id,
            instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms: if rebalance_timeout_ms < 0 {
                session_timeout_ms
            } else {
                rebalance_timeout_ms
            },
            session_timeout_ms,
            subscription,
            assignment,
        });
    }
    Ok(GroupMetadata {
        group: group.to_string(),
        protocol_type,
        generation,
        protocol,
        leader,
        current_state_timestamp_ms,
        members,
    })
}

/// The topics of a consumer-protocol subscription (`ConsumerProtocolSubscription`,
/// any version: the topic list comes first in all of them). `None` if the
/// bytes are not one.
pub fn subscribed_topics(subscription: &[u8]) -> Option<Vec<String>> {
    let mut r = Reader(subscription);
    r.i16().ok()?;
    let count = r.i32().ok()?;
    let mut topics = Vec::new();
    for _ in 0..count.max(0) {
        topics.push(r.string().ok()?);
    }
    Some(topics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let records = [
            GroupRecord::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: 3,
                value: Some(CommittedOffset {
                    offset: 42,
                    leader_epoch: 0,
                    metadata: "m".into(),
                    commit_timestamp_ms: 1_700_000_000_000,
                }),
            },
            GroupRecord::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: 3,
                value: None,
            },
            GroupRecord::Group {
                group: "g".into(),
                value: Some(GroupMetadata {
                    group: "g".into(),
                    protocol_type: "consumer".into(),
                    generation: 7,
                    protocol: Some("range".into()),
                    leader: Some("m-1".into()),
                    current_state_timestamp_ms: 5,
                    members: vec![MemberMetadata {
                        member_id: "m-1".into(),
                        instance_id: Some("i".into()),
                        client_id: "c".into(),
                        client_host: "/127.0.0.1".into(),
                        rebalance_timeout_ms: 300_000,
                        session_timeout_ms: 45_000,
                        subscription: Bytes::from_static(b"sub"),
                        assignment: Bytes::from_static(b"asg"),
                    }],
                }),
            },
        ];
        for r in records {
            let key = r.encode_key();
            let value = r.encode_value();
            assert_eq!(GroupRecord::decode(&key, value.as_deref()).unwrap(), r);
        }
    }

    #[test]
    fn truncated_records_are_errors() {
        let r = GroupRecord::Group {
            group: "group".into(),
            value: None,
        };
        let key = r.encode_key();
        for n in 0..key.len() {
            assert!(GroupRecord::decode(&key[..n], None).is_err());
        }
    }

    #[test]
    fn subscription_topics() {
        // version 1, topics ["a", "bc"], then fields this reader ignores.
        let sub = [0, 1, 0, 0, 0, 2, 0, 1, b'a', 0, 2, b'b', b'c', 255, 255, 255, 255];
        assert_eq!(subscribed_topics(&sub), Some(vec!["a".into(), "bc".into()]));
        assert_eq!(subscribed_topics(&[0, 1, 0, 0]), None);
    }
}
