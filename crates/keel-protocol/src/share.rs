//! ShareFetch and ShareAcknowledge v2 and DescribeShareGroupOffsets v1
//! (Kafka 4.2), which `kafka-protocol` 0.18 lacks: it has ShareFetch and
//! ShareAcknowledge v1 and DescribeShareGroupOffsets v0 only.
//!
//! v2 adds fixed-size fields at the top level and nothing below it:
//!
//! * ShareFetchRequest: `ShareAcquireMode` (int8, KIP-1206) and
//!   `IsRenewAck` (bool, KIP-1222), after `BatchSize`;
//! * ShareAcknowledgeRequest: `IsRenewAck` (bool), after
//!   `ShareSessionEpoch`;
//! * ShareAcknowledgeResponse: `AcquisitionLockTimeoutMs` (int32), after
//!   `ErrorMessage`;
//! * ShareFetchResponse: nothing (v2 is laid out as v1).
//!
//! So each v2 message is its v1 encoding with those bytes inserted at one
//! place: the codec's v1 encoder and decoder do everything else, and this
//! module only finds the place (past the leading strings and integers)
//! and moves the bytes.
//!
//! DescribeShareGroupOffsetsResponse v1 adds `Lag` (int64, KIP-1226) to
//! every partition, so [`ShareOffsetsAnswer`] writes and reads v1 whole
//! (its request v1 is laid out as v0).

use anyhow::{bail, ensure, Result};
use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::{
    DescribeShareGroupOffsetsResponse, GroupId, ShareAcknowledgeRequest, ShareAcknowledgeResponse,
    ShareFetchRequest, TopicName,
};
use kafka_protocol::protocol::buf::{ByteBuf, ByteBufMut};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::protocol::{Decodable, Encodable, Message, VersionRange};

/// How a ShareFetch acquires records (`share.acquire.mode`, KIP-1206).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ShareAcquireMode {
    /// `batch_optimized` (0): `MaxRecords` may be exceeded to finish a
    /// batch.
    #[default]
    BatchOptimized,
    /// `record_limit` (1): never more than `MaxRecords`.
    RecordLimit,
    /// Any other id: the request is answered INVALID_REQUEST.
    Unknown(i8),
}

impl ShareAcquireMode {
    fn from_id(id: i8) -> ShareAcquireMode {
        match id {
            0 => ShareAcquireMode::BatchOptimized,
            1 => ShareAcquireMode::RecordLimit,
            other => ShareAcquireMode::Unknown(other),
        }
    }

    fn id(self) -> i8 {
        match self {
            ShareAcquireMode::BatchOptimized => 0,
            ShareAcquireMode::RecordLimit => 1,
            ShareAcquireMode::Unknown(id) => id,
        }
    }
}

/// A ShareFetch request of any version Keel serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShareFetch {
    /// The fields v1 has.
    pub request: ShareFetchRequest,
    /// v2: how to acquire.
    pub acquire_mode: ShareAcquireMode,
    /// v2: the acknowledgements may renew locks; nothing is fetched.
    pub is_renew_ack: bool,
}

/// A ShareAcknowledge request of any version Keel serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShareAcknowledge {
    /// The fields v1 has.
    pub request: ShareAcknowledgeRequest,
    /// v2: the acknowledgements may renew locks.
    pub is_renew_ack: bool,
}

/// A ShareAcknowledge response of any version Keel serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShareAcknowledgeAnswer {
    /// The fields v1 has.
    pub response: ShareAcknowledgeResponse,
    /// v2: how long acquired records stay locked to their member.
    pub acquisition_lock_timeout_ms: i32,
}

const V1: i16 = 1;
const VERSIONS: VersionRange = VersionRange { min: 1, max: 2 };

fn check_version(version: i16) -> Result<()> {
    ensure!(
        (VERSIONS.min..=VERSIONS.max).contains(&version),
        "specified version not supported by this message type"
    );
    Ok(())
}

/// The length of `strings` compact nullable strings and then `fixed`
/// bytes at the start of `bytes`: where a v2 field goes.
fn prefix_len(bytes: &[u8], strings: usize, fixed: usize) -> Result<usize> {
    let mut at = 0;
    for _ in 0..strings {
        // A compact nullable string: an unsigned varint of its length
        // plus one (0: null), then the bytes.
        let mut len: u64 = 0;
        for shift in (0..35).step_by(7) {
            let Some(&b) = bytes.get(at) else {
                bail!("message ends inside a string length");
            };
            at += 1;
            len |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            ensure!(shift < 28, "string length varint too long");
        }
        at += usize::try_from(len.saturating_sub(1))?;
    }
    let at = at + fixed;
    ensure!(at <= bytes.len(), "message ends inside its fixed fields");
    Ok(at)
}

