//! The classic consumer group APIs: FindCoordinator, JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups,
//! DescribeGroups, DeleteGroups and OffsetDelete, and TxnOffsetCommit.
//! Each handler translates between the wire messages (whose fields vary by
//! version) and [`keel_coord::groups::GroupCoordinator`].

use std::sync::Arc;

use keel_protocol::messages::delete_groups_response::DeletableGroupResult;
use keel_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use keel_protocol::messages::find_coordinator_response::Coordinator;
use keel_protocol::messages::join_group_response::JoinGroupResponseMember;
use keel_protocol::messages::leave_group_response::MemberResponse;
use keel_protocol::messages::list_groups_response::ListedGroup;
use keel_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use keel_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use keel_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use keel_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use keel_protocol::messages::*;
use keel_protocol::{ResponseError, StrBytes};

use super::{partition_exists, str_bytes, topic_name};
use crate::Broker;
use keel_coord::groups::group::JoinParams;
use keel_coord::groups::records::CommittedOffset;
use keel_coord::groups::OffsetToCommit;
use keel_log::marker::TxnWrite;

/// FindCoordinator key types.
const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

fn code(result: Result<(), ResponseError>) -> i16 {
    result.err().map_or(0, |e| e.code())
}

fn opt_str(s: &Option<StrBytes>) -> Option<&str> {
    s.as_ref().map(|s| s.as_str())
}

pub fn find_coordinator(
    broker: &Broker,
    req: FindCoordinatorRequest,
    version: i16,
    listener: &str,
) -> FindCoordinatorResponse {
    // The coordinator of a key: this broker for one node; in a cluster,
    // the leader of the key's partition of Kafka's internal topic.
    let answer = |key: &str| -> Result<(i32, StrBytes, i32), (ResponseError, String)> {
        let transactions = match req.key_type {
            KEY_TYPE_GROUP if key.is_empty() => {
                return Err((ResponseError::InvalidGroupId, "empty group id".into()))
            }
            KEY_TYPE_GROUP => false,
            KEY_TYPE_TRANSACTION if key.is_empty() => {
                return Err((ResponseError::InvalidRequest, "empty transactional id".into()))
            }
            KEY_TYPE_TRANSACTION => true,
            other => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("unsupported key type {other}"),
                ))
            }
        };
        let unavailable = |e: ResponseError| (e, "the coordinator is not available".to_string());
        let node = broker.coordinator_of(key, transactions).map_err(unavailable)?;
        let (host, port) = endpoint_of(broker, node, listener)
            .ok_or_else(|| unavailable(ResponseError::CoordinatorNotAvailable))?;
        Ok((node, str_bytes(host), port))
    };
    let parts = |result: Result<(i32, StrBytes, i32), (ResponseError, String)>| match result {
        Ok((node, host, port)) => (0, None, node, host, port),
        Err((e, m)) => (e.code(), Some(str_bytes(m)), -1, str_bytes(""), -1),
    };
    if version < 4 {
        let (error, message, node, host, port) = parts(answer(req.key.as_str()));
        let mut resp = FindCoordinatorResponse::default()
            .with_error_code(error)
            .with_node_id(BrokerId(node))
            .with_host(host)
            .with_port(port);
        if version >= 1 {
            resp = resp.with_error_message(message);
        }
        return resp;
    }
    let coordinators = req
        .coordinator_keys
        .iter()
        .map(|key| {
            let (error, message, node, host, port) = parts(answer(key.as_str()));
            Coordinator::default()
                .with_key(key.clone())
                .with_node_id(BrokerId(node))
                .with_host(host)
                .with_port(port)
                .with_error_code(error)
                .with_error_message(message)
        })
        .collect();
    FindCoordinatorResponse::default().with_coordinators(coordinators)
}

