//! The group coordinator's APIs (a group the client may not use is refused before these, `Broker::group_denied`).
//!
//! One function per API: its ACL checks (`handlers::authz`), its handler,
//! the denials merged into the answer, its quota accounting, the answer.

use super::*;

pub(super) async fn find_coordinator(
    b: &Arc<Broker>,
    mut r: FindCoordinatorRequest,
    call: Call<'_>,
) -> Reply {
    let denied = handlers::authz::find_coordinator(b, call.client, &mut r, call.version);
    let mut resp = match denied {
        handlers::authz::Coordinators::Refused(resp) => resp,
        handlers::authz::Coordinators::Keys(denied) => {
            // In a cluster, the first FindCoordinator for a key the client
            // may ask about places the coordinators.
            let asked = if call.version < 4 {
                !r.key.is_empty()
            } else {
                !r.coordinator_keys.is_empty()
            };
            if asked && matches!(r.key_type, 0 | 1) {
                b.ensure_coordinators(r.key_type == 1).await;
            }
            let mut resp = handlers::groups::find_coordinator(b, r, call.version, &call.client.listener);
            resp.coordinators.extend(denied);
            resp
        }
    };
    call.answer(b, ApiKey::FindCoordinator, &mut resp)
}

pub(super) async fn join_group(b: &Arc<Broker>, r: JoinGroupRequest, call: Call<'_>) -> Reply {
    let mut resp =
        handlers::groups::join_group(b, r, call.version, call.client_id, call.client.host.as_str()).await;
    call.answer(b, ApiKey::JoinGroup, &mut resp)
}

pub(super) async fn sync_group(b: &Arc<Broker>, r: SyncGroupRequest, call: Call<'_>) -> Reply {
    call.answer(
        b,
        ApiKey::SyncGroup,
        &mut handlers::groups::sync_group(b, r, call.version).await,
    )
}

pub(super) async fn heartbeat(b: &Arc<Broker>, r: HeartbeatRequest, call: Call<'_>) -> Reply {
    call.answer(b, ApiKey::Heartbeat, &mut handlers::groups::heartbeat(b, r))
}

pub(super) async fn leave_group(b: &Arc<Broker>, r: LeaveGroupRequest, call: Call<'_>) -> Reply {
    call.answer(
        b,
        ApiKey::LeaveGroup,
        &mut handlers::groups::leave_group(b, r, call.version).await,
    )
}

pub(super) async fn offset_commit(b: &Arc<Broker>, mut r: OffsetCommitRequest, call: Call<'_>) -> Reply {
    let denied = handlers::authz::offset_commit_topics(b, call.client, &mut r);
    let mut resp = handlers::groups::offset_commit(b, r, call.version).await;
    resp.topics.extend(denied);
    call.answer(b, ApiKey::OffsetCommit, &mut resp)
}

pub(super) async fn offset_fetch(b: &Arc<Broker>, mut r: OffsetFetchRequest, call: Call<'_>) -> Reply {
    let listing = handlers::authz::offset_fetch_listing(&r, call.version);
    let denied = handlers::authz::offset_fetch_groups(b, call.client, &mut r, call.version);
    let mut resp = handlers::groups::offset_fetch(b, r, call.version);
    handlers::authz::offset_fetch_topics(b, call.client, &listing, call.version, &mut resp);
    resp.groups.extend(denied);
    call.answer(b, ApiKey::OffsetFetch, &mut resp)
}

pub(super) async fn list_groups(b: &Arc<Broker>, r: ListGroupsRequest, call: Call<'_>) -> Reply {
    let mut resp = handlers::groups::list_groups(b, r, call.version);
    handlers::authz::list_groups(b, call.client, &mut resp);
    call.answer(b, ApiKey::ListGroups, &mut resp)
}

pub(super) async fn describe_groups(b: &Arc<Broker>, mut r: DescribeGroupsRequest, call: Call<'_>) -> Reply {
    let include = r.include_authorized_operations;
    let denied = handlers::authz::describe_groups(b, call.client, &mut r);
    let mut resp = handlers::groups::describe_groups(b, r, call.version);
    handlers::authz::describe_groups_masks(b, call.client, include, &mut resp);
    resp.groups.extend(denied);
    call.answer(b, ApiKey::DescribeGroups, &mut resp)
}

pub(super) async fn delete_groups(b: &Arc<Broker>, mut r: DeleteGroupsRequest, call: Call<'_>) -> Reply {
    let denied = handlers::authz::delete_groups(b, call.client, &mut r);
    let mut resp = handlers::groups::delete_groups(b, r).await;
    resp.results.extend(denied);
    call.answer(b, ApiKey::DeleteGroups, &mut resp)
}

