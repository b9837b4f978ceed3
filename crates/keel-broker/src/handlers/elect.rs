//! ElectLeaders: `kafka-leader-election` and `Admin.electLeaders`. Keel is
//! one broker holding the only replica of every partition, which is both
//! the preferred and the current leader: there is never an election to
//! run, and the answer is Kafka's for a partition that already has the
//! leader asked for.

use keel_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::str_bytes;
use crate::Broker;

/// Kafka's election types: the preferred replica, or (unclean) any live one.
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

pub fn elect_leaders(broker: &Broker, req: ElectLeadersRequest) -> ElectLeadersResponse {
    if !matches!(req.election_type, PREFERRED | UNCLEAN) {
        return ElectLeadersResponse::default().with_error_code(ResponseError::InvalidRequest.code());
    }
    let Some(wanted) = req.topic_partitions else {
        // Every partition: Kafka lists only those where an election ran or
        // failed, which on one broker is none.
        return ElectLeadersResponse::default();
    };
    let results = wanted
        .into_iter()
        .map(|t| {
            let topic = broker
                .data
                .topics
                .get(t.topic.0.as_str())
                .filter(|t| !t.meta.deleting);
            let partitions = t
                .partitions
                .iter()
                .map(|&index| {
                    let result = PartitionResult::default().with_partition_id(index);
                    match topic.as_ref().and_then(|topic| topic.partition(index)) {
                        Some(_) => result.with_error_code(ResponseError::ElectionNotNeeded.code()),
                        None => result
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                            .with_error_message(Some(str_bytes(format!(
                                "No such partition as {}-{index}",
                                t.topic.0.as_str()
                            )))),
                    }
                })
                .collect();
            ReplicaElectionResult::default()
                .with_topic(t.topic)
                .with_partition_result(partitions)
        })
        .collect();
    ElectLeadersResponse::default().with_replica_election_results(results)
}
