//! The Kafka APIs the broker serves, one entry each: `Broker::handle`
//! finds a request's entry in [`APIS`] and runs it. An entry's function
//! makes the API's ACL checks (`handlers::authz`), runs its handler,
//! merges the denials into the answer, accounts the client's quotas and
//! encodes the answer; adding an API is adding its function, with its ACL
//! checks, and its row.

mod admin;
mod data;
mod groups;
mod security;
mod txn;

use std::future::Future;
use std::pin::Pin;

pub(super) use super::*;
pub(super) use keel_protocol::messages::*;

/// What an API's function needs of the request besides its body.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub version: i16,
    pub id: i32,
    pub client_id: &'a str,
    pub client: &'a ClientInfo,
    /// The request frame's size (Kafka counts it against
    /// `producer_byte_rate`).
    pub request_bytes: usize,
}

impl Call<'_> {
    /// Encodes `body` as this request's answer, its throttle time raised
    /// to the client's `request_percentage` (see `Broker::answer`).
    pub fn answer<R: Encodable + crate::quotas::Throttle>(
        &self,
        b: &Broker,
        key: ApiKey,
        body: &mut R,
    ) -> Reply {
        b.answer(self.client_id, key, self.version, self.id, body)
    }
}

type Served<'a> = Pin<Box<dyn Future<Output = Reply> + Send + 'a>>;

/// One API as the broker serves it.
pub(super) struct Api {
    pub key: ApiKey,
    pub serve: for<'a> fn(&'a Arc<Broker>, Request, Call<'a>) -> Served<'a>,
}

/// An entry for the API `$variant`, served by `$serve`.
macro_rules! api {
    ($variant:ident, $serve:path) => {
        Api {
            key: ApiKey::$variant,
            serve: {
                fn serve<'a>(b: &'a Arc<Broker>, body: Request, call: Call<'a>) -> Served<'a> {
                    Box::pin(async move {
                        match body {
                            Request::$variant(r) => $serve(b, r, call).await,
                            other => Reply::Close(format!("no handler for {other:?}")),
                        }
                    })
                }
                serve
            },
        }
    };
}

/// Every API the broker serves.
pub(super) static APIS: &[Api] = &[
    api!(ApiVersions, data::api_versions),
    api!(Metadata, data::metadata),
    api!(Produce, data::produce),
    api!(Fetch, data::fetch),
    api!(ListOffsets, data::list_offsets),
    api!(OffsetForLeaderEpoch, data::offset_for_leader_epoch),
    api!(DeleteRecords, data::delete_records),
    api!(DescribeTopicPartitions, data::describe_topic_partitions),
    api!(DescribeCluster, data::describe_cluster),
    api!(CreateTopics, admin::create_topics),
    api!(DeleteTopics, admin::delete_topics),
    api!(CreatePartitions, admin::create_partitions),
    api!(DescribeConfigs, admin::describe_configs),
    api!(IncrementalAlterConfigs, admin::incremental_alter_configs),
    api!(AlterConfigs, admin::alter_configs),
    api!(DescribeLogDirs, admin::describe_log_dirs),
    api!(ElectLeaders, admin::elect_leaders),
    api!(DescribeClientQuotas, admin::describe_client_quotas),
    api!(AlterClientQuotas, admin::alter_client_quotas),
    api!(ListConfigResources, admin::list_config_resources),
    api!(InitProducerId, txn::init_producer_id),
    api!(AddPartitionsToTxn, txn::add_partitions_to_txn),
    api!(EndTxn, txn::end_txn),
    api!(AddOffsetsToTxn, txn::add_offsets_to_txn),
    api!(TxnOffsetCommit, txn::txn_offset_commit),
    api!(WriteTxnMarkers, txn::write_txn_markers),
    api!(DescribeTransactions, txn::describe_transactions),
    api!(ListTransactions, txn::list_transactions),
    api!(DescribeProducers, txn::describe_producers),
    api!(
        DescribeUserScramCredentials,
        security::describe_user_scram_credentials
    ),
    api!(AlterUserScramCredentials, security::alter_user_scram_credentials),
    api!(CreateAcls, security::create_acls),
    api!(DescribeAcls, security::describe_acls),
    api!(DeleteAcls, security::delete_acls),
    api!(SaslHandshake, security::sasl_handshake),
    api!(SaslAuthenticate, security::sasl_authenticate),
    api!(FindCoordinator, groups::find_coordinator),
    api!(JoinGroup, groups::join_group),
    api!(SyncGroup, groups::sync_group),
    api!(Heartbeat, groups::heartbeat),
    api!(LeaveGroup, groups::leave_group),
    api!(OffsetCommit, groups::offset_commit),
    api!(OffsetFetch, groups::offset_fetch),
    api!(ListGroups, groups::list_groups),
    api!(DescribeGroups, groups::describe_groups),
    api!(DeleteGroups, groups::delete_groups),
    api!(OffsetDelete, groups::offset_delete),
    api!(ConsumerGroupHeartbeat, groups::consumer_group_heartbeat),
    api!(ConsumerGroupDescribe, groups::consumer_group_describe),
    api!(ShareGroupHeartbeat, groups::share_group_heartbeat),
    api!(ShareGroupDescribe, groups::share_group_describe),
    api!(ShareFetch, data::share_fetch),
    api!(ShareAcknowledge, data::share_acknowledge),
    api!(DescribeShareGroupOffsets, groups::describe_share_group_offsets),
    api!(AlterShareGroupOffsets, groups::alter_share_group_offsets),
    api!(DeleteShareGroupOffsets, groups::delete_share_group_offsets),
];

/// The entry of `key`, if the broker serves it.
pub(super) fn find(key: ApiKey) -> Option<&'static Api> {
    APIS.iter().find(|a| a.key == key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every API and version the broker advertises has an entry, and no
    /// entry is for an API it does not advertise.
    #[test]
    fn the_table_serves_exactly_what_api_versions_advertises() {
        let advertised: std::collections::BTreeSet<i16> = keel_protocol::versions::SUPPORTED
            .iter()
            .map(|v| v.key as i16)
            .collect();
        let served: std::collections::BTreeSet<i16> = APIS.iter().map(|a| a.key as i16).collect();
        assert_eq!(advertised, served);
        assert_eq!(APIS.len(), served.len(), "one entry per API");
    }
}
