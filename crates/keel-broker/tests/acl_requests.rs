//! ACL checks on requests a broker answers, where a check's answer
//! depends on the request's version or on what filtering leaves: a
//! Metadata v0 naming only topics the client may not see must not turn
//! into a listing of every topic, a refused ElectLeaders must encode at
//! v0, which has no error code of its own, and OffsetFetch shows a group's
//! offsets only for topics the client may see.

#[path = "../../keel-protocol/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use keel_broker::{Broker, ClientInfo, Reply};
use keel_config::BrokerConfig;
use keel_protocol::{Request, RequestFrame};

const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;

fn user(name: &str) -> ClientInfo {
    ClientInfo {
        user: Some(Arc::from(name)),
        ..ClientInfo::default()
    }
}

/// Sends `body` at `version` as `client`; -> the response.
async fn call<R: Decodable>(
    broker: &Arc<Broker>,
    client: &ClientInfo,
    key: ApiKey,
    version: i16,
    body: Request,
) -> R {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("acl-test")));
    let frame = RequestFrame::parse(common::encode_frame(&header, &body).unwrap()).unwrap();
    let Reply::Frame(mut bytes) = broker.handle(frame, client).await else {
        panic!("{key:?} v{version}: not answered with a frame");
    };
    let _size = bytes::Buf::get_i32(&mut bytes);
    ResponseHeader::decode(&mut bytes, key.response_header_version(version)).unwrap();
    R::decode(&mut bytes, version).unwrap_or_else(|e| panic!("{key:?} v{version}: {e}"))
}

async fn broker(dir: &tempfile::TempDir) -> Arc<Broker> {
    let map: BTreeMap<String, String> = [
        ("log.dirs", dir.path().display().to_string()),
        (
            "authorizer.class.name",
            keel_auth::acl::STANDARD_AUTHORIZER.to_string(),
        ),
        ("super.users", "User:admin".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let config = BrokerConfig::from_map(&map).unwrap();
    tokio::task::spawn_blocking(move || {
        Broker::open(
            config,
            vec![keel_config::listeners::Endpoint::plaintext("127.0.0.1", 9092)],
        )
    })
    .await
    .unwrap()
    .unwrap()
}

async fn create_topics(broker: &Arc<Broker>, admin: &ClientInfo, names: &[&str]) {
    let topics = names
        .iter()
        .map(|t| {
            create_topics_request::CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_string(t.to_string())))
                .with_num_partitions(1)
                .with_replication_factor(1)
        })
        .collect();
    let request = Request::CreateTopics(CreateTopicsRequest::default().with_topics(topics));
    let created: CreateTopicsResponse = call(broker, admin, ApiKey::CreateTopics, 5, request).await;
    assert!(created.topics.iter().all(|t| t.error_code == 0), "{created:?}");
}

/// An ALLOW ACL for User:alice: `operation` on the literal resource
/// `name` of `resource_type` (Kafka's codes).
async fn allow(broker: &Arc<Broker>, admin: &ClientInfo, resource_type: i8, name: &str, operation: i8) {
    let acl = create_acls_request::AclCreation::default()
        .with_resource_type(resource_type)
        .with_resource_name(StrBytes::from_string(name.to_string()))
        .with_resource_pattern_type(3) // literal
        .with_principal(StrBytes::from_static_str("User:alice"))
        .with_host(StrBytes::from_static_str("*"))
        .with_operation(operation)
        .with_permission_type(3); // allow
    let request = Request::CreateAcls(CreateAclsRequest::default().with_creations(vec![acl]));
    let acls: CreateAclsResponse = call(broker, admin, ApiKey::CreateAcls, 3, request).await;
    assert!(acls.results.iter().all(|r| r.error_code == 0), "{acls:?}");
}

fn names(resp: &MetadataResponse) -> Vec<(String, i16)> {
    let mut out: Vec<(String, i16)> = resp
        .topics
        .iter()
        .map(|t| {
            (
                t.name.as_deref().map_or("", |n| n.as_str()).to_string(),
                t.error_code,
            )
        })
        .collect();
    out.sort();
    out
}