/// Decodes a v2 message as v1 after taking the `n` bytes of its v2
/// fields out at their place: the message and those bytes. Like the
/// codec's decoders, it ignores whatever follows the message.
fn decode_without<M: Decodable, B: ByteBuf>(
    buf: &mut B,
    strings: usize,
    fixed: usize,
    n: usize,
) -> Result<(M, Bytes)> {
    let all = buf.try_get_bytes(buf.remaining())?;
    let at = prefix_len(&all, strings, fixed)?;
    ensure!(all.len() >= at + n, "message ends inside its version 2 fields");
    let mut v1 = BytesMut::with_capacity(all.len() - n);
    v1.extend_from_slice(&all[..at]);
    v1.extend_from_slice(&all[at + n..]);
    let message = M::decode(&mut v1.freeze(), V1)?;
    Ok((message, all.slice(at..at + n)))
}

/// Encodes `message` as v1 with `extra` inserted at its place.
fn encode_with<M: Encodable, B: ByteBufMut>(
    buf: &mut B,
    message: &M,
    strings: usize,
    fixed: usize,
    extra: &[u8],
) -> Result<()> {
    let mut v1 = BytesMut::with_capacity(message.compute_size(V1)?);
    message.encode(&mut v1, V1)?;
    let at = prefix_len(&v1, strings, fixed)?;
    buf.put_slice(&v1[..at]);
    buf.put_slice(extra);
    buf.put_slice(&v1[at..]);
    Ok(())
}

// ShareFetchRequest: GroupId, MemberId, then six int32 (session epoch,
// max wait, min bytes, max bytes, max records, batch size).
const FETCH_STRINGS: usize = 2;
const FETCH_FIXED: usize = 24;

impl Decodable for ShareFetch {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        check_version(version)?;
        if version == V1 {
            return Ok(ShareFetch {
                request: ShareFetchRequest::decode(buf, V1)?,
                ..ShareFetch::default()
            });
        }
        let (request, mut extra) =
            decode_without::<ShareFetchRequest, B>(buf, FETCH_STRINGS, FETCH_FIXED, 2)?;
        let acquire_mode = ShareAcquireMode::from_id(extra.get_i8());
        let is_renew_ack = extra.get_u8() != 0;
        Ok(ShareFetch {
            request,
            acquire_mode,
            is_renew_ack,
        })
    }
}

impl Encodable for ShareFetch {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        check_version(version)?;
        if version == V1 {
            return self.request.encode(buf, V1);
        }
        let extra = [self.acquire_mode.id() as u8, u8::from(self.is_renew_ack)];
        encode_with(buf, &self.request, FETCH_STRINGS, FETCH_FIXED, &extra)
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        check_version(version)?;
        Ok(self.request.compute_size(V1)? + if version == V1 { 0 } else { 2 })
    }
}

impl Message for ShareFetch {
    const VERSIONS: VersionRange = VERSIONS;
    const DEPRECATED_VERSIONS: Option<VersionRange> = None;
}

// ShareAcknowledgeRequest: GroupId, MemberId, ShareSessionEpoch.
const ACK_STRINGS: usize = 2;
const ACK_FIXED: usize = 4;

impl Decodable for ShareAcknowledge {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        check_version(version)?;
        if version == V1 {
            return Ok(ShareAcknowledge {
                request: ShareAcknowledgeRequest::decode(buf, V1)?,
                is_renew_ack: false,
            });
        }
        let (request, mut extra) =
            decode_without::<ShareAcknowledgeRequest, B>(buf, ACK_STRINGS, ACK_FIXED, 1)?;
        let is_renew_ack = extra.get_u8() != 0;
        Ok(ShareAcknowledge {
            request,
            is_renew_ack,
        })
    }
}

impl Encodable for ShareAcknowledge {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        check_version(version)?;
        if version == V1 {
            return self.request.encode(buf, V1);
        }
        encode_with(
            buf,
            &self.request,
            ACK_STRINGS,
            ACK_FIXED,
            &[u8::from(self.is_renew_ack)],
        )
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        check_version(version)?;
        Ok(self.request.compute_size(V1)? + if version == V1 { 0 } else { 1 })
    }
}

