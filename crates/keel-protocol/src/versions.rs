//! The APIs and versions Keel implements. This table is the only source for
//! the ApiVersions response and for refusing requests Keel cannot decode, so
//! what is advertised is exactly what is implemented.

use kafka_protocol::messages::ApiKey;

/// One implemented API: the versions advertised to clients and the versions
/// actually decoded. They differ only for Produce (see [`SUPPORTED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiSupport {
    pub key: ApiKey,
    /// Lowest version advertised in ApiVersions.
    pub advertised_min: i16,
    /// Lowest version decoded; requests below it are refused.
    pub min: i16,
    pub max: i16,
}

const fn api(key: ApiKey, min: i16, max: i16) -> ApiSupport {
    ApiSupport {
        key,
        advertised_min: min,
        min,
        max,
    }
}

/// Every API Keel serves.
///
/// Produce is advertised from version 0, as Apache Kafka 4.x does, although
/// versions below 3 (message formats v0/v1) are refused: librdkafka before
/// 2.10 disables compression when a broker advertises Produce from 3.
pub const SUPPORTED: &[ApiSupport] = &[
    ApiSupport {
        key: ApiKey::Produce,
        advertised_min: 0,
        min: 3,
        max: 13,
    },
    api(ApiKey::Fetch, 4, 18),
    api(ApiKey::ListOffsets, 1, 10),
    api(ApiKey::Metadata, 0, 13),
    api(ApiKey::ApiVersions, 0, 4),
    api(ApiKey::CreateTopics, 2, 7),
    api(ApiKey::DeleteTopics, 1, 6),
    api(ApiKey::DeleteRecords, 0, 2),
    api(ApiKey::InitProducerId, 0, 5),
    api(ApiKey::OffsetForLeaderEpoch, 2, 4),
    api(ApiKey::DescribeConfigs, 1, 4),
    api(ApiKey::CreatePartitions, 0, 3),
    api(ApiKey::DescribeCluster, 0, 2),
    // The classic consumer group protocol. JoinGroup v0 and v1 were removed
    // in Kafka 4.0 (KIP-896).
    api(ApiKey::FindCoordinator, 0, 6),
    api(ApiKey::JoinGroup, 2, 9),
    api(ApiKey::SyncGroup, 0, 5),
    api(ApiKey::Heartbeat, 0, 4),
    api(ApiKey::LeaveGroup, 0, 5),
    api(ApiKey::OffsetCommit, 2, 9),
    api(ApiKey::OffsetFetch, 1, 9),
    api(ApiKey::ListGroups, 0, 5),
    api(ApiKey::DescribeGroups, 0, 6),
    api(ApiKey::DeleteGroups, 0, 2),
    api(ApiKey::OffsetDelete, 0, 0),
    // Transactions (KIP-98). AddPartitionsToTxn v4+ is the batched form
    // brokers send each other, verify-only requests included. Transactions
    // v2 (KIP-890) are EndTxn v5, which bumps the epoch at every end,
    // TxnOffsetCommit v5 and Produce v12+, which add their partition to
    // the transaction themselves; clients use them when the ApiVersions
    // answer finalizes `transaction.version` 2.
    api(ApiKey::AddPartitionsToTxn, 0, 5),
    api(ApiKey::EndTxn, 0, 5),
    api(ApiKey::AddOffsetsToTxn, 0, 4),
    api(ApiKey::TxnOffsetCommit, 0, 5),
    // What `kafka-transactions` uses (KIP-664). WriteTxnMarkers v0 was
    // removed in Kafka 4.0.
    api(ApiKey::WriteTxnMarkers, 1, 1),
    api(ApiKey::DescribeTransactions, 0, 0),
    api(ApiKey::ListTransactions, 0, 2),
    api(ApiKey::DescribeProducers, 0, 0),
    // The operator surface. DescribeLogDirs v0 was removed in Kafka 4.0.
    api(ApiKey::DescribeLogDirs, 1, 4),
    api(ApiKey::IncrementalAlterConfigs, 0, 1),
    api(ApiKey::AlterConfigs, 0, 2),
    api(ApiKey::ElectLeaders, 0, 2),
    api(ApiKey::DescribeTopicPartitions, 0, 0),
    // Client quotas (KIP-546).
    api(ApiKey::DescribeClientQuotas, 0, 1),
    api(ApiKey::AlterClientQuotas, 0, 1),
    // SASL (KIP-43, KIP-152; SaslAuthenticate v1 carries the session
    // lifetime of KIP-368) and SCRAM credentials (KIP-554).
    api(ApiKey::SaslHandshake, 0, 1),
    api(ApiKey::SaslAuthenticate, 0, 2),
    api(ApiKey::DescribeUserScramCredentials, 0, 0),
    api(ApiKey::AlterUserScramCredentials, 0, 0),
    // ACLs (KIP-140; v0 and v1 were removed in Kafka 4.0).
    api(ApiKey::CreateAcls, 2, 3),
    api(ApiKey::DescribeAcls, 2, 3),
    api(ApiKey::DeleteAcls, 2, 3),
    // The consumer group protocol (KIP-848).
    api(ApiKey::ConsumerGroupHeartbeat, 0, 1),
    api(ApiKey::ConsumerGroupDescribe, 0, 1),
    // Share groups (KIP-932). ShareFetch and ShareAcknowledge v2 (Kafka
    // 4.2: RENEW acknowledgements, KIP-1222, and the record_limit acquire
    // mode, KIP-1206) are not in `kafka-protocol` 0.18: `crate::share`
    // adds them to its v1.
    api(ApiKey::ShareGroupHeartbeat, 1, 1),
    api(ApiKey::ShareGroupDescribe, 1, 1),
    api(ApiKey::ShareFetch, 1, 2),
    api(ApiKey::ShareAcknowledge, 1, 2),
    // What `kafka-share-groups` uses for offsets. DescribeShareGroupOffsets
    // v1 (Kafka 4.2: lag) is not in `kafka-protocol` 0.18: its request is
    // laid out as v0, its response is `crate::share::ShareOffsetsAnswer`.
    api(ApiKey::DescribeShareGroupOffsets, 0, 1),
    api(ApiKey::AlterShareGroupOffsets, 0, 0),
    api(ApiKey::DeleteShareGroupOffsets, 0, 0),
    // KIP-1142 (v0: ListClientMetricsResources).
    api(ApiKey::ListConfigResources, 0, 1),
];