fn metadata_request(topics: &[&str]) -> Request {
    Request::Metadata(
        MetadataRequest::default().with_topics(Some(
            topics
                .iter()
                .map(|t| {
                    metadata_request::MetadataRequestTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_string(t.to_string()))))
                })
                .collect(),
        )),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_v0_of_denied_topics_lists_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir).await;
    let admin = user("admin");
    create_topics(&broker, &admin, &["open", "secret"]).await;
    allow(&broker, &admin, 2, "open", 8).await; // DESCRIBE the topic

    let alice = user("alice");
    // Named and denied: only the denial, at v0 and later.
    for version in [0, 1, 12] {
        let resp: MetadataResponse = call(
            &broker,
            &alice,
            ApiKey::Metadata,
            version,
            metadata_request(&["secret"]),
        )
        .await;
        assert_eq!(
            names(&resp),
            [("secret".to_string(), TOPIC_AUTHORIZATION_FAILED)],
            "v{version}"
        );
    }
    // A listing (v0's empty list, v1+'s null) shows what she may describe.
    let resp: MetadataResponse = call(&broker, &alice, ApiKey::Metadata, 0, metadata_request(&[])).await;
    assert_eq!(names(&resp), [("open".to_string(), 0)]);
    let all = Request::Metadata(MetadataRequest::default().with_topics(None));
    let resp: MetadataResponse = call(&broker, &alice, ApiKey::Metadata, 12, all).await;
    assert_eq!(names(&resp), [("open".to_string(), 0)]);
    // An empty list at v1+ names no topic.
    let resp: MetadataResponse = call(&broker, &alice, ApiKey::Metadata, 12, metadata_request(&[])).await;
    assert_eq!(names(&resp), []);
    let resp: MetadataResponse = call(&broker, &admin, ApiKey::Metadata, 0, metadata_request(&[])).await;
    assert_eq!(names(&resp), [("open".to_string(), 0), ("secret".to_string(), 0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_elect_leaders_encodes_at_every_version() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir).await;
    let request = || {
        Request::ElectLeaders(ElectLeadersRequest::default().with_topic_partitions(Some(vec![
                elect_leaders_request::TopicPartitions::default()
                    .with_topic(TopicName(StrBytes::from_static_str("t")))
                    .with_partitions(vec![0, 1]),
            ])))
    };
    for version in 0..=2 {
        let resp: ElectLeadersResponse =
            call(&broker, &user("alice"), ApiKey::ElectLeaders, version, request()).await;
        let top = if version >= 1 {
            CLUSTER_AUTHORIZATION_FAILED
        } else {
            0
        };
        assert_eq!(resp.error_code, top, "v{version}");
        let partitions: Vec<i16> = resp
            .replica_election_results
            .iter()
            .flat_map(|t| t.partition_result.iter().map(|p| p.error_code))
            .collect();
        assert_eq!(partitions, [CLUSTER_AUTHORIZATION_FAILED; 2], "v{version}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_fetch_shows_only_topics_the_client_may_describe() {
    use offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir).await;
    let admin = user("admin");
    create_topics(&broker, &admin, &["open", "secret"]).await;
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g")))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(
            ["open", "secret"]
                .iter()
                .map(|t| {
                    OffsetCommitRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partitions(vec![OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(5)])
                })
                .collect(),
        );
    let committed: OffsetCommitResponse = call(
        &broker,
        &admin,
        ApiKey::OffsetCommit,
        8,
        Request::OffsetCommit(commit),
    )
    .await;
    assert!(
        committed
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .all(|p| p.error_code == 0),
        "{committed:?}"
    );
    allow(&broker, &admin, 2, "open", 8).await; // DESCRIBE the topic
    allow(&broker, &admin, 3, "g", 8).await; // DESCRIBE the group
    let alice = user("alice");
    let offsets = |topics: &OffsetFetchResponse| -> Vec<(String, i64, i16)> {
        let mut out: Vec<_> = topics
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (t.name.to_string(), p.committed_offset, p.error_code))
            })
            .collect();
        out.sort();
        out
    };
    // Named: the secret topic is answered TOPIC_AUTHORIZATION_FAILED.
    let named = OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g")))
        .with_topics(Some(
            ["open", "secret"]
                .iter()
                .map(|t| {
                    offset_fetch_request::OffsetFetchRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partition_indexes(vec![0])
                })
                .collect(),
        ));
    let resp: OffsetFetchResponse = call(
        &broker,
        &alice,
        ApiKey::OffsetFetch,
        7,
        Request::OffsetFetch(named),
    )
    .await;
    assert_eq!(
        offsets(&resp),
        [
            ("open".into(), 5, 0),
            ("secret".into(), -1, TOPIC_AUTHORIZATION_FAILED)
        ]
    );
    // Every committed topic: the secret one is left out.
    let all = OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g")))
        .with_topics(None);
    let resp: OffsetFetchResponse =
        call(&broker, &alice, ApiKey::OffsetFetch, 7, Request::OffsetFetch(all)).await;
    assert_eq!(offsets(&resp), [("open".into(), 5, 0)]);
    let all = OffsetFetchRequest::default().with_groups(vec![
        offset_fetch_request::OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_topics(None),
    ]);
    let resp: OffsetFetchResponse =
        call(&broker, &alice, ApiKey::OffsetFetch, 9, Request::OffsetFetch(all)).await;
    let topics: Vec<String> = resp.groups[0].topics.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(topics, ["open"]);
    // v8+ naming topics: per partition, as v0-7.
    let named = OffsetFetchRequest::default().with_groups(vec![
        offset_fetch_request::OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_topics(Some(
                ["open", "secret"]
                    .iter()
                    .map(|t| {
                        offset_fetch_request::OffsetFetchRequestTopics::default()
                            .with_name(TopicName(StrBytes::from_string(t.to_string())))
                            .with_partition_indexes(vec![0])
                    })
                    .collect(),
            )),
    ]);
    let resp: OffsetFetchResponse = call(
        &broker,
        &alice,
        ApiKey::OffsetFetch,
        9,
        Request::OffsetFetch(named),
    )
    .await;
    let mut partitions: Vec<(String, i64, i16)> = resp.groups[0]
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.to_string(), p.committed_offset, p.error_code))
        })
        .collect();
    partitions.sort();
    assert_eq!(
        partitions,
        [
            ("open".into(), 5, 0),
            ("secret".into(), -1, TOPIC_AUTHORIZATION_FAILED)
        ]
    );
    let resp: OffsetFetchResponse = call(
        &broker,
        &admin,
        ApiKey::OffsetFetch,
        7,
        Request::OffsetFetch(
            OffsetFetchRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g")))
                .with_topics(None),
        ),
    )
    .await;
    assert_eq!(offsets(&resp), [("open".into(), 5, 0), ("secret".into(), 5, 0)]);
}