impl Message for ShareAcknowledge {
    const VERSIONS: VersionRange = VERSIONS;
    const DEPRECATED_VERSIONS: Option<VersionRange> = None;
}

/// Where ShareAcknowledgeResponse's `AcquisitionLockTimeoutMs` goes:
/// past the throttle time and error code (6 bytes) and the error message.
fn ack_answer_at(bytes: &[u8]) -> Result<usize> {
    ensure!(bytes.len() >= 6, "message ends inside its fixed fields");
    Ok(6 + prefix_len(&bytes[6..], 1, 0)?)
}

impl Encodable for ShareAcknowledgeAnswer {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        check_version(version)?;
        if version == V1 {
            return self.response.encode(buf, V1);
        }
        let mut v1 = BytesMut::with_capacity(self.response.compute_size(V1)?);
        self.response.encode(&mut v1, V1)?;
        let at = ack_answer_at(&v1)?;
        buf.put_slice(&v1[..at]);
        buf.put_i32(self.acquisition_lock_timeout_ms);
        buf.put_slice(&v1[at..]);
        Ok(())
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        check_version(version)?;
        Ok(self.response.compute_size(V1)? + if version == V1 { 0 } else { 4 })
    }
}

impl Decodable for ShareAcknowledgeAnswer {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        check_version(version)?;
        if version == V1 {
            return Ok(ShareAcknowledgeAnswer {
                response: ShareAcknowledgeResponse::decode(buf, V1)?,
                acquisition_lock_timeout_ms: 0,
            });
        }
        let all = buf.try_get_bytes(buf.remaining())?;
        let at = ack_answer_at(&all)?;
        ensure!(all.len() >= at + 4, "message ends inside its version 2 fields");
        let mut timeout = &all[at..at + 4];
        let acquisition_lock_timeout_ms = timeout.get_i32();
        let mut v1 = BytesMut::with_capacity(all.len() - 4);
        v1.extend_from_slice(&all[..at]);
        v1.extend_from_slice(&all[at + 4..]);
        let response = ShareAcknowledgeResponse::decode(&mut v1.freeze(), V1)?;
        Ok(ShareAcknowledgeAnswer {
            response,
            acquisition_lock_timeout_ms,
        })
    }
}

impl Message for ShareAcknowledgeAnswer {
    const VERSIONS: VersionRange = VERSIONS;
    const DEPRECATED_VERSIONS: Option<VersionRange> = None;
}

/// A DescribeShareGroupOffsets response of any version Keel serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShareOffsetsAnswer {
    /// The fields v0 has.
    pub response: DescribeShareGroupOffsetsResponse,
    /// v1: each share partition's lag, by group, topic name and
    /// partition; a partition without one is answered -1 (unknown), as
    /// Kafka answers it.
    pub lags: std::collections::BTreeMap<(String, String, i32), i64>,
}

/// The lag of a partition Kafka does not know it for.
pub const UNKNOWN_LAG: i64 = -1;