pub(super) async fn offset_delete(b: &Arc<Broker>, mut r: OffsetDeleteRequest, call: Call<'_>) -> Reply {
    let mut resp = match handlers::authz::offset_delete(b, call.client, &mut r) {
        Err(refused) => refused,
        Ok(denied) => {
            let mut resp = handlers::groups::offset_delete(b, r).await;
            // A group-level error answers for every topic.
            if resp.error_code == 0 {
                resp.topics.extend(denied);
            }
            resp
        }
    };
    call.answer(b, ApiKey::OffsetDelete, &mut resp)
}

pub(super) async fn consumer_group_heartbeat(
    b: &Arc<Broker>,
    r: ConsumerGroupHeartbeatRequest,
    call: Call<'_>,
) -> Reply {
    call.answer(
        b,
        ApiKey::ConsumerGroupHeartbeat,
        &mut handlers::consumer_groups::consumer_group_heartbeat(
            b,
            r,
            call.version,
            call.client_id,
            call.client.host.as_str(),
        )
        .await,
    )
}

pub(super) async fn consumer_group_describe(
    b: &Arc<Broker>,
    mut r: ConsumerGroupDescribeRequest,
    call: Call<'_>,
) -> Reply {
    let include = r.include_authorized_operations;
    let denied = handlers::authz::consumer_group_describe(b, call.client, &mut r);
    let mut resp = handlers::consumer_groups::consumer_group_describe(b, r, call.version);
    handlers::authz::consumer_group_describe_topics(b, call.client, include, &mut resp);
    resp.groups.extend(denied);
    call.answer(b, ApiKey::ConsumerGroupDescribe, &mut resp)
}

pub(super) async fn share_group_heartbeat(
    b: &Arc<Broker>,
    r: ShareGroupHeartbeatRequest,
    call: Call<'_>,
) -> Reply {
    use keel_auth::acl::{Operation, ResourceType};
    // DESCRIBE on every topic it subscribes to, as Kafka checks it.
    let denied: Vec<String> = r
        .subscribed_topic_names
        .iter()
        .flatten()
        .filter(|t| !b.authorized(call.client, Operation::Describe, ResourceType::Topic, t))
        .map(|t| t.to_string())
        .collect();
    let mut resp = if !handlers::authz::group(b, call.client, &r.group_id, Operation::Read) {
        ShareGroupHeartbeatResponse::default()
            .with_error_code(keel_protocol::ResponseError::GroupAuthorizationFailed.code())
            .with_error_message(Some(handlers::str_bytes("Group authorization failed.")))
    } else if !denied.is_empty() {
        ShareGroupHeartbeatResponse::default()
            .with_error_code(keel_protocol::ResponseError::TopicAuthorizationFailed.code())
            .with_error_message(Some(handlers::str_bytes(format!(
                "Topic authorization failed for topics {denied:?}"
            ))))
    } else {
        handlers::share::share_group_heartbeat(b, r, call.client_id, call.client.host.as_str()).await
    };
    call.answer(b, ApiKey::ShareGroupHeartbeat, &mut resp)
}

pub(super) async fn share_group_describe(
    b: &Arc<Broker>,
    mut r: ShareGroupDescribeRequest,
    call: Call<'_>,
) -> Reply {
    // DESCRIBE on each group; the others are answered
    // GROUP_AUTHORIZATION_FAILED.
    let mut denied = Vec::new();
    r.group_ids.retain(|g| {
        let may = handlers::authz::group(b, call.client, g, keel_auth::acl::Operation::Describe);
        if !may {
            denied.push(
                share_group_describe_response::DescribedGroup::default()
                    .with_group_id(g.clone())
                    .with_error_code(keel_protocol::ResponseError::GroupAuthorizationFailed.code()),
            );
        }
        may
    });
    let mut resp = handlers::share::share_group_describe(b, r);
    resp.groups.extend(denied);
    call.answer(b, ApiKey::ShareGroupDescribe, &mut resp)
}

pub(super) async fn describe_share_group_offsets(
    b: &Arc<Broker>,
    r: DescribeShareGroupOffsetsRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = handlers::share::admin::describe_offsets(b, call.client, r);
    call.answer(b, ApiKey::DescribeShareGroupOffsets, &mut resp)
}

pub(super) async fn alter_share_group_offsets(
    b: &Arc<Broker>,
    r: AlterShareGroupOffsetsRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = handlers::share::admin::alter_offsets(b, call.client, r).await;
    call.answer(b, ApiKey::AlterShareGroupOffsets, &mut resp)
}

pub(super) async fn delete_share_group_offsets(
    b: &Arc<Broker>,
    r: DeleteShareGroupOffsetsRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = handlers::share::admin::delete_offsets(b, call.client, r).await;
    call.answer(b, ApiKey::DeleteShareGroupOffsets, &mut resp)
}
