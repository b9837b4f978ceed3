//! Topics, configs, log dirs, leader elections and client quotas.
//!
//! One function per API: its ACL checks (`handlers::authz`), its handler,
//! the denials merged into the answer, its quota accounting, the answer.

use super::*;

/// Kafka's controller_mutation_rate is strict (refusing with
/// THROTTLING_QUOTA_EXCEEDED) from CreateTopics v6, DeleteTopics v5 and
/// CreatePartitions v3 on.
pub(super) async fn create_topics(b: &Arc<Broker>, mut r: CreateTopicsRequest, call: Call<'_>) -> Reply {
    let denied = handlers::authz::create_topics(b, call.client, &mut r);
    let mut quota = b.mutations(call.client_id, call.version >= 6);
    let mut resp = handlers::admin::create_topics(b, r, call.version, &mut quota).await;
    resp.topics.extend(denied);
    resp.throttle_time_ms = b.throttled(CONTROLLER_MUTATION_RATE, quota.throttle_ms());
    call.answer(b, ApiKey::CreateTopics, &mut resp)
}

pub(super) async fn delete_topics(b: &Arc<Broker>, mut r: DeleteTopicsRequest, call: Call<'_>) -> Reply {
    let denied = handlers::authz::delete_topics(b, call.client, &mut r);
    let mut quota = b.mutations(call.client_id, call.version >= 5);
    let mut resp = handlers::admin::delete_topics(b, r, &mut quota).await;
    resp.responses.extend(denied);
    resp.throttle_time_ms = b.throttled(CONTROLLER_MUTATION_RATE, quota.throttle_ms());
    call.answer(b, ApiKey::DeleteTopics, &mut resp)
}

pub(super) async fn create_partitions(
    b: &Arc<Broker>,
    mut r: CreatePartitionsRequest,
    call: Call<'_>,
) -> Reply {
    let denied = handlers::authz::create_partitions(b, call.client, &mut r);
    let mut quota = b.mutations(call.client_id, call.version >= 3);
    let mut resp = handlers::admin::create_partitions(b, r, &mut quota).await;
    resp.results.extend(denied);
    resp.throttle_time_ms = b.throttled(CONTROLLER_MUTATION_RATE, quota.throttle_ms());
    call.answer(b, ApiKey::CreatePartitions, &mut resp)
}

pub(super) async fn describe_configs(
    b: &Arc<Broker>,
    mut r: DescribeConfigsRequest,
    call: Call<'_>,
) -> Reply {
    let denied = handlers::authz::describe_configs(b, call.client, &mut r);
    let mut resp = handlers::configs::describe_configs(b, r);
    resp.results.extend(denied);
    call.answer(b, ApiKey::DescribeConfigs, &mut resp)
}

pub(super) async fn incremental_alter_configs(
    b: &Arc<Broker>,
    mut r: IncrementalAlterConfigsRequest,
    call: Call<'_>,
) -> Reply {
    let denied = handlers::authz::alter_configs(
        b,
        call.client,
        &mut r.resources,
        |x| (x.resource_type, &x.resource_name),
        |t, name, error| {
            keel_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_error_code(error.code())
                    .with_error_message(Some(handlers::str_bytes("Authorization failed.")))
                    .with_resource_type(t)
                    .with_resource_name(name)
        },
    );
    let mut resp = handlers::alter_configs::incremental_alter_configs(b, r).await;
    resp.responses.extend(denied);
    call.answer(b, ApiKey::IncrementalAlterConfigs, &mut resp)
}

pub(super) async fn alter_configs(b: &Arc<Broker>, mut r: AlterConfigsRequest, call: Call<'_>) -> Reply {
    let denied = handlers::authz::alter_configs(
        b,
        call.client,
        &mut r.resources,
        |x| (x.resource_type, &x.resource_name),
        |t, name, error| {
            keel_protocol::messages::alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(error.code())
                .with_error_message(Some(handlers::str_bytes("Authorization failed.")))
                .with_resource_type(t)
                .with_resource_name(name)
        },
    );
    let mut resp = handlers::alter_configs::alter_configs(b, r).await;
    resp.responses.extend(denied);
    call.answer(b, ApiKey::AlterConfigs, &mut resp)
}

pub(super) async fn describe_log_dirs(b: &Arc<Broker>, r: DescribeLogDirsRequest, call: Call<'_>) -> Reply {
    let mut resp = match handlers::authz::describe_log_dirs(b, call.client) {
        Some(refused) => refused,
        None => handlers::log_dirs::describe_log_dirs(b, r).await,
    };
    call.answer(b, ApiKey::DescribeLogDirs, &mut resp)
}

pub(super) async fn elect_leaders(b: &Arc<Broker>, r: ElectLeadersRequest, call: Call<'_>) -> Reply {
    let mut resp = match handlers::authz::elect_leaders(b, call.client, &r, call.version) {
        Some(refused) => refused,
        None => handlers::elect::elect_leaders(b, r),
    };
    call.answer(b, ApiKey::ElectLeaders, &mut resp)
}

pub(super) async fn describe_client_quotas(
    b: &Arc<Broker>,
    r: DescribeClientQuotasRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = if handlers::authz::cluster_refused(b, call.client, Operation::DescribeConfigs) {
        handlers::authz::describe_client_quotas_refused()
    } else {
        handlers::quotas::describe_client_quotas(b, r)
    };
    call.answer(b, ApiKey::DescribeClientQuotas, &mut resp)
}

pub(super) async fn alter_client_quotas(
    b: &Arc<Broker>,
    r: AlterClientQuotasRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = if handlers::authz::cluster_refused(b, call.client, Operation::AlterConfigs) {
        handlers::authz::alter_client_quotas_refused(&r)
    } else {
        handlers::quotas::alter_client_quotas(b, r).await
    };
    call.answer(b, ApiKey::AlterClientQuotas, &mut resp)
}

pub(super) async fn list_config_resources(
    b: &Arc<Broker>,
    r: ListConfigResourcesRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = match handlers::authz::list_config_resources(b, call.client) {
        Some(refused) => refused,
        None => handlers::configs::list_config_resources(b, r, call.version),
    };
    call.answer(b, ApiKey::ListConfigResources, &mut resp)
}
