//! Metadata, produce, fetch and offsets: the data path.
//!
//! One function per API: its ACL checks (`handlers::authz`), its handler,
//! the denials merged into the answer, its quota accounting, the answer.

use super::*;

pub(super) async fn api_versions(b: &Arc<Broker>, _r: ApiVersionsRequest, call: Call<'_>) -> Reply {
    call.answer(b, ApiKey::ApiVersions, &mut handlers::api_versions(b))
}

pub(super) async fn metadata(b: &Arc<Broker>, mut r: MetadataRequest, call: Call<'_>) -> Reply {
    // Metadata v0 asks for every topic with an empty list: made
    // a listing here, before denied topics are taken out of a
    // named list (which may leave it empty).
    if call.version == 0 && r.topics.as_ref().is_some_and(|t| t.is_empty()) {
        r.topics = None;
    }
    let listed_all = r.topics.is_none();
    let (topic_ops, cluster_ops) = (
        r.include_topic_authorized_operations,
        r.include_cluster_authorized_operations,
    );
    let denied = handlers::authz::metadata_request(b, call.client, &mut r);
    let mut resp = handlers::metadata::metadata(b, r, call.version, &call.client.listener).await;
    handlers::authz::metadata_response(b, call.client, listed_all, topic_ops, cluster_ops, &mut resp);
    resp.topics.extend(denied);
    call.answer(b, ApiKey::Metadata, &mut resp)
}

pub(super) async fn produce(b: &Arc<Broker>, mut r: ProduceRequest, call: Call<'_>) -> Reply {
    let acks = r.acks;
    let denied = handlers::authz::produce(b, call.client, &mut r);
    let mut resp = handlers::produce::produce(b, r, call.version).await;
    handlers::leader_hints::produce(b, &mut resp, &call.client.listener);
    resp.responses.extend(denied);
    // Kafka counts the whole request against producer_byte_rate.
    resp.throttle_time_ms = b.quota_throttle(PRODUCER_BYTE_RATE, call.client_id, call.request_bytes, false);
    if acks != 0 {
        call.answer(b, ApiKey::Produce, &mut resp)
    } else {
        // No response to carry it: the throttle mutes the
        // connection only.
        b.request_throttle(call.client_id);
        handlers::produce::acks_zero_failure(&resp).map_or(Reply::Nothing, Reply::Close)
    }
}

pub(super) async fn fetch(b: &Arc<Broker>, mut r: FetchRequest, call: Call<'_>) -> Reply {
    let denied = handlers::authz::fetch(b, call.client, &mut r);
    // The fetch names its reader: the client, by id and address.
    let reader = keel_data::readers::Reader::new(call.client_id, &call.client.host, call.client.port);
    let answer = handlers::fetch::fetch(b, r, &reader).await;
    // Over a quota, Kafka answers empty, with the throttle time,
    // and does not count the records withheld against
    // consumer_byte_rate.
    let answer_bytes = answer.bytes();
    let mut throttle = b.request_throttle(call.client_id);
    if throttle == 0 {
        throttle = b.quota_throttle(CONSUMER_BYTE_RATE, call.client_id, answer_bytes, true);
    }
    if throttle > 0 {
        let empty = keel_protocol::messages::FetchResponse::default().with_throttle_time_ms(throttle);
        return respond(ApiKey::Fetch, call.version, call.id, &empty);
    }
    let (broker, listener) = (Arc::clone(b), call.client.listener.clone());
    let response = move || {
        let mut resp = answer.into_response();
        handlers::leader_hints::fetch(&broker, &mut resp, &listener);
        resp.responses.extend(denied);
        resp
    };
    if answer_bytes < BULK_RESPONSE_BYTES {
        return respond(ApiKey::Fetch, call.version, call.id, &response());
    }
    // Joining and encoding megabytes of records: on a bulk
    // thread, so no produce or tail fetch waits behind the copy.
    let encode = move || respond(ApiKey::Fetch, call.version, call.id, &response());
    let encoding = Instant::now();
    let reply = b.data.cold.bulk().run(encode).await;
    trace::add(Stage::Encode, encoding.elapsed());
    reply.unwrap_or_else(|e| Reply::Close(format!("fetch response: {e}")))
}

