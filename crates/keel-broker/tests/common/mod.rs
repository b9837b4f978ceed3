//! What the in-process request tests share: a broker on a temporary
//! directory and one request through `Broker::handle`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::BytesMut;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use keel_broker::{Broker, ClientInfo, Reply};
use keel_config::BrokerConfig;
use keel_protocol::RequestFrame;

/// Sends `body` as one request and decodes the response.
pub async fn call<Q: Encodable, R: Decodable>(
    broker: &Arc<Broker>,
    key: ApiKey,
    version: i16,
    body: &Q,
) -> R {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("request-test")))
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    body.encode(&mut buf, version).unwrap();
    let reply = broker
        .handle(RequestFrame::parse(buf.freeze()).unwrap(), &ClientInfo::default())
        .await;
    let Reply::Frame(mut bytes) = reply else {
        panic!("{key:?}: expected a response, got {reply:?}");
    };
    let _size = bytes::Buf::get_i32(&mut bytes);
    ResponseHeader::decode(&mut bytes, key.response_header_version(version)).unwrap();
    R::decode(&mut bytes, version).unwrap()
}

/// A broker with its defaults on `dir`.
pub async fn open_broker(dir: &std::path::Path) -> Arc<Broker> {
    let mut map = BTreeMap::new();
    map.insert("log.dirs".to_string(), dir.display().to_string());
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

pub fn topic_name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}
