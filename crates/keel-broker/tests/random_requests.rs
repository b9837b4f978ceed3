//! Random requests of every API and version Keel advertises, built by the
//! protocol tests' generators (any field any value: odd names, negative
//! counts and limits, unknown resource types, huge indexes), handled by a
//! real broker on a temporary directory. Nothing may panic, and every
//! request is answered with a frame that decodes at its version, or (a
//! Produce with acks=0) with nothing or a close, or is still waiting when
//! the test gives up on it (long polls, joins).
//!
//! CreateTopics and CreatePartitions are sent with `validate_only`, so a
//! random partition count does not create 100,000 directories. The seed is
//! printed; `KEEL_TEST_SEED=<seed>` replays a failure, and
//! `KEEL_RANDOM_REQUEST_CASES` sets the requests per API version (default 25).

#[path = "../../keel-protocol/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::Gen;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;
use keel_broker::{Broker, ClientInfo, Reply};
use keel_config::BrokerConfig;
use keel_protocol::versions::SUPPORTED;
use keel_protocol::{Request, RequestFrame};
use rand::Rng;

fn cases() -> usize {
    std::env::var("KEEL_RANDOM_REQUEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25)
}

/// The generated request, made safe to run many times: no topic or
/// partition is really created.
fn tame(body: Request) -> Request {
    match body {
        Request::CreateTopics(r) => Request::CreateTopics(r.with_validate_only(true)),
        Request::CreatePartitions(r) => Request::CreatePartitions(r.with_validate_only(true)),
        other => other,
    }
}

/// Checks that a response frame decodes at the request's version.
fn check_response(key: ApiKey, version: i16, mut bytes: bytes::Bytes, what: &str) {
    let _size = bytes::Buf::get_i32(&mut bytes);
    let header_version = if key == ApiKey::ApiVersions {
        0
    } else {
        key.response_header_version(version)
    };
    ResponseHeader::decode(&mut bytes, header_version)
        .unwrap_or_else(|e| panic!("{what}: response header: {e}"));
    let decoded = match key {
        ApiKey::Produce => ProduceResponse::decode(&mut bytes, version).map(drop),
        ApiKey::Fetch => FetchResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ListOffsets => ListOffsetsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::Metadata => MetadataResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ApiVersions => ApiVersionsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::CreateTopics => CreateTopicsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DeleteTopics => DeleteTopicsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DeleteRecords => DeleteRecordsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::InitProducerId => InitProducerIdResponse::decode(&mut bytes, version).map(drop),
        ApiKey::OffsetForLeaderEpoch => OffsetForLeaderEpochResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DescribeConfigs => DescribeConfigsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::CreatePartitions => CreatePartitionsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DescribeCluster => DescribeClusterResponse::decode(&mut bytes, version).map(drop),
        ApiKey::FindCoordinator => FindCoordinatorResponse::decode(&mut bytes, version).map(drop),
        ApiKey::JoinGroup => JoinGroupResponse::decode(&mut bytes, version).map(drop),
        ApiKey::SyncGroup => SyncGroupResponse::decode(&mut bytes, version).map(drop),
        ApiKey::Heartbeat => HeartbeatResponse::decode(&mut bytes, version).map(drop),
        ApiKey::LeaveGroup => LeaveGroupResponse::decode(&mut bytes, version).map(drop),
        ApiKey::OffsetCommit => OffsetCommitResponse::decode(&mut bytes, version).map(drop),
        ApiKey::OffsetFetch => OffsetFetchResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ListGroups => ListGroupsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DescribeGroups => DescribeGroupsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DeleteGroups => DeleteGroupsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::OffsetDelete => OffsetDeleteResponse::decode(&mut bytes, version).map(drop),
        ApiKey::AddPartitionsToTxn => AddPartitionsToTxnResponse::decode(&mut bytes, version).map(drop),
        ApiKey::EndTxn => EndTxnResponse::decode(&mut bytes, version).map(drop),
        ApiKey::AddOffsetsToTxn => AddOffsetsToTxnResponse::decode(&mut bytes, version).map(drop),
        ApiKey::TxnOffsetCommit => TxnOffsetCommitResponse::decode(&mut bytes, version).map(drop),
        ApiKey::WriteTxnMarkers => WriteTxnMarkersResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DescribeTransactions => DescribeTransactionsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ListTransactions => ListTransactionsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DescribeProducers => DescribeProducersResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DescribeLogDirs => DescribeLogDirsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::IncrementalAlterConfigs => {
            IncrementalAlterConfigsResponse::decode(&mut bytes, version).map(drop)
        }
        ApiKey::AlterConfigs => AlterConfigsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ElectLeaders => ElectLeadersResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DescribeTopicPartitions => {
            DescribeTopicPartitionsResponse::decode(&mut bytes, version).map(drop)
        }
        ApiKey::DescribeClientQuotas => DescribeClientQuotasResponse::decode(&mut bytes, version).map(drop),
        ApiKey::AlterClientQuotas => AlterClientQuotasResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DescribeUserScramCredentials => {
            DescribeUserScramCredentialsResponse::decode(&mut bytes, version).map(drop)
        }
        ApiKey::AlterUserScramCredentials => {
            AlterUserScramCredentialsResponse::decode(&mut bytes, version).map(drop)
        }
        ApiKey::SaslHandshake => SaslHandshakeResponse::decode(&mut bytes, version).map(drop),
        ApiKey::CreateAcls => CreateAclsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DescribeAcls => DescribeAclsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::DeleteAcls => DeleteAclsResponse::decode(&mut bytes, version).map(drop),
        ApiKey::SaslAuthenticate => SaslAuthenticateResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ConsumerGroupHeartbeat => {
            ConsumerGroupHeartbeatResponse::decode(&mut bytes, version).map(drop)
        }
        ApiKey::ConsumerGroupDescribe => ConsumerGroupDescribeResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ListConfigResources => ListConfigResourcesResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ShareGroupHeartbeat => ShareGroupHeartbeatResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ShareGroupDescribe => ShareGroupDescribeResponse::decode(&mut bytes, version).map(drop),
        ApiKey::ShareFetch => ShareFetchResponse::decode(&mut bytes, version.min(1)).map(drop),
        ApiKey::ShareAcknowledge => {
            keel_protocol::share::ShareAcknowledgeAnswer::decode(&mut bytes, version).map(drop)
        }
        ApiKey::DescribeShareGroupOffsets => {
            keel_protocol::share::ShareOffsetsAnswer::decode(&mut bytes, version).map(drop)
        }
        ApiKey::AlterShareGroupOffsets => {
            AlterShareGroupOffsetsResponse::decode(&mut bytes, version).map(drop)
        }
        ApiKey::DeleteShareGroupOffsets => {
            DeleteShareGroupOffsetsResponse::decode(&mut bytes, version).map(drop)
        }
        other => panic!("{other:?} is advertised but this test cannot decode its response"),
    };
    decoded.unwrap_or_else(|e| panic!("{what}: response does not decode: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_requests_of_every_api_are_answered_without_panics() {
    random_requests(&[]).await;
}

/// With ACLs on and none set, every request is denied: each API's denial
/// must be a well-formed answer at every version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_requests_denied_by_acls_are_answered_without_panics() {
    random_requests(&[("authorizer.class.name", keel_auth::acl::STANDARD_AUTHORIZER)]).await;
}

/// With ACLs on and every resource open (no ACL names it), every request
/// goes through the checks to its handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_requests_allowed_by_acls_are_answered_without_panics() {
    random_requests(&[
        ("authorizer.class.name", keel_auth::acl::STANDARD_AUTHORIZER),
        ("allow.everyone.if.no.acl.found", "true"),
    ])
    .await;
}

async fn random_requests(extra: &[(&str, &str)]) {
    let seed = common::test_seed();
    let mut g = Gen::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut map = BTreeMap::new();
    map.insert("log.dirs".to_string(), dir.path().display().to_string());
    map.insert("group.initial.rebalance.delay.ms".to_string(), "0".to_string());
    for (k, v) in extra {
        map.insert(k.to_string(), v.to_string());
    }
    let config = BrokerConfig::from_map(&map).unwrap();
    let broker: Arc<Broker> = tokio::task::spawn_blocking(move || {
        Broker::open(
            config,
            vec![keel_config::listeners::Endpoint::plaintext("127.0.0.1", 9092)],
        )
    })
    .await
    .unwrap()
    .unwrap();
    let client = ClientInfo::default();
    // The SASL APIs also go to a SASL listener's connection, in the middle
    // of an exchange of a random mechanism, so random tokens reach the
    // mechanisms.
    let sasl_settings = keel_auth::sasl::settings(
        &BrokerConfig::from_map(&BTreeMap::from([
            (
                "sasl.enabled.mechanisms".to_string(),
                "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512".to_string(),
            ),
            (
                "listener.name.sasl.plain.sasl.jaas.config".to_string(),
                "org.apache.kafka.common.security.plain.PlainLoginModule required user_alice=\"alice-secret\";"
                    .to_string(),
            ),
        ]))
        .unwrap(),
        "SASL",
    )
    .unwrap();
    let sasl_listener =
        Arc::new(keel_auth::sasl::SaslListener::new(sasl_settings, Arc::clone(&broker.scram)).unwrap());
    let (mut answered, mut waiting) = (0, 0);
    for api in SUPPORTED {
        for version in api.min..=api.max {
            for case in 0..cases() {
                let what = format!("seed {seed}: {:?} v{version} case {case}", api.key);
                let header = common::header(&mut g, api.key, version);
                let body =
                    common::body(&mut g, api.key, version).unwrap_or_else(|| panic!("{what}: no generator"));
                let acks_zero = matches!(&body, Request::Produce(p) if p.acks == 0);
                let frame = common::encode_frame(&header, &tame(body)).expect("the generators encode");
                let frame = RequestFrame::parse(frame).unwrap_or_else(|e| panic!("{what}: {e}"));
                let sasl_client;
                let client = if matches!(api.key, ApiKey::SaslHandshake | ApiKey::SaslAuthenticate)
                    && g.rng().gen_bool(0.5)
                {
                    let auth = keel_auth::sasl::ConnectionAuth::new(Arc::clone(&sasl_listener));
                    if api.key == ApiKey::SaslAuthenticate {
                        let mechanism = keel_auth::sasl::MECHANISMS[g.rng().gen_range(0..3)];
                        auth.lock().handshake(mechanism, 1);
                    }
                    sasl_client = ClientInfo {
                        sasl: Some(auth),
                        ..ClientInfo::default()
                    };
                    &sasl_client
                } else {
                    &client
                };
                let handled = broker.handle(frame, client);
                match tokio::time::timeout(Duration::from_millis(300), handled).await {
                    Ok(Reply::Frame(bytes)) => {
                        check_response(api.key, version, bytes, &what);
                        answered += 1;
                    }
                    Ok(Reply::Nothing | Reply::Close(_)) if acks_zero => answered += 1,
                    // A failed SASL exchange: answered, then closed.
                    Ok(Reply::FrameThenClose { frame, reason, .. }) => {
                        assert!(!reason.is_empty(), "{what}: closed without a reason");
                        check_response(api.key, version, frame, &what);
                        answered += 1;
                    }
                    // A request the generator made unreadable for this
                    // broker's rules (Kafka closes on these too).
                    Ok(Reply::Close(reason)) => {
                        assert!(!reason.is_empty(), "{what}: closed without a reason");
                        // Never because the dispatcher has no function for it.
                        assert!(!reason.starts_with("no handler"), "{what}: {reason}");
                        // Never because the answer (an authorization
                        // error's too) does not encode at this version.
                        assert!(
                            !reason.contains(&format!("{:?} v{version}:", api.key)),
                            "{what}: {reason}"
                        );
                        answered += 1;
                    }
                    Ok(Reply::Nothing) => panic!("{what}: no response"),
                    Ok(Reply::Refused(reason)) => panic!("{what}: an advertised API refused: {reason}"),
                    Err(_) => waiting += 1,
                }
            }
        }
    }
    println!("seed {seed} {extra:?}: {answered} requests answered, {waiting} still waiting at 300 ms");
    assert!(
        answered > waiting * 10,
        "most requests are answered: {answered} vs {waiting}"
    );
    let b = Arc::clone(&broker);
    tokio::task::spawn_blocking(move || b.shutdown()).await.unwrap();
}