pub(super) async fn list_offsets(b: &Arc<Broker>, mut r: ListOffsetsRequest, call: Call<'_>) -> Reply {
    let denied = handlers::authz::list_offsets(b, call.client, &mut r);
    let mut resp = handlers::offsets::list_offsets(b, r, call.version).await;
    resp.topics.extend(denied);
    call.answer(b, ApiKey::ListOffsets, &mut resp)
}

pub(super) async fn offset_for_leader_epoch(
    b: &Arc<Broker>,
    mut r: OffsetForLeaderEpochRequest,
    call: Call<'_>,
) -> Reply {
    let denied = handlers::authz::offset_for_leader_epoch(b, call.client, &mut r);
    let mut resp = handlers::offsets::offset_for_leader_epoch(b, r);
    resp.topics.extend(denied);
    call.answer(b, ApiKey::OffsetForLeaderEpoch, &mut resp)
}

pub(super) async fn delete_records(b: &Arc<Broker>, mut r: DeleteRecordsRequest, call: Call<'_>) -> Reply {
    let denied = handlers::authz::delete_records(b, call.client, &mut r);
    let mut resp = handlers::offsets::delete_records(b, r).await;
    resp.topics.extend(denied);
    call.answer(b, ApiKey::DeleteRecords, &mut resp)
}

pub(super) async fn describe_topic_partitions(
    b: &Arc<Broker>,
    r: DescribeTopicPartitionsRequest,
    call: Call<'_>,
) -> Reply {
    let may_describe =
        |topic: &str, listing| handlers::authz::may_describe_topic(b, call.client, topic, listing);
    let mut resp = handlers::metadata::describe_topic_partitions(b, r, &may_describe);
    handlers::authz::describe_topic_partitions_masks(b, call.client, &mut resp);
    call.answer(b, ApiKey::DescribeTopicPartitions, &mut resp)
}

pub(super) async fn describe_cluster(b: &Arc<Broker>, r: DescribeClusterRequest, call: Call<'_>) -> Reply {
    let cluster_ops = r.include_cluster_authorized_operations;
    let mut resp = handlers::metadata::describe_cluster(b, r, &call.client.listener);
    if cluster_ops && b.authorizer.enabled {
        resp.cluster_authorized_operations = b.authorized_operations(
            call.client,
            keel_auth::acl::ResourceType::Cluster,
            keel_auth::acl::CLUSTER_NAME,
        );
    }
    call.answer(b, ApiKey::DescribeCluster, &mut resp)
}

pub(super) async fn share_fetch(
    b: &Arc<Broker>,
    r: keel_protocol::share::ShareFetch,
    call: Call<'_>,
) -> Reply {
    let mut resp = handlers::share::fetch::share_fetch(b, r, call.client, call.client_id).await;
    // Records acquired are locked to this member: they go out whatever
    // the quota, so they count against it (nothing taken back, unlike a
    // Fetch answered empty), and the throttle time slows the client's
    // next fetch.
    let bytes: usize = resp
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
        .sum();
    resp.throttle_time_ms = b.quota_throttle(CONSUMER_BYTE_RATE, call.client_id, bytes, false);
    call.answer(b, ApiKey::ShareFetch, &mut resp)
}

pub(super) async fn share_acknowledge(
    b: &Arc<Broker>,
    r: keel_protocol::share::ShareAcknowledge,
    call: Call<'_>,
) -> Reply {
    let mut resp = handlers::share::fetch::share_acknowledge(b, r, call.client).await;
    call.answer(b, ApiKey::ShareAcknowledge, &mut resp)
}
