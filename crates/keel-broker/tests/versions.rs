//! Every API Keel advertises, at every version it advertises, answered with
//! a response that decodes at that version. Catches fields set on versions
//! that cannot carry them (the encoder refuses those, and the connection
//! would be closed).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use keel_broker::{Broker, ClientInfo, Reply};
use keel_config::BrokerConfig;
use keel_protocol::versions::SUPPORTED;
use keel_protocol::RequestFrame;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

async fn call<R: Encodable>(broker: &Arc<Broker>, key: ApiKey, version: i16, body: &R) -> Bytes {
    let mut buf = BytesMut::new();
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(9)
        .with_client_id(Some(StrBytes::from_static_str("versions-test")));
    header
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    body.encode(&mut buf, version).unwrap();
    match broker
        .handle(RequestFrame::parse(buf.freeze()).unwrap(), &ClientInfo::default())
        .await
    {
        Reply::Frame(mut bytes) => {
            let _size = bytes::Buf::get_i32(&mut bytes);
            let header_version = if key == ApiKey::ApiVersions {
                0
            } else {
                key.response_header_version(version)
            };
            let header = ResponseHeader::decode(&mut bytes, header_version).unwrap();
            assert_eq!(header.correlation_id, 9);
            bytes
        }
        other => panic!("{key:?} v{version}: expected a response, got {other:?}"),
    }
}

fn batch() -> Bytes {
    let mut b = keel_log::testing::BatchBuilder::new(1_000);
    for i in 0..3u8 {
        b = b.record(Some(&[i]), Some(b"v"));
    }
    Bytes::from(b.build())
}

