//! In a cluster, a group's or transactional id's requests are served only
//! by its coordinator (`Broker::coordinator_of`); any other broker answers
//! NOT_COORDINATOR (COORDINATOR_NOT_AVAILABLE while there is none), and the
//! client finds the coordinator again, as with Kafka. While the
//! coordinator reads the key's partition of `__consumer_offsets` (or
//! `__transaction_state`) it answers COORDINATOR_LOAD_IN_PROGRESS (a SyncGroup
//! REBALANCE_IN_PROGRESS, as Kafka's classic coordinator did, and a
//! Heartbeat NONE). Requests naming several groups (DescribeGroups,
//! DeleteGroups, OffsetFetch v8+, ConsumerGroupDescribe) get these errors
//! group by group, and TxnOffsetCommit and OffsetDelete once their ACLs
//! are checked, from their handlers; ListGroups waits for every partition
//! this broker leads to be loaded.

use keel_protocol::messages::*;
use keel_protocol::{Request, ResponseError, StrBytes};

use super::respond;
use crate::broker::{Broker, Reply};
use crate::handlers;

impl Broker {
    /// The answer to a request for a group or transactional id another
    /// broker coordinates; `None` if this broker serves it (or is one node).
    pub(super) fn not_coordinator(&self, body: &Request, version: i16, id: i32) -> Option<Reply> {
        if !self.topics_shared() {
            return None;
        }
        let group = |g: &StrBytes| self.group_refused(g.as_str());
        let txn = |t: &StrBytes| self.txn_refused(t.as_str());
        // While its partition loads, a SyncGroup is answered
        // REBALANCE_IN_PROGRESS (the member joins again, as Kafka's classic
        // coordinator answered it: clients take COORDINATOR_LOAD_IN_PROGRESS
        // there for fatal) and a Heartbeat NONE, as Kafka does.
        let loading = |e: ResponseError, instead: Option<ResponseError>| match e {
            ResponseError::CoordinatorLoadInProgress => instead,
            other => Some(other),
        };
        let reply = match body {
            Request::JoinGroup(r) => {
                let resp = JoinGroupResponse::default()
                    .with_error_code(group(&r.group_id)?.code())
                    .with_generation_id(-1);
                respond(ApiKey::JoinGroup, version, id, &resp)
            }
            Request::SyncGroup(r) => {
                let e = loading(group(&r.group_id)?, Some(ResponseError::RebalanceInProgress));
                let resp = SyncGroupResponse::default().with_error_code(e.map_or(0, |e| e.code()));
                respond(ApiKey::SyncGroup, version, id, &resp)
            }
            Request::Heartbeat(r) => {
                let e = loading(group(&r.group_id)?, None);
                let resp = HeartbeatResponse::default().with_error_code(e.map_or(0, |e| e.code()));
                respond(ApiKey::Heartbeat, version, id, &resp)
            }
            Request::LeaveGroup(r) => {
                let resp = LeaveGroupResponse::default().with_error_code(group(&r.group_id)?.code());
                respond(ApiKey::LeaveGroup, version, id, &resp)
            }
            Request::OffsetCommit(r) => {
                let e = group(&r.group_id)?;
                let topics = r
                    .topics
                    .iter()
                    .map(|t| handlers::authz::offset_commit_refused(t, e))
                    .collect();
                respond(
                    ApiKey::OffsetCommit,
                    version,
                    id,
                    &OffsetCommitResponse::default().with_topics(topics),
                )
            }
            Request::OffsetFetch(r) if version < 8 => {
                let resp = OffsetFetchResponse::default().with_error_code(group(&r.group_id)?.code());
                respond(ApiKey::OffsetFetch, version, id, &resp)
            }
            Request::ConsumerGroupHeartbeat(r) => {
                let resp =
                    ConsumerGroupHeartbeatResponse::default().with_error_code(group(&r.group_id)?.code());
                respond(ApiKey::ConsumerGroupHeartbeat, version, id, &resp)
            }
            Request::InitProducerId(r) => {
                let e = r.transactional_id.as_ref().and_then(|t| txn(t))?;
                let resp = InitProducerIdResponse::default()
                    .with_error_code(e.code())
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1);
                respond(ApiKey::InitProducerId, version, id, &resp)
            }
            Request::AddOffsetsToTxn(r) => {
                let resp =
                    AddOffsetsToTxnResponse::default().with_error_code(txn(&r.transactional_id)?.code());
                respond(ApiKey::AddOffsetsToTxn, version, id, &resp)
            }
            Request::EndTxn(r) => {
                let resp = EndTxnResponse::default()
                    .with_error_code(txn(&r.transactional_id)?.code())
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1);
                respond(ApiKey::EndTxn, version, id, &resp)
            }
            _ => return None,
        };
        Some(reply)
    }
}