/// The support entry for an API key, if Keel implements it.
pub fn support(key: ApiKey) -> Option<&'static ApiSupport> {
    SUPPORTED.iter().find(|a| a.key == key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::Message;

    /// Every advertised version must be decodable by the codec underneath;
    /// a version outside the codec's range would be advertised but unusable.
    #[test]
    fn table_stays_within_codec_ranges() {
        fn check<M: Message>(a: &ApiSupport) {
            assert!(
                a.min >= M::VERSIONS.min,
                "{:?} min {} < codec {}",
                a.key,
                a.min,
                M::VERSIONS.min
            );
            assert!(
                a.max <= M::VERSIONS.max,
                "{:?} max {} > codec {}",
                a.key,
                a.max,
                M::VERSIONS.max
            );
            assert!(a.advertised_min <= a.min);
        }
        for a in SUPPORTED {
            match a.key {
                ApiKey::Produce => check::<ProduceRequest>(a),
                ApiKey::Fetch => check::<FetchRequest>(a),
                ApiKey::ListOffsets => check::<ListOffsetsRequest>(a),
                ApiKey::Metadata => check::<MetadataRequest>(a),
                ApiKey::ApiVersions => check::<ApiVersionsRequest>(a),
                ApiKey::CreateTopics => check::<CreateTopicsRequest>(a),
                ApiKey::DeleteTopics => check::<DeleteTopicsRequest>(a),
                ApiKey::DeleteRecords => check::<DeleteRecordsRequest>(a),
                ApiKey::InitProducerId => check::<InitProducerIdRequest>(a),
                ApiKey::OffsetForLeaderEpoch => check::<OffsetForLeaderEpochRequest>(a),
                ApiKey::DescribeConfigs => check::<DescribeConfigsRequest>(a),
                ApiKey::CreatePartitions => check::<CreatePartitionsRequest>(a),
                ApiKey::DescribeCluster => check::<DescribeClusterRequest>(a),
                ApiKey::FindCoordinator => check::<FindCoordinatorRequest>(a),
                ApiKey::JoinGroup => check::<JoinGroupRequest>(a),
                ApiKey::SyncGroup => check::<SyncGroupRequest>(a),
                ApiKey::Heartbeat => check::<HeartbeatRequest>(a),
                ApiKey::LeaveGroup => check::<LeaveGroupRequest>(a),
                ApiKey::OffsetCommit => check::<OffsetCommitRequest>(a),
                ApiKey::OffsetFetch => check::<OffsetFetchRequest>(a),
                ApiKey::AddPartitionsToTxn => check::<AddPartitionsToTxnRequest>(a),
                ApiKey::EndTxn => check::<EndTxnRequest>(a),
                ApiKey::AddOffsetsToTxn => check::<AddOffsetsToTxnRequest>(a),
                ApiKey::TxnOffsetCommit => check::<TxnOffsetCommitRequest>(a),
                ApiKey::WriteTxnMarkers => check::<WriteTxnMarkersRequest>(a),
                ApiKey::DescribeTransactions => check::<DescribeTransactionsRequest>(a),
                ApiKey::ListTransactions => check::<ListTransactionsRequest>(a),
                ApiKey::DescribeProducers => check::<DescribeProducersRequest>(a),
                ApiKey::DescribeLogDirs => check::<DescribeLogDirsRequest>(a),
                ApiKey::IncrementalAlterConfigs => check::<IncrementalAlterConfigsRequest>(a),
                ApiKey::AlterConfigs => check::<AlterConfigsRequest>(a),
                ApiKey::ElectLeaders => check::<ElectLeadersRequest>(a),
                ApiKey::DescribeTopicPartitions => check::<DescribeTopicPartitionsRequest>(a),
                ApiKey::DescribeClientQuotas => check::<DescribeClientQuotasRequest>(a),
                ApiKey::AlterClientQuotas => check::<AlterClientQuotasRequest>(a),
                ApiKey::SaslHandshake => check::<SaslHandshakeRequest>(a),
                ApiKey::SaslAuthenticate => check::<SaslAuthenticateRequest>(a),
                ApiKey::DescribeUserScramCredentials => check::<DescribeUserScramCredentialsRequest>(a),
                ApiKey::AlterUserScramCredentials => check::<AlterUserScramCredentialsRequest>(a),
                ApiKey::CreateAcls => check::<CreateAclsRequest>(a),
                ApiKey::DescribeAcls => check::<DescribeAclsRequest>(a),
                ApiKey::DeleteAcls => check::<DeleteAclsRequest>(a),
                ApiKey::ConsumerGroupHeartbeat => check::<ConsumerGroupHeartbeatRequest>(a),
                ApiKey::ConsumerGroupDescribe => check::<ConsumerGroupDescribeRequest>(a),
                ApiKey::ShareGroupHeartbeat => check::<ShareGroupHeartbeatRequest>(a),
                ApiKey::ShareGroupDescribe => check::<ShareGroupDescribeRequest>(a),
                ApiKey::ShareFetch => check::<crate::share::ShareFetch>(a),
                ApiKey::ShareAcknowledge => check::<crate::share::ShareAcknowledge>(a),
                // The request of v1 is v0's; the response is Keel's.
                ApiKey::DescribeShareGroupOffsets => check::<crate::share::ShareOffsetsAnswer>(a),
                ApiKey::AlterShareGroupOffsets => check::<AlterShareGroupOffsetsRequest>(a),
                ApiKey::DeleteShareGroupOffsets => check::<DeleteShareGroupOffsetsRequest>(a),
                ApiKey::ListConfigResources => check::<ListConfigResourcesRequest>(a),
                ApiKey::ListGroups => check::<ListGroupsRequest>(a),
                ApiKey::DescribeGroups => check::<DescribeGroupsRequest>(a),
                ApiKey::DeleteGroups => check::<DeleteGroupsRequest>(a),
                ApiKey::OffsetDelete => check::<OffsetDeleteRequest>(a),
                other => panic!("{other:?} is in the table but has no codec check"),
            }
        }
    }
}