/// Where clients of `listener` reach the live broker `node`.
fn endpoint_of(broker: &Broker, node: i32, listener: &str) -> Option<(String, i32)> {
    if node == broker.config().node_id() {
        let (host, port) = broker.endpoint(listener);
        return Some((host.to_string(), port));
    }
    let member = broker
        .cluster
        .members()
        .into_iter()
        .find(|m| m.registration.node_id == node)?;
    let e = member.registration.endpoint(listener)?;
    Some((e.host.clone(), e.port))
}

pub async fn join_group(
    broker: &Arc<Broker>,
    req: JoinGroupRequest,
    version: i16,
    client_id: &str,
    client_host: &str,
) -> JoinGroupResponse {
    let params = JoinParams {
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()),
        client_id: client_id.to_string(),
        client_host: client_host.to_string(),
        session_timeout_ms: req.session_timeout_ms,
        rebalance_timeout_ms: if version >= 1 {
            req.rebalance_timeout_ms
        } else {
            req.session_timeout_ms
        },
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .iter()
            .map(|p| (p.name.to_string(), p.metadata.clone()))
            .collect(),
        require_known_member_id: version >= 4,
    };
    let topics = super::consumer_groups::topics(broker);
    let r = broker.groups.join(req.group_id.as_str(), params, &topics).await;
    let members = r
        .members
        .into_iter()
        .map(|m| {
            let member = JoinGroupResponseMember::default()
                .with_member_id(str_bytes(m.member_id))
                .with_metadata(m.metadata);
            if version >= 5 {
                member.with_group_instance_id(m.instance_id.map(str_bytes))
            } else {
                member
            }
        })
        .collect();
    let protocol_name = match (r.protocol_name, version >= 7) {
        (Some(name), _) => Some(str_bytes(name)),
        (None, true) => None,
        (None, false) => Some(str_bytes("")),
    };
    let mut resp = JoinGroupResponse::default()
        .with_error_code(r.error.map_or(0, |e| e.code()))
        .with_generation_id(r.generation)
        .with_protocol_name(protocol_name)
        .with_leader(str_bytes(r.leader))
        .with_member_id(str_bytes(r.member_id))
        .with_members(members);
    if version >= 7 {
        resp = resp.with_protocol_type(r.protocol_type.map(str_bytes));
    }
    resp
}

pub async fn sync_group(broker: &Arc<Broker>, req: SyncGroupRequest, version: i16) -> SyncGroupResponse {
    let assignments = req
        .assignments
        .iter()
        .map(|a| (a.member_id.to_string(), a.assignment.clone()))
        .collect();
    let result = broker
        .groups
        .sync(
            req.group_id.as_str(),
            req.generation_id,
            req.member_id.as_str(),
            opt_str(&req.group_instance_id),
            (opt_str(&req.protocol_type), opt_str(&req.protocol_name)),
            assignments,
            &super::consumer_groups::topics(broker),
        )
        .await;
    match result {
        Ok(answer) => {
            let resp = SyncGroupResponse::default().with_assignment(answer.assignment);
            if version >= 5 {
                resp.with_protocol_type(answer.protocol_type.map(str_bytes))
                    .with_protocol_name(answer.protocol_name.map(str_bytes))
            } else {
                resp
            }
        }
        Err(e) => SyncGroupResponse::default().with_error_code(e.code()),
    }
}

pub fn heartbeat(broker: &Broker, req: HeartbeatRequest) -> HeartbeatResponse {
    let result = broker.groups.heartbeat(
        req.group_id.as_str(),
        req.generation_id,
        req.member_id.as_str(),
        opt_str(&req.group_instance_id),
    );
    HeartbeatResponse::default().with_error_code(code(result))
}