fn put_uvarint<B: ByteBufMut>(buf: &mut B, mut n: u64) {
    while n >= 0x80 {
        buf.put_u8((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    buf.put_u8(n as u8);
}

fn uvarint_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

fn get_uvarint<B: ByteBuf>(buf: &mut B) -> Result<u64> {
    let mut n: u64 = 0;
    for shift in (0..35).step_by(7) {
        ensure!(buf.has_remaining(), "message ends inside a varint");
        let b = buf.get_u8();
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(n);
        }
    }
    bail!("varint too long")
}

/// A compact (nullable) string.
fn put_string<B: ByteBufMut>(buf: &mut B, s: Option<&str>) {
    match s {
        None => put_uvarint(buf, 0),
        Some(s) => {
            put_uvarint(buf, s.len() as u64 + 1);
            buf.put_slice(s.as_bytes());
        }
    }
}

fn string_len(s: Option<&str>) -> usize {
    s.map_or(1, |s| uvarint_len(s.len() as u64 + 1) + s.len())
}

fn get_string<B: ByteBuf>(buf: &mut B) -> Result<Option<StrBytes>> {
    let n = get_uvarint(buf)?;
    if n == 0 {
        return Ok(None);
    }
    let len = usize::try_from(n - 1)?;
    ensure!(buf.remaining() >= len, "message ends inside a string");
    let bytes = buf.try_get_bytes(len)?;
    Ok(Some(StrBytes::from_utf8(bytes)?))
}

/// A compact array's length (its count plus one; 0 is null, which no
/// array of this message may be).
fn get_len<B: ByteBuf>(buf: &mut B) -> Result<usize> {
    let n = get_uvarint(buf)?;
    ensure!(n > 0, "null array");
    let n = usize::try_from(n - 1)?;
    // Every element takes a byte at least: a hostile count allocates
    // nothing it does not carry.
    ensure!(n <= buf.remaining(), "array longer than the message");
    Ok(n)
}

/// Skips a tagged-field section (Keel writes none).
fn skip_tags<B: ByteBuf>(buf: &mut B) -> Result<()> {
    for _ in 0..get_uvarint(buf)? {
        get_uvarint(buf)?;
        let size = usize::try_from(get_uvarint(buf)?)?;
        ensure!(buf.remaining() >= size, "message ends inside a tagged field");
        buf.advance(size);
    }
    Ok(())
}

fn need<B: ByteBuf>(buf: &B, n: usize) -> Result<()> {
    ensure!(buf.remaining() >= n, "message ends inside its fixed fields");
    Ok(())
}

impl ShareOffsetsAnswer {
    fn lag(&self, group: &str, topic: &str, partition: i32) -> i64 {
        self.lags
            .get(&(group.to_string(), topic.to_string(), partition))
            .copied()
            .unwrap_or(UNKNOWN_LAG)
    }
}

impl Encodable for ShareOffsetsAnswer {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        ensure!(
            (0..=1).contains(&version),
            "specified version not supported by this message type"
        );
        if version == 0 {
            return self.response.encode(buf, 0);
        }
        let r = &self.response;
        buf.put_i32(r.throttle_time_ms);
        put_uvarint(buf, r.groups.len() as u64 + 1);
        for g in &r.groups {
            put_string(buf, Some(&g.group_id));
            put_uvarint(buf, g.topics.len() as u64 + 1);
            for t in &g.topics {
                put_string(buf, Some(&t.topic_name));
                buf.put_slice(t.topic_id.as_bytes());
                put_uvarint(buf, t.partitions.len() as u64 + 1);
                for p in &t.partitions {
                    buf.put_i32(p.partition_index);
                    buf.put_i64(p.start_offset);
                    buf.put_i32(p.leader_epoch);
                    buf.put_i64(self.lag(&g.group_id, &t.topic_name, p.partition_index));
                    buf.put_i16(p.error_code);
                    put_string(buf, p.error_message.as_deref());
                    put_uvarint(buf, 0);
                }
                put_uvarint(buf, 0);
            }
            buf.put_i16(g.error_code);
            put_string(buf, g.error_message.as_deref());
            put_uvarint(buf, 0);
        }
        put_uvarint(buf, 0);
        Ok(())
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        ensure!(
            (0..=1).contains(&version),
            "specified version not supported by this message type"
        );
        if version == 0 {
            return self.response.compute_size(0);
        }
        let r = &self.response;
        let mut n = 4 + uvarint_len(r.groups.len() as u64 + 1) + 1;
        for g in &r.groups {
            n += string_len(Some(&g.group_id)) + uvarint_len(g.topics.len() as u64 + 1);
            for t in &g.topics {
                n += string_len(Some(&t.topic_name)) + 16 + uvarint_len(t.partitions.len() as u64 + 1) + 1;
                for p in &t.partitions {
                    n += 4 + 8 + 4 + 8 + 2 + string_len(p.error_message.as_deref()) + 1;
                }
            }
            n += 2 + string_len(g.error_message.as_deref()) + 1;
        }
        Ok(n)
    }
}

impl Decodable for ShareOffsetsAnswer {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        ensure!(
            (0..=1).contains(&version),
            "specified version not supported by this message type"
        );
        if version == 0 {
            return Ok(ShareOffsetsAnswer {
                response: DescribeShareGroupOffsetsResponse::decode(buf, 0)?,
                lags: Default::default(),
            });
        }
        let mut lags = std::collections::BTreeMap::new();
        need(buf, 4)?;
        let throttle_time_ms = buf.get_i32();
        let mut groups = Vec::new();
        for _ in 0..get_len(buf)? {
            let group_id = get_string(buf)?.ok_or_else(|| anyhow::anyhow!("null group id"))?;
            let mut topics = Vec::new();
            for _ in 0..get_len(buf)? {
                let name = get_string(buf)?.ok_or_else(|| anyhow::anyhow!("null topic name"))?;
                need(buf, 16)?;
                let mut id = [0u8; 16];
                buf.copy_to_slice(&mut id);
                let mut partitions = Vec::new();
                for _ in 0..get_len(buf)? {
                    need(buf, 4 + 8 + 4 + 8 + 2)?;
                    let (index, start, epoch) = (buf.get_i32(), buf.get_i64(), buf.get_i32());
                    lags.insert((group_id.to_string(), name.to_string(), index), buf.get_i64());
                    let error_code = buf.get_i16();
                    let error_message = get_string(buf)?;
                    skip_tags(buf)?;
                    partitions.push(
                        DescribeShareGroupOffsetsResponsePartition::default()
                            .with_partition_index(index)
                            .with_start_offset(start)
                            .with_leader_epoch(epoch)
                            .with_error_code(error_code)
                            .with_error_message(error_message),
                    );
                }
                skip_tags(buf)?;
                topics.push(
                    DescribeShareGroupOffsetsResponseTopic::default()
                        .with_topic_name(TopicName(name))
                        .with_topic_id(uuid::Uuid::from_bytes(id))
                        .with_partitions(partitions),
                );
            }
            need(buf, 2)?;
            let error_code = buf.get_i16();
            let error_message = get_string(buf)?;
            skip_tags(buf)?;
            groups.push(
                DescribeShareGroupOffsetsResponseGroup::default()
                    .with_group_id(GroupId(group_id))
                    .with_topics(topics)
                    .with_error_code(error_code)
                    .with_error_message(error_message),
            );
        }
        skip_tags(buf)?;
        Ok(ShareOffsetsAnswer {
            response: DescribeShareGroupOffsetsResponse::default()
                .with_throttle_time_ms(throttle_time_ms)
                .with_groups(groups),
            lags,
        })
    }
}

