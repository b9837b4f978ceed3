//! Share groups (KIP-932): ShareGroupHeartbeat and ShareGroupDescribe
//! here, ShareFetch and ShareAcknowledge in [`fetch`]. The requests'
//! checks are Kafka's; the groups, share partitions and sessions are
//! `keel_coord::share`. Served while `keel.share.version` is 1; at 0 every
//! share API answers UNSUPPORTED_VERSION, as Kafka does while the
//! `share.version` feature is off.

pub mod admin;
pub mod fetch;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use keel_protocol::messages::share_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member as DescribedMember,
    TopicPartitions as DescribedPartitions,
};
use keel_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::str_bytes;
use crate::group_configs::ShareReset;
use crate::{Broker, ClientInfo};
use keel_coord::groups::consumer;
use keel_coord::share::group::{ShareHeartbeat, LEAVE_EPOCH};
use keel_coord::share::partition::ShareLimits;

/// Whether share groups are served: `share.version` 1, on one node (a
/// cluster does not place share groups on coordinators yet).
pub fn enabled(broker: &Broker) -> bool {
    broker.config().share_version() >= 1 && !broker.topics_shared()
}

/// Which connection a request came on: a share session ends with it.
pub fn connection_key(client: &ClientInfo) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&client.listener, &client.host, client.port).hash(&mut h);
    h.finish()
}

/// The limits a group's share partitions work under: its own configs
/// over the broker's `group.share.*`.
pub fn limits(broker: &Broker, group: &str) -> ShareLimits {
    broker
        .group_configs
        .share_limits(group, broker.config().share_limits())
}

impl Broker {
    /// A connection closed: its share sessions end and what their
    /// members held is released for others.
    pub fn connection_closed(&self, client: &ClientInfo) {
        self.share
            .close_connection(connection_key(client), &|g| limits(self, g));
    }
}

/// Kafka's checks of a heartbeat's fields, in its order.
fn check(req: &ShareGroupHeartbeatRequest) -> Result<(), String> {
    if req.group_id.is_empty() {
        return Err("GroupId can't be empty.".into());
    }
    if req.member_id.is_empty() {
        return Err("MemberId can't be empty.".into());
    }
    if req.rack_id.as_ref().is_some_and(|r| r.is_empty()) {
        return Err("RackId can't be empty.".into());
    }
    if req.member_epoch == 0 && req.subscribed_topic_names.as_ref().is_none_or(|t| t.is_empty()) {
        return Err("SubscribedTopicNames must be set in first request.".into());
    }
    if req.member_epoch < LEAVE_EPOCH {
        return Err(format!(
            "MemberEpoch is {}, but must be greater than or equal to -1.",
            req.member_epoch
        ));
    }
    Ok(())
}

fn heartbeat_error(e: ResponseError, message: impl Into<String>) -> ShareGroupHeartbeatResponse {
    ShareGroupHeartbeatResponse::default()
        .with_error_code(e.code())
        .with_error_message(Some(str_bytes(message)))
}

/// ShareGroupHeartbeat: joins, stays in or leaves a share group. The
/// partitions a member is assigned have their share state before it
/// hears of them: new ones start at the log's end
/// (`share.auto.offset.reset` latest, Kafka's default) or start.
pub async fn share_group_heartbeat(
    broker: &Broker,
    req: ShareGroupHeartbeatRequest,
    client_id: &str,
    client_host: &str,
) -> ShareGroupHeartbeatResponse {
    if !enabled(broker) {
        return heartbeat_error(ResponseError::UnsupportedVersion, "Share groups are not enabled.");
    }
    if let Err(why) = check(&req) {
        return heartbeat_error(ResponseError::InvalidRequest, why);
    }
    let group = req.group_id.as_str();
    if broker.groups.describe(group).is_some() || broker.groups.describe_consumer(group).is_ok() {
        return heartbeat_error(
            ResponseError::GroupIdNotFound,
            format!("Group {group} is not a share group."),
        );
    }
    let topics = super::consumer_groups::topics(broker);
    let hb = ShareHeartbeat {
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        rack_id: req.rack_id.as_ref().map(|r| r.to_string()),
        subscribed: req
            .subscribed_topic_names
            .as_ref()
            .map(|names| names.iter().map(|n| n.0.to_string()).collect()),
        client_id: client_id.to_string(),
        client_host: client_host.to_string(),
    };
    let now_ms = broker.data.clock.now_ms();
    let config = group_config(broker, group);
    let answer = match broker.share.heartbeat(group, hb, &topics, &config, now_ms) {
        Ok(a) => a,
        Err((e, message)) => return heartbeat_error(e, message),
    };
    initialize(broker, group).await;
    let assignment = answer.assignment.map(|a| {
        Assignment::default().with_topic_partitions(
            a.into_iter()
                .map(|(id, ps)| {
                    TopicPartitions::default()
                        .with_topic_id(id)
                        .with_partitions(ps.into_iter().collect())
                })
                .collect(),
        )
    });
    ShareGroupHeartbeatResponse::default()
        .with_member_id(Some(req.member_id.clone()))
        .with_member_epoch(answer.member_epoch)
        .with_heartbeat_interval_ms(config.heartbeat_interval_ms)
        .with_assignment(assignment)
}

