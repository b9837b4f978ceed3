//! ShareFetch and ShareAcknowledge v2 (Kafka 4.2), which `kafka-protocol`
//! 0.18 lacks: it has v1 only.
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

use anyhow::{bail, ensure, Result};
use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::{ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest};
use kafka_protocol::protocol::buf::{ByteBuf, ByteBufMut};
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
}

impl ShareAcquireMode {
    fn from_id(id: i8) -> Result<ShareAcquireMode> {
        match id {
            0 => Ok(ShareAcquireMode::BatchOptimized),
            1 => Ok(ShareAcquireMode::RecordLimit),
            other => bail!("unknown share acquire mode {other}"),
        }
    }

    fn id(self) -> i8 {
        match self {
            ShareAcquireMode::BatchOptimized => 0,
            ShareAcquireMode::RecordLimit => 1,
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
        let acquire_mode = ShareAcquireMode::from_id(extra.get_i8())?;
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

    /// Cut short anywhere, or with an unknown acquire mode, a v2 request
    /// is an error, never a panic.
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
        let mut bad = buf.to_vec();
        bad[2 + 7 + 24] = 7;
        assert!(ShareFetch::decode(&mut Bytes::from(bad), 2).is_err());
        // A string length varint that never ends.
        assert!(ShareFetch::decode(&mut Bytes::from(vec![0xff; 40]), 2).is_err());
        assert!(ShareFetch::decode(&mut Bytes::new(), 3).is_err());
    }
}
