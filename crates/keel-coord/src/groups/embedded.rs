//! The consumer protocol that classic JoinGroup and SyncGroup carry as
//! opaque bytes: Kafka's `ConsumerProtocolSubscription` and
//! `ConsumerProtocolAssignment`, versions 0 to 3 (not flexible). The
//! coordinator reads and writes them where a group moves between the
//! classic and the consumer protocol (KIP-848 online migration) and for
//! classic members that a consumer group hosts.
//!
//! ```text
//! Subscription: version i16, topics [string], user_data nullable bytes,
//!               v1+ owned_partitions [topic string, partitions [i32]],
//!               v2+ generation_id i32, v3+ rack_id nullable string
//! Assignment:   version i16, assigned_partitions [topic string, partitions [i32]],
//!               user_data nullable bytes
//! ```
//!
//! A version above 3 is read as 3, as Kafka's clients read it.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::{put_str, Reader, RecordError};

/// Partitions by topic name, in the order they were written.
pub type TopicPartitions = Vec<(String, Vec<i32>)>;

/// The highest version of either schema.
const HIGHEST_VERSION: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub version: i16,
    pub topics: Vec<String>,
    /// The partitions the member still holds (v1+; empty before).
    pub owned: TopicPartitions,
    pub rack_id: Option<String>,
}

fn version(r: &mut Reader) -> Result<i16, RecordError> {
    let v = r.i16()?;
    if v < 0 {
        return Err(RecordError(format!("consumer protocol version {v}")));
    }
    Ok(v.min(HIGHEST_VERSION))
}

fn count(r: &mut Reader) -> Result<usize, RecordError> {
    // Each element takes at least two bytes: a count beyond what is left
    // is refused before anything is allocated for it.
    let n = r.i32()?;
    let n = usize::try_from(n.max(0)).unwrap_or(0);
    r.need(n.saturating_mul(2).min(r.0.len() + 1))?;
    Ok(n)
}

fn topic_partitions(r: &mut Reader) -> Result<TopicPartitions, RecordError> {
    let mut out = Vec::new();
    for _ in 0..count(r)? {
        let topic = r.string()?;
        let mut partitions = Vec::new();
        for _ in 0..count(r)? {
            partitions.push(r.i32()?);
        }
        out.push((topic, partitions));
    }
    Ok(out)
}

impl Subscription {
    pub fn parse(bytes: &[u8]) -> Result<Subscription, RecordError> {
        let mut r = Reader(bytes);
        let version = version(&mut r)?;
        let mut topics = Vec::new();
        for _ in 0..count(&mut r)? {
            topics.push(r.string()?);
        }
        r.bytes()?; // user data
        let owned = if version >= 1 {
            topic_partitions(&mut r)?
        } else {
            Vec::new()
        };
        if version >= 2 {
            r.i32()?; // generation id
        }
        let rack_id = if version >= 3 { r.opt_string()? } else { None };
        Ok(Subscription {
            version,
            topics,
            owned,
            rack_id,
        })
    }

    /// The subscription as a v3 `ConsumerProtocolSubscription` (no user
    /// data, generation -1), as clients send it (tests).
    #[cfg(test)]
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(HIGHEST_VERSION);
        b.put_i32(self.topics.len() as i32);
        for t in &self.topics {
            put_str(&mut b, t);
        }
        b.put_i32(-1);
        put_topic_partitions(&mut b, &self.owned);
        b.put_i32(-1);
        match &self.rack_id {
            Some(rack) => put_str(&mut b, rack),
            None => b.put_i16(-1),
        }
        b.freeze()
    }
}

/// The version a subscription was written in (0 if it is too short to
/// say), the version its member reads assignments in.
pub fn subscription_version(bytes: &[u8]) -> i16 {
    version(&mut Reader(bytes)).unwrap_or(0)
}

/// An assignment: its partitions, and whether it carries user data (which
/// a server-side assignor cannot keep).
pub fn parse_assignment(bytes: &[u8]) -> Result<(TopicPartitions, bool), RecordError> {
    let mut r = Reader(bytes);
    version(&mut r)?;
    let partitions = topic_partitions(&mut r)?;
    let user_data = r.bytes()?;
    Ok((partitions, !user_data.is_empty()))
}

fn put_topic_partitions(b: &mut BytesMut, partitions: &TopicPartitions) {
    b.put_i32(partitions.len() as i32);
    for (topic, ps) in partitions {
        put_str(b, topic);
        b.put_i32(ps.len() as i32);
        for p in ps {
            b.put_i32(*p);
        }
    }
}

/// An assignment in `version` (clamped to 0..=3), without user data.
pub fn encode_assignment(version: i16, partitions: &TopicPartitions) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(version.clamp(0, HIGHEST_VERSION));
    put_topic_partitions(&mut b, partitions);
    b.put_i32(-1);
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_of_every_version_parse() {
        let v3 = Subscription {
            version: 3,
            topics: vec!["a".into(), "bc".into()],
            owned: vec![("a".into(), vec![0, 2])],
            rack_id: Some("r1".into()),
        };
        assert_eq!(Subscription::parse(&v3.encode()).unwrap(), v3);
        // v0: topics and user data only.
        let v0 = [0, 0, 0, 0, 0, 1, 0, 1, b'a', 0, 0, 0, 2, 7, 7];
        let parsed = Subscription::parse(&v0).unwrap();
        assert_eq!(
            (parsed.version, parsed.topics, parsed.owned),
            (0, vec!["a".to_string()], vec![])
        );
        // A version from the future is read as 3.
        let mut v9 = v3.encode().to_vec();
        v9[1] = 9;
        assert_eq!(Subscription::parse(&v9).unwrap().owned, v3.owned);
        assert_eq!(subscription_version(&v9), 3);
    }

    #[test]
    fn assignments_round_trip_and_report_user_data() {
        let parts: TopicPartitions = vec![("t".into(), vec![1, 3]), ("u".into(), vec![])];
        for version in [0, 1, 3] {
            assert_eq!(
                parse_assignment(&encode_assignment(version, &parts)).unwrap(),
                (parts.clone(), false)
            );
        }
        let mut with_data = encode_assignment(0, &parts).to_vec();
        with_data.truncate(with_data.len() - 4);
        with_data.extend_from_slice(&[0, 0, 0, 1, 9]);
        assert!(parse_assignment(&with_data).unwrap().1);
    }

    #[test]
    fn hostile_bytes_are_errors_not_allocations() {
        // A count of two billion topics in six bytes.
        assert!(Subscription::parse(&[0, 0, 0x7f, 0xff, 0xff, 0xff]).is_err());
        assert!(parse_assignment(&[0, 0, 0x7f, 0xff, 0xff, 0xff]).is_err());
        assert!(Subscription::parse(&[0xff, 0xff]).is_err());
        let good = encode_assignment(1, &vec![("t".into(), vec![1])]);
        for n in 0..good.len() {
            assert!(parse_assignment(&good[..n]).is_err(), "{n}");
        }
    }
}