/// Gives the group's newly assigned partitions their share state where
/// the group's `share.auto.offset.reset` says: at the end of their logs
/// (`latest`), at their start (`earliest`), or at the first record at
/// most a duration old (`by_duration:`; at the end when every record is
/// older, as ListOffsets by timestamp answers).
pub async fn initialize(broker: &Broker, group: &str) {
    let reset = broker.group_configs.share_reset(group);
    for (topic_id, partition) in broker.share.uninitialized(group) {
        let Some(topic) = broker.data.topics.get_by_id(topic_id) else {
            continue;
        };
        let Some(p) = topic.partition(partition) else {
            continue;
        };
        let key = keel_coord::share::key(group, topic_id, partition);
        // Not waited for: a share partition whose start is lost starts
        // again at the log end, as a new one does.
        let start = match reset {
            ShareReset::Latest => p.high_watermark(),
            ShareReset::Earliest => p.log_start_offset(),
            ShareReset::ByDuration(ms) => {
                let since = broker.data.clock.now_ms().saturating_sub(ms);
                match crate::handlers::offsets::by_timestamp(p, since).await {
                    Ok((offset, _)) if offset >= 0 => offset.min(p.high_watermark()),
                    Ok(_) => p.high_watermark(),
                    // Not initialized: the next heartbeat tries again.
                    Err(_) => continue,
                }
            }
        };
        drop(broker.share.initialize(key, start));
    }
}

/// ShareGroupDescribe: each group's members, assignments and epochs; a
/// group id that is no share group is GROUP_ID_NOT_FOUND.
pub fn share_group_describe(broker: &Broker, req: ShareGroupDescribeRequest) -> ShareGroupDescribeResponse {
    if !enabled(broker) {
        let groups = req
            .group_ids
            .iter()
            .map(|g| {
                DescribedGroup::default()
                    .with_group_id(g.clone())
                    .with_error_code(ResponseError::UnsupportedVersion.code())
            })
            .collect();
        return ShareGroupDescribeResponse::default().with_groups(groups);
    }
    let topics = super::consumer_groups::topics(broker);
    let names: std::collections::HashMap<uuid::Uuid, String> =
        topics.iter().map(|(name, t)| (t.id, name.clone())).collect();
    let groups = req
        .group_ids
        .iter()
        .map(|id| match broker.share.describe(id.as_str()) {
            None => DescribedGroup::default()
                .with_group_id(id.clone())
                .with_error_code(ResponseError::GroupIdNotFound.code())
                .with_error_message(Some(str_bytes(format!("Group {} not found.", id.as_str())))),
            Some(g) => described(g, &names),
        })
        .collect();
    ShareGroupDescribeResponse::default().with_groups(groups)
}

fn described(
    g: keel_coord::share::ShareGroupDescription,
    names: &std::collections::HashMap<uuid::Uuid, String>,
) -> DescribedGroup {
    let assignment = |a: &consumer::Assignment| {
        DescribedAssignment::default().with_topic_partitions(
            a.iter()
                .map(|(id, ps)| {
                    DescribedPartitions::default()
                        .with_topic_id(*id)
                        .with_topic_name(TopicName(str_bytes(names.get(id).cloned().unwrap_or_default())))
                        .with_partitions(ps.iter().copied().collect())
                })
                .collect(),
        )
    };
    let members = g
        .members
        .iter()
        .map(|m| {
            DescribedMember::default()
                .with_member_id(str_bytes(m.member_id.clone()))
                .with_rack_id(m.rack_id.clone().map(str_bytes))
                .with_member_epoch(m.epoch)
                .with_client_id(str_bytes(m.client_id.clone()))
                .with_client_host(str_bytes(m.client_host.clone()))
                .with_subscribed_topic_names(
                    m.subscribed
                        .iter()
                        .map(|t| TopicName(str_bytes(t.clone())))
                        .collect(),
                )
                .with_assignment(assignment(&m.assignment))
        })
        .collect();
    DescribedGroup::default()
        .with_group_id(GroupId(str_bytes(g.group_id)))
        .with_group_state(str_bytes(g.state.name()))
        .with_group_epoch(g.epoch)
        .with_assignment_epoch(g.assignment_epoch)
        .with_assignor_name(str_bytes("simple"))
        .with_members(members)
        .with_authorized_operations(i32::MIN)
}

/// `group`'s membership settings: its `share.session.timeout.ms` and
/// `share.heartbeat.interval.ms` over the broker's.
fn group_config(broker: &Broker, group: &str) -> keel_coord::share::group::ShareGroupConfig {
    broker
        .group_configs
        .share_group_config(group, broker.config().share_group_config())
}

/// Releases expired locks and removes members past their session
/// timeout, waking at the next lock's deadline (at least once a second).
pub fn spawn_sweeper(broker: &Arc<Broker>) {
    let weak = Arc::downgrade(broker);
    tokio::spawn(async move {
        loop {
            let Some(broker) = weak.upgrade() else { return };
            let now_ms = broker.data.clock.now_ms();
            let next = if enabled(&broker) {
                broker.share.sweep(
                    &|| super::consumer_groups::topics(&broker),
                    &|g| group_config(&broker, g),
                    &|g| limits(&broker, g),
                    now_ms,
                )
            } else {
                None
            };
            drop(broker);
            let wait_ms = next.map_or(1000, |at| (at - now_ms).clamp(1, 1000));
            tokio::time::sleep(Duration::from_millis(u64::try_from(wait_ms).unwrap_or(1000))).await;
        }
    });
}