pub async fn leave_group(broker: &Broker, req: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    if version < 3 {
        let results = broker
            .groups
            .leave(
                req.group_id.as_str(),
                &[(req.member_id.to_string(), None)],
                &super::consumer_groups::topics(broker),
            )
            .await;
        let result = results.into_iter().next().unwrap_or(Ok(()));
        return LeaveGroupResponse::default().with_error_code(code(result));
    }
    let leaving: Vec<(String, Option<String>)> = req
        .members
        .iter()
        .map(|m| {
            (
                m.member_id.to_string(),
                m.group_instance_id.as_ref().map(|s| s.to_string()),
            )
        })
        .collect();
    let topics = super::consumer_groups::topics(broker);
    let results = broker
        .groups
        .leave(req.group_id.as_str(), &leaving, &topics)
        .await;
    let members = req
        .members
        .into_iter()
        .zip(results)
        .map(|(m, r)| {
            MemberResponse::default()
                .with_member_id(m.member_id)
                .with_group_instance_id(m.group_instance_id)
                .with_error_code(code(r))
        })
        .collect();
    LeaveGroupResponse::default().with_members(members)
}

/// A commit request's topics as [`CommitRow`]s: OffsetCommit and
/// TxnOffsetCommit name their fields alike, in types of their own.
macro_rules! commit_rows {
    ($topics:expr, $with_leader_epoch:expr) => {
        $topics
            .iter()
            .map(|t| {
                let partitions = t.partitions.iter().map(|p| {
                    let leader_epoch = if $with_leader_epoch {
                        p.committed_leader_epoch
                    } else {
                        -1
                    };
                    (
                        p.partition_index,
                        p.committed_offset,
                        leader_epoch,
                        &p.committed_metadata,
                    )
                });
                (t.name.clone(), partitions.collect())
            })
            .collect::<Vec<CommitRow<'_>>>()
    };
}

/// [`Commit::results`] as a commit response's topics.
macro_rules! commit_response {
    ($results:expr, $topic:ident, $partition:ident) => {
        $results
            .into_iter()
            .map(|(name, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|(index, error)| {
                        $partition::default()
                            .with_partition_index(index)
                            .with_error_code(error)
                    })
                    .collect();
                $topic::default().with_name(name).with_partitions(partitions)
            })
            .collect()
    };
}

pub async fn offset_commit(
    broker: &Arc<Broker>,
    req: OffsetCommitRequest,
    version: i16,
) -> OffsetCommitResponse {
    let (offsets, commit) = Commit::split(broker, commit_rows!(req.topics, version >= 6));
    let outcome = broker
        .groups
        .commit_offsets(
            req.group_id.as_str(),
            req.generation_id_or_member_epoch,
            req.member_id.as_str(),
            opt_str(&req.group_instance_id),
            offsets,
            version,
        )
        .await;
    let topics = commit_response!(
        commit.results(outcome),
        OffsetCommitResponseTopic,
        OffsetCommitResponsePartition
    );
    OffsetCommitResponse::default().with_topics(topics)
}

/// TxnOffsetCommit: offsets written in the producer's transaction, which
/// must hold the group's offsets (AddOffsetsToTxn).
pub async fn txn_offset_commit(
    broker: &Arc<Broker>,
    req: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    let (offsets, commit) = Commit::split(broker, commit_rows!(req.topics, version >= 2));
    if let Some(e) = broker.group_refused(req.group_id.as_str()) {
        let topics = commit_response!(
            commit.results(Err(e)),
            TxnOffsetCommitResponseTopic,
            TxnOffsetCommitResponsePartition
        );
        return TxnOffsetCommitResponse::default().with_topics(topics);
    }
    let producer = (req.producer_id.0, req.producer_epoch);
    let offsets_partition = broker.offsets_partition_of(req.group_id.as_str());
    let txn = TxnOf {
        id: req.transactional_id.as_str(),
        producer,
        offsets_partition: &offsets_partition,
        at: super::txn::coordinator_at(broker, req.transactional_id.as_str()),
    };
    // Taken before the coordinator is asked: a marker ending the
    // transaction queued after this refuses the offsets (see
    // `TxnOffsetsGuard`). From v5 transactions end with the epoch bumped.
    let guard = broker.groups.txn_offsets_guard(TxnWrite {
        producer_id: producer.0,
        producer_epoch: producer.1,
        bumped_on_end: version >= 5,
    });
    // From v5 (transactions v2) the commit takes the offsets partition
    // into the transaction itself, instead of an AddOffsetsToTxn before.
    let added = if version >= 5 {
        txn.add(broker)
            .await
            // While the last transaction's markers are written: an error
            // every client retries at once.
            .map_err(|e| match e {
                ResponseError::ConcurrentTransactions => ResponseError::CoordinatorLoadInProgress,
                other => other,
            })
    } else {
        Ok(())
    };
    let verified = match added {
        Ok(()) => txn.verify(broker).await,
        Err(e) => Err(e),
    };
    let outcome = match verified {
        Err(e) => Err(e),
        Ok(()) => {
            broker
                .groups
                .commit_transactional_offsets(
                    req.group_id.as_str(),
                    producer,
                    req.generation_id,
                    req.member_id.as_str(),
                    opt_str(&req.group_instance_id),
                    offsets,
                    &guard,
                )
                .await
        }
    };
    let topics = commit_response!(
        commit.results(outcome),
        TxnOffsetCommitResponseTopic,
        TxnOffsetCommitResponsePartition
    );
    TxnOffsetCommitResponse::default().with_topics(topics)
}

