//! Request dispatch: `Broker::handle` decodes a frame, checks that the
//! client may send it, and hands it to its API family (data, admin,
//! transactions, security, groups). Each family is a match over its APIs
//! that runs the ACL checks (`handlers::authz`), the API's handler and the
//! quota accounting, and encodes the answer.

use super::*;

/// What a family's handler needs of the request besides its body.
#[derive(Clone, Copy)]
struct Call<'a> {
    version: i16,
    id: i32,
    client_id: &'a str,
    client: &'a ClientInfo,
    /// The request frame's size (Kafka counts it against
    /// `producer_byte_rate`).
    request_bytes: usize,
}

/// The API families `Broker::handle` routes to.
enum Family {
    Data,
    Admin,
    Txn,
    Security,
    Groups,
}

fn family(api: ApiKey) -> Family {
    use ApiKey::*;
    match api {
        ApiVersions
        | Metadata
        | Produce
        | Fetch
        | ListOffsets
        | OffsetForLeaderEpoch
        | DeleteRecords
        | DescribeTopicPartitions
        | DescribeCluster => Family::Data,
        CreateTopics
        | DeleteTopics
        | CreatePartitions
        | DescribeConfigs
        | IncrementalAlterConfigs
        | AlterConfigs
        | DescribeLogDirs
        | ElectLeaders
        | DescribeClientQuotas
        | AlterClientQuotas
        | ListConfigResources => Family::Admin,
        InitProducerId | AddPartitionsToTxn | EndTxn | AddOffsetsToTxn | TxnOffsetCommit
        | WriteTxnMarkers | DescribeTransactions | ListTransactions | DescribeProducers => Family::Txn,
        DescribeUserScramCredentials
        | AlterUserScramCredentials
        | CreateAcls
        | DescribeAcls
        | DeleteAcls
        | SaslHandshake
        | SaslAuthenticate => Family::Security,
        _ => Family::Groups,
    }
}

impl Broker {
    /// Handles one request frame.
    pub async fn handle(self: &Arc<Self>, frame: RequestFrame, client: &ClientInfo) -> Reply {
        let decoding = Instant::now();
        let decoded = keel_protocol::decode(&frame);
        trace::add(Stage::Decode, decoding.elapsed());
        let decoded = match decoded {
            Ok(d) => d,
            Err(DecodeError::UnsupportedVersion { api_key, .. }) if api_key == ApiKey::ApiVersions as i16 => {
                return match keel_protocol::response::api_versions_unsupported(frame.correlation_id) {
                    Ok(bytes) => Reply::Frame(bytes),
                    Err(e) => Reply::Close(e.to_string()),
                };
            }
            Err(e @ (DecodeError::UnsupportedApi { .. } | DecodeError::UnsupportedVersion { .. })) => {
                self.refused_apis.log(&frame, &client.host);
                return Reply::Refused(e.to_string());
            }
            Err(e) => return Reply::Close(e.to_string()),
        };
        let version = frame.api_version;
        let id = frame.correlation_id;
        let client_id = decoded.header.client_id.as_ref().map_or("", |c| c.as_str());
        trace::set_client_id(client_id);
        if let Some(reason) = self.unchecked_api(frame.api_key, client) {
            return Reply::Close(reason);
        }
        let call = Call {
            version,
            id,
            client_id,
            client,
            request_bytes: frame.bytes.len(),
        };
        let Ok(api) = ApiKey::try_from(frame.api_key) else {
            return Reply::Close(format!("unknown API key {}", frame.api_key));
        };
        match family(api) {
            Family::Data => self.data_apis(decoded.body, call).await,
            Family::Admin => self.admin_apis(decoded.body, call).await,
            Family::Txn => self.txn_apis(decoded.body, call).await,
            Family::Security => self.security_apis(decoded.body, call).await,
            Family::Groups => {
                self.handle_group(decoded.body, version, id, client_id, client)
                    .await
            }
        }
    }