fn request(key: ApiKey, version: i16, topic_id: uuid::Uuid) -> Box<dyn Fn(&mut BytesMut)> {
    let t = name("t");
    let id = if version >= 13 {
        topic_id
    } else {
        uuid::Uuid::nil()
    };
    match key {
        ApiKey::Produce => {
            let r = ProduceRequest::default()
                .with_acks(1)
                .with_timeout_ms(1000)
                .with_topic_data(vec![produce_request::TopicProduceData::default()
                    .with_name(if version >= 13 { name("") } else { t })
                    .with_topic_id(id)
                    .with_partition_data(vec![produce_request::PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(batch()))])]);
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::Fetch => {
            let r = FetchRequest::default()
                .with_max_wait_ms(0)
                .with_max_bytes(1 << 20)
                .with_topics(vec![fetch_request::FetchTopic::default()
                    .with_topic(if version >= 13 { name("") } else { t })
                    .with_topic_id(id)
                    .with_partitions(vec![fetch_request::FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(0)
                        .with_partition_max_bytes(1 << 20)])]);
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::ListOffsets => {
            let r = ListOffsetsRequest::default().with_topics(vec![
                list_offsets_request::ListOffsetsTopic::default()
                    .with_name(t)
                    .with_partitions(vec![list_offsets_request::ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(0)]),
            ]);
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::Metadata => {
            let r = MetadataRequest::default().with_topics(Some(vec![
                metadata_request::MetadataRequestTopic::default().with_name(Some(t)),
            ]));
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::ApiVersions => {
            let r = ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("test"))
                .with_client_software_version(StrBytes::from_static_str("1"));
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::CreateTopics => {
            let r = CreateTopicsRequest::default().with_topics(vec![
                create_topics_request::CreatableTopic::default()
                    .with_name(name(&format!("new-{version}")))
                    .with_num_partitions(1)
                    .with_replication_factor(1),
            ]);
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::DeleteTopics => {
            let n = name(&format!("new-{version}"));
            let r = if version >= 6 {
                DeleteTopicsRequest::default().with_topics(vec![
                    delete_topics_request::DeleteTopicState::default().with_name(Some(n)),
                ])
            } else {
                DeleteTopicsRequest::default().with_topic_names(vec![n])
            };
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::DeleteRecords => {
            let r = DeleteRecordsRequest::default().with_topics(vec![
                delete_records_request::DeleteRecordsTopic::default()
                    .with_name(t)
                    .with_partitions(vec![delete_records_request::DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(0)]),
            ]);
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::InitProducerId => {
            let r = InitProducerIdRequest::default()
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::OffsetForLeaderEpoch => {
            let r = OffsetForLeaderEpochRequest::default().with_topics(vec![
                offset_for_leader_epoch_request::OffsetForLeaderTopic::default()
                    .with_topic(t)
                    .with_partitions(vec![
                        offset_for_leader_epoch_request::OffsetForLeaderPartition::default()
                            .with_leader_epoch(0),
                    ]),
            ]);
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::DescribeConfigs => {
            let r = DescribeConfigsRequest::default()
                .with_include_synonyms(version >= 1)
                .with_resources(vec![
                    describe_configs_request::DescribeConfigsResource::default()
                        .with_resource_type(2)
                        .with_resource_name(StrBytes::from_static_str("t")),
                    describe_configs_request::DescribeConfigsResource::default()
                        .with_resource_type(4)
                        .with_resource_name(StrBytes::from_static_str("1")),
                ]);
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::CreatePartitions => {
            let r = CreatePartitionsRequest::default().with_topics(vec![
                create_partitions_request::CreatePartitionsTopic::default()
                    .with_name(t)
                    .with_count(2 + i32::from(version)),
            ]);
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        ApiKey::DescribeCluster => {
            let r = DescribeClusterRequest::default();
            Box::new(move |b| r.encode(b, version).unwrap())
        }
        _ => group_request(key, version),
    }
}

fn group_id(s: &str) -> GroupId {
    GroupId(StrBytes::from_string(s.to_string()))
}

fn str(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// Group APIs. Joins complete at once (no initial delay, one member); the
/// rest address an empty or unknown group, so nothing waits.
fn group_request(key: ApiKey, version: i16) -> Box<dyn Fn(&mut BytesMut)> {
    macro_rules! encoded {
        ($r:expr) => {{
            let r = $r;
            Box::new(move |b: &mut BytesMut| r.encode(b, version).unwrap())
        }};
    }
    match key {
        ApiKey::FindCoordinator if version < 4 => {
            encoded!(FindCoordinatorRequest::default().with_key(str("g")))
        }
        ApiKey::FindCoordinator => {
            encoded!(FindCoordinatorRequest::default().with_coordinator_keys(vec![str("g"), str("")]))
        }
        ApiKey::JoinGroup => {
            let r = JoinGroupRequest::default()
                .with_group_id(group_id(&format!("join-v{version}")))
                .with_session_timeout_ms(10_000)
                .with_rebalance_timeout_ms(10_000)
                .with_protocol_type(str("consumer"))
                .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default()
                    .with_name(str("range"))
                    .with_metadata(Bytes::from_static(b"m"))]);
            // v5+: a static member joins in one step.
            encoded!(if version >= 5 {
                r.with_group_instance_id(Some(str("instance")))
            } else {
                r
            })
        }
        ApiKey::SyncGroup => encoded!(SyncGroupRequest::default()
            .with_group_id(group_id("unknown"))
            .with_member_id(str("m"))),
        ApiKey::Heartbeat => encoded!(HeartbeatRequest::default()
            .with_group_id(group_id("unknown"))
            .with_member_id(str("m"))),
        ApiKey::LeaveGroup if version < 3 => encoded!(LeaveGroupRequest::default()
            .with_group_id(group_id("unknown"))
            .with_member_id(str("m"))),
        ApiKey::LeaveGroup => encoded!(LeaveGroupRequest::default()
            .with_group_id(group_id("unknown"))
            .with_members(vec![
                leave_group_request::MemberIdentity::default().with_member_id(str("m"))
            ])),
        ApiKey::OffsetCommit => encoded!(OffsetCommitRequest::default()
            .with_group_id(group_id("committed"))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![offset_commit_request::OffsetCommitRequestTopic::default()
                .with_name(name("t"))
                .with_partitions(vec![
                    offset_commit_request::OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(1)
                        .with_committed_metadata(Some(str("meta"))),
                    offset_commit_request::OffsetCommitRequestPartition::default().with_partition_index(9),
                ])])),
        ApiKey::OffsetFetch if version < 8 => encoded!(OffsetFetchRequest::default()
            .with_group_id(group_id("committed"))
            .with_topics(Some(vec![
                offset_fetch_request::OffsetFetchRequestTopic::default()
                    .with_name(name("t"))
                    .with_partition_indexes(vec![0, 1])
            ]))),
        ApiKey::OffsetFetch => encoded!(OffsetFetchRequest::default().with_groups(vec![
            offset_fetch_request::OffsetFetchRequestGroup::default()
                .with_group_id(group_id("committed"))
                .with_topics(None),
            offset_fetch_request::OffsetFetchRequestGroup::default()
                .with_group_id(group_id("unknown"))
                .with_topics(Some(vec![
                    offset_fetch_request::OffsetFetchRequestTopics::default()
                        .with_name(name("t"))
                        .with_partition_indexes(vec![0])
                ])),
        ])),
        ApiKey::ListGroups => encoded!(ListGroupsRequest::default()),
        ApiKey::DescribeGroups => encoded!(DescribeGroupsRequest::default().with_groups(vec![
            group_id("join-v5"),
            group_id("committed"),
            group_id("unknown"),
        ])),
        ApiKey::DeleteGroups => {
            encoded!(DeleteGroupsRequest::default()
                .with_groups_names(vec![group_id("unknown"), group_id("join-v5")]))
        }
        ApiKey::OffsetDelete => encoded!(OffsetDeleteRequest::default()
            .with_group_id(group_id("committed"))
            .with_topics(vec![offset_delete_request::OffsetDeleteRequestTopic::default()
                .with_name(name("t"))
                .with_partitions(vec![
                    offset_delete_request::OffsetDeleteRequestPartition::default().with_partition_index(0)
                ])])),
        ApiKey::AddPartitionsToTxn if version < 4 => encoded!(AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(str("unknown-txn")))
            .with_v3_and_below_producer_id(ProducerId(1))
            .with_v3_and_below_topics(vec![
                add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                    .with_name(name("t"))
                    .with_partitions(vec![0, 9])
            ])),
        ApiKey::AddPartitionsToTxn => encoded!(AddPartitionsToTxnRequest::default().with_transactions(vec![
            add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
                .with_transactional_id(TransactionalId(str("unknown-txn")))
                .with_producer_id(ProducerId(1))
                .with_verify_only(true)
                .with_topics(vec![
                    add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                        .with_name(name("t"))
                        .with_partitions(vec![0])
                ])
        ])),
        ApiKey::EndTxn => encoded!(EndTxnRequest::default()
            .with_transactional_id(TransactionalId(str("unknown-txn")))
            .with_producer_id(ProducerId(1))
            .with_committed(true)),
        ApiKey::AddOffsetsToTxn => encoded!(AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(str("unknown-txn")))
            .with_producer_id(ProducerId(1))
            .with_group_id(group_id("committed"))),
        ApiKey::TxnOffsetCommit => encoded!(TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(str("unknown-txn")))
            .with_group_id(group_id("committed"))
            .with_producer_id(ProducerId(1))
            .with_topics(vec![
                txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                    .with_name(name("t"))
                    .with_partitions(vec![
                        txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(1)
                    ])
            ])),
        ApiKey::WriteTxnMarkers => encoded!(WriteTxnMarkersRequest::default().with_markers(vec![
            write_txn_markers_request::WritableTxnMarker::default()
                .with_producer_id(ProducerId(123_456))
                .with_topics(vec![write_txn_markers_request::WritableTxnMarkerTopic::default()
                    .with_name(name("unknown-topic"))
                    .with_partition_indexes(vec![0])])
        ])),
        ApiKey::DescribeTransactions => encoded!(DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(str("unknown-txn"))])),
        ApiKey::ListTransactions => encoded!(ListTransactionsRequest::default().with_duration_filter(-1)),
        ApiKey::IncrementalAlterConfigs => encoded!(IncrementalAlterConfigsRequest::default()
            .with_resources(vec![
                incremental_alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(str("unknown-topic"))
            ])),
        ApiKey::AlterConfigs => encoded!(AlterConfigsRequest::default().with_resources(vec![
            alter_configs_request::AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(str("unknown-topic"))
        ])),
        ApiKey::DescribeTopicPartitions => encoded!(DescribeTopicPartitionsRequest::default()
            .with_topics(vec![
                describe_topic_partitions_request::TopicRequest::default().with_name(name("t"))
            ])
            .with_response_partition_limit(10)),
        ApiKey::ElectLeaders => encoded!(ElectLeadersRequest::default().with_topic_partitions(Some(vec![
            elect_leaders_request::TopicPartitions::default()
                .with_topic(name("t"))
                .with_partitions(vec![0, 9])
        ]))),
        ApiKey::DescribeLogDirs => encoded!(DescribeLogDirsRequest::default().with_topics(Some(vec![
            describe_log_dirs_request::DescribableLogDirTopic::default()
                .with_topic(name("t"))
                .with_partitions(vec![0, 9])
        ]))),
        ApiKey::DescribeProducers => encoded!(DescribeProducersRequest::default().with_topics(vec![
            describe_producers_request::TopicRequest::default()
                .with_name(name("t"))
                .with_partition_indexes(vec![0, 9])
        ])),
        ApiKey::DescribeClientQuotas => {
            encoded!(DescribeClientQuotasRequest::default().with_components(vec![
                describe_client_quotas_request::ComponentData::default()
                    .with_entity_type(str("user"))
                    .with_match_type(2)
            ]))
        }
        ApiKey::AlterClientQuotas => encoded!(AlterClientQuotasRequest::default().with_entries(vec![
            alter_client_quotas_request::EntryData::default()
                .with_entity(vec![alter_client_quotas_request::EntityData::default()
                    .with_entity_type(str("client-id"))
                    .with_entity_name(Some(str("versions")))])
                .with_ops(vec![alter_client_quotas_request::OpData::default()
                    .with_key(str("producer_byte_rate"))
                    .with_value(1e9)])
        ])),
        ApiKey::DescribeUserScramCredentials => encoded!(DescribeUserScramCredentialsRequest::default()
            .with_users(Some(vec![
                describe_user_scram_credentials_request::UserName::default().with_name(str("alice"))
            ]))),
        ApiKey::AlterUserScramCredentials => encoded!(AlterUserScramCredentialsRequest::default()
            .with_deletions(vec![
                alter_user_scram_credentials_request::ScramCredentialDeletion::default()
                    .with_name(str("alice"))
                    .with_mechanism(1)
            ])),
        ApiKey::SaslHandshake => encoded!(SaslHandshakeRequest::default().with_mechanism(str("PLAIN"))),
        ApiKey::CreateAcls => encoded!(CreateAclsRequest::default().with_creations(vec![
            create_acls_request::AclCreation::default()
                .with_resource_type(2)
                .with_resource_name(str("t"))
                .with_resource_pattern_type(3)
                .with_principal(str("User:alice"))
                .with_host(str("*"))
                .with_operation(4)
                .with_permission_type(3)
        ])),
        ApiKey::DescribeAcls => encoded!(DescribeAclsRequest::default()
            .with_resource_type_filter(1)
            .with_pattern_type_filter(1)
            .with_operation(1)
            .with_permission_type(1)),
        ApiKey::DeleteAcls => encoded!(DeleteAclsRequest::default().with_filters(vec![
            delete_acls_request::DeleteAclsFilter::default()
                .with_resource_type_filter(1)
                .with_pattern_type_filter(1)
                .with_operation(1)
                .with_permission_type(1)
        ])),
        ApiKey::SaslAuthenticate => encoded!(SaslAuthenticateRequest::default()
            .with_auth_bytes(bytes::Bytes::from_static(b"\0alice\0alice-secret"))),
        ApiKey::ConsumerGroupHeartbeat => encoded!(ConsumerGroupHeartbeatRequest::default()
            .with_group_id(group_id("kip848"))
            .with_member_id(str("member-1"))
            .with_member_epoch(0)
            .with_rebalance_timeout_ms(30_000)
            .with_subscribed_topic_names(Some(vec![name("t")]))
            .with_topic_partitions(Some(vec![]))),
        ApiKey::ConsumerGroupDescribe => encoded!(ConsumerGroupDescribeRequest::default()
            .with_group_ids(vec![group_id("kip848"), group_id("unknown")])),
        ApiKey::ListConfigResources => encoded!(ListConfigResourcesRequest::default()),
        ApiKey::ShareGroupHeartbeat => encoded!(ShareGroupHeartbeatRequest::default()
            .with_group_id(group_id("queue"))
            .with_member_id(str("share-member-1"))
            .with_member_epoch(0)
            .with_subscribed_topic_names(Some(vec![name("t")]))),
        ApiKey::ShareGroupDescribe => {
            encoded!(ShareGroupDescribeRequest::default()
                .with_group_ids(vec![group_id("queue"), group_id("unknown")]))
        }
        ApiKey::ShareFetch => encoded!(keel_protocol::share::ShareFetch {
            request: ShareFetchRequest::default()
                .with_group_id(Some(group_id("queue")))
                .with_member_id(Some(str("share-member-1")))
                .with_share_session_epoch(0)
                .with_max_records(10)
                .with_topics(vec![share_fetch_request::FetchTopic::default()
                    .with_topic_id(uuid::Uuid::nil())
                    .with_partitions(vec![share_fetch_request::FetchPartition::default()])]),
            acquire_mode: keel_protocol::share::ShareAcquireMode::RecordLimit,
            is_renew_ack: false,
        }),
        ApiKey::ShareAcknowledge => encoded!(keel_protocol::share::ShareAcknowledge {
            request: ShareAcknowledgeRequest::default()
                .with_group_id(Some(group_id("queue")))
                .with_member_id(Some(str("share-member-1")))
                .with_share_session_epoch(1),
            is_renew_ack: true,
        }),
        ApiKey::DescribeShareGroupOffsets => {
            let r = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
                describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup::default()
                    .with_group_id(group_id("queue")),
            ]);
            // v1 of the request is laid out as v0.
            Box::new(move |b: &mut BytesMut| r.encode(b, 0).unwrap())
        }
        ApiKey::AlterShareGroupOffsets => encoded!(AlterShareGroupOffsetsRequest::default()
            .with_group_id(group_id("queue"))
            .with_topics(vec![
                alter_share_group_offsets_request::AlterShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(name("t"))
                    .with_partitions(vec![
                        alter_share_group_offsets_request::AlterShareGroupOffsetsRequestPartition::default()
                    ])
            ])),
        ApiKey::DeleteShareGroupOffsets => encoded!(DeleteShareGroupOffsetsRequest::default()
            .with_group_id(group_id("other-queue"))
            .with_topics(vec![
                delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(name("t"))
            ])),
        other => panic!("{other:?} has no request in this test"),
    }
}

/// Wraps pre-encoded body bytes so `call` can frame them.
struct Raw(Bytes);

impl Encodable for Raw {
    fn encode<B: kafka_protocol::protocol::buf::ByteBufMut>(
        &self,
        buf: &mut B,
        _v: i16,
    ) -> anyhow::Result<()> {
        buf.put_slice(&self.0);
        Ok(())
    }
    fn compute_size(&self, _v: i16) -> anyhow::Result<usize> {
        Ok(self.0.len())
    }
}

fn decode_response(key: ApiKey, version: i16, mut body: Bytes) {
    let r = match key {
        ApiKey::Produce => ProduceResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::Fetch => FetchResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::ListOffsets => ListOffsetsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::Metadata => MetadataResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::ApiVersions => ApiVersionsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::CreateTopics => CreateTopicsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DeleteTopics => DeleteTopicsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DeleteRecords => DeleteRecordsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::InitProducerId => InitProducerIdResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::OffsetForLeaderEpoch => OffsetForLeaderEpochResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DescribeConfigs => DescribeConfigsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::CreatePartitions => CreatePartitionsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DescribeCluster => DescribeClusterResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::FindCoordinator => FindCoordinatorResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::JoinGroup => JoinGroupResponse::decode(&mut body, version).map(|r| {
            assert_eq!(
                r.error_code,
                if version == 4 { 79 } else { 0 },
                "JoinGroup v{version}"
            );
        }),
        ApiKey::SyncGroup => SyncGroupResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::Heartbeat => HeartbeatResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::LeaveGroup => LeaveGroupResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::OffsetCommit => OffsetCommitResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::OffsetFetch => OffsetFetchResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::ListGroups => ListGroupsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DescribeGroups => DescribeGroupsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DeleteGroups => DeleteGroupsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::OffsetDelete => OffsetDeleteResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::AddPartitionsToTxn => AddPartitionsToTxnResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::EndTxn => EndTxnResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::AddOffsetsToTxn => AddOffsetsToTxnResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::TxnOffsetCommit => TxnOffsetCommitResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::WriteTxnMarkers => WriteTxnMarkersResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DescribeTransactions => DescribeTransactionsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::ListTransactions => ListTransactionsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DescribeProducers => DescribeProducersResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DescribeLogDirs => DescribeLogDirsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::IncrementalAlterConfigs => {
            IncrementalAlterConfigsResponse::decode(&mut body, version).map(|_| ())
        }
        ApiKey::AlterConfigs => AlterConfigsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::ElectLeaders => ElectLeadersResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DescribeTopicPartitions => {
            DescribeTopicPartitionsResponse::decode(&mut body, version).map(|_| ())
        }
        ApiKey::DescribeClientQuotas => DescribeClientQuotasResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::AlterClientQuotas => AlterClientQuotasResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DescribeUserScramCredentials => {
            DescribeUserScramCredentialsResponse::decode(&mut body, version).map(|_| ())
        }
        ApiKey::AlterUserScramCredentials => {
            AlterUserScramCredentialsResponse::decode(&mut body, version).map(|_| ())
        }
        ApiKey::SaslHandshake => SaslHandshakeResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::CreateAcls => CreateAclsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DescribeAcls => DescribeAclsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::DeleteAcls => DeleteAclsResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::SaslAuthenticate => SaslAuthenticateResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::ConsumerGroupHeartbeat => {
            ConsumerGroupHeartbeatResponse::decode(&mut body, version).map(|_| ())
        }
        ApiKey::ConsumerGroupDescribe => {
            ConsumerGroupDescribeResponse::decode(&mut body, version).map(|_| ())
        }
        ApiKey::ListConfigResources => ListConfigResourcesResponse::decode(&mut body, version).map(|_| ()),
        ApiKey::ShareGroupHeartbeat => ShareGroupHeartbeatResponse::decode(&mut body, version).map(|r| {
            assert_eq!(r.error_code, 0, "ShareGroupHeartbeat: {:?}", r.error_message);
            assert!(r.assignment.is_some(), "a joining member is sent its assignment");
        }),
        ApiKey::ShareGroupDescribe => ShareGroupDescribeResponse::decode(&mut body, version).map(|_| ()),
        // v2 is laid out as v1 (see keel_protocol::share).
        ApiKey::ShareFetch => ShareFetchResponse::decode(&mut body, version.min(1)).map(|r| {
            assert_eq!(r.error_code, 0, "ShareFetch: {:?}", r.error_message);
        }),
        ApiKey::ShareAcknowledge => keel_protocol::share::ShareAcknowledgeAnswer::decode(&mut body, version)
            .map(|a| {
                assert!(version < 2 || a.acquisition_lock_timeout_ms > 0, "{a:?}");
            }),
        ApiKey::DescribeShareGroupOffsets => {
            keel_protocol::share::ShareOffsetsAnswer::decode(&mut body, version).map(|_| ())
        }
        ApiKey::AlterShareGroupOffsets => {
            AlterShareGroupOffsetsResponse::decode(&mut body, version).map(|_| ())
        }
        ApiKey::DeleteShareGroupOffsets => {
            DeleteShareGroupOffsetsResponse::decode(&mut body, version).map(|_| ())
        }
        other => panic!("{other:?} has no response in this test"),
    };
    r.unwrap_or_else(|e| panic!("{key:?} v{version}: response does not decode: {e}"));
    assert!(
        body.is_empty(),
        "{key:?} v{version}: {} trailing bytes",
        body.len()
    );
}

/// A broker in a temporary dir with a one-partition topic "t": the
/// broker, the dir (kept while the broker runs) and the topic's id.
async fn broker_with_topic() -> (Arc<Broker>, tempfile::TempDir, uuid::Uuid) {
    let dir = tempfile::tempdir().unwrap();
    let mut map = BTreeMap::new();
    map.insert("log.dirs".to_string(), dir.path().display().to_string());
    map.insert("group.initial.rebalance.delay.ms".to_string(), "0".to_string());
    let config = BrokerConfig::from_map(&map).unwrap();
    let broker = tokio::task::spawn_blocking(move || {
        Broker::open(
            config,
            vec![keel_config::listeners::Endpoint::plaintext("127.0.0.1", 9092)],
        )
    })
    .await
    .unwrap()
    .unwrap();
    let create =
        CreateTopicsRequest::default().with_topics(vec![create_topics_request::CreatableTopic::default()
            .with_name(name("t"))
            .with_num_partitions(1)
            .with_replication_factor(1)]);
    call(&broker, ApiKey::CreateTopics, 7, &create).await;
    let topic_id = broker.data.topics.get("t").unwrap().meta.topic_id;
    (broker, dir, topic_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_advertised_version_is_answered() {
    let (broker, _dir, topic_id) = broker_with_topic().await;
    for api in SUPPORTED {
        for version in api.min..=api.max {
            let mut body = BytesMut::new();
            request(api.key, version, topic_id)(&mut body);
            let response = call(&broker, api.key, version, &Raw(body.freeze())).await;
            decode_response(api.key, version, response);
        }
    }
}

/// RENEW acknowledgements (KIP-1222) as Kafka takes them: only at v2 and
/// with `IsRenewAck` (else the partition's acknowledgement fails with
/// INVALID_REQUEST); a renewing ShareFetch must set every limit to 0 and
/// fetches nothing; ShareAcknowledge v2 answers the lock duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_acknowledgements_need_v2_and_is_renew_ack() {
    use keel_protocol::share::{ShareAcknowledge, ShareAcknowledgeAnswer, ShareAcquireMode, ShareFetch};
    let (broker, _dir, topic_id) = broker_with_topic().await;
    let group = || GroupId(StrBytes::from_static_str("q"));
    let member = || StrBytes::from_static_str("renewer");
    // The member joins (its share partition starts at the log end), then
    // three records arrive.
    let join = ShareGroupHeartbeatRequest::default()
        .with_group_id(group())
        .with_member_id(member())
        .with_member_epoch(0)
        .with_subscribed_topic_names(Some(vec![name("t")]));
    call(&broker, ApiKey::ShareGroupHeartbeat, 1, &join).await;
    let produce = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![produce_request::TopicProduceData::default()
            .with_name(name("t"))
            .with_partition_data(vec![produce_request::PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(batch()))])]);
    call(&broker, ApiKey::Produce, 9, &produce).await;
    let fetch = |epoch: i32, acks: Option<i8>, max: i32, renews: bool| ShareFetch {
        request: ShareFetchRequest::default()
            .with_group_id(Some(group()))
            .with_member_id(Some(member()))
            .with_share_session_epoch(epoch)
            .with_max_records(max)
            .with_max_bytes(if max > 0 { 1 << 20 } else { 0 })
            .with_topics(vec![share_fetch_request::FetchTopic::default()
                .with_topic_id(topic_id)
                .with_partitions(vec![share_fetch_request::FetchPartition::default()
                    .with_acknowledgement_batches(
                        acks.map(|t| {
                            share_fetch_request::AcknowledgementBatch::default()
                                .with_first_offset(0)
                                .with_last_offset(2)
                                .with_acknowledge_types(vec![t])
                        })
                        .into_iter()
                        .collect(),
                    )])]),
        acquire_mode: ShareAcquireMode::RecordLimit,
        is_renew_ack: renews,
    };
    // (top-level error, the partition's acknowledgement error, offsets acquired)
    let answer = |mut body: Bytes| {
        let r = ShareFetchResponse::decode(&mut body, 1).unwrap();
        let part = r.responses.first().and_then(|t| t.partitions.first());
        (
            r.error_code,
            part.map_or(0, |p| p.acknowledge_error_code),
            part.map_or(0, |p| {
                p.acquired_records
                    .iter()
                    .map(|a| a.last_offset - a.first_offset + 1)
                    .sum::<i64>()
            }),
        )
    };
    let invalid = kafka_protocol::error::ResponseError::InvalidRequest.code();
    let unknown_mode = ShareFetch {
        acquire_mode: ShareAcquireMode::Unknown(7),
        ..fetch(0, None, 10, false)
    };
    let got = answer(call(&broker, ApiKey::ShareFetch, 2, &unknown_mode).await);
    assert_eq!(got.0, invalid, "an unknown acquire mode");
    let got = answer(call(&broker, ApiKey::ShareFetch, 2, &fetch(0, None, 10, false)).await);
    assert_eq!(got, (0, 0, 3), "the three records acquired");
    // RENEW at v1, or at v2 without IsRenewAck: refused.
    let got = answer(call(&broker, ApiKey::ShareFetch, 1, &fetch(1, Some(4), 0, false)).await);
    assert_eq!(got.1, invalid, "RENEW at v1");
    let got = answer(call(&broker, ApiKey::ShareFetch, 2, &fetch(2, Some(4), 0, false)).await);
    assert_eq!(got.1, invalid, "RENEW without IsRenewAck");
    // A renewing fetch that asks for records: refused whole.
    let got = answer(call(&broker, ApiKey::ShareFetch, 2, &fetch(3, Some(4), 10, true)).await);
    assert_eq!(got.0, invalid, "a renewing fetch with limits");
    let got = answer(call(&broker, ApiKey::ShareFetch, 2, &fetch(3, Some(4), 0, true)).await);
    assert_eq!(got, (0, 0, 0), "renewed, nothing fetched");
    // A group with share.renew.acknowledge.enable=false may not renew.
    let disable = IncrementalAlterConfigsRequest::default().with_resources(vec![
        incremental_alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(32)
            .with_resource_name(str("q"))
            .with_configs(vec![incremental_alter_configs_request::AlterableConfig::default(
            )
            .with_name(str("share.renew.acknowledge.enable"))
            .with_config_operation(0)
            .with_value(Some(str("false")))]),
    ]);
    let mut body = call(&broker, ApiKey::IncrementalAlterConfigs, 1, &disable).await;
    let altered = IncrementalAlterConfigsResponse::decode(&mut body, 1).unwrap();
    assert_eq!(altered.responses[0].error_code, 0, "{altered:?}");
    let got = answer(call(&broker, ApiKey::ShareFetch, 2, &fetch(4, Some(4), 0, true)).await);
    let state = kafka_protocol::error::ResponseError::InvalidRecordState.code();
    assert_eq!(got, (0, state, 0), "renewals disabled");
    let accept = ShareAcknowledge {
        request: ShareAcknowledgeRequest::default()
            .with_group_id(Some(group()))
            .with_member_id(Some(member()))
            .with_share_session_epoch(5)
            .with_topics(vec![share_acknowledge_request::AcknowledgeTopic::default()
                .with_topic_id(topic_id)
                .with_partitions(vec![
                    share_acknowledge_request::AcknowledgePartition::default().with_acknowledgement_batches(
                        vec![share_acknowledge_request::AcknowledgementBatch::default()
                            .with_first_offset(0)
                            .with_last_offset(2)
                            .with_acknowledge_types(vec![1])],
                    ),
                ])]),
        is_renew_ack: false,
    };
    let mut body = call(&broker, ApiKey::ShareAcknowledge, 2, &accept).await;
    let a = ShareAcknowledgeAnswer::decode(&mut body, 2).unwrap();
    let codes: Vec<i16> = a.response.responses[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!((a.response.error_code, codes), (0, vec![0]), "{a:?}");
    assert_eq!(a.acquisition_lock_timeout_ms, 30_000);
}
