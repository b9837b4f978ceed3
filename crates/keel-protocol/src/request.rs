//! Request decoding: header first (by hand, so short input cannot panic),
//! then the body through the codec, only for APIs and versions in
//! [`crate::versions::SUPPORTED`].

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::{Buf, Bytes};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;

use crate::versions;

/// A request frame whose fixed header fields have been read. The body (and
/// the rest of the header: client id, tagged fields) is still undecoded.
#[derive(Debug, Clone)]
pub struct RequestFrame {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    /// The whole frame, header included, without the size prefix.
    pub bytes: Bytes,
}

impl RequestFrame {
    /// Reads api key, version and correlation id. Never panics: frames shorter
    /// than [`crate::frame::MIN_REQUEST_BYTES`] are refused.
    pub fn parse(bytes: Bytes) -> Result<RequestFrame, DecodeError> {
        if bytes.len() < crate::frame::MIN_REQUEST_BYTES {
            return Err(DecodeError::Truncated);
        }
        let mut fixed = &bytes[..crate::frame::MIN_REQUEST_BYTES];
        Ok(RequestFrame {
            api_key: fixed.get_i16(),
            api_version: fixed.get_i16(),
            correlation_id: fixed.get_i32(),
            bytes,
        })
    }

    /// The API key, if it is one Kafka defines.
    pub fn known_api_key(&self) -> Option<ApiKey> {
        ApiKey::try_from(self.api_key).ok()
    }

    /// The client id of a request whose body is not decoded (an API or
    /// version Keel does not serve), read where request headers v1 and v2
    /// keep it: a nullable int16-length string after the correlation id.
    /// `None` when absent, null or cut short; invalid UTF-8 is replaced.
    pub fn client_id(&self) -> Option<String> {
        let rest = self.bytes.get(crate::frame::MIN_REQUEST_BYTES..)?;
        let len = usize::try_from(i16::from_be_bytes([*rest.first()?, *rest.get(1)?])).ok()?;
        rest.get(2..2 + len)
            .map(|id| String::from_utf8_lossy(id).into_owned())
    }
}

/// A decoded request Keel implements.
#[derive(Debug, Clone)]
pub enum Request {
    Produce(ProduceRequest),
    Fetch(FetchRequest),
    ListOffsets(ListOffsetsRequest),
    Metadata(MetadataRequest),
    ApiVersions(ApiVersionsRequest),
    CreateTopics(CreateTopicsRequest),
    DeleteTopics(DeleteTopicsRequest),
    DeleteRecords(DeleteRecordsRequest),
    InitProducerId(InitProducerIdRequest),
    OffsetForLeaderEpoch(OffsetForLeaderEpochRequest),
    DescribeConfigs(DescribeConfigsRequest),
    CreatePartitions(CreatePartitionsRequest),
    DescribeCluster(DescribeClusterRequest),
    FindCoordinator(FindCoordinatorRequest),
    JoinGroup(JoinGroupRequest),
    SyncGroup(SyncGroupRequest),
    Heartbeat(HeartbeatRequest),
    LeaveGroup(LeaveGroupRequest),
    OffsetCommit(OffsetCommitRequest),
    OffsetFetch(OffsetFetchRequest),
    ListGroups(ListGroupsRequest),
    DescribeGroups(DescribeGroupsRequest),
    DeleteGroups(DeleteGroupsRequest),
    OffsetDelete(OffsetDeleteRequest),
    AddPartitionsToTxn(AddPartitionsToTxnRequest),
    EndTxn(EndTxnRequest),
    AddOffsetsToTxn(AddOffsetsToTxnRequest),
    TxnOffsetCommit(TxnOffsetCommitRequest),
    WriteTxnMarkers(WriteTxnMarkersRequest),
    DescribeTransactions(DescribeTransactionsRequest),
    ListTransactions(ListTransactionsRequest),
    DescribeProducers(DescribeProducersRequest),
    DescribeLogDirs(DescribeLogDirsRequest),
    IncrementalAlterConfigs(IncrementalAlterConfigsRequest),
    AlterConfigs(AlterConfigsRequest),
    ElectLeaders(ElectLeadersRequest),
    DescribeTopicPartitions(DescribeTopicPartitionsRequest),
    DescribeClientQuotas(DescribeClientQuotasRequest),
    AlterClientQuotas(AlterClientQuotasRequest),
    SaslHandshake(SaslHandshakeRequest),
    SaslAuthenticate(SaslAuthenticateRequest),
    DescribeUserScramCredentials(DescribeUserScramCredentialsRequest),
    AlterUserScramCredentials(AlterUserScramCredentialsRequest),
    CreateAcls(CreateAclsRequest),
    DescribeAcls(DescribeAclsRequest),
    DeleteAcls(DeleteAclsRequest),
    ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest),
    ConsumerGroupDescribe(ConsumerGroupDescribeRequest),
    ShareGroupHeartbeat(ShareGroupHeartbeatRequest),
    ShareGroupDescribe(ShareGroupDescribeRequest),
    ShareFetch(crate::share::ShareFetch),
    ShareAcknowledge(crate::share::ShareAcknowledge),
    DescribeShareGroupOffsets(DescribeShareGroupOffsetsRequest),
    AlterShareGroupOffsets(AlterShareGroupOffsetsRequest),
    DeleteShareGroupOffsets(DeleteShareGroupOffsetsRequest),
    ListConfigResources(ListConfigResourcesRequest),
}