/// The transaction a TxnOffsetCommit writes in, and where its coordinator
/// is.
struct TxnOf<'a> {
    id: &'a str,
    producer: (i64, i16),
    offsets_partition: &'a (String, i32),
    /// Another broker is asked (AddPartitionsToTxn); none that can answer
    /// is an error the client retries.
    at: super::txn::CoordinatorAt,
}

impl TxnOf<'_> {
    /// Takes the group's offsets partition into the transaction.
    async fn add(&self, broker: &Broker) -> Result<(), ResponseError> {
        let partitions = std::slice::from_ref(self.offsets_partition);
        match self.at {
            super::txn::CoordinatorAt::Unavailable(e) => Err(e),
            super::txn::CoordinatorAt::Elsewhere => {
                let ask = super::txn::Ask::Add(std::time::Duration::ZERO);
                super::txn::ask_coordinator(broker, self.id, self.producer, partitions, ask).await
            }
            super::txn::CoordinatorAt::Here => {
                broker
                    .txns
                    .add_partitions(
                        self.id,
                        self.producer.0,
                        self.producer.1,
                        partitions,
                        keel_coord::txn::state::TRANSACTION_VERSION_2,
                        ResponseError::ProducerFenced,
                    )
                    .await
            }
        }
    }

    /// Whether the group's offsets partition is in the open transaction.
    async fn verify(&self, broker: &Broker) -> Result<(), ResponseError> {
        match self.at {
            super::txn::CoordinatorAt::Unavailable(e) => Err(e),
            super::txn::CoordinatorAt::Elsewhere => {
                let partitions = std::slice::from_ref(self.offsets_partition);
                let ask = super::txn::Ask::Verify;
                super::txn::ask_coordinator(broker, self.id, self.producer, partitions, ask).await
            }
            super::txn::CoordinatorAt::Here => {
                broker
                    .txns
                    .verify(self.id, self.producer.0, self.producer.1, self.offsets_partition)
            }
        }
    }
}

/// One topic of a commit request: `(partition, offset, leader epoch,
/// metadata)` per partition.
type CommitRow<'a> = (TopicName, Vec<(i32, i64, i32, &'a Option<StrBytes>)>);

/// A partition of a commit and why it was refused, if it was.
type Refusal = (i32, Option<ResponseError>);

/// A commit request's partitions, by topic in request order: each
/// partition and its refusal, if any.
struct Commit {
    rows: Vec<(TopicName, Vec<Refusal>)>,
}