    /// Metadata, produce, fetch and offsets: the data path.
    async fn data_apis(self: &Arc<Self>, body: Request, call: Call<'_>) -> Reply {
        let Call {
            version,
            id,
            client_id,
            client,
            request_bytes,
        } = call;
        match body {
            Request::ApiVersions(_) => self.answer(
                client_id,
                ApiKey::ApiVersions,
                version,
                id,
                &mut handlers::api_versions(self),
            ),
            Request::Metadata(mut r) => {
                // Metadata v0 asks for every topic with an empty list: made
                // a listing here, before denied topics are taken out of a
                // named list (which may leave it empty).
                if version == 0 && r.topics.as_ref().is_some_and(|t| t.is_empty()) {
                    r.topics = None;
                }
                let listed_all = r.topics.is_none();
                let (topic_ops, cluster_ops) = (
                    r.include_topic_authorized_operations,
                    r.include_cluster_authorized_operations,
                );
                let denied = handlers::authz::metadata_request(self, client, &mut r);
                let mut resp = handlers::metadata::metadata(self, r, version, &client.listener).await;
                handlers::authz::metadata_response(
                    self,
                    client,
                    listed_all,
                    topic_ops,
                    cluster_ops,
                    &mut resp,
                );
                resp.topics.extend(denied);
                self.answer(client_id, ApiKey::Metadata, version, id, &mut resp)
            }
            Request::Produce(mut r) => {
                let acks = r.acks;
                let denied = handlers::authz::produce(self, client, &mut r);
                let mut resp = handlers::produce::produce(self, r, version).await;
                resp.responses.extend(denied);
                // Kafka counts the whole request against producer_byte_rate.
                resp.throttle_time_ms =
                    self.quota_throttle(PRODUCER_BYTE_RATE, client_id, request_bytes, false);
                if acks != 0 {
                    self.answer(client_id, ApiKey::Produce, version, id, &mut resp)
                } else {
                    // No response to carry it: the throttle mutes the
                    // connection only.
                    self.request_throttle(client_id);
                    handlers::produce::acks_zero_failure(&resp).map_or(Reply::Nothing, Reply::Close)
                }
            }
            Request::Fetch(mut r) => {
                let denied = handlers::authz::fetch(self, client, &mut r);
                let answer = handlers::fetch::fetch(self, r).await;
                // Over a quota, Kafka answers empty, with the throttle time,
                // and does not count the records withheld against
                // consumer_byte_rate.
                let answer_bytes = answer.bytes();
                let mut throttle = self.request_throttle(client_id);
                if throttle == 0 {
                    throttle = self.quota_throttle(CONSUMER_BYTE_RATE, client_id, answer_bytes, true);
                }
                if throttle > 0 {
                    let empty =
                        keel_protocol::messages::FetchResponse::default().with_throttle_time_ms(throttle);
                    return respond(ApiKey::Fetch, version, id, &empty);
                }
                let response = move || {
                    let mut resp = answer.into_response();
                    resp.responses.extend(denied);
                    resp
                };
                if answer_bytes < BULK_RESPONSE_BYTES {
                    return respond(ApiKey::Fetch, version, id, &response());
                }
                // Joining and encoding megabytes of records: on a bulk
                // thread, so no produce or tail fetch waits behind the copy.
                let encode = move || respond(ApiKey::Fetch, version, id, &response());
                let encoding = Instant::now();
                let reply = self.data.cold.bulk().run(encode).await;
                trace::add(Stage::Encode, encoding.elapsed());
                reply.unwrap_or_else(|e| Reply::Close(format!("fetch response: {e}")))
            }
            Request::ListOffsets(mut r) => {
                let denied = handlers::authz::list_offsets(self, client, &mut r);
                let mut resp = handlers::offsets::list_offsets(self, r, version).await;
                resp.topics.extend(denied);
                self.answer(client_id, ApiKey::ListOffsets, version, id, &mut resp)
            }
            Request::OffsetForLeaderEpoch(mut r) => {
                let denied = handlers::authz::offset_for_leader_epoch(self, client, &mut r);
                let mut resp = handlers::offsets::offset_for_leader_epoch(self, r);
                resp.topics.extend(denied);
                self.answer(client_id, ApiKey::OffsetForLeaderEpoch, version, id, &mut resp)
            }
            Request::DeleteRecords(mut r) => {
                let denied = handlers::authz::delete_records(self, client, &mut r);
                let mut resp = handlers::offsets::delete_records(self, r).await;
                resp.topics.extend(denied);
                self.answer(client_id, ApiKey::DeleteRecords, version, id, &mut resp)
            }
            Request::DescribeTopicPartitions(r) => {
                let may_describe =
                    |topic: &str, listing| handlers::authz::may_describe_topic(self, client, topic, listing);
                let mut resp = handlers::metadata::describe_topic_partitions(self, r, &may_describe);
                handlers::authz::describe_topic_partitions_masks(self, client, &mut resp);
                self.answer(client_id, ApiKey::DescribeTopicPartitions, version, id, &mut resp)
            }
            Request::DescribeCluster(r) => {
                let cluster_ops = r.include_cluster_authorized_operations;
                let mut resp = handlers::metadata::describe_cluster(self, r, &client.listener);
                if cluster_ops && self.authorizer.enabled {
                    resp.cluster_authorized_operations = self.authorized_operations(
                        client,
                        keel_auth::acl::ResourceType::Cluster,
                        keel_auth::acl::CLUSTER_NAME,
                    );
                }
                self.answer(client_id, ApiKey::DescribeCluster, version, id, &mut resp)
            }
            other => Reply::Close(format!("no handler for {other:?}")),
        }
    }

