//! KIP-951: a Produce or Fetch for a partition this broker does not lead is
//! answered NOT_LEADER_OR_FOLLOWER (a Fetch in an old epoch,
//! FENCED_LEADER_EPOCH) with the partition's current leader and epoch, and the response lists where that broker is, so the client goes
//! there without first asking for Metadata. (Produce v10+ and Fetch v16+
//! carry them; older versions leave them out when encoding.)

use std::collections::BTreeSet;

use keel_protocol::messages::{fetch_response, produce_response, BrokerId, FetchResponse, ProduceResponse};
use keel_protocol::ResponseError;
use uuid::Uuid;

use super::str_bytes;
use crate::Broker;

const NOT_LEADER: i16 = ResponseError::NotLeaderOrFollower.code();
const FENCED: i16 = ResponseError::FencedLeaderEpoch.code();

/// The live leader of a partition, by topic name or id.
fn leader_of(broker: &Broker, name: &str, id: Uuid, index: i32) -> Option<(i32, i32)> {
    let topic = broker.data.topics.resolve(name, id).ok()?;
    let leader = broker.data.leader(&topic, index)?;
    Some((leader.node_id, leader.epoch))
}

/// Where clients of `listener` reach each of `nodes` that is live.
fn endpoints(
    broker: &Broker,
    nodes: &BTreeSet<i32>,
    listener: &str,
) -> Vec<(i32, String, i32, Option<String>)> {
    if nodes.is_empty() {
        return Vec::new(); // the common case: every partition served here
    }
    broker
        .cluster
        .members()
        .into_iter()
        .filter(|m| nodes.contains(&m.registration.node_id))
        .filter_map(|m| {
            let r = m.registration;
            let e = r.endpoint(listener)?;
            Some((r.node_id, e.host.clone(), e.port, r.rack.clone()))
        })
        .collect()
}

/// The current leader of a partition, and where the hinted brokers are,
/// in the message types of one response (Produce's and Fetch's have the
/// same fields).
macro_rules! current_leader {
    ($module:ident, $node:expr, $epoch:expr) => {
        $module::LeaderIdAndEpoch::default()
            .with_leader_id(BrokerId($node))
            .with_leader_epoch($epoch)
    };
}

macro_rules! node_endpoints {
    ($module:ident, $broker:expr, $nodes:expr, $listener:expr) => {
        endpoints($broker, $nodes, $listener)
            .into_iter()
            .map(|(node, host, port, rack)| {
                $module::NodeEndpoint::default()
                    .with_node_id(BrokerId(node))
                    .with_host(str_bytes(host))
                    .with_port(port)
                    .with_rack(rack.map(str_bytes))
            })
            .collect()
    };
}

/// Adds the leader hints to a Produce response.
pub fn produce(broker: &Broker, resp: &mut ProduceResponse, listener: &str) {
    let mut nodes = BTreeSet::new();
    for t in &mut resp.responses {
        for p in t
            .partition_responses
            .iter_mut()
            .filter(|p| p.error_code == NOT_LEADER)
        {
            if let Some((node, epoch)) = leader_of(broker, t.name.0.as_str(), t.topic_id, p.index) {
                p.current_leader = current_leader!(produce_response, node, epoch);
                nodes.insert(node);
            }
        }
    }
    resp.node_endpoints = node_endpoints!(produce_response, broker, &nodes, listener);
}

/// Adds the leader hints to a Fetch response.
pub fn fetch(broker: &Broker, resp: &mut FetchResponse, listener: &str) {
    let mut nodes = BTreeSet::new();
    for t in &mut resp.responses {
        for p in t
            .partitions
            .iter_mut()
            .filter(|p| p.error_code == NOT_LEADER || p.error_code == FENCED)
        {
            if let Some((node, epoch)) = leader_of(broker, t.topic.0.as_str(), t.topic_id, p.partition_index)
            {
                p.current_leader = current_leader!(fetch_response, node, epoch);
                nodes.insert(node);
            }
        }
    }
    resp.node_endpoints = node_endpoints!(fetch_response, broker, &nodes, listener);
}
