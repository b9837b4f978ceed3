//! Transactions v2 through the broker's request handling: a produce that
//! names several partitions adds them to the transaction in one step, as
//! Kafka's one AddPartitionsToTxn per produce request does, and the next
//! transaction's first produce, sent as soon as the commit is answered,
//! waits for the last transaction's markers instead of being refused.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{call, open_broker, topic_name};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use keel_broker::Broker;

const PARTITIONS: i32 = 8;
const TXN_ID: &str = "tx";

/// One transactional produce (v12: partitions add themselves) of a batch
/// to every partition of `topic`; the error code of each partition.
async fn produce_everywhere(broker: &Arc<Broker>, topic: &str, producer: (i64, i16)) -> Vec<i16> {
    let partitions = (0..PARTITIONS)
        .map(|index| {
            let batch = keel_log::testing::BatchBuilder::new(1_000)
                .producer(producer.0, producer.1, 0)
                .transactional(true)
                .record(Some(b"k"), Some(b"v"))
                .build();
            produce_request::PartitionProduceData::default()
                .with_index(index)
                .with_records(Some(Bytes::from(batch)))
        })
        .collect();
    let request = ProduceRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str(TXN_ID))))
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![produce_request::TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(partitions)]);
    let response: ProduceResponse = call(broker, ApiKey::Produce, 12, &request).await;
    let mut codes: Vec<(i32, i16)> = response
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter().map(|p| (p.index, p.error_code)))
        .collect();
    codes.sort_unstable();
    codes.into_iter().map(|(_, code)| code).collect()
}

async fn commit(broker: &Arc<Broker>, producer: (i64, i16)) -> (i64, i16) {
    let request = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_static_str(TXN_ID)))
        .with_producer_id(ProducerId(producer.0))
        .with_producer_epoch(producer.1)
        .with_committed(true);
    let response: EndTxnResponse = call(broker, ApiKey::EndTxn, 5, &request).await;
    assert_eq!(response.error_code, 0, "EndTxn {producer:?}");
    (response.producer_id.0, response.producer_epoch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_adds_all_its_partitions_and_follows_the_last_markers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_broker(dir.path()).await;
    let create =
        CreateTopicsRequest::default().with_topics(vec![create_topics_request::CreatableTopic::default()
            .with_name(topic_name("out"))
            .with_num_partitions(PARTITIONS)
            .with_replication_factor(1)]);
    let _: CreateTopicsResponse = call(&broker, ApiKey::CreateTopics, 7, &create).await;
    let init = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str(TXN_ID))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let init: InitProducerIdResponse = call(&broker, ApiKey::InitProducerId, 5, &init).await;
    assert_eq!(init.error_code, 0);
    let mut producer = (init.producer_id.0, init.producer_epoch);
    for round in 0..5 {
        // Sent as soon as the last commit is answered: its markers may
        // still be being written.
        assert_eq!(
            produce_everywhere(&broker, "out", producer).await,
            vec![0; PARTITIONS as usize],
            "round {round}, producer {producer:?}"
        );
        let next = commit(&broker, producer).await;
        assert_eq!(next, (producer.0, producer.1 + 1), "every end bumps the epoch");
        producer = next;
    }
}