/// A request with its full header.
#[derive(Debug, Clone)]
pub struct DecodedRequest {
    pub header: RequestHeader,
    pub body: Request,
}

/// Why a request could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than the fixed header.
    Truncated,
    /// An API key Kafka does not define, or one Keel does not implement.
    UnsupportedApi { api_key: i16 },
    /// An implemented API at a version outside Keel's range. ApiVersions is
    /// answered anyway (KIP-511); every other API closes the connection.
    UnsupportedVersion { api_key: i16, api_version: i16 },
    /// The bytes do not form a valid message of the stated API and version.
    Malformed {
        api_key: i16,
        api_version: i16,
        reason: String,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "request shorter than its fixed header"),
            DecodeError::UnsupportedApi { api_key } => write!(f, "unsupported api key {api_key}"),
            DecodeError::UnsupportedVersion { api_key, api_version } => {
                write!(f, "unsupported version {api_version} of api key {api_key}")
            }
            DecodeError::Malformed {
                api_key,
                api_version,
                reason,
            } => {
                write!(
                    f,
                    "malformed request (api key {api_key} v{api_version}): {reason}"
                )
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes header and body of an implemented API.
pub fn decode(frame: &RequestFrame) -> Result<DecodedRequest, DecodeError> {
    let (api_key, api_version) = (frame.api_key, frame.api_version);
    let key = frame
        .known_api_key()
        .ok_or(DecodeError::UnsupportedApi { api_key })?;
    let support = versions::support(key).ok_or(DecodeError::UnsupportedApi { api_key })?;
    if api_version < support.min || api_version > support.max {
        return Err(DecodeError::UnsupportedVersion { api_key, api_version });
    }
    let malformed = |reason: String| DecodeError::Malformed {
        api_key,
        api_version,
        reason,
    };
    let mut buf = frame.bytes.clone();
    // The codec's decoders are not all panic-free on hostile input; a panic
    // here must cost one request, not a connection task or the process.
    catch_unwind(AssertUnwindSafe(|| {
        let header = RequestHeader::decode(&mut buf, key.request_header_version(api_version))
            .map_err(|e| malformed(format!("header: {e}")))?;
        let body = decode_body(key, &mut buf, api_version).map_err(|e| malformed(e.to_string()))?;
        Ok(DecodedRequest { header, body })
    }))
    .unwrap_or_else(|_| Err(malformed("decoder panicked".to_string())))
}

/// Decodes the body of an implemented API (the codec reports errors as
/// `anyhow::Error`, which is already in the dependency tree through it).
fn decode_body(key: ApiKey, buf: &mut Bytes, v: i16) -> anyhow::Result<Request> {
    Ok(match key {
        ApiKey::Produce => Request::Produce(ProduceRequest::decode(buf, v)?),
        ApiKey::Fetch => Request::Fetch(FetchRequest::decode(buf, v)?),
        ApiKey::ListOffsets => Request::ListOffsets(ListOffsetsRequest::decode(buf, v)?),
        ApiKey::Metadata => Request::Metadata(MetadataRequest::decode(buf, v)?),
        ApiKey::ApiVersions => Request::ApiVersions(ApiVersionsRequest::decode(buf, v)?),
        ApiKey::CreateTopics => Request::CreateTopics(CreateTopicsRequest::decode(buf, v)?),
        ApiKey::DeleteTopics => Request::DeleteTopics(DeleteTopicsRequest::decode(buf, v)?),
        ApiKey::DeleteRecords => Request::DeleteRecords(DeleteRecordsRequest::decode(buf, v)?),
        ApiKey::InitProducerId => Request::InitProducerId(InitProducerIdRequest::decode(buf, v)?),
        ApiKey::OffsetForLeaderEpoch => {
            Request::OffsetForLeaderEpoch(OffsetForLeaderEpochRequest::decode(buf, v)?)
        }
        ApiKey::DescribeConfigs => Request::DescribeConfigs(DescribeConfigsRequest::decode(buf, v)?),
        ApiKey::CreatePartitions => Request::CreatePartitions(CreatePartitionsRequest::decode(buf, v)?),
        ApiKey::DescribeCluster => Request::DescribeCluster(DescribeClusterRequest::decode(buf, v)?),
        ApiKey::FindCoordinator => Request::FindCoordinator(FindCoordinatorRequest::decode(buf, v)?),
        ApiKey::JoinGroup => Request::JoinGroup(JoinGroupRequest::decode(buf, v)?),
        ApiKey::SyncGroup => Request::SyncGroup(SyncGroupRequest::decode(buf, v)?),
        ApiKey::Heartbeat => Request::Heartbeat(HeartbeatRequest::decode(buf, v)?),
        ApiKey::LeaveGroup => Request::LeaveGroup(LeaveGroupRequest::decode(buf, v)?),
        ApiKey::OffsetCommit => Request::OffsetCommit(OffsetCommitRequest::decode(buf, v)?),
        ApiKey::OffsetFetch => Request::OffsetFetch(OffsetFetchRequest::decode(buf, v)?),
        ApiKey::ListGroups => Request::ListGroups(ListGroupsRequest::decode(buf, v)?),
        ApiKey::DescribeGroups => Request::DescribeGroups(DescribeGroupsRequest::decode(buf, v)?),
        ApiKey::DeleteGroups => Request::DeleteGroups(DeleteGroupsRequest::decode(buf, v)?),
        ApiKey::OffsetDelete => Request::OffsetDelete(OffsetDeleteRequest::decode(buf, v)?),
        ApiKey::AddPartitionsToTxn => Request::AddPartitionsToTxn(AddPartitionsToTxnRequest::decode(buf, v)?),
        ApiKey::EndTxn => Request::EndTxn(EndTxnRequest::decode(buf, v)?),
        ApiKey::AddOffsetsToTxn => Request::AddOffsetsToTxn(AddOffsetsToTxnRequest::decode(buf, v)?),
        ApiKey::TxnOffsetCommit => Request::TxnOffsetCommit(TxnOffsetCommitRequest::decode(buf, v)?),
        ApiKey::WriteTxnMarkers => Request::WriteTxnMarkers(WriteTxnMarkersRequest::decode(buf, v)?),
        ApiKey::DescribeTransactions => {
            Request::DescribeTransactions(DescribeTransactionsRequest::decode(buf, v)?)
        }
        ApiKey::ListTransactions => Request::ListTransactions(ListTransactionsRequest::decode(buf, v)?),
        ApiKey::DescribeProducers => Request::DescribeProducers(DescribeProducersRequest::decode(buf, v)?),
        ApiKey::DescribeLogDirs => Request::DescribeLogDirs(DescribeLogDirsRequest::decode(buf, v)?),
        ApiKey::IncrementalAlterConfigs => {
            Request::IncrementalAlterConfigs(IncrementalAlterConfigsRequest::decode(buf, v)?)
        }
        ApiKey::AlterConfigs => Request::AlterConfigs(AlterConfigsRequest::decode(buf, v)?),
        ApiKey::ElectLeaders => Request::ElectLeaders(ElectLeadersRequest::decode(buf, v)?),
        ApiKey::DescribeClientQuotas => {
            Request::DescribeClientQuotas(DescribeClientQuotasRequest::decode(buf, v)?)
        }
        ApiKey::AlterClientQuotas => Request::AlterClientQuotas(AlterClientQuotasRequest::decode(buf, v)?),
        ApiKey::SaslHandshake => Request::SaslHandshake(SaslHandshakeRequest::decode(buf, v)?),
        ApiKey::CreateAcls => Request::CreateAcls(CreateAclsRequest::decode(buf, v)?),
        ApiKey::DescribeAcls => Request::DescribeAcls(DescribeAclsRequest::decode(buf, v)?),
        ApiKey::DeleteAcls => Request::DeleteAcls(DeleteAclsRequest::decode(buf, v)?),
        ApiKey::SaslAuthenticate => Request::SaslAuthenticate(SaslAuthenticateRequest::decode(buf, v)?),
        ApiKey::AlterUserScramCredentials => {
            Request::AlterUserScramCredentials(AlterUserScramCredentialsRequest::decode(buf, v)?)
        }
        ApiKey::DescribeUserScramCredentials => {
            Request::DescribeUserScramCredentials(DescribeUserScramCredentialsRequest::decode(buf, v)?)
        }
        ApiKey::ConsumerGroupHeartbeat => {
            Request::ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest::decode(buf, v)?)
        }
        ApiKey::ConsumerGroupDescribe => {
            Request::ConsumerGroupDescribe(ConsumerGroupDescribeRequest::decode(buf, v)?)
        }
        ApiKey::ShareGroupHeartbeat => {
            Request::ShareGroupHeartbeat(ShareGroupHeartbeatRequest::decode(buf, v)?)
        }
        ApiKey::ShareGroupDescribe => Request::ShareGroupDescribe(ShareGroupDescribeRequest::decode(buf, v)?),
        ApiKey::ShareFetch => Request::ShareFetch(crate::share::ShareFetch::decode(buf, v)?),
        ApiKey::ShareAcknowledge => {
            Request::ShareAcknowledge(crate::share::ShareAcknowledge::decode(buf, v)?)
        }
        // v1 of the request is laid out as v0, the codec's last.
        ApiKey::DescribeShareGroupOffsets => {
            Request::DescribeShareGroupOffsets(DescribeShareGroupOffsetsRequest::decode(buf, v.min(0))?)
        }
        ApiKey::AlterShareGroupOffsets => {
            Request::AlterShareGroupOffsets(AlterShareGroupOffsetsRequest::decode(buf, v)?)
        }
        ApiKey::DeleteShareGroupOffsets => {
            Request::DeleteShareGroupOffsets(DeleteShareGroupOffsetsRequest::decode(buf, v)?)
        }
        ApiKey::ListConfigResources => {
            Request::ListConfigResources(ListConfigResourcesRequest::decode(buf, v)?)
        }
        ApiKey::DescribeTopicPartitions => {
            Request::DescribeTopicPartitions(DescribeTopicPartitionsRequest::decode(buf, v)?)
        }
        other => anyhow::bail!("{other:?} is not implemented"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(key: i16, version: i16, rest: &[u8]) -> RequestFrame {
        let mut v = Vec::new();
        v.extend_from_slice(&key.to_be_bytes());
        v.extend_from_slice(&version.to_be_bytes());
        v.extend_from_slice(&7i32.to_be_bytes());
        v.extend_from_slice(rest);
        RequestFrame::parse(Bytes::from(v)).expect("fixed header present")
    }

    #[test]
    fn short_frames_are_refused_without_panicking() {
        for n in 0..8 {
            let r = RequestFrame::parse(Bytes::from(vec![0u8; n]));
            assert_eq!(r.unwrap_err(), DecodeError::Truncated);
        }
    }

    #[test]
    fn api_versions_v3_decodes() {
        // client id "c", tagged fields 0, software name "n", version "1", tags 0
        let f = frame(18, 3, &[0, 1, b'c', 0, 2, b'n', 2, b'1', 0]);
        let d = decode(&f).expect("decodes");
        assert_eq!(d.header.correlation_id, 7);
        match d.body {
            Request::ApiVersions(r) => assert_eq!(r.client_software_name.as_str(), "n"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn the_client_id_is_read_without_decoding_the_body() {
        let frame = |bytes: &[u8]| RequestFrame::parse(Bytes::copy_from_slice(bytes)).unwrap();
        let fixed = [0u8, 7, 0, 3, 0, 0, 0, 9];
        let with = |tail: &[u8]| frame(&[&fixed[..], tail].concat());
        assert_eq!(with(b"\x00\x05probe\x00").client_id().as_deref(), Some("probe"));
        assert_eq!(with(b"\xff\xff").client_id(), None, "null");
        assert_eq!(with(b"\x00\x09cut").client_id(), None, "cut short");
        assert_eq!(with(b"").client_id(), None);
    }

    #[test]
    fn unknown_and_unsupported_are_distinguished() {
        assert_eq!(
            decode(&frame(999, 0, &[])).unwrap_err(),
            DecodeError::UnsupportedApi { api_key: 999 }
        );
        // Envelope: only KRaft controllers forward requests in one.
        assert_eq!(
            decode(&frame(58, 0, &[])).unwrap_err(),
            DecodeError::UnsupportedApi { api_key: 58 }
        );
        assert_eq!(
            decode(&frame(18, 99, &[])).unwrap_err(),
            DecodeError::UnsupportedVersion {
                api_key: 18,
                api_version: 99
            }
        );
        assert!(matches!(
            decode(&frame(0, 1, &[])),
            Err(DecodeError::UnsupportedVersion { .. })
        ));
    }

    #[test]
    fn truncated_bodies_are_malformed() {
        assert!(matches!(
            decode(&frame(3, 1, &[0, 1])),
            Err(DecodeError::Malformed { .. })
        ));
        assert!(matches!(
            decode(&frame(0, 9, &[0, 1, b'c', 0])),
            Err(DecodeError::Malformed { .. })
        ));
    }
}