impl Commit {
    /// The offsets to hand the coordinator together, and the request's
    /// shape: partitions of unknown topics are refused one by one.
    fn split(broker: &Broker, topics: Vec<CommitRow<'_>>) -> (Vec<OffsetToCommit>, Commit) {
        let mut offsets = Vec::new();
        let mut rows = Vec::with_capacity(topics.len());
        for (name, partitions) in topics {
            let mut row = Vec::with_capacity(partitions.len());
            for (index, offset, leader_epoch, metadata) in partitions {
                if partition_exists(broker, name.as_str(), index) {
                    offsets.push(OffsetToCommit {
                        topic: name.to_string(),
                        partition: index,
                        offset,
                        leader_epoch,
                        metadata: metadata.as_ref().map_or_else(String::new, |m| m.to_string()),
                    });
                    row.push((index, None));
                } else {
                    row.push((index, Some(ResponseError::UnknownTopicOrPartition)));
                }
            }
            rows.push((name, row));
        }
        (offsets, Commit { rows })
    }

    /// Each partition's error code, given what the coordinator said about
    /// the committed ones (in order) or the whole request.
    fn results(
        self,
        outcome: Result<Vec<Result<(), ResponseError>>, ResponseError>,
    ) -> Vec<(TopicName, Vec<(i32, i16)>)> {
        let mut committed = match &outcome {
            Ok(results) => results.clone().into_iter(),
            Err(_) => Vec::new().into_iter(),
        };
        self.rows
            .into_iter()
            .map(|(name, row)| {
                let codes = row
                    .into_iter()
                    .map(|(index, refused)| {
                        let error = match (refused, &outcome) {
                            (Some(e), _) => e.code(),
                            (None, Err(e)) => e.code(),
                            (None, Ok(_)) => code(committed.next().unwrap_or(Ok(()))),
                        };
                        (index, error)
                    })
                    .collect();
                (name, codes)
            })
            .collect()
    }
}

/// `(topic, [(partition, committed)])`, grouped by topic in request order
/// (or name order when every partition was asked for).
type FetchedOffsets = Vec<(String, Vec<(i32, Fetched)>)>;
type Fetched = Result<Option<CommittedOffset>, ResponseError>;

fn fetch_group_offsets(
    broker: &Broker,
    group: &str,
    wanted: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
) -> FetchedOffsets {
    let flat: Option<Vec<(String, i32)>> = wanted.as_ref().map(|w| {
        w.iter()
            .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
            .collect()
    });
    let found = broker
        .groups
        .fetch_offsets_stable(group, flat.as_deref(), require_stable);
    let mut out: FetchedOffsets = Vec::new();
    for (topic, partition, value) in found {
        match out.last_mut() {
            Some((t, ps)) if *t == topic => ps.push((partition, value)),
            _ => out.push((topic, vec![(partition, value)])),
        }
    }
    out
}

pub fn offset_fetch(broker: &Broker, req: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
    if version < 8 {
        let topics = req.topics.map(|ts| {
            ts.into_iter()
                .map(|t| (t.name.to_string(), t.partition_indexes))
                .collect()
        });
        let fetched = fetch_group_offsets(broker, req.group_id.as_str(), topics, req.require_stable);
        let topics = fetched
            .into_iter()
            .map(|(topic, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|(p, v)| {
                        let (offset, epoch, meta, error) = committed_fields(v, version >= 5);
                        OffsetFetchResponsePartition::default()
                            .with_partition_index(p)
                            .with_error_code(error)
                            .with_committed_offset(offset)
                            .with_committed_leader_epoch(epoch)
                            .with_metadata(Some(str_bytes(meta)))
                    })
                    .collect();
                OffsetFetchResponseTopic::default()
                    .with_name(topic_name(&topic))
                    .with_partitions(partitions)
            })
            .collect();
        return OffsetFetchResponse::default().with_topics(topics);
    }
    let groups = req
        .groups
        .into_iter()
        .map(|g| {
            let member = g.member_id.as_ref().map(|m| m.as_str());
            let refused = broker.group_refused(g.group_id.as_str()).map_or(Ok(()), Err);
            if let Err(e) = refused.and_then(|()| {
                broker
                    .groups
                    .validate_consumer_fetch(g.group_id.as_str(), member, g.member_epoch)
            }) {
                return OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_error_code(e.code());
            }
            let topics = g.topics.map(|ts| {
                ts.into_iter()
                    .map(|t| (t.name.to_string(), t.partition_indexes))
                    .collect()
            });
            let fetched = fetch_group_offsets(broker, g.group_id.as_str(), topics, req.require_stable);
            let topics = fetched
                .into_iter()
                .map(|(topic, partitions)| {
                    let partitions = partitions
                        .into_iter()
                        .map(|(p, v)| {
                            let (offset, epoch, meta, error) = committed_fields(v, true);
                            OffsetFetchResponsePartitions::default()
                                .with_partition_index(p)
                                .with_error_code(error)
                                .with_committed_offset(offset)
                                .with_committed_leader_epoch(epoch)
                                .with_metadata(Some(str_bytes(meta)))
                        })
                        .collect();
                    OffsetFetchResponseTopics::default()
                        .with_name(topic_name(&topic))
                        .with_partitions(partitions)
                })
                .collect();
            OffsetFetchResponseGroup::default()
                .with_group_id(g.group_id)
                .with_topics(topics)
        })
        .collect();
    OffsetFetchResponse::default().with_groups(groups)
}