impl Message for ShareOffsetsAnswer {
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };
    const DEPRECATED_VERSIONS: Option<VersionRange> = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::GroupId;
    use kafka_protocol::protocol::StrBytes;

    fn fetch() -> ShareFetch {
        ShareFetch {
            request: ShareFetchRequest::default()
                .with_group_id(Some(GroupId(StrBytes::from_static_str("g"))))
                .with_member_id(Some(StrBytes::from_static_str("member")))
                .with_share_session_epoch(3)
                .with_max_records(500)
                .with_batch_size(500),
            acquire_mode: ShareAcquireMode::RecordLimit,
            is_renew_ack: true,
        }
    }

    /// The v2 fields sit where Kafka's schema puts them: after the six
    /// int32 that follow the group and member ids.
    #[test]
    fn share_fetch_v2_puts_its_fields_after_batch_size() {
        let f = fetch();
        let mut v2 = BytesMut::new();
        f.encode(&mut v2, 2).expect("encodes");
        let mut v1 = BytesMut::new();
        f.request.encode(&mut v1, 1).expect("encodes");
        assert_eq!(v2.len(), f.compute_size(2).expect("sized"));
        // "g" and "member": lengths plus one, then the bytes.
        let at = 2 + 7 + 24;
        assert_eq!(&v2[..at], &v1[..at]);
        assert_eq!(&v2[at..at + 2], &[1, 1]);
        assert_eq!(&v2[at + 2..], &v1[at..]);
        assert_eq!(ShareFetch::decode(&mut v2.freeze(), 2).expect("decodes"), f);
        let plain = ShareFetch::decode(&mut v1.freeze(), 1).expect("decodes");
        assert_eq!(
            (plain.acquire_mode, plain.is_renew_ack),
            (ShareAcquireMode::BatchOptimized, false)
        );
    }

    #[test]
    fn share_acknowledge_and_its_answer_round_trip_at_v2() {
        let a = ShareAcknowledge {
            request: ShareAcknowledgeRequest::default()
                .with_group_id(None)
                .with_share_session_epoch(9),
            is_renew_ack: true,
        };
        let mut buf = BytesMut::new();
        a.encode(&mut buf, 2).expect("encodes");
        // null group (0), empty member (1), epoch, then IsRenewAck.
        assert_eq!(&buf[..7], &[0, 1, 0, 0, 0, 9, 1]);
        assert_eq!(
            ShareAcknowledge::decode(&mut buf.freeze(), 2).expect("decodes"),
            a
        );
        let answer = ShareAcknowledgeAnswer {
            response: ShareAcknowledgeResponse::default()
                .with_error_code(87)
                .with_error_message(Some(StrBytes::from_static_str("no"))),
            acquisition_lock_timeout_ms: 30_000,
        };
        let mut buf = BytesMut::new();
        answer.encode(&mut buf, 2).expect("encodes");
        assert_eq!(buf.len(), answer.compute_size(2).expect("sized"));
        // throttle, error 87, "no", then the lock timeout.
        assert_eq!(&buf[4..13], &[0, 87, 3, b'n', b'o', 0, 0, 0x75, 0x30]);
        assert_eq!(
            ShareAcknowledgeAnswer::decode(&mut buf.freeze(), 2).expect("decodes"),
            answer
        );
    }

    /// Cut short anywhere, a v2 request is an error, never a panic; an
    /// unknown acquire mode is kept for the broker to refuse.
    #[test]
    fn short_or_unknown_v2_requests_are_errors() {
        let mut buf = BytesMut::new();
        fetch().encode(&mut buf, 2).expect("encodes");
        for n in 0..buf.len() {
            assert!(
                ShareFetch::decode(&mut buf.clone().freeze().slice(..n), 2).is_err(),
                "{n}"
            );
        }
        let mut unknown = buf.to_vec();
        unknown[2 + 7 + 24] = 7;
        let decoded = ShareFetch::decode(&mut Bytes::from(unknown), 2).expect("decodes");
        assert_eq!(decoded.acquire_mode, ShareAcquireMode::Unknown(7));
        // A string length varint that never ends.
        assert!(ShareFetch::decode(&mut Bytes::from(vec![0xff; 40]), 2).is_err());
        assert!(ShareFetch::decode(&mut Bytes::new(), 3).is_err());
    }

    /// DescribeShareGroupOffsetsResponse v1 writes each partition's lag
    /// after its leader epoch, and reads back what it wrote; v0 is the
    /// codec's.
    #[test]
    fn share_offsets_v1_carry_the_lag() {
        let partition = |i: i32| {
            DescribeShareGroupOffsetsResponsePartition::default()
                .with_partition_index(i)
                .with_start_offset(40)
                .with_leader_epoch(3)
        };
        let answer = ShareOffsetsAnswer {
            response: DescribeShareGroupOffsetsResponse::default().with_groups(vec![
                DescribeShareGroupOffsetsResponseGroup::default()
                    .with_group_id(GroupId(StrBytes::from_static_str("g")))
                    .with_topics(vec![DescribeShareGroupOffsetsResponseTopic::default()
                        .with_topic_name(TopicName(StrBytes::from_static_str("t")))
                        .with_topic_id(uuid::Uuid::from_u128(7))
                        .with_partitions(vec![partition(0), partition(1)])]),
                DescribeShareGroupOffsetsResponseGroup::default()
                    .with_group_id(GroupId(StrBytes::from_static_str("h")))
                    .with_error_code(69)
                    .with_error_message(Some(StrBytes::from_static_str("Group h not found."))),
            ]),
            lags: [(("g".to_string(), "t".to_string(), 0), 12)].into(),
        };
        let mut buf = BytesMut::new();
        answer.encode(&mut buf, 1).expect("encodes");
        assert_eq!(buf.len(), answer.compute_size(1).expect("sized"));
        // throttle, 2 groups, "g", 1 topic, "t", id, 2 partitions, then
        // partition 0: index, start 40, epoch 3, lag 12.
        let at = 4 + 1 + 2 + 1 + 2 + 16 + 1;
        assert_eq!(&buf[at..at + 4], &[0, 0, 0, 0]);
        assert_eq!(&buf[at + 16..at + 24], &12i64.to_be_bytes());
        let v1 = buf.freeze();
        let back = ShareOffsetsAnswer::decode(&mut v1.clone(), 1).expect("decodes");
        let mut expected = answer.clone();
        expected.lags.insert(("g".into(), "t".into(), 1), UNKNOWN_LAG);
        assert_eq!(back, expected);
        // Cut short anywhere: an error, never a panic.
        for n in 0..v1.len() {
            assert!(ShareOffsetsAnswer::decode(&mut v1.slice(..n), 1).is_err(), "{n}");
        }
    }
}
