//! Random, valid requests for every API and version Keel decodes, built
//! with the codec's builders and encoded as a client would send them.
//!
//! Each generator sets exactly the fields that exist in the requested
//! version (the codec refuses to encode a non-default field the version
//! lacks), with values biased towards edges: empty and multi-byte strings,
//! nulls where the version allows them, empty arrays, 0/-1/MIN/MAX numbers,
//! and unknown tagged fields on flexible versions.

#![allow(dead_code, reason = "each test binary uses part of this module")]

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use keel_protocol::messages::*;
use keel_protocol::{Encodable, Request, StrBytes};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The seed for this run: `KEEL_TEST_SEED` if set, else time-based. Printed
/// so that a failure can be replayed.
pub fn test_seed() -> u64 {
    let seed = std::env::var("KEEL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x5eed, |d| d.as_nanos() as u64)
        });
    eprintln!("seed={seed} (replay with KEEL_TEST_SEED={seed})");
    seed
}

/// A seeded source of edge-biased field values.
pub struct Gen {
    rng: SmallRng,
}

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen {
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    pub fn rng(&mut self) -> &mut SmallRng {
        &mut self.rng
    }

    fn bool(&mut self) -> bool {
        self.rng.gen()
    }

    /// True one time in `n`.
    fn one_in(&mut self, n: u32) -> bool {
        self.rng.gen_ratio(1, n)
    }

    fn i8(&mut self) -> i8 {
        match self.rng.gen_range(0..4) {
            0 => 0,
            1 => -1,
            2 => 1,
            _ => self.rng.gen(),
        }
    }

    fn i16(&mut self) -> i16 {
        match self.rng.gen_range(0..5) {
            0 => 0,
            1 => -1,
            2 => i16::MAX,
            3 => i16::MIN,
            _ => self.rng.gen(),
        }
    }

    fn i32(&mut self) -> i32 {
        match self.rng.gen_range(0..6) {
            0 => 0,
            1 => -1,
            2 => i32::MAX,
            3 => i32::MIN,
            4 => self.rng.gen_range(0..1000),
            _ => self.rng.gen(),
        }
    }

    fn i64(&mut self) -> i64 {
        match self.rng.gen_range(0..6) {
            0 => 0,
            1 => -1,
            2 => i64::MAX,
            3 => i64::MIN,
            4 => self.rng.gen_range(0..1_000_000),
            _ => self.rng.gen(),
        }
    }

    fn uuid(&mut self) -> uuid::Uuid {
        if self.one_in(4) {
            uuid::Uuid::nil()
        } else {
            uuid::Uuid::from_u128(self.rng.gen())
        }
    }

    /// 0..=max elements.
    fn vec<T>(&mut self, max: usize, mut f: impl FnMut(&mut Gen) -> T) -> Vec<T> {
        let n = self.rng.gen_range(0..=max);
        (0..n).map(|_| f(self)).collect()
    }

    fn string(&mut self) -> StrBytes {
        const PIECES: &[&str] = &["", "a", "topic", "-", "_", ".", "é", "日本", "🦀", "\0", " "];
        let n = self.rng.gen_range(0..8);
        let mut s = String::new();
        for _ in 0..n {
            if self.one_in(3) {
                s.push(self.rng.gen_range('a'..='z'));
            } else {
                s.push_str(PIECES[self.rng.gen_range(0..PIECES.len())]);
            }
        }
        StrBytes::from_string(s)
    }

    /// A finite or infinite number, often one a quota check cares about
    /// (never NaN, which would not compare equal after a round trip).
    fn f64(&mut self) -> f64 {
        const EDGES: &[f64] = &[
            0.0,
            -1.0,
            1.0,
            1048576.0,
            0.5,
            1e20,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        if self.one_in(2) {
            EDGES[self.rng.gen_range(0..EDGES.len())]
        } else {
            f64::from(self.i32()) / 4.0
        }
    }

    /// A quota entity type or key: mostly Kafka's, sometimes anything.
    fn quota_word(&mut self, known: &[&'static str]) -> StrBytes {
        if self.one_in(4) {
            self.string()
        } else {
            StrBytes::from_static_str(known[self.rng.gen_range(0..known.len())])
        }
    }

    fn opt_string(&mut self) -> Option<StrBytes> {
        (!self.one_in(3)).then(|| self.string())
    }

    fn topic(&mut self) -> TopicName {
        TopicName(self.string())
    }

    fn bytes(&mut self, max: usize) -> Bytes {
        let n = self.rng.gen_range(0..=max);
        let mut b = vec![0u8; n];
        self.rng.fill(&mut b[..]);
        Bytes::from(b)
    }

    /// Unknown tagged fields for a flexible version (tags far above any
    /// tag the schema defines), else none.
    fn tags(&mut self, flexible: bool) -> BTreeMap<i32, Bytes> {
        let mut tags = BTreeMap::new();
        if flexible && self.one_in(3) {
            for _ in 0..self.rng.gen_range(1..3) {
                let tag = self.rng.gen_range(100..10_000);
                let value = self.bytes(8);
                tags.insert(tag, value);
            }
        }
        tags
    }
}

/// Whether `version` of `key` uses the flexible (tagged-field) encoding.
pub fn is_flexible(key: ApiKey, version: i16) -> bool {
    key.request_header_version(version) >= 2
}

/// A random request header for `key` at `version`.
pub fn header(g: &mut Gen, key: ApiKey, version: i16) -> RequestHeader {
    let header_version = key.request_header_version(version);
    let client_id = if header_version >= 1 { g.opt_string() } else { None };
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(g.i32())
        .with_client_id(client_id)
        .with_unknown_tagged_fields(g.tags(header_version >= 2))
}

/// A random body of `key` at `version`; `None` if no generator exists for
/// the API (the round-trip test fails on such an API in the table).
pub fn body(g: &mut Gen, key: ApiKey, v: i16) -> Option<Request> {
    Some(match key {
        ApiKey::Produce => Request::Produce(produce(g, v)),
        ApiKey::Fetch => Request::Fetch(fetch(g, v)),
        ApiKey::ListOffsets => Request::ListOffsets(list_offsets(g, v)),
        ApiKey::Metadata => Request::Metadata(metadata(g, v)),
        ApiKey::ApiVersions => Request::ApiVersions(api_versions(g, v)),
        ApiKey::CreateTopics => Request::CreateTopics(create_topics(g, v)),
        ApiKey::DeleteTopics => Request::DeleteTopics(delete_topics(g, v)),
        ApiKey::DeleteRecords => Request::DeleteRecords(delete_records(g, v)),
        ApiKey::InitProducerId => Request::InitProducerId(init_producer_id(g, v)),
        ApiKey::OffsetForLeaderEpoch => Request::OffsetForLeaderEpoch(offset_for_leader_epoch(g, v)),
        ApiKey::DescribeConfigs => Request::DescribeConfigs(describe_configs(g, v)),
        ApiKey::CreatePartitions => Request::CreatePartitions(create_partitions(g, v)),
        ApiKey::DescribeCluster => Request::DescribeCluster(describe_cluster(g, v)),
        ApiKey::FindCoordinator => Request::FindCoordinator(find_coordinator(g, v)),
        ApiKey::JoinGroup => Request::JoinGroup(join_group(g, v)),
        ApiKey::SyncGroup => Request::SyncGroup(sync_group(g, v)),
        ApiKey::Heartbeat => Request::Heartbeat(heartbeat(g, v)),
        ApiKey::LeaveGroup => Request::LeaveGroup(leave_group(g, v)),
        ApiKey::OffsetCommit => Request::OffsetCommit(offset_commit(g, v)),
        ApiKey::OffsetFetch => Request::OffsetFetch(offset_fetch(g, v)),
        ApiKey::ListGroups => Request::ListGroups(list_groups(g, v)),
        ApiKey::DescribeGroups => Request::DescribeGroups(describe_groups(g, v)),
        ApiKey::DeleteGroups => Request::DeleteGroups(delete_groups(g, v)),
        ApiKey::OffsetDelete => Request::OffsetDelete(offset_delete(g, v)),
        ApiKey::AddPartitionsToTxn => Request::AddPartitionsToTxn(add_partitions_to_txn(g, v)),
        ApiKey::EndTxn => Request::EndTxn(end_txn(g, v)),
        ApiKey::AddOffsetsToTxn => Request::AddOffsetsToTxn(add_offsets_to_txn(g, v)),
        ApiKey::TxnOffsetCommit => Request::TxnOffsetCommit(txn_offset_commit(g, v)),
        ApiKey::WriteTxnMarkers => Request::WriteTxnMarkers(write_txn_markers(g, v)),
        ApiKey::DescribeTransactions => Request::DescribeTransactions(describe_transactions(g, v)),
        ApiKey::ListTransactions => Request::ListTransactions(list_transactions(g, v)),
        ApiKey::DescribeProducers => Request::DescribeProducers(describe_producers(g, v)),
        ApiKey::DescribeLogDirs => Request::DescribeLogDirs(describe_log_dirs(g, v)),
        ApiKey::IncrementalAlterConfigs => Request::IncrementalAlterConfigs(incremental_alter_configs(g, v)),
        ApiKey::AlterConfigs => Request::AlterConfigs(alter_configs(g, v)),
        ApiKey::ElectLeaders => Request::ElectLeaders(elect_leaders(g, v)),
        ApiKey::DescribeTopicPartitions => Request::DescribeTopicPartitions(describe_topic_partitions(g, v)),
        ApiKey::DescribeClientQuotas => Request::DescribeClientQuotas(describe_client_quotas(g, v)),
        ApiKey::AlterClientQuotas => Request::AlterClientQuotas(alter_client_quotas(g, v)),
        ApiKey::DescribeUserScramCredentials => {
            Request::DescribeUserScramCredentials(describe_user_scram_credentials(g, v))
        }
        ApiKey::AlterUserScramCredentials => {
            Request::AlterUserScramCredentials(alter_user_scram_credentials(g, v))
        }
        ApiKey::SaslHandshake => Request::SaslHandshake(sasl_handshake(g, v)),
        ApiKey::CreateAcls => Request::CreateAcls(create_acls(g, v)),
        ApiKey::DescribeAcls => Request::DescribeAcls(describe_acls(g, v)),
        ApiKey::DeleteAcls => Request::DeleteAcls(delete_acls(g, v)),
        ApiKey::SaslAuthenticate => Request::SaslAuthenticate(sasl_authenticate(g, v)),
        ApiKey::ConsumerGroupHeartbeat => Request::ConsumerGroupHeartbeat(consumer_group_heartbeat(g, v)),
        ApiKey::ConsumerGroupDescribe => Request::ConsumerGroupDescribe(consumer_group_describe(g, v)),
        ApiKey::ShareGroupHeartbeat => Request::ShareGroupHeartbeat(share_group_heartbeat(g, v)),
        ApiKey::ShareGroupDescribe => Request::ShareGroupDescribe(share_group_describe(g, v)),
        ApiKey::ShareFetch => Request::ShareFetch(share_fetch(g, v)),
        ApiKey::ShareAcknowledge => Request::ShareAcknowledge(share_acknowledge(g, v)),
        ApiKey::DescribeShareGroupOffsets => {
            Request::DescribeShareGroupOffsets(describe_share_group_offsets(g, v))
        }
        ApiKey::AlterShareGroupOffsets => Request::AlterShareGroupOffsets(alter_share_group_offsets(g, v)),
        ApiKey::DeleteShareGroupOffsets => Request::DeleteShareGroupOffsets(delete_share_group_offsets(g, v)),
        ApiKey::ListConfigResources => Request::ListConfigResources(list_config_resources(g, v)),
        _ => return None,
    })
}

/// Encodes a body at `version`.
pub fn encode_body(body: &Request, buf: &mut BytesMut, v: i16) -> anyhow::Result<()> {
    match body {
        Request::Produce(r) => r.encode(buf, v),
        Request::Fetch(r) => r.encode(buf, v),
        Request::ListOffsets(r) => r.encode(buf, v),
        Request::Metadata(r) => r.encode(buf, v),
        Request::ApiVersions(r) => r.encode(buf, v),
        Request::CreateTopics(r) => r.encode(buf, v),
        Request::DeleteTopics(r) => r.encode(buf, v),
        Request::DeleteRecords(r) => r.encode(buf, v),
        Request::InitProducerId(r) => r.encode(buf, v),
        Request::OffsetForLeaderEpoch(r) => r.encode(buf, v),
        Request::DescribeConfigs(r) => r.encode(buf, v),
        Request::CreatePartitions(r) => r.encode(buf, v),
        Request::DescribeCluster(r) => r.encode(buf, v),
        Request::FindCoordinator(r) => r.encode(buf, v),
        Request::JoinGroup(r) => r.encode(buf, v),
        Request::SyncGroup(r) => r.encode(buf, v),
        Request::Heartbeat(r) => r.encode(buf, v),
        Request::LeaveGroup(r) => r.encode(buf, v),
        Request::OffsetCommit(r) => r.encode(buf, v),
        Request::OffsetFetch(r) => r.encode(buf, v),
        Request::ListGroups(r) => r.encode(buf, v),
        Request::DescribeGroups(r) => r.encode(buf, v),
        Request::DeleteGroups(r) => r.encode(buf, v),
        Request::OffsetDelete(r) => r.encode(buf, v),
        Request::AddPartitionsToTxn(r) => r.encode(buf, v),
        Request::EndTxn(r) => r.encode(buf, v),
        Request::AddOffsetsToTxn(r) => r.encode(buf, v),
        Request::TxnOffsetCommit(r) => r.encode(buf, v),
        Request::WriteTxnMarkers(r) => r.encode(buf, v),
        Request::DescribeTransactions(r) => r.encode(buf, v),
        Request::ListTransactions(r) => r.encode(buf, v),
        Request::DescribeProducers(r) => r.encode(buf, v),
        Request::DescribeLogDirs(r) => r.encode(buf, v),
        Request::IncrementalAlterConfigs(r) => r.encode(buf, v),
        Request::AlterConfigs(r) => r.encode(buf, v),
        Request::ElectLeaders(r) => r.encode(buf, v),
        Request::DescribeTopicPartitions(r) => r.encode(buf, v),
        Request::DescribeClientQuotas(r) => r.encode(buf, v),
        Request::AlterClientQuotas(r) => r.encode(buf, v),
        Request::DescribeUserScramCredentials(r) => r.encode(buf, v),
        Request::AlterUserScramCredentials(r) => r.encode(buf, v),
        Request::SaslHandshake(r) => r.encode(buf, v),
        Request::CreateAcls(r) => r.encode(buf, v),
        Request::DescribeAcls(r) => r.encode(buf, v),
        Request::DeleteAcls(r) => r.encode(buf, v),
        Request::SaslAuthenticate(r) => r.encode(buf, v),
        Request::ConsumerGroupHeartbeat(r) => r.encode(buf, v),
        Request::ConsumerGroupDescribe(r) => r.encode(buf, v),
        Request::ShareGroupHeartbeat(r) => r.encode(buf, v),
        Request::ShareGroupDescribe(r) => r.encode(buf, v),
        Request::ShareFetch(r) => r.encode(buf, v),
        Request::ShareAcknowledge(r) => r.encode(buf, v),
        // v1 of the request is laid out as v0.
        Request::DescribeShareGroupOffsets(r) => r.encode(buf, v.min(0)),
        Request::AlterShareGroupOffsets(r) => r.encode(buf, v),
        Request::DeleteShareGroupOffsets(r) => r.encode(buf, v),
        Request::ListConfigResources(r) => r.encode(buf, v),
        #[allow(unreachable_patterns, reason = "the enum grows with Keel's APIs")]
        other => anyhow::bail!("no encoder for {other:?}"),
    }
}

/// Header and body as one request frame, without the size prefix (what
/// `RequestFrame::parse` takes).
pub fn encode_frame(header: &RequestHeader, body: &Request) -> anyhow::Result<Bytes> {
    let key = ApiKey::try_from(header.request_api_key)
        .map_err(|()| anyhow::anyhow!("unknown api key {}", header.request_api_key))?;
    let v = header.request_api_version;
    let mut buf = BytesMut::new();
    header.encode(&mut buf, key.request_header_version(v))?;
    encode_body(body, &mut buf, v)?;
    Ok(buf.freeze())
}

/// Field-by-field equality of two decoded bodies of the same API.
pub fn same_body(a: &Request, b: &Request) -> bool {
    match (a, b) {
        (Request::Produce(a), Request::Produce(b)) => a == b,
        (Request::Fetch(a), Request::Fetch(b)) => a == b,
        (Request::ListOffsets(a), Request::ListOffsets(b)) => a == b,
        (Request::Metadata(a), Request::Metadata(b)) => a == b,
        (Request::ApiVersions(a), Request::ApiVersions(b)) => a == b,
        (Request::CreateTopics(a), Request::CreateTopics(b)) => a == b,
        (Request::DeleteTopics(a), Request::DeleteTopics(b)) => a == b,
        (Request::DeleteRecords(a), Request::DeleteRecords(b)) => a == b,
        (Request::InitProducerId(a), Request::InitProducerId(b)) => a == b,
        (Request::OffsetForLeaderEpoch(a), Request::OffsetForLeaderEpoch(b)) => a == b,
        (Request::DescribeConfigs(a), Request::DescribeConfigs(b)) => a == b,
        (Request::CreatePartitions(a), Request::CreatePartitions(b)) => a == b,
        (Request::DescribeCluster(a), Request::DescribeCluster(b)) => a == b,
        (Request::FindCoordinator(a), Request::FindCoordinator(b)) => a == b,
        (Request::JoinGroup(a), Request::JoinGroup(b)) => a == b,
        (Request::SyncGroup(a), Request::SyncGroup(b)) => a == b,
        (Request::Heartbeat(a), Request::Heartbeat(b)) => a == b,
        (Request::LeaveGroup(a), Request::LeaveGroup(b)) => a == b,
        (Request::OffsetCommit(a), Request::OffsetCommit(b)) => a == b,
        (Request::OffsetFetch(a), Request::OffsetFetch(b)) => a == b,
        (Request::ListGroups(a), Request::ListGroups(b)) => a == b,
        (Request::DescribeGroups(a), Request::DescribeGroups(b)) => a == b,
        (Request::DeleteGroups(a), Request::DeleteGroups(b)) => a == b,
        (Request::OffsetDelete(a), Request::OffsetDelete(b)) => a == b,
        (Request::AddPartitionsToTxn(a), Request::AddPartitionsToTxn(b)) => a == b,
        (Request::EndTxn(a), Request::EndTxn(b)) => a == b,
        (Request::AddOffsetsToTxn(a), Request::AddOffsetsToTxn(b)) => a == b,
        (Request::TxnOffsetCommit(a), Request::TxnOffsetCommit(b)) => a == b,
        (Request::WriteTxnMarkers(a), Request::WriteTxnMarkers(b)) => a == b,
        (Request::DescribeTransactions(a), Request::DescribeTransactions(b)) => a == b,
        (Request::ListTransactions(a), Request::ListTransactions(b)) => a == b,
        (Request::DescribeProducers(a), Request::DescribeProducers(b)) => a == b,
        (Request::DescribeLogDirs(a), Request::DescribeLogDirs(b)) => a == b,
        (Request::IncrementalAlterConfigs(a), Request::IncrementalAlterConfigs(b)) => a == b,
        (Request::AlterConfigs(a), Request::AlterConfigs(b)) => a == b,
        (Request::ElectLeaders(a), Request::ElectLeaders(b)) => a == b,
        (Request::DescribeTopicPartitions(a), Request::DescribeTopicPartitions(b)) => a == b,
        (Request::DescribeClientQuotas(a), Request::DescribeClientQuotas(b)) => a == b,
        (Request::AlterClientQuotas(a), Request::AlterClientQuotas(b)) => a == b,
        (Request::DescribeUserScramCredentials(a), Request::DescribeUserScramCredentials(b)) => a == b,
        (Request::AlterUserScramCredentials(a), Request::AlterUserScramCredentials(b)) => a == b,
        (Request::SaslHandshake(a), Request::SaslHandshake(b)) => a == b,
        (Request::CreateAcls(a), Request::CreateAcls(b)) => a == b,
        (Request::DescribeAcls(a), Request::DescribeAcls(b)) => a == b,
        (Request::DeleteAcls(a), Request::DeleteAcls(b)) => a == b,
        (Request::SaslAuthenticate(a), Request::SaslAuthenticate(b)) => a == b,
        (Request::ConsumerGroupHeartbeat(a), Request::ConsumerGroupHeartbeat(b)) => a == b,
        (Request::ConsumerGroupDescribe(a), Request::ConsumerGroupDescribe(b)) => a == b,
        (Request::ShareGroupHeartbeat(a), Request::ShareGroupHeartbeat(b)) => a == b,
        (Request::ShareGroupDescribe(a), Request::ShareGroupDescribe(b)) => a == b,
        (Request::ShareFetch(a), Request::ShareFetch(b)) => a == b,
        (Request::ShareAcknowledge(a), Request::ShareAcknowledge(b)) => a == b,
        (Request::DescribeShareGroupOffsets(a), Request::DescribeShareGroupOffsets(b)) => a == b,
        (Request::AlterShareGroupOffsets(a), Request::AlterShareGroupOffsets(b)) => a == b,
        (Request::DeleteShareGroupOffsets(a), Request::DeleteShareGroupOffsets(b)) => a == b,
        (Request::ListConfigResources(a), Request::ListConfigResources(b)) => a == b,
        _ => false,
    }
}

// ------------------------------------------------------------ generators

fn produce(g: &mut Gen, v: i16) -> ProduceRequest {
    let flexible = is_flexible(ApiKey::Produce, v);
    let topics = g.vec(3, |g| {
        let partitions = g.vec(3, |g| {
            let records = (!g.one_in(4)).then(|| g.bytes(200));
            produce_request::PartitionProduceData::default()
                .with_index(g.i32())
                .with_records(records)
                .with_unknown_tagged_fields(g.tags(flexible))
        });
        let t = produce_request::TopicProduceData::default()
            .with_partition_data(partitions)
            .with_unknown_tagged_fields(g.tags(flexible));
        if v >= 13 {
            t.with_topic_id(g.uuid())
        } else {
            t.with_name(g.topic())
        }
    });
    let transactional_id = g.opt_string().map(TransactionalId);
    ProduceRequest::default()
        .with_transactional_id(transactional_id)
        .with_acks(g.i16())
        .with_timeout_ms(g.i32())
        .with_topic_data(topics)
        .with_unknown_tagged_fields(g.tags(flexible))
}

fn fetch(g: &mut Gen, v: i16) -> FetchRequest {
    use fetch_request::*;
    let flexible = is_flexible(ApiKey::Fetch, v);
    let topics = g.vec(3, |g| {
        let partitions = g.vec(3, |g| {
            let mut p = FetchPartition::default()
                .with_partition(g.i32())
                .with_fetch_offset(g.i64())
                .with_partition_max_bytes(g.i32())
                .with_unknown_tagged_fields(g.tags(flexible));
            if v >= 5 {
                p = p.with_log_start_offset(g.i64());
            }
            if v >= 9 {
                p = p.with_current_leader_epoch(g.i32());
            }
            if v >= 12 {
                p = p.with_last_fetched_epoch(g.i32());
            }
            if v >= 17 {
                p = p.with_replica_directory_id(g.uuid());
            }
            if v >= 18 {
                p = p.with_high_watermark(g.i64());
            }
            p
        });
        let t = FetchTopic::default()
            .with_partitions(partitions)
            .with_unknown_tagged_fields(g.tags(flexible));
        if v >= 13 {
            t.with_topic_id(g.uuid())
        } else {
            t.with_topic(g.topic())
        }
    });
    let mut r = FetchRequest::default()
        .with_max_wait_ms(g.i32())
        .with_min_bytes(g.i32())
        .with_max_bytes(g.i32())
        .with_isolation_level(g.i8())
        .with_topics(topics)
        .with_unknown_tagged_fields(g.tags(flexible));
    if v <= 14 {
        r = r.with_replica_id(BrokerId(g.i32()));
    }
    if v >= 7 {
        let forgotten = g.vec(2, |g| {
            let t = ForgottenTopic::default()
                .with_partitions(g.vec(4, Gen::i32))
                .with_unknown_tagged_fields(g.tags(flexible));
            if v >= 13 {
                t.with_topic_id(g.uuid())
            } else {
                t.with_topic(g.topic())
            }
        });
        r = r
            .with_session_id(g.i32())
            .with_session_epoch(g.i32())
            .with_forgotten_topics_data(forgotten);
    }
    if v >= 11 {
        r = r.with_rack_id(g.string());
    }
    if v >= 12 {
        r = r.with_cluster_id(g.opt_string());
    }
    if v >= 15 {
        let state = ReplicaState::default()
            .with_replica_id(BrokerId(g.i32()))
            .with_replica_epoch(g.i64())
            .with_unknown_tagged_fields(g.tags(flexible));
        r = r.with_replica_state(state);
    }
    r
}

fn list_offsets(g: &mut Gen, v: i16) -> ListOffsetsRequest {
    use list_offsets_request::*;
    let flexible = is_flexible(ApiKey::ListOffsets, v);
    let topics = g.vec(3, |g| {
        let partitions = g.vec(3, |g| {
            let p = ListOffsetsPartition::default()
                .with_partition_index(g.i32())
                .with_timestamp(g.i64())
                .with_unknown_tagged_fields(g.tags(flexible));
            if v >= 4 {
                p.with_current_leader_epoch(g.i32())
            } else {
                p
            }
        });
        ListOffsetsTopic::default()
            .with_name(g.topic())
            .with_partitions(partitions)
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    let mut r = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(g.i32()))
        .with_topics(topics)
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 2 {
        r = r.with_isolation_level(g.i8());
    }
    if v >= 10 {
        r = r.with_timeout_ms(g.i32());
    }
    r
}

fn metadata(g: &mut Gen, v: i16) -> MetadataRequest {
    use metadata_request::*;
    let flexible = is_flexible(ApiKey::Metadata, v);
    let topics = (v == 0 || !g.one_in(4)).then(|| {
        g.vec(3, |g| {
            let t = MetadataRequestTopic::default().with_unknown_tagged_fields(g.tags(flexible));
            if v >= 10 {
                let name = g.opt_string().map(TopicName);
                t.with_topic_id(g.uuid()).with_name(name)
            } else {
                t.with_name(Some(g.topic()))
            }
        })
    });
    let mut r = MetadataRequest::default()
        .with_topics(topics)
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 4 {
        r = r.with_allow_auto_topic_creation(g.bool());
    }
    if (8..=10).contains(&v) {
        r = r.with_include_cluster_authorized_operations(g.bool());
    }
    if v >= 8 {
        r = r.with_include_topic_authorized_operations(g.bool());
    }
    r
}

fn api_versions(g: &mut Gen, v: i16) -> ApiVersionsRequest {
    let r = ApiVersionsRequest::default();
    if v >= 3 {
        r.with_client_software_name(g.string())
            .with_client_software_version(g.string())
            .with_unknown_tagged_fields(g.tags(true))
    } else {
        r
    }
}

fn create_topics(g: &mut Gen, v: i16) -> CreateTopicsRequest {
    use create_topics_request::*;
    let flexible = is_flexible(ApiKey::CreateTopics, v);
    let topics = g.vec(3, |g| {
        let assignments = g.vec(2, |g| {
            CreatableReplicaAssignment::default()
                .with_partition_index(g.i32())
                .with_broker_ids(g.vec(3, |g| BrokerId(g.i32())))
                .with_unknown_tagged_fields(g.tags(flexible))
        });
        let configs = g.vec(3, |g| {
            CreatableTopicConfig::default()
                .with_name(g.string())
                .with_value(g.opt_string())
                .with_unknown_tagged_fields(g.tags(flexible))
        });
        CreatableTopic::default()
            .with_name(g.topic())
            .with_num_partitions(g.i32())
            .with_replication_factor(g.i16())
            .with_assignments(assignments)
            .with_configs(configs)
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    CreateTopicsRequest::default()
        .with_topics(topics)
        .with_timeout_ms(g.i32())
        .with_validate_only(g.bool())
        .with_unknown_tagged_fields(g.tags(flexible))
}

fn delete_topics(g: &mut Gen, v: i16) -> DeleteTopicsRequest {
    use delete_topics_request::*;
    let flexible = is_flexible(ApiKey::DeleteTopics, v);
    let r = DeleteTopicsRequest::default()
        .with_timeout_ms(g.i32())
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 6 {
        let topics = g.vec(3, |g| {
            let name = g.opt_string().map(TopicName);
            DeleteTopicState::default()
                .with_name(name)
                .with_topic_id(g.uuid())
                .with_unknown_tagged_fields(g.tags(flexible))
        });
        r.with_topics(topics)
    } else {
        r.with_topic_names(g.vec(3, Gen::topic))
    }
}

fn delete_records(g: &mut Gen, v: i16) -> DeleteRecordsRequest {
    use delete_records_request::*;
    let flexible = is_flexible(ApiKey::DeleteRecords, v);
    let topics = g.vec(3, |g| {
        let partitions = g.vec(3, |g| {
            DeleteRecordsPartition::default()
                .with_partition_index(g.i32())
                .with_offset(g.i64())
                .with_unknown_tagged_fields(g.tags(flexible))
        });
        DeleteRecordsTopic::default()
            .with_name(g.topic())
            .with_partitions(partitions)
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    DeleteRecordsRequest::default()
        .with_topics(topics)
        .with_timeout_ms(g.i32())
        .with_unknown_tagged_fields(g.tags(flexible))
}

fn init_producer_id(g: &mut Gen, v: i16) -> InitProducerIdRequest {
    let flexible = is_flexible(ApiKey::InitProducerId, v);
    let transactional_id = g.opt_string().map(TransactionalId);
    let r = InitProducerIdRequest::default()
        .with_transactional_id(transactional_id)
        .with_transaction_timeout_ms(g.i32())
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 3 {
        r.with_producer_id(ProducerId(g.i64()))
            .with_producer_epoch(g.i16())
    } else {
        r
    }
}

fn offset_for_leader_epoch(g: &mut Gen, v: i16) -> OffsetForLeaderEpochRequest {
    use offset_for_leader_epoch_request::*;
    let flexible = is_flexible(ApiKey::OffsetForLeaderEpoch, v);
    let topics = g.vec(3, |g| {
        let partitions = g.vec(3, |g| {
            OffsetForLeaderPartition::default()
                .with_partition(g.i32())
                .with_current_leader_epoch(g.i32())
                .with_leader_epoch(g.i32())
                .with_unknown_tagged_fields(g.tags(flexible))
        });
        OffsetForLeaderTopic::default()
            .with_topic(g.topic())
            .with_partitions(partitions)
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    let r = OffsetForLeaderEpochRequest::default()
        .with_topics(topics)
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 3 {
        r.with_replica_id(BrokerId(g.i32()))
    } else {
        r
    }
}

fn describe_configs(g: &mut Gen, v: i16) -> DescribeConfigsRequest {
    use describe_configs_request::*;
    let flexible = is_flexible(ApiKey::DescribeConfigs, v);
    let resources = g.vec(3, |g| {
        let keys = (!g.one_in(3)).then(|| g.vec(3, Gen::string));
        DescribeConfigsResource::default()
            .with_resource_type(g.i8())
            .with_resource_name(g.string())
            .with_configuration_keys(keys)
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    let r = DescribeConfigsRequest::default()
        .with_resources(resources)
        .with_include_synonyms(g.bool())
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 3 {
        r.with_include_documentation(g.bool())
    } else {
        r
    }
}

fn create_partitions(g: &mut Gen, v: i16) -> CreatePartitionsRequest {
    use create_partitions_request::*;
    let flexible = is_flexible(ApiKey::CreatePartitions, v);
    let topics = g.vec(3, |g| {
        let assignments = (!g.one_in(3)).then(|| {
            g.vec(2, |g| {
                CreatePartitionsAssignment::default()
                    .with_broker_ids(g.vec(3, |g| BrokerId(g.i32())))
                    .with_unknown_tagged_fields(g.tags(flexible))
            })
        });
        CreatePartitionsTopic::default()
            .with_name(g.topic())
            .with_count(g.i32())
            .with_assignments(assignments)
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    CreatePartitionsRequest::default()
        .with_topics(topics)
        .with_timeout_ms(g.i32())
        .with_validate_only(g.bool())
        .with_unknown_tagged_fields(g.tags(flexible))
}

fn describe_cluster(g: &mut Gen, v: i16) -> DescribeClusterRequest {
    let mut r = DescribeClusterRequest::default()
        .with_include_cluster_authorized_operations(g.bool())
        .with_unknown_tagged_fields(g.tags(true));
    if v >= 1 {
        r = r.with_endpoint_type(g.i8());
    }
    if v >= 2 {
        r = r.with_include_fenced_brokers(g.bool());
    }
    r
}

// ------------------------------------------------------- group generators

fn group_id(g: &mut Gen) -> GroupId {
    GroupId(g.string())
}

fn find_coordinator(g: &mut Gen, v: i16) -> FindCoordinatorRequest {
    let flexible = is_flexible(ApiKey::FindCoordinator, v);
    let mut r = FindCoordinatorRequest::default().with_unknown_tagged_fields(g.tags(flexible));
    if v < 4 {
        r = r.with_key(g.string());
    } else {
        r = r.with_coordinator_keys(g.vec(3, Gen::string));
    }
    if v >= 1 {
        r = r.with_key_type(g.i8());
    }
    r
}

fn join_group(g: &mut Gen, v: i16) -> JoinGroupRequest {
    use join_group_request::*;
    let flexible = is_flexible(ApiKey::JoinGroup, v);
    let protocols = g.vec(3, |g| {
        JoinGroupRequestProtocol::default()
            .with_name(g.string())
            .with_metadata(g.bytes(64))
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    let mut r = JoinGroupRequest::default()
        .with_group_id(group_id(g))
        .with_session_timeout_ms(g.i32())
        .with_rebalance_timeout_ms(g.i32())
        .with_member_id(g.string())
        .with_protocol_type(g.string())
        .with_protocols(protocols)
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 5 {
        r = r.with_group_instance_id(g.opt_string());
    }
    if v >= 8 {
        r = r.with_reason(g.opt_string());
    }
    r
}

fn sync_group(g: &mut Gen, v: i16) -> SyncGroupRequest {
    use sync_group_request::*;
    let flexible = is_flexible(ApiKey::SyncGroup, v);
    let assignments = g.vec(3, |g| {
        SyncGroupRequestAssignment::default()
            .with_member_id(g.string())
            .with_assignment(g.bytes(64))
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    let mut r = SyncGroupRequest::default()
        .with_group_id(group_id(g))
        .with_generation_id(g.i32())
        .with_member_id(g.string())
        .with_assignments(assignments)
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 3 {
        r = r.with_group_instance_id(g.opt_string());
    }
    if v >= 5 {
        r = r
            .with_protocol_type(g.opt_string())
            .with_protocol_name(g.opt_string());
    }
    r
}

fn heartbeat(g: &mut Gen, v: i16) -> HeartbeatRequest {
    let flexible = is_flexible(ApiKey::Heartbeat, v);
    let r = HeartbeatRequest::default()
        .with_group_id(group_id(g))
        .with_generation_id(g.i32())
        .with_member_id(g.string())
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 3 {
        r.with_group_instance_id(g.opt_string())
    } else {
        r
    }
}

fn leave_group(g: &mut Gen, v: i16) -> LeaveGroupRequest {
    use leave_group_request::*;
    let flexible = is_flexible(ApiKey::LeaveGroup, v);
    let r = LeaveGroupRequest::default()
        .with_group_id(group_id(g))
        .with_unknown_tagged_fields(g.tags(flexible));
    if v < 3 {
        return r.with_member_id(g.string());
    }
    let members = g.vec(3, |g| {
        let m = MemberIdentity::default()
            .with_member_id(g.string())
            .with_group_instance_id(g.opt_string())
            .with_unknown_tagged_fields(g.tags(flexible));
        if v >= 5 {
            m.with_reason(g.opt_string())
        } else {
            m
        }
    });
    r.with_members(members)
}

fn offset_commit(g: &mut Gen, v: i16) -> OffsetCommitRequest {
    use offset_commit_request::*;
    let flexible = is_flexible(ApiKey::OffsetCommit, v);
    let topics = g.vec(3, |g| {
        let partitions = g.vec(3, |g| {
            let p = OffsetCommitRequestPartition::default()
                .with_partition_index(g.i32())
                .with_committed_offset(g.i64())
                .with_committed_metadata(g.opt_string())
                .with_unknown_tagged_fields(g.tags(flexible));
            if v >= 6 {
                p.with_committed_leader_epoch(g.i32())
            } else {
                p
            }
        });
        OffsetCommitRequestTopic::default()
            .with_name(g.topic())
            .with_partitions(partitions)
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    let mut r = OffsetCommitRequest::default()
        .with_group_id(group_id(g))
        .with_generation_id_or_member_epoch(g.i32())
        .with_member_id(g.string())
        .with_topics(topics)
        .with_unknown_tagged_fields(g.tags(flexible));
    if v <= 4 {
        r = r.with_retention_time_ms(g.i64());
    }
    if v >= 7 {
        r = r.with_group_instance_id(g.opt_string());
    }
    r
}

fn offset_fetch(g: &mut Gen, v: i16) -> OffsetFetchRequest {
    use offset_fetch_request::*;
    let flexible = is_flexible(ApiKey::OffsetFetch, v);
    let mut r = OffsetFetchRequest::default().with_unknown_tagged_fields(g.tags(flexible));
    if v < 8 {
        let topics = g.vec(3, |g| {
            OffsetFetchRequestTopic::default()
                .with_name(g.topic())
                .with_partition_indexes(g.vec(3, Gen::i32))
                .with_unknown_tagged_fields(g.tags(flexible))
        });
        // Null ("every partition") from v2 on.
        let topics = if v >= 2 && g.one_in(3) { None } else { Some(topics) };
        r = r.with_group_id(group_id(g)).with_topics(topics);
    } else {
        let groups = g.vec(3, |g| {
            let topics = (!g.one_in(3)).then(|| {
                g.vec(3, |g| {
                    OffsetFetchRequestTopics::default()
                        .with_name(g.topic())
                        .with_partition_indexes(g.vec(3, Gen::i32))
                        .with_unknown_tagged_fields(g.tags(flexible))
                })
            });
            let group = OffsetFetchRequestGroup::default()
                .with_group_id(group_id(g))
                .with_topics(topics)
                .with_unknown_tagged_fields(g.tags(flexible));
            if v >= 9 {
                group.with_member_id(g.opt_string()).with_member_epoch(g.i32())
            } else {
                group
            }
        });
        r = r.with_groups(groups);
    }
    if v >= 7 {
        r = r.with_require_stable(g.bool());
    }
    r
}

fn list_groups(g: &mut Gen, v: i16) -> ListGroupsRequest {
    let flexible = is_flexible(ApiKey::ListGroups, v);
    let mut r = ListGroupsRequest::default().with_unknown_tagged_fields(g.tags(flexible));
    if v >= 4 {
        r = r.with_states_filter(g.vec(3, Gen::string));
    }
    if v >= 5 {
        r = r.with_types_filter(g.vec(3, Gen::string));
    }
    r
}

fn describe_groups(g: &mut Gen, v: i16) -> DescribeGroupsRequest {
    let flexible = is_flexible(ApiKey::DescribeGroups, v);
    let r = DescribeGroupsRequest::default()
        .with_groups(g.vec(3, group_id))
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 3 {
        r.with_include_authorized_operations(g.bool())
    } else {
        r
    }
}

fn delete_groups(g: &mut Gen, v: i16) -> DeleteGroupsRequest {
    let flexible = is_flexible(ApiKey::DeleteGroups, v);
    DeleteGroupsRequest::default()
        .with_groups_names(g.vec(3, group_id))
        .with_unknown_tagged_fields(g.tags(flexible))
}

fn offset_delete(g: &mut Gen, _v: i16) -> OffsetDeleteRequest {
    use offset_delete_request::*;
    let topics = g.vec(3, |g| {
        let partitions = g.vec(3, |g| {
            OffsetDeleteRequestPartition::default().with_partition_index(g.i32())
        });
        OffsetDeleteRequestTopic::default()
            .with_name(g.topic())
            .with_partitions(partitions)
    });
    OffsetDeleteRequest::default()
        .with_group_id(group_id(g))
        .with_topics(topics)
}

fn add_partitions_to_txn(g: &mut Gen, v: i16) -> AddPartitionsToTxnRequest {
    use add_partitions_to_txn_request::*;
    let flexible = is_flexible(ApiKey::AddPartitionsToTxn, v);
    let topics = |g: &mut Gen| {
        g.vec(3, |g| {
            AddPartitionsToTxnTopic::default()
                .with_name(g.topic())
                .with_partitions(g.vec(3, |g| g.i32()))
                .with_unknown_tagged_fields(g.tags(flexible))
        })
    };
    let r = AddPartitionsToTxnRequest::default().with_unknown_tagged_fields(g.tags(flexible));
    if v >= 4 {
        let transactions = g.vec(3, |g| {
            AddPartitionsToTxnTransaction::default()
                .with_transactional_id(TransactionalId(g.string()))
                .with_producer_id(ProducerId(g.i64()))
                .with_producer_epoch(g.i16())
                .with_verify_only(g.bool())
                .with_topics(topics(g))
                .with_unknown_tagged_fields(g.tags(flexible))
        });
        r.with_transactions(transactions)
    } else {
        r.with_v3_and_below_transactional_id(TransactionalId(g.string()))
            .with_v3_and_below_producer_id(ProducerId(g.i64()))
            .with_v3_and_below_producer_epoch(g.i16())
            .with_v3_and_below_topics(topics(g))
    }
}

fn end_txn(g: &mut Gen, v: i16) -> EndTxnRequest {
    EndTxnRequest::default()
        .with_transactional_id(TransactionalId(g.string()))
        .with_producer_id(ProducerId(g.i64()))
        .with_producer_epoch(g.i16())
        .with_committed(g.bool())
        .with_unknown_tagged_fields(g.tags(is_flexible(ApiKey::EndTxn, v)))
}

fn add_offsets_to_txn(g: &mut Gen, v: i16) -> AddOffsetsToTxnRequest {
    AddOffsetsToTxnRequest::default()
        .with_transactional_id(TransactionalId(g.string()))
        .with_producer_id(ProducerId(g.i64()))
        .with_producer_epoch(g.i16())
        .with_group_id(group_id(g))
        .with_unknown_tagged_fields(g.tags(is_flexible(ApiKey::AddOffsetsToTxn, v)))
}

fn txn_offset_commit(g: &mut Gen, v: i16) -> TxnOffsetCommitRequest {
    use txn_offset_commit_request::*;
    let flexible = is_flexible(ApiKey::TxnOffsetCommit, v);
    let topics = g.vec(3, |g| {
        let partitions = g.vec(3, |g| {
            let p = TxnOffsetCommitRequestPartition::default()
                .with_partition_index(g.i32())
                .with_committed_offset(g.i64())
                .with_committed_metadata(g.opt_string())
                .with_unknown_tagged_fields(g.tags(flexible));
            if v >= 2 {
                p.with_committed_leader_epoch(g.i32())
            } else {
                p
            }
        });
        TxnOffsetCommitRequestTopic::default()
            .with_name(g.topic())
            .with_partitions(partitions)
            .with_unknown_tagged_fields(g.tags(flexible))
    });
    let r = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(g.string()))
        .with_group_id(group_id(g))
        .with_producer_id(ProducerId(g.i64()))
        .with_producer_epoch(g.i16())
        .with_topics(topics)
        .with_unknown_tagged_fields(g.tags(flexible));
    if v >= 3 {
        r.with_generation_id(g.i32())
            .with_member_id(g.string())
            .with_group_instance_id(g.opt_string())
    } else {
        r
    }
}

fn write_txn_markers(g: &mut Gen, _v: i16) -> WriteTxnMarkersRequest {
    use write_txn_markers_request::*;
    let markers = g.vec(3, |g| {
        let topics = g.vec(3, |g| {
            WritableTxnMarkerTopic::default()
                .with_name(g.topic())
                .with_partition_indexes(g.vec(3, |g| g.i32()))
                .with_unknown_tagged_fields(g.tags(true))
        });
        WritableTxnMarker::default()
            .with_producer_id(ProducerId(g.i64()))
            .with_producer_epoch(g.i16())
            .with_transaction_result(g.bool())
            .with_topics(topics)
            .with_coordinator_epoch(g.i32())
            .with_unknown_tagged_fields(g.tags(true))
    });
    WriteTxnMarkersRequest::default()
        .with_markers(markers)
        .with_unknown_tagged_fields(g.tags(true))
}

fn describe_transactions(g: &mut Gen, _v: i16) -> DescribeTransactionsRequest {
    DescribeTransactionsRequest::default()
        .with_transactional_ids(g.vec(3, |g| TransactionalId(g.string())))
        .with_unknown_tagged_fields(g.tags(true))
}

fn list_transactions(g: &mut Gen, v: i16) -> ListTransactionsRequest {
    let mut r = ListTransactionsRequest::default()
        .with_state_filters(g.vec(3, |g| g.string()))
        .with_producer_id_filters(g.vec(3, |g| ProducerId(g.i64())))
        .with_unknown_tagged_fields(g.tags(true));
    if v >= 1 {
        r = r.with_duration_filter(g.i64());
    }
    if v >= 2 {
        r = r.with_transactional_id_pattern(g.opt_string());
    }
    r
}

fn incremental_alter_configs(g: &mut Gen, v: i16) -> IncrementalAlterConfigsRequest {
    use incremental_alter_configs_request::*;
    let resources = g.vec(3, |g| {
        AlterConfigsResource::default()
            .with_resource_type(g.i8())
            .with_resource_name(g.string())
            .with_configs(g.vec(3, |g| {
                AlterableConfig::default()
                    .with_name(g.string())
                    .with_config_operation(g.i8())
                    .with_value(g.opt_string())
                    .with_unknown_tagged_fields(g.tags(v >= 1))
            }))
            .with_unknown_tagged_fields(g.tags(v >= 1))
    });
    IncrementalAlterConfigsRequest::default()
        .with_resources(resources)
        .with_validate_only(g.bool())
        .with_unknown_tagged_fields(g.tags(v >= 1))
}

fn alter_configs(g: &mut Gen, v: i16) -> AlterConfigsRequest {
    use alter_configs_request::*;
    let resources = g.vec(3, |g| {
        AlterConfigsResource::default()
            .with_resource_type(g.i8())
            .with_resource_name(g.string())
            .with_configs(g.vec(3, |g| {
                AlterableConfig::default()
                    .with_name(g.string())
                    .with_value(g.opt_string())
                    .with_unknown_tagged_fields(g.tags(v >= 2))
            }))
            .with_unknown_tagged_fields(g.tags(v >= 2))
    });
    AlterConfigsRequest::default()
        .with_resources(resources)
        .with_validate_only(g.bool())
        .with_unknown_tagged_fields(g.tags(v >= 2))
}

fn describe_topic_partitions(g: &mut Gen, _v: i16) -> DescribeTopicPartitionsRequest {
    use describe_topic_partitions_request::*;
    let cursor = Cursor::default()
        .with_topic_name(g.topic())
        .with_partition_index(g.i32())
        .with_unknown_tagged_fields(g.tags(true));
    DescribeTopicPartitionsRequest::default()
        .with_topics(g.vec(3, |g| {
            TopicRequest::default()
                .with_name(g.topic())
                .with_unknown_tagged_fields(g.tags(true))
        }))
        .with_response_partition_limit(g.i32())
        .with_cursor(g.bool().then_some(cursor))
        .with_unknown_tagged_fields(g.tags(true))
}

const QUOTA_ENTITY_TYPES: &[&str] = &["user", "client-id", "ip", "group"];
const QUOTA_KEYS: &[&str] = &[
    "producer_byte_rate",
    "consumer_byte_rate",
    "connection_creation_rate",
    "request_percentage",
];

fn describe_client_quotas(g: &mut Gen, v: i16) -> DescribeClientQuotasRequest {
    use describe_client_quotas_request::*;
    DescribeClientQuotasRequest::default()
        .with_components(g.vec(3, |g| {
            ComponentData::default()
                .with_entity_type(g.quota_word(QUOTA_ENTITY_TYPES))
                .with_match_type(if g.one_in(4) { g.i8() } else { g.i8().rem_euclid(3) })
                .with_match(g.opt_string())
                .with_unknown_tagged_fields(g.tags(v >= 1))
        }))
        .with_strict(g.bool())
        .with_unknown_tagged_fields(g.tags(v >= 1))
}

fn alter_client_quotas(g: &mut Gen, v: i16) -> AlterClientQuotasRequest {
    use alter_client_quotas_request::*;
    let entries = g.vec(3, |g| {
        EntryData::default()
            .with_entity(g.vec(3, |g| {
                EntityData::default()
                    .with_entity_type(g.quota_word(QUOTA_ENTITY_TYPES))
                    .with_entity_name(g.opt_string())
                    .with_unknown_tagged_fields(g.tags(v >= 1))
            }))
            .with_ops(g.vec(3, |g| {
                OpData::default()
                    .with_key(g.quota_word(QUOTA_KEYS))
                    .with_value(g.f64())
                    .with_remove(g.bool())
                    .with_unknown_tagged_fields(g.tags(v >= 1))
            }))
            .with_unknown_tagged_fields(g.tags(v >= 1))
    });
    AlterClientQuotasRequest::default()
        .with_entries(entries)
        .with_validate_only(g.bool())
        .with_unknown_tagged_fields(g.tags(v >= 1))
}

fn describe_user_scram_credentials(g: &mut Gen, _v: i16) -> DescribeUserScramCredentialsRequest {
    use describe_user_scram_credentials_request::*;
    let users = g.vec(3, |g| {
        UserName::default()
            .with_name(g.string())
            .with_unknown_tagged_fields(g.tags(true))
    });
    DescribeUserScramCredentialsRequest::default()
        .with_users(g.bool().then_some(users))
        .with_unknown_tagged_fields(g.tags(true))
}

fn alter_user_scram_credentials(g: &mut Gen, _v: i16) -> AlterUserScramCredentialsRequest {
    use alter_user_scram_credentials_request::*;
    // Mechanism ids around Kafka's (1 and 2), iteration counts around its
    // bounds, salted passwords of the right length and of others.
    let mechanism = |g: &mut Gen| g.i8().rem_euclid(4) - 1;
    let user = |g: &mut Gen| {
        if g.bool() {
            StrBytes::from_static_str(["alice", "bob", ""][g.rng().gen_range(0..3)])
        } else {
            g.string()
        }
    };
    let deletions = g.vec(3, |g| {
        ScramCredentialDeletion::default()
            .with_name(user(g))
            .with_mechanism(mechanism(g))
            .with_unknown_tagged_fields(g.tags(true))
    });
    let upsertions = g.vec(3, |g| {
        let len = [0, 31, 32, 64, 65][g.rng().gen_range(0..5)];
        let iterations = [4095, 4096, 8192, 16384, 16385, -1, g.i32()][g.rng().gen_range(0..7)];
        ScramCredentialUpsertion::default()
            .with_name(user(g))
            .with_mechanism(mechanism(g))
            .with_iterations(iterations)
            .with_salt(g.bytes(24))
            .with_salted_password(Bytes::from(vec![7u8; len]))
            .with_unknown_tagged_fields(g.tags(true))
    });
    AlterUserScramCredentialsRequest::default()
        .with_deletions(deletions)
        .with_upsertions(upsertions)
        .with_unknown_tagged_fields(g.tags(true))
}

/// An ACL field's id: around Kafka's (0 UNKNOWN, 1 ANY, 2 MATCH or the
/// first concrete one, ...), sometimes anything.
fn acl_id(g: &mut Gen, max: i8) -> i8 {
    if g.one_in(6) {
        g.i8()
    } else {
        g.rng().gen_range(0..=max)
    }
}

fn acl_name(g: &mut Gen) -> StrBytes {
    const NAMES: &[&str] = &[
        "t",
        "*",
        "orders-",
        "kafka-cluster",
        "User:alice",
        "User:*",
        "127.0.0.1",
    ];
    if g.bool() {
        StrBytes::from_static_str(NAMES[g.rng().gen_range(0..NAMES.len())])
    } else {
        g.string()
    }
}

fn create_acls(g: &mut Gen, v: i16) -> CreateAclsRequest {
    use create_acls_request::*;
    let creations = g.vec(3, |g| {
        AclCreation::default()
            .with_resource_type(acl_id(g, 7))
            .with_resource_name(acl_name(g))
            .with_resource_pattern_type(acl_id(g, 4))
            .with_principal(acl_name(g))
            .with_host(acl_name(g))
            .with_operation(acl_id(g, 15))
            .with_permission_type(acl_id(g, 3))
            .with_unknown_tagged_fields(g.tags(v >= 2))
    });
    CreateAclsRequest::default()
        .with_creations(creations)
        .with_unknown_tagged_fields(g.tags(v >= 2))
}

fn describe_acls(g: &mut Gen, v: i16) -> DescribeAclsRequest {
    DescribeAclsRequest::default()
        .with_resource_type_filter(acl_id(g, 7))
        .with_resource_name_filter(g.bool().then(|| acl_name(g)))
        .with_pattern_type_filter(acl_id(g, 4))
        .with_principal_filter(g.bool().then(|| acl_name(g)))
        .with_host_filter(g.bool().then(|| acl_name(g)))
        .with_operation(acl_id(g, 15))
        .with_permission_type(acl_id(g, 3))
        .with_unknown_tagged_fields(g.tags(v >= 2))
}

fn delete_acls(g: &mut Gen, v: i16) -> DeleteAclsRequest {
    use delete_acls_request::*;
    let filters = g.vec(3, |g| {
        DeleteAclsFilter::default()
            .with_resource_type_filter(acl_id(g, 7))
            .with_resource_name_filter(g.bool().then(|| acl_name(g)))
            .with_pattern_type_filter(acl_id(g, 4))
            .with_principal_filter(g.bool().then(|| acl_name(g)))
            .with_host_filter(g.bool().then(|| acl_name(g)))
            .with_operation(acl_id(g, 15))
            .with_permission_type(acl_id(g, 3))
            .with_unknown_tagged_fields(g.tags(v >= 2))
    });
    DeleteAclsRequest::default()
        .with_filters(filters)
        .with_unknown_tagged_fields(g.tags(v >= 2))
}

fn sasl_handshake(g: &mut Gen, _v: i16) -> SaslHandshakeRequest {
    const NAMES: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "plain"];
    let mechanism = if g.one_in(4) {
        g.string()
    } else {
        StrBytes::from_static_str(NAMES[g.rng().gen_range(0..NAMES.len())])
    };
    SaslHandshakeRequest::default().with_mechanism(mechanism)
}

fn sasl_authenticate(g: &mut Gen, v: i16) -> SaslAuthenticateRequest {
    // A PLAIN token, a SCRAM client-first message, or noise.
    let token = match g.rng().gen_range(0..3) {
        0 => Bytes::from(format!("\0{}\0{}", g.string().as_str(), g.string().as_str())),
        1 => Bytes::from(format!("n,,n={},r={}", g.string().as_str(), g.string().as_str())),
        _ => g.bytes(64),
    };
    SaslAuthenticateRequest::default()
        .with_auth_bytes(token)
        .with_unknown_tagged_fields(g.tags(v >= 2))
}

fn consumer_group_heartbeat(g: &mut Gen, v: i16) -> ConsumerGroupHeartbeatRequest {
    use consumer_group_heartbeat_request::*;
    // Epochs a coordinator treats apart: join, leave, static leave, others.
    let epoch = match g.i8().rem_euclid(5) {
        0 => 0,
        1 => -1,
        2 => -2,
        3 => g.i32(),
        _ => i32::from(g.i8().rem_euclid(4)),
    };
    let owned = g.vec(3, |g| {
        TopicPartitions::default()
            .with_topic_id(g.uuid())
            .with_partitions(g.vec(4, |g| g.i32()))
            .with_unknown_tagged_fields(g.tags(true))
    });
    let mut r = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(g.string()))
        .with_member_id(if g.one_in(2) {
            g.string()
        } else {
            StrBytes::from_static_str("member-1")
        })
        .with_member_epoch(epoch)
        .with_instance_id(g.opt_string())
        .with_rack_id(g.opt_string())
        .with_rebalance_timeout_ms(if g.one_in(3) { -1 } else { g.i32() })
        .with_subscribed_topic_names(g.bool().then(|| g.vec(3, |g| g.topic())))
        .with_server_assignor(if g.one_in(2) {
            None
        } else {
            Some(g.quota_word(&["uniform", "range"]))
        })
        .with_topic_partitions(g.bool().then_some(owned))
        .with_unknown_tagged_fields(g.tags(true));
    if v >= 1 {
        r = r.with_subscribed_topic_regex(g.opt_string());
    }
    r
}

fn consumer_group_describe(g: &mut Gen, _v: i16) -> ConsumerGroupDescribeRequest {
    ConsumerGroupDescribeRequest::default()
        .with_group_ids(g.vec(3, |g| GroupId(g.string())))
        .with_include_authorized_operations(g.bool())
        .with_unknown_tagged_fields(g.tags(true))
}

fn list_config_resources(g: &mut Gen, v: i16) -> ListConfigResourcesRequest {
    let mut r = ListConfigResourcesRequest::default().with_unknown_tagged_fields(g.tags(true));
    if v >= 1 {
        r = r.with_resource_types(g.vec(4, |g| {
            if g.one_in(3) {
                g.i8()
            } else {
                1 << g.i8().rem_euclid(6)
            }
        }));
    }
    r
}

fn elect_leaders(g: &mut Gen, v: i16) -> ElectLeadersRequest {
    use elect_leaders_request::*;
    let topics = g.vec(3, |g| {
        TopicPartitions::default()
            .with_topic(g.topic())
            .with_partitions(g.vec(4, |g| g.i32()))
            .with_unknown_tagged_fields(g.tags(v >= 2))
    });
    let mut r = ElectLeadersRequest::default()
        .with_topic_partitions(g.bool().then_some(topics))
        .with_timeout_ms(g.i32())
        .with_unknown_tagged_fields(g.tags(v >= 2));
    if v >= 1 {
        r = r.with_election_type(g.i8());
    }
    r
}

fn describe_log_dirs(g: &mut Gen, v: i16) -> DescribeLogDirsRequest {
    use describe_log_dirs_request::*;
    let topics = g.vec(3, |g| {
        DescribableLogDirTopic::default()
            .with_topic(g.topic())
            .with_partitions(g.vec(4, |g| g.i32()))
            .with_unknown_tagged_fields(g.tags(v >= 2))
    });
    DescribeLogDirsRequest::default()
        .with_topics(g.bool().then_some(topics))
        .with_unknown_tagged_fields(g.tags(v >= 2))
}

fn describe_producers(g: &mut Gen, _v: i16) -> DescribeProducersRequest {
    use describe_producers_request::*;
    let topics = g.vec(3, |g| {
        TopicRequest::default()
            .with_name(g.topic())
            .with_partition_indexes(g.vec(3, |g| g.i32()))
            .with_unknown_tagged_fields(g.tags(true))
    });
    DescribeProducersRequest::default()
        .with_topics(topics)
        .with_unknown_tagged_fields(g.tags(true))
}

fn share_group_heartbeat(g: &mut Gen, _v: i16) -> ShareGroupHeartbeatRequest {
    // Epochs the coordinator treats apart: join, leave, others.
    let epoch = match g.i8().rem_euclid(4) {
        0 => 0,
        1 => -1,
        2 => g.i32(),
        _ => i32::from(g.i8().rem_euclid(4)),
    };
    ShareGroupHeartbeatRequest::default()
        .with_group_id(GroupId(g.string()))
        .with_member_id(g.string())
        .with_member_epoch(epoch)
        .with_rack_id(g.opt_string())
        .with_subscribed_topic_names(g.bool().then(|| g.vec(3, |g| g.topic())))
        .with_unknown_tagged_fields(g.tags(true))
}

fn share_group_describe(g: &mut Gen, _v: i16) -> ShareGroupDescribeRequest {
    ShareGroupDescribeRequest::default()
        .with_group_ids(g.vec(3, |g| GroupId(g.string())))
        .with_include_authorized_operations(g.bool())
        .with_unknown_tagged_fields(g.tags(true))
}

fn share_ack_types(g: &mut Gen) -> Vec<i8> {
    g.vec(3, |g| g.i8().rem_euclid(5))
}

fn share_fetch(g: &mut Gen, v: i16) -> keel_protocol::share::ShareFetch {
    use share_fetch_request::*;
    let topics = g.vec(3, |g| {
        FetchTopic::default()
            .with_topic_id(g.uuid())
            .with_partitions(g.vec(3, |g| {
                FetchPartition::default()
                    .with_partition_index(g.i32())
                    .with_acknowledgement_batches(g.vec(2, |g| {
                        AcknowledgementBatch::default()
                            .with_first_offset(g.i64())
                            .with_last_offset(g.i64())
                            .with_acknowledge_types(share_ack_types(g))
                            .with_unknown_tagged_fields(g.tags(true))
                    }))
                    .with_unknown_tagged_fields(g.tags(true))
            }))
            .with_unknown_tagged_fields(g.tags(true))
    });
    let request = ShareFetchRequest::default()
        .with_group_id(g.bool().then(|| GroupId(g.string())))
        .with_member_id(g.opt_string())
        .with_share_session_epoch(i32::from(g.i8()))
        .with_max_wait_ms(g.i32())
        .with_min_bytes(g.i32())
        .with_max_bytes(g.i32())
        .with_max_records(g.i32())
        .with_batch_size(g.i32())
        .with_topics(topics)
        .with_forgotten_topics_data(g.vec(2, |g| {
            share_fetch_request::ForgottenTopic::default()
                .with_topic_id(g.uuid())
                .with_partitions(g.vec(3, |g| g.i32()))
                .with_unknown_tagged_fields(g.tags(true))
        }))
        .with_unknown_tagged_fields(g.tags(true));
    let v2 = v >= 2;
    keel_protocol::share::ShareFetch {
        request,
        acquire_mode: if v2 && g.bool() {
            keel_protocol::share::ShareAcquireMode::RecordLimit
        } else {
            keel_protocol::share::ShareAcquireMode::BatchOptimized
        },
        is_renew_ack: v2 && g.bool(),
    }
}

fn share_acknowledge(g: &mut Gen, v: i16) -> keel_protocol::share::ShareAcknowledge {
    use share_acknowledge_request::*;
    let request = ShareAcknowledgeRequest::default()
        .with_group_id(g.bool().then(|| GroupId(g.string())))
        .with_member_id(g.opt_string())
        .with_share_session_epoch(i32::from(g.i8()))
        .with_topics(g.vec(3, |g| {
            AcknowledgeTopic::default()
                .with_topic_id(g.uuid())
                .with_partitions(g.vec(3, |g| {
                    AcknowledgePartition::default()
                        .with_partition_index(g.i32())
                        .with_acknowledgement_batches(g.vec(2, |g| {
                            AcknowledgementBatch::default()
                                .with_first_offset(g.i64())
                                .with_last_offset(g.i64())
                                .with_acknowledge_types(share_ack_types(g))
                                .with_unknown_tagged_fields(g.tags(true))
                        }))
                        .with_unknown_tagged_fields(g.tags(true))
                }))
                .with_unknown_tagged_fields(g.tags(true))
        }))
        .with_unknown_tagged_fields(g.tags(true));
    keel_protocol::share::ShareAcknowledge {
        request,
        is_renew_ack: v >= 2 && g.bool(),
    }
}

fn describe_share_group_offsets(g: &mut Gen, _v: i16) -> DescribeShareGroupOffsetsRequest {
    use describe_share_group_offsets_request::*;
    DescribeShareGroupOffsetsRequest::default()
        .with_groups(g.vec(3, |g| {
            DescribeShareGroupOffsetsRequestGroup::default()
                .with_group_id(GroupId(g.string()))
                .with_topics(g.bool().then(|| {
                    g.vec(3, |g| {
                        DescribeShareGroupOffsetsRequestTopic::default()
                            .with_topic_name(g.topic())
                            .with_partitions(g.vec(3, |g| g.i32()))
                            .with_unknown_tagged_fields(g.tags(true))
                    })
                }))
                .with_unknown_tagged_fields(g.tags(true))
        }))
        .with_unknown_tagged_fields(g.tags(true))
}

fn alter_share_group_offsets(g: &mut Gen, _v: i16) -> AlterShareGroupOffsetsRequest {
    use alter_share_group_offsets_request::*;
    AlterShareGroupOffsetsRequest::default()
        .with_group_id(GroupId(g.string()))
        .with_topics(g.vec(3, |g| {
            AlterShareGroupOffsetsRequestTopic::default()
                .with_topic_name(g.topic())
                .with_partitions(g.vec(3, |g| {
                    AlterShareGroupOffsetsRequestPartition::default()
                        .with_partition_index(g.i32())
                        .with_start_offset(g.i64())
                        .with_unknown_tagged_fields(g.tags(true))
                }))
                .with_unknown_tagged_fields(g.tags(true))
        }))
        .with_unknown_tagged_fields(g.tags(true))
}

fn delete_share_group_offsets(g: &mut Gen, _v: i16) -> DeleteShareGroupOffsetsRequest {
    use delete_share_group_offsets_request::*;
    DeleteShareGroupOffsetsRequest::default()
        .with_group_id(GroupId(g.string()))
        .with_topics(g.vec(3, |g| {
            DeleteShareGroupOffsetsRequestTopic::default()
                .with_topic_name(g.topic())
                .with_unknown_tagged_fields(g.tags(true))
        }))
        .with_unknown_tagged_fields(g.tags(true))
}
