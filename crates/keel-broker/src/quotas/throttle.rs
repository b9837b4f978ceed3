//! The responses a client quota can throttle: every response with Kafka's
//! `throttle_time_ms` field.

use keel_protocol::messages::*;

/// A response that carries a throttle time.
pub trait Throttle {
    /// Raises the response's `throttle_time_ms` to `ms` (the longest of
    /// what the request's quotas ask is what Kafka reports).
    fn raise_throttle_time_ms(&mut self, ms: i32);
}

macro_rules! throttle_field {
    ($($response:ty),* $(,)?) => {
        $(impl Throttle for $response {
            fn raise_throttle_time_ms(&mut self, ms: i32) {
                self.throttle_time_ms = self.throttle_time_ms.max(ms);
            }
        })*
    };
}

throttle_field!(
    ProduceResponse,
    FetchResponse,
    ListOffsetsResponse,
    MetadataResponse,
    ApiVersionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
    DeleteRecordsResponse,
    InitProducerIdResponse,
    OffsetForLeaderEpochResponse,
    DescribeConfigsResponse,
    CreatePartitionsResponse,
    DescribeClusterResponse,
    FindCoordinatorResponse,
    JoinGroupResponse,
    SyncGroupResponse,
    HeartbeatResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    ListGroupsResponse,
    DescribeGroupsResponse,
    DeleteGroupsResponse,
    OffsetDeleteResponse,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    AddOffsetsToTxnResponse,
    TxnOffsetCommitResponse,
    DescribeTransactionsResponse,
    ListTransactionsResponse,
    DescribeProducersResponse,
    DescribeLogDirsResponse,
    IncrementalAlterConfigsResponse,
    AlterConfigsResponse,
    ElectLeadersResponse,
    DescribeTopicPartitionsResponse,
    DescribeClientQuotasResponse,
    AlterClientQuotasResponse,
    DescribeUserScramCredentialsResponse,
    AlterUserScramCredentialsResponse,
    CreateAclsResponse,
    DescribeAclsResponse,
    DeleteAclsResponse,
    ConsumerGroupHeartbeatResponse,
    ConsumerGroupDescribeResponse,
    ShareGroupHeartbeatResponse,
    ShareGroupDescribeResponse,
    ShareFetchResponse,
    ShareAcknowledgeResponse,
    DescribeShareGroupOffsetsResponse,
    AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsetsResponse,
    ListConfigResourcesResponse,
);

/// DescribeShareGroupOffsets of any version (v1 is written by
/// `keel_protocol::share`).
impl Throttle for keel_protocol::share::ShareOffsetsAnswer {
    fn raise_throttle_time_ms(&mut self, ms: i32) {
        self.response.raise_throttle_time_ms(ms);
    }
}

/// ShareAcknowledge of any version (v2 is written by `keel_protocol::share`).
impl Throttle for keel_protocol::share::ShareAcknowledgeAnswer {
    fn raise_throttle_time_ms(&mut self, ms: i32) {
        self.response.raise_throttle_time_ms(ms);
    }
}