/// `(offset, leader epoch, metadata, error code)`; no commit (or an
/// unstable one) is offset -1 with empty metadata, as in Kafka.
fn committed_fields(v: Fetched, with_epoch: bool) -> (i64, i32, String, i16) {
    match v {
        Ok(Some(c)) => (
            c.offset,
            if with_epoch { c.leader_epoch } else { -1 },
            c.metadata,
            0,
        ),
        Ok(None) => (-1, -1, String::new(), 0),
        Err(e) => (-1, -1, String::new(), e.code()),
    }
}

pub fn list_groups(broker: &Broker, req: ListGroupsRequest, version: i16) -> ListGroupsResponse {
    // Kafka lists groups only once every partition it leads is loaded.
    if broker.groups_loading() {
        return ListGroupsResponse::default()
            .with_error_code(ResponseError::CoordinatorLoadInProgress.code());
    }
    let states: Vec<String> = req.states_filter.iter().map(|s| s.to_lowercase()).collect();
    let types: Vec<String> = req.types_filter.iter().map(|s| s.to_lowercase()).collect();
    // (id, protocol type, state, group type)
    let classic = broker
        .groups
        .list()
        .into_iter()
        .map(|(id, protocol_type, state)| (id, protocol_type, state.name(), "classic"));
    let consumer = broker
        .groups
        .list_consumer()
        .into_iter()
        .map(|(id, state)| (id, "consumer".to_string(), state.name(), "consumer"));
    // Share groups (KIP-932): protocol type "share", as Kafka lists them.
    let share = broker
        .share
        .list()
        .into_iter()
        .map(|(id, state)| (id, "share".to_string(), state.name(), "share"));
    let groups = classic
        .chain(consumer)
        .chain(share)
        .filter(|(_, _, state, _)| states.is_empty() || states.contains(&state.to_lowercase()))
        .filter(|(_, _, _, kind)| types.is_empty() || types.iter().any(|t| t == kind))
        .map(|(id, protocol_type, state, kind)| {
            let g = ListedGroup::default()
                .with_group_id(GroupId(str_bytes(id)))
                .with_protocol_type(str_bytes(protocol_type));
            match version {
                0..=3 => g,
                4 => g.with_group_state(str_bytes(state)),
                _ => g
                    .with_group_state(str_bytes(state))
                    .with_group_type(str_bytes(kind)),
            }
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

pub fn describe_groups(broker: &Broker, req: DescribeGroupsRequest, version: i16) -> DescribeGroupsResponse {
    let groups = req
        .groups
        .into_iter()
        .map(|id| {
            let base = DescribedGroup::default()
                .with_group_id(id.clone())
                .with_authorized_operations(super::operations::if_asked(
                    req.include_authorized_operations,
                    super::operations::GROUP,
                ));
            if let Some(e) = broker.group_refused(id.as_str()) {
                return base.with_error_code(e.code());
            }
            let Some(d) = broker.groups.describe(id.as_str()) else {
                // Kafka: an unknown group is reported Dead; from v6 with
                // GROUP_ID_NOT_FOUND.
                let base = base
                    .with_group_state(str_bytes("Dead"))
                    .with_protocol_type(str_bytes(""))
                    .with_protocol_data(str_bytes(""));
                return if version >= 6 {
                    base.with_error_code(ResponseError::GroupIdNotFound.code())
                        .with_error_message(Some(str_bytes(format!("group {} not found", id.as_str()))))
                } else {
                    base
                };
            };
            let members = d
                .members
                .into_iter()
                .map(|m| {
                    let member = DescribedGroupMember::default()
                        .with_member_id(str_bytes(m.member_id))
                        .with_client_id(str_bytes(m.client_id))
                        .with_client_host(str_bytes(m.client_host))
                        .with_member_metadata(m.metadata)
                        .with_member_assignment(m.assignment);
                    if version >= 4 {
                        member.with_group_instance_id(m.instance_id.map(str_bytes))
                    } else {
                        member
                    }
                })
                .collect();
            base.with_group_state(str_bytes(d.state.name()))
                .with_protocol_type(str_bytes(d.protocol_type))
                .with_protocol_data(str_bytes(d.protocol))
                .with_members(members)
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

pub async fn delete_groups(broker: &Arc<Broker>, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    // Groups another broker coordinates (or whose partition is loading)
    // are answered with why; share groups by the share coordinator (an
    // empty one goes with its share state); the rest are deleted here.
    let mut outcomes: Vec<Option<Result<(), ResponseError>>> = Vec::with_capacity(req.groups_names.len());
    for g in &req.groups_names {
        let outcome = match broker.group_refused(g.as_str()) {
            Some(e) => Some(Err(e)),
            None if broker.share.has_group(g.as_str()) => Some(match broker.share.delete_group(g.as_str()) {
                Ok(write) => write.await.map_err(|_| ResponseError::CoordinatorNotAvailable),
                Err((e, _)) => Err(e),
            }),
            None => None,
        };
        outcomes.push(outcome);
    }
    let ids: Vec<String> = req
        .groups_names
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| o.is_none())
        .map(|(g, _)| g.to_string())
        .collect();
    let mut deleted = broker.groups.delete_groups(&ids).await.into_iter();
    let results = req
        .groups_names
        .into_iter()
        .zip(outcomes)
        .map(|(g, outcome)| {
            let r =
                outcome.unwrap_or_else(|| deleted.next().unwrap_or(Err(ResponseError::UnknownServerError)));
            DeletableGroupResult::default()
                .with_group_id(g)
                .with_error_code(code(r))
        })
        .collect();
    DeleteGroupsResponse::default().with_results(results)
}

pub async fn offset_delete(broker: &Arc<Broker>, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    if let Some(e) = broker.group_refused(req.group_id.as_str()) {
        return OffsetDeleteResponse::default().with_error_code(e.code());
    }
    let partitions: Vec<(String, i32)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.to_string(), p.partition_index))
        })
        .collect();
    let outcome = broker
        .groups
        .delete_offsets(req.group_id.as_str(), &partitions)
        .await;
    let mut results = match outcome {
        Err(e) => return OffsetDeleteResponse::default().with_error_code(e.code()),
        Ok(results) => results.into_iter(),
    };
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let known = partition_exists(broker, t.name.as_str(), p.partition_index);
                    let result = results.next().unwrap_or(Ok(()));
                    let error = if known {
                        code(result)
                    } else {
                        ResponseError::UnknownTopicOrPartition.code()
                    };
                    OffsetDeleteResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error)
                })
                .collect();
            OffsetDeleteResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetDeleteResponse::default().with_topics(topics)
}