    /// Topics, configs, log dirs, leader elections and client quotas.
    async fn admin_apis(self: &Arc<Self>, body: Request, call: Call<'_>) -> Reply {
        let Call {
            version,
            id,
            client_id,
            client,
            ..
        } = call;
        match body {
            // Kafka's controller_mutation_rate is strict (refusing with
            // THROTTLING_QUOTA_EXCEEDED) from these versions on.
            Request::CreateTopics(mut r) => {
                let denied = handlers::authz::create_topics(self, client, &mut r);
                let mut quota = self.mutations(client_id, version >= 6);
                let mut resp = handlers::admin::create_topics(self, r, version, &mut quota).await;
                resp.topics.extend(denied);
                resp.throttle_time_ms = self.throttled(CONTROLLER_MUTATION_RATE, quota.throttle_ms());
                self.answer(client_id, ApiKey::CreateTopics, version, id, &mut resp)
            }
            Request::DeleteTopics(mut r) => {
                let denied = handlers::authz::delete_topics(self, client, &mut r);
                let mut quota = self.mutations(client_id, version >= 5);
                let mut resp = handlers::admin::delete_topics(self, r, &mut quota).await;
                resp.responses.extend(denied);
                resp.throttle_time_ms = self.throttled(CONTROLLER_MUTATION_RATE, quota.throttle_ms());
                self.answer(client_id, ApiKey::DeleteTopics, version, id, &mut resp)
            }
            Request::CreatePartitions(mut r) => {
                let denied = handlers::authz::create_partitions(self, client, &mut r);
                let mut quota = self.mutations(client_id, version >= 3);
                let mut resp = handlers::admin::create_partitions(self, r, &mut quota).await;
                resp.results.extend(denied);
                resp.throttle_time_ms = self.throttled(CONTROLLER_MUTATION_RATE, quota.throttle_ms());
                self.answer(client_id, ApiKey::CreatePartitions, version, id, &mut resp)
            }
            Request::DescribeConfigs(mut r) => {
                let denied = handlers::authz::describe_configs(self, client, &mut r);
                let mut resp = handlers::configs::describe_configs(self, r);
                resp.results.extend(denied);
                self.answer(client_id, ApiKey::DescribeConfigs, version, id, &mut resp)
            }
            Request::IncrementalAlterConfigs(mut r) => {
                let denied = handlers::authz::alter_configs(
                    self,
                    client,
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
                let mut resp = handlers::alter_configs::incremental_alter_configs(self, r).await;
                resp.responses.extend(denied);
                self.answer(client_id, ApiKey::IncrementalAlterConfigs, version, id, &mut resp)
            }
            Request::AlterConfigs(mut r) => {
                let denied = handlers::authz::alter_configs(
                    self,
                    client,
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
                let mut resp = handlers::alter_configs::alter_configs(self, r).await;
                resp.responses.extend(denied);
                self.answer(client_id, ApiKey::AlterConfigs, version, id, &mut resp)
            }
            Request::DescribeLogDirs(r) => {
                let mut resp = match handlers::authz::describe_log_dirs(self, client) {
                    Some(refused) => refused,
                    None => handlers::log_dirs::describe_log_dirs(self, r).await,
                };
                self.answer(client_id, ApiKey::DescribeLogDirs, version, id, &mut resp)
            }
            Request::ElectLeaders(r) => {
                let mut resp = match handlers::authz::elect_leaders(self, client, &r, version) {
                    Some(refused) => refused,
                    None => handlers::elect::elect_leaders(self, r),
                };
                self.answer(client_id, ApiKey::ElectLeaders, version, id, &mut resp)
            }
            Request::DescribeClientQuotas(r) => {
                let mut resp = if handlers::authz::cluster_refused(self, client, Operation::DescribeConfigs) {
                    handlers::authz::describe_client_quotas_refused()
                } else {
                    handlers::quotas::describe_client_quotas(self, r)
                };
                self.answer(client_id, ApiKey::DescribeClientQuotas, version, id, &mut resp)
            }
            Request::AlterClientQuotas(r) => {
                let mut resp = if handlers::authz::cluster_refused(self, client, Operation::AlterConfigs) {
                    handlers::authz::alter_client_quotas_refused(&r)
                } else {
                    handlers::quotas::alter_client_quotas(self, r).await
                };
                self.answer(client_id, ApiKey::AlterClientQuotas, version, id, &mut resp)
            }
            Request::ListConfigResources(r) => {
                let mut resp = match handlers::authz::list_config_resources(self, client) {
                    Some(refused) => refused,
                    None => handlers::configs::list_config_resources(self, r, version),
                };
                self.answer(client_id, ApiKey::ListConfigResources, version, id, &mut resp)
            }
            other => Reply::Close(format!("no handler for {other:?}")),
        }
    }

    /// Producer ids and transactions.
    async fn txn_apis(self: &Arc<Self>, body: Request, call: Call<'_>) -> Reply {
        let Call {
            version,
            id,
            client_id,
            client,
            ..
        } = call;
        match body {
            Request::InitProducerId(r) => {
                let mut resp = match handlers::authz::init_producer_id(self, client, &r) {
                    Some(error) => keel_protocol::messages::InitProducerIdResponse::default()
                        .with_error_code(error.code())
                        .with_producer_id(keel_protocol::messages::ProducerId(-1))
                        .with_producer_epoch(-1),
                    None => handlers::produce::init_producer_id(self, r).await,
                };
                self.answer(client_id, ApiKey::InitProducerId, version, id, &mut resp)
            }
            Request::AddPartitionsToTxn(r) => {
                let mut resp = match handlers::authz::add_partitions_to_txn(self, client, &r, version) {
                    Some(refused) => refused,
                    None => handlers::txn::add_partitions_to_txn(self, r, version).await,
                };
                self.answer(client_id, ApiKey::AddPartitionsToTxn, version, id, &mut resp)
            }
            Request::EndTxn(r) => {
                let mut resp = match handlers::authz::end_txn(self, client, &r) {
                    Some(refused) => refused,
                    None => handlers::txn::end_txn(self, r, version).await,
                };
                self.answer(client_id, ApiKey::EndTxn, version, id, &mut resp)
            }
            Request::AddOffsetsToTxn(r) => {
                let mut resp = match handlers::authz::add_offsets_to_txn(self, client, &r) {
                    Some(error) => keel_protocol::messages::AddOffsetsToTxnResponse::default()
                        .with_error_code(error.code()),
                    None => handlers::txn::add_offsets_to_txn(self, r, version).await,
                };
                self.answer(client_id, ApiKey::AddOffsetsToTxn, version, id, &mut resp)
            }
            Request::TxnOffsetCommit(mut r) => {
                let mut resp = match handlers::authz::txn_offset_commit(self, client, &mut r) {
                    Err(refused) => refused,
                    Ok(denied) => {
                        let mut resp = handlers::groups::txn_offset_commit(self, r, version).await;
                        resp.topics.extend(denied);
                        resp
                    }
                };
                self.answer(client_id, ApiKey::TxnOffsetCommit, version, id, &mut resp)
            }
            Request::WriteTxnMarkers(r) => {
                let resp = match handlers::authz::write_txn_markers(self, client, &r) {
                    Some(refused) => refused,
                    None => handlers::txn_admin::write_txn_markers(self, r).await,
                };
                respond(ApiKey::WriteTxnMarkers, version, id, &resp)
            }
            Request::DescribeTransactions(mut r) => {
                let denied = handlers::authz::describe_transactions(self, client, &mut r);
                let mut resp = handlers::txn_admin::describe_transactions(self, r);
                handlers::authz::describe_transactions_topics(self, client, &mut resp);
                resp.transaction_states.extend(denied);
                self.answer(client_id, ApiKey::DescribeTransactions, version, id, &mut resp)
            }
            Request::ListTransactions(r) => {
                let mut resp = handlers::txn_admin::list_transactions(self, r);
                handlers::authz::list_transactions(self, client, &mut resp);
                self.answer(client_id, ApiKey::ListTransactions, version, id, &mut resp)
            }
            Request::DescribeProducers(mut r) => {
                let denied = handlers::authz::describe_producers(self, client, &mut r);
                let mut resp = handlers::txn_admin::describe_producers(self, r);
                resp.topics.extend(denied);
                self.answer(client_id, ApiKey::DescribeProducers, version, id, &mut resp)
            }
            other => Reply::Close(format!("no handler for {other:?}")),
        }
    }

    /// SCRAM credentials, ACLs and the SASL exchange.
    async fn security_apis(self: &Arc<Self>, body: Request, call: Call<'_>) -> Reply {
        let Call {
            version,
            id,
            client_id,
            client,
            ..
        } = call;
        match body {
            Request::DescribeUserScramCredentials(r) => {
                let mut resp = if handlers::authz::cluster_refused(self, client, Operation::Describe) {
                    handlers::authz::describe_user_scram_refused()
                } else {
                    handlers::scram::describe_user_scram_credentials(self, r)
                };
                self.answer(
                    client_id,
                    ApiKey::DescribeUserScramCredentials,
                    version,
                    id,
                    &mut resp,
                )
            }
            Request::AlterUserScramCredentials(r) => {
                let mut resp = if handlers::authz::cluster_refused(self, client, Operation::Alter) {
                    handlers::authz::alter_user_scram_refused(&r)
                } else {
                    handlers::scram::alter_user_scram_credentials(self, r).await
                };
                self.answer(
                    client_id,
                    ApiKey::AlterUserScramCredentials,
                    version,
                    id,
                    &mut resp,
                )
            }
            Request::CreateAcls(r) => self.answer(
                client_id,
                ApiKey::CreateAcls,
                version,
                id,
                &mut handlers::acls::create_acls(self, client, r).await,
            ),
            Request::DescribeAcls(r) => self.answer(
                client_id,
                ApiKey::DescribeAcls,
                version,
                id,
                &mut handlers::acls::describe_acls(self, client, r),
            ),
            Request::DeleteAcls(r) => self.answer(
                client_id,
                ApiKey::DeleteAcls,
                version,
                id,
                &mut handlers::acls::delete_acls(self, client, r).await,
            ),
            // Kafka neither throttles nor counts the SASL exchange against
            // quotas: its answers go out as they are.
            Request::SaslHandshake(r) => {
                let (resp, next) = handlers::sasl::handshake(client, &r, version);
                self.sasl_reply(ApiKey::SaslHandshake, version, id, &resp, next, client)
            }
            Request::SaslAuthenticate(r) => {
                let (resp, next) = handlers::sasl::authenticate(client, &r);
                self.sasl_reply(ApiKey::SaslAuthenticate, version, id, &resp, next, client)
            }
            other => Reply::Close(format!("no handler for {other:?}")),
        }
    }

    /// Why a request of an API whose ACL checks Keel does not make yet is
    /// refused: with an authorizer, only `super.users` may send one.
    fn unchecked_api(&self, api_key: i16, client: &ClientInfo) -> Option<String> {
        if !self.authorizer.enabled {
            return None;
        }
        let api = ApiKey::try_from(api_key).ok()?;
        if handlers::authz::checked(api) || self.is_super_user(client) {
            return None;
        }
        let reason = format!("{api:?} is open to super.users only: Keel does not check its ACLs yet");
        tracing::info!(target: "keel::authorizer", listener = %client.listener, client = %client.host, "{reason}; closing the connection");
        Some(reason)
    }

    /// The answer to a group API whose group the client may not use (READ;
    /// DESCRIBE for OffsetFetch): Kafka's GROUP_AUTHORIZATION_FAILED.
    fn group_denied(
        &self,
        body: &Request,
        version: i16,
        id: i32,
        client_id: &str,
        client: &ClientInfo,
    ) -> Option<Reply> {
        use keel_auth::acl::Operation::{Describe, Read};
        use keel_protocol::messages::*;
        if !self.authorizer.enabled {
            return None;
        }
        let code = keel_protocol::ResponseError::GroupAuthorizationFailed.code();
        let denied = |group: &str, op| !handlers::authz::group(self, client, group, op);
        let reply = match body {
            Request::JoinGroup(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::JoinGroup,
                version,
                id,
                &mut JoinGroupResponse::default()
                    .with_error_code(code)
                    .with_generation_id(-1),
            ),
            Request::SyncGroup(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::SyncGroup,
                version,
                id,
                &mut SyncGroupResponse::default().with_error_code(code),
            ),
            Request::Heartbeat(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::Heartbeat,
                version,
                id,
                &mut HeartbeatResponse::default().with_error_code(code),
            ),
            Request::LeaveGroup(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::LeaveGroup,
                version,
                id,
                &mut LeaveGroupResponse::default().with_error_code(code),
            ),
            Request::OffsetCommit(r) if denied(&r.group_id, Read) => {
                let topics = r
                    .topics
                    .iter()
                    .map(|t| {
                        handlers::authz::offset_commit_refused(
                            t,
                            keel_protocol::ResponseError::GroupAuthorizationFailed,
                        )
                    })
                    .collect();
                self.answer(
                    client_id,
                    ApiKey::OffsetCommit,
                    version,
                    id,
                    &mut OffsetCommitResponse::default().with_topics(topics),
                )
            }
            Request::OffsetFetch(r) if version < 8 && denied(&r.group_id, Describe) => self.answer(
                client_id,
                ApiKey::OffsetFetch,
                version,
                id,
                &mut OffsetFetchResponse::default().with_error_code(code),
            ),
            Request::ConsumerGroupHeartbeat(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::ConsumerGroupHeartbeat,
                version,
                id,
                &mut ConsumerGroupHeartbeatResponse::default()
                    .with_error_code(code)
                    .with_error_message(Some(handlers::str_bytes("Group authorization failed."))),
            ),
            _ => return None,
        };
        Some(reply)
    }

    /// A SASL answer, and what the connection does after it: a failed
    /// authentication is answered after
    /// `connection.failed.authentication.delay.ms` (Kafka's brake on
    /// password guessing) and closes the connection.
    fn sasl_reply<R: Encodable>(
        &self,
        key: ApiKey,
        version: i16,
        id: i32,
        body: &R,
        next: keel_auth::sasl::Next,
        client: &ClientInfo,
    ) -> Reply {
        let reply = respond(key, version, id, body);
        let Reply::Frame(frame) = reply else {
            return reply;
        };
        self.sasl_outcome(frame, next, client)
    }

    /// Counts a SASL step's outcome and turns it into a reply carrying
    /// `frame` (a response, or a bare token's answer after a v0 handshake).
    pub fn sasl_outcome(&self, frame: Bytes, next: keel_auth::sasl::Next, client: &ClientInfo) -> Reply {
        use keel_auth::sasl::Next;
        match next {
            Next::Continue => Reply::Frame(frame),
            Next::Authenticated => {
                if let Some(session) = client.sasl.as_ref().and_then(|a| a.lock().session().cloned()) {
                    self.metrics.authenticated(&client.listener, session.mechanism);
                    tracing::debug!(listener = %client.listener, user = %session.user, mechanism = session.mechanism, "SASL authentication succeeded");
                }
                Reply::Frame(frame)
            }
            Next::Fail(reason) => {
                self.metrics.authentication_failed(&client.listener);
                tracing::info!(listener = %client.listener, client = %client.host, %reason, "SASL authentication failed; closing the connection");
                let delay = Duration::from_millis(
                    self.config()
                        .num("connection.failed.authentication.delay.ms")
                        .max(0) as u64,
                );
                Reply::FrameThenClose { frame, delay, reason }
            }
            Next::Close(reason) => {
                // Counted as Kafka counts a broken handshake: a failed
                // authentication.
                self.metrics.authentication_failed(&client.listener);
                tracing::info!(listener = %client.listener, client = %client.host, %reason, "SASL protocol error; closing the connection");
                Reply::FrameThenClose {
                    frame,
                    delay: Duration::ZERO,
                    reason,
                }
            }
        }
    }

    /// Encodes a response after raising its throttle time to what the
    /// client's `request_percentage` asks for the time the request has
    /// taken so far (Kafka throttles every response but those of cluster
    /// actions that way).
    fn answer<R: Encodable + Throttle>(
        &self,
        client_id: &str,
        key: ApiKey,
        version: i16,
        id: i32,
        body: &mut R,
    ) -> Reply {
        let throttle = self.request_throttle(client_id);
        if throttle > 0 {
            body.raise_throttle_time_ms(throttle);
        }
        respond(key, version, id, body)
    }

    /// The client's `controller_mutation_rate` for one request.
    fn mutations(&self, client_id: &str, strict: bool) -> crate::quotas::Mutations<'_> {
        self.quotas.mutations(&quota_user(), client_id, strict)
    }

    /// Records the current request's handling time against the client's
    /// `request_percentage` and returns the throttle time.
    fn request_throttle(&self, client_id: &str) -> i32 {
        let Some(busy) = trace::busy() else {
            return 0;
        };
        let ms = self
            .quotas
            .record_request_time(&quota_user(), client_id, busy, now_ms());
        self.throttled(REQUEST_PERCENTAGE, ms)
    }

    /// Records `bytes` against the client's quota `key` and returns the
    /// throttle time, which also mutes the connection after the response
    /// (see `crate::quotas`).
    fn quota_throttle(&self, key: &'static str, client_id: &str, bytes: usize, take_back: bool) -> i32 {
        let ms = self
            .quotas
            .record(key, &quota_user(), client_id, bytes as f64, take_back, now_ms());
        self.throttled(key, ms)
    }

    /// A throttle time of `ms` from the quota `key`: on the request's trace
    /// (the connection mutes for it) and in the metrics.
    fn throttled(&self, key: &'static str, ms: i64) -> i32 {
        let ms = u32::try_from(ms).unwrap_or(if ms < 0 { 0 } else { u32::MAX });
        if ms > 0 {
            trace::throttle(ms);
            self.metrics.quota_throttled(key, u64::from(ms));
        }
        i32::try_from(ms).unwrap_or(i32::MAX)
    }

    /// Counts a new connection from `ip` against its address's
    /// `connection_creation_rate`: how long to hold it unread before
    /// closing it, or `None` to serve it.
    pub fn connection_throttle(&self, ip: std::net::IpAddr) -> Option<Duration> {
        let ms = u64::try_from(self.quotas.record_connection(ip, now_ms())).unwrap_or(0);
        if ms == 0 {
            return None;
        }
        self.metrics.quota_throttled(CONNECTION_CREATION_RATE, ms);
        Some(Duration::from_millis(ms))
    }

    /// The group coordinator's APIs.
    async fn handle_group(
        self: &Arc<Self>,
        body: Request,
        version: i16,
        id: i32,
        client_id: &str,
        client: &ClientInfo,
    ) -> Reply {
        let client_host = client.host.as_str();
        use handlers::groups;
        if let Some(reply) = self.group_denied(&body, version, id, client_id, client) {
            return reply;
        }
        match body {
            Request::FindCoordinator(mut r) => {
                let denied = handlers::authz::find_coordinator(self, client, &mut r, version);
                let mut resp = match denied {
                    handlers::authz::Coordinators::Refused(resp) => resp,
                    handlers::authz::Coordinators::Keys(denied) => {
                        let mut resp = groups::find_coordinator(self, r, version, &client.listener);
                        resp.coordinators.extend(denied);
                        resp
                    }
                };
                self.answer(client_id, ApiKey::FindCoordinator, version, id, &mut resp)
            }
            Request::JoinGroup(r) => {
                let mut resp = groups::join_group(self, r, version, client_id, client_host).await;
                self.answer(client_id, ApiKey::JoinGroup, version, id, &mut resp)
            }
            Request::SyncGroup(r) => self.answer(
                client_id,
                ApiKey::SyncGroup,
                version,
                id,
                &mut groups::sync_group(self, r, version).await,
            ),
            Request::Heartbeat(r) => self.answer(
                client_id,
                ApiKey::Heartbeat,
                version,
                id,
                &mut groups::heartbeat(self, r),
            ),
            Request::LeaveGroup(r) => self.answer(
                client_id,
                ApiKey::LeaveGroup,
                version,
                id,
                &mut groups::leave_group(self, r, version).await,
            ),
            Request::OffsetCommit(mut r) => {
                let denied = handlers::authz::offset_commit_topics(self, client, &mut r);
                let mut resp = groups::offset_commit(self, r, version).await;
                resp.topics.extend(denied);
                self.answer(client_id, ApiKey::OffsetCommit, version, id, &mut resp)
            }
            Request::OffsetFetch(mut r) => {
                let listing = handlers::authz::offset_fetch_listing(&r, version);
                let denied = handlers::authz::offset_fetch_groups(self, client, &mut r, version);
                let mut resp = groups::offset_fetch(self, r, version);
                handlers::authz::offset_fetch_topics(self, client, &listing, version, &mut resp);
                resp.groups.extend(denied);
                self.answer(client_id, ApiKey::OffsetFetch, version, id, &mut resp)
            }
            Request::ListGroups(r) => {
                let mut resp = groups::list_groups(self, r, version);
                handlers::authz::list_groups(self, client, &mut resp);
                self.answer(client_id, ApiKey::ListGroups, version, id, &mut resp)
            }
            Request::DescribeGroups(mut r) => {
                let include = r.include_authorized_operations;
                let denied = handlers::authz::describe_groups(self, client, &mut r);
                let mut resp = groups::describe_groups(self, r, version);
                handlers::authz::describe_groups_masks(self, client, include, &mut resp);
                resp.groups.extend(denied);
                self.answer(client_id, ApiKey::DescribeGroups, version, id, &mut resp)
            }
            Request::DeleteGroups(mut r) => {
                let denied = handlers::authz::delete_groups(self, client, &mut r);
                let mut resp = groups::delete_groups(self, r).await;
                resp.results.extend(denied);
                self.answer(client_id, ApiKey::DeleteGroups, version, id, &mut resp)
            }
            Request::OffsetDelete(mut r) => {
                let mut resp = match handlers::authz::offset_delete(self, client, &mut r) {
                    Err(refused) => refused,
                    Ok(denied) => {
                        let mut resp = groups::offset_delete(self, r).await;
                        // A group-level error answers for every topic.
                        if resp.error_code == 0 {
                            resp.topics.extend(denied);
                        }
                        resp
                    }
                };
                self.answer(client_id, ApiKey::OffsetDelete, version, id, &mut resp)
            }
            Request::ConsumerGroupHeartbeat(r) => self.answer(
                client_id,
                ApiKey::ConsumerGroupHeartbeat,
                version,
                id,
                &mut handlers::consumer_groups::consumer_group_heartbeat(
                    self,
                    r,
                    version,
                    client_id,
                    client_host,
                )
                .await,
            ),
            Request::ConsumerGroupDescribe(mut r) => {
                let include = r.include_authorized_operations;
                let denied = handlers::authz::consumer_group_describe(self, client, &mut r);
                let mut resp = handlers::consumer_groups::consumer_group_describe(self, r, version);
                handlers::authz::consumer_group_describe_topics(self, client, include, &mut resp);
                resp.groups.extend(denied);
                self.answer(client_id, ApiKey::ConsumerGroupDescribe, version, id, &mut resp)
            }
            other => Reply::Close(format!("no handler for {other:?}")),
        }
    }
}
