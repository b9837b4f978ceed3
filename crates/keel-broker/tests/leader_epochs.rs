//! The leader epoch a request carries is checked as Kafka checks it
//! (KIP-320) on every path that reaches a partition, and the answers name
//! this broker as the leader in epoch 0: one node leads every partition
//! and is never re-elected.

mod common;

use common::{call, open_broker, topic_name};
use kafka_protocol::messages::*;
use keel_protocol::ResponseError;

const TOPIC: &str = "epochs";

fn code(e: ResponseError) -> i16 {
    e.code()
}

async fn broker_with_topic(dir: &std::path::Path) -> std::sync::Arc<keel_broker::Broker> {
    let broker = open_broker(dir).await;
    let create =
        CreateTopicsRequest::default().with_topics(vec![create_topics_request::CreatableTopic::default()
            .with_name(topic_name(TOPIC))
            .with_num_partitions(2)
            .with_replication_factor(1)]);
    let created: CreateTopicsResponse = call(&broker, ApiKey::CreateTopics, 7, &create).await;
    assert_eq!(created.topics[0].error_code, 0);
    broker
}

#[tokio::test]
async fn metadata_names_this_broker_the_leader_in_epoch_zero() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker_with_topic(dir.path()).await;
    let req = MetadataRequest::default().with_topics(Some(vec![
        metadata_request::MetadataRequestTopic::default().with_name(Some(topic_name(TOPIC))),
    ]));
    let resp: MetadataResponse = call(&broker, ApiKey::Metadata, 12, &req).await;
    let partitions = &resp.topics[0].partitions;
    assert_eq!(partitions.len(), 2);
    for p in partitions {
        assert_eq!((p.error_code, p.leader_id.0, p.leader_epoch), (0, 1, 0));
        assert_eq!(p.replica_nodes.iter().map(|b| b.0).collect::<Vec<_>>(), vec![1]);
        assert_eq!(p.isr_nodes, p.replica_nodes);
    }
}

fn list_offsets(partition: i32, current_leader_epoch: i32) -> ListOffsetsRequest {
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![list_offsets_request::ListOffsetsTopic::default()
            .with_name(topic_name(TOPIC))
            .with_partitions(vec![
                list_offsets_request::ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_current_leader_epoch(current_leader_epoch)
                    .with_timestamp(-1),
            ])])
}

#[tokio::test]
async fn list_offsets_checks_the_leader_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker_with_topic(dir.path()).await;
    for (partition, epoch, error) in [
        (0, -1, 0),
        (0, 0, 0),
        (0, 1, code(ResponseError::UnknownLeaderEpoch)),
        (2, -1, code(ResponseError::UnknownTopicOrPartition)),
    ] {
        let resp: ListOffsetsResponse =
            call(&broker, ApiKey::ListOffsets, 7, &list_offsets(partition, epoch)).await;
        let p = &resp.topics[0].partitions[0];
        assert_eq!(
            p.error_code, error,
            "partition {partition}, current epoch {epoch}"
        );
        if error == 0 {
            assert_eq!((p.offset, p.leader_epoch), (0, 0));
        } else {
            assert_eq!(p.offset, -1);
        }
    }
}

#[tokio::test]
async fn fetch_checks_the_leader_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker_with_topic(dir.path()).await;
    for (epoch, error) in [(-1, 0), (0, 0), (1, code(ResponseError::UnknownLeaderEpoch))] {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_topics(vec![fetch_request::FetchTopic::default()
                .with_topic(topic_name(TOPIC))
                .with_partitions(vec![fetch_request::FetchPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(epoch)
                    .with_fetch_offset(0)
                    .with_partition_max_bytes(1 << 20)])]);
        let resp: FetchResponse = call(&broker, ApiKey::Fetch, 12, &req).await;
        let p = &resp.responses[0].partitions[0];
        assert_eq!(p.error_code, error, "current epoch {epoch}");
    }
}

#[tokio::test]
async fn offset_for_leader_epoch_answers_epoch_zero_with_the_end_offset() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker_with_topic(dir.path()).await;
    for (current, asked, expected) in [
        (-1, 0, (0, 0, 0)),
        (0, 0, (0, 0, 0)),
        (1, 0, (code(ResponseError::UnknownLeaderEpoch), -1, -1)),
        (-1, -1, (0, -1, -1)),
    ] {
        let req = OffsetForLeaderEpochRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![
                offset_for_leader_epoch_request::OffsetForLeaderTopic::default()
                    .with_topic(topic_name(TOPIC))
                    .with_partitions(vec![
                        offset_for_leader_epoch_request::OffsetForLeaderPartition::default()
                            .with_partition(0)
                            .with_current_leader_epoch(current)
                            .with_leader_epoch(asked),
                    ]),
            ]);
        let resp: OffsetForLeaderEpochResponse = call(&broker, ApiKey::OffsetForLeaderEpoch, 4, &req).await;
        let p = &resp.topics[0].partitions[0];
        assert_eq!(
            (p.error_code, p.leader_epoch, p.end_offset),
            expected,
            "current epoch {current}, asked for {asked}"
        );
    }
}
