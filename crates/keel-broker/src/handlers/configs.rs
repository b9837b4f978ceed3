//! DescribeConfigs for topics, the broker, loggers and consumer groups, and
//! ListConfigResources.

use std::collections::BTreeSet;

use keel_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::config_resource::{RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_GROUP, RESOURCE_TOPIC};
use super::str_bytes;
use crate::group_configs::GROUP_CONFIGS;
use crate::Broker;
use keel_config::kafka_configs::{foreign, NOT_ACTED_ON};
use keel_config::{broker_config_type, is_dynamic, ConfigSource, ConfigType, TOPIC_CONFIGS};

struct Entry {
    name: String,
    value: String,
    source: ConfigSource,
    kind: ConfigType,
    read_only: bool,
    synonyms: Vec<(String, String, ConfigSource)>,
    /// Said when the request asks for documentation (v3+).
    documentation: Option<&'static str>,
}

pub fn describe_configs(broker: &Broker, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let results = req
        .resources
        .iter()
        .map(|r| {
            let base = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let entries = match r.resource_type {
                RESOURCE_TOPIC => topic_entries(broker, r.resource_name.as_str()),
                RESOURCE_BROKER => broker_entries(broker, r.resource_name.as_str()),
                RESOURCE_BROKER_LOGGER => logger_entries(broker, r.resource_name.as_str()),
                RESOURCE_GROUP => Ok(group_entries(broker, r.resource_name.as_str())),
                other => Err((
                    ResponseError::InvalidRequest,
                    format!("resource type {other} is not supported"),
                )),
            };
            match entries {
                Ok(entries) => {
                    let keys = r.configuration_keys.as_ref();
                    let configs = entries
                        .into_iter()
                        .filter(|e| keys.is_none_or(|k| k.iter().any(|k| k.as_str() == e.name)))
                        .map(|e| to_result(e, req.include_synonyms, req.include_documentation))
                        .collect();
                    base.with_configs(configs)
                }
                Err((error, message)) => base
                    .with_error_code(error.code())
                    .with_error_message(Some(str_bytes(message))),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// A broker key's synonyms: its value in each source, highest first.
fn broker_synonyms(config: &keel_config::BrokerConfig, key: &str) -> Vec<(String, String, ConfigSource)> {
    config
        .layers(key)
        .into_iter()
        .map(|(value, source)| (key.to_string(), value, source))
        .collect()
}

fn topic_entries(broker: &Broker, name: &str) -> Result<Vec<Entry>, (ResponseError, String)> {
    let topic = broker.data.topics.get(name).ok_or((
        ResponseError::UnknownTopicOrPartition,
        format!("topic `{name}` does not exist"),
    ))?;
    let config = broker.config();
    let overrides = &topic.meta.configs;
    Ok(TOPIC_CONFIGS
        .iter()
        .map(|d| {
            let mut synonyms = broker_synonyms(&config, d.broker_name);
            let (value, source) = match overrides.get(d.name) {
                Some(v) => {
                    synonyms.insert(0, (d.name.to_string(), v.clone(), ConfigSource::DynamicTopic));
                    (v.clone(), ConfigSource::DynamicTopic)
                }
                None => (config.topic_default(d).to_string(), config.source(d.broker_name)),
            };
            Entry {
                name: d.name.to_string(),
                value,
                source,
                kind: d.kind,
                read_only: false,
                synonyms,
                documentation: None,
            }
        })
        .collect())
}

/// This broker's configs (`name` its node id): every key, the dynamic ones
/// writable; or the cluster default (`name` empty): the keys set there.
fn broker_entries(broker: &Broker, name: &str) -> Result<Vec<Entry>, (ResponseError, String)> {
    let config = broker.config();
    let node = config.node_id().to_string();
    let kind_of = |key: &str| {
        broker_config_type(key)
            .or_else(|| foreign(key).map(|k| k.kind))
            .unwrap_or(ConfigType::String)
    };
    let documentation = |key: &str| foreign(key).map(|_| NOT_ACTED_ON);
    if name.is_empty() {
        return Ok(config
            .dynamic()
            .default
            .iter()
            .map(|(k, v)| Entry {
                name: k.clone(),
                value: v.clone(),
                source: ConfigSource::DynamicDefaultBroker,
                kind: kind_of(k),
                read_only: false,
                // Kafka names only the default itself here.
                synonyms: vec![(k.clone(), v.clone(), ConfigSource::DynamicDefaultBroker)],
                documentation: documentation(k),
            })
            .collect());
    }
    if name != node {
        return Err((
            ResponseError::InvalidRequest,
            format!("broker `{name}` is not this broker ({node})"),
        ));
    }
    let entry = |k: &str, v: &str| Entry {
        name: k.to_string(),
        value: v.to_string(),
        source: config.source(k),
        kind: kind_of(k),
        read_only: !is_dynamic(k),
        synonyms: broker_synonyms(&config, k),
        documentation: documentation(k),
    };
    let mut entries: Vec<Entry> = config.entries().map(|(k, v)| entry(k, v)).collect();
    // Kafka's keys Keel does not use, where they are set: not in force, so
    // not among the entries.
    let layers = config.dynamic();
    let foreign_keys: BTreeSet<&String> = layers
        .broker
        .keys()
        .chain(layers.default.keys())
        .filter(|k| foreign(k).is_some())
        .collect();
    for k in foreign_keys {
        let value = layers.broker.get(k).or_else(|| layers.default.get(k));
        entries.push(entry(k, value.map_or("", String::as_str)));
    }
    Ok(entries)
}

/// A consumer group's configs, as Kafka describes them whether the group
/// exists or not: its own value (GROUP_CONFIG) or the broker's default,
/// which Kafka reports as DEFAULT_CONFIG whatever set it, and which is
/// the synonym either way.
fn group_entries(broker: &Broker, name: &str) -> Vec<Entry> {
    let config = broker.config();
    let set = broker.group_configs.get(name);
    let strings = crate::group_configs::SHARE_CHOICE_CONFIGS
        .iter()
        .map(|(key, kind, default, _)| {
            let (value, source, synonyms) = match set.get(*key) {
                Some(v) => (
                    v.clone(),
                    ConfigSource::GroupConfig,
                    vec![(key.to_string(), v.clone(), ConfigSource::GroupConfig)],
                ),
                None => (default.to_string(), ConfigSource::Default, Vec::new()),
            };
            Entry {
                name: key.to_string(),
                value,
                source,
                kind: *kind,
                read_only: false,
                synonyms,
                documentation: None,
            }
        });
    let ints: Vec<Entry> = GROUP_CONFIGS
        .iter()
        .map(|(key, broker_key)| {
            let default = config.get(broker_key).to_string();
            let mut synonyms = vec![(broker_key.to_string(), default.clone(), ConfigSource::Default)];
            let (value, source) = match set.get(*key) {
                Some(v) => {
                    synonyms.insert(0, (key.to_string(), v.clone(), ConfigSource::GroupConfig));
                    (v.clone(), ConfigSource::GroupConfig)
                }
                None => (default, ConfigSource::Default),
            };
            Entry {
                name: key.to_string(),
                value,
                source,
                kind: ConfigType::Int,
                read_only: false,
                synonyms,
                documentation: None,
            }
        })
        .collect();
    ints.into_iter().chain(strings).collect()
}

/// The loggers with a level of their own, and the root logger.
fn logger_entries(broker: &Broker, name: &str) -> Result<Vec<Entry>, (ResponseError, String)> {
    let node = broker.config().node_id().to_string();
    if name != node {
        return Err((
            ResponseError::InvalidRequest,
            format!("Unexpected broker id, expected {node}, but received {name}"),
        ));
    }
    Ok(broker
        .loggers
        .get()
        .map(|l| l.levels())
        .unwrap_or_default()
        .into_iter()
        .map(|(logger, level)| Entry {
            name: logger,
            value: level,
            source: ConfigSource::DynamicBrokerLogger,
            kind: ConfigType::String,
            read_only: false,
            synonyms: Vec::new(),
            documentation: None,
        })
        .collect())
}

fn to_result(e: Entry, include_synonyms: bool, include_documentation: bool) -> DescribeConfigsResourceResult {
    let synonyms = if include_synonyms {
        e.synonyms
            .into_iter()
            .map(|(n, v, s)| {
                DescribeConfigsSynonym::default()
                    .with_name(str_bytes(n))
                    .with_value(Some(str_bytes(v)))
                    .with_source(s as i8)
            })
            .collect()
    } else {
        Vec::new()
    };
    // Secrets are described as sensitive, without their value (as Kafka does).
    let sensitive = e.kind == ConfigType::Password;
    let synonyms = if sensitive {
        synonyms.into_iter().map(|s| s.with_value(None)).collect()
    } else {
        synonyms
    };
    DescribeConfigsResourceResult::default()
        .with_name(str_bytes(e.name))
        .with_value((!sensitive).then(|| str_bytes(e.value)))
        .with_is_sensitive(sensitive)
        .with_read_only(e.read_only)
        .with_config_source(e.source as i8)
        .with_config_type(e.kind as i8)
        .with_synonyms(synonyms)
        .with_documentation(e.documentation.filter(|_| include_documentation).map(str_bytes))
}

/// ListConfigResources (KIP-1142; v0 was ListClientMetricsResources): the
/// resources that have configs, of the types asked (all if none), in
/// Kafka 4.3.1's order. Keel has no client metrics subscriptions, so that
/// type lists nothing; groups are listed when they set a config; a type
/// Kafka does not list is UNSUPPORTED_VERSION.
pub fn list_config_resources(
    broker: &Broker,
    req: ListConfigResourcesRequest,
    version: i16,
) -> ListConfigResourcesResponse {
    use super::config_resource::RESOURCE_CLIENT_METRICS;
    use keel_protocol::messages::list_config_resources_response::ConfigResource;
    const LISTED: [i8; 5] = [
        RESOURCE_BROKER_LOGGER,
        RESOURCE_BROKER,
        RESOURCE_TOPIC,
        RESOURCE_CLIENT_METRICS,
        RESOURCE_GROUP,
    ];
    // v0 lists client metrics resources only.
    let wanted: Vec<i8> = match (version, req.resource_types.is_empty()) {
        (0, _) => vec![RESOURCE_CLIENT_METRICS],
        (_, true) => LISTED.to_vec(),
        (_, false) => req.resource_types.clone(),
    };
    if wanted.iter().any(|t| !LISTED.contains(t)) {
        return ListConfigResourcesResponse::default()
            .with_error_code(ResponseError::UnsupportedVersion.code());
    }
    let node = broker.config().node_id().to_string();
    let resource = |name: String, kind: i8| {
        ConfigResource::default()
            .with_resource_name(str_bytes(name))
            .with_resource_type(kind)
    };
    let mut out = Vec::new();
    for kind in LISTED.into_iter().filter(|k| wanted.contains(k)) {
        match kind {
            RESOURCE_BROKER_LOGGER | RESOURCE_BROKER => out.push(resource(node.clone(), kind)),
            RESOURCE_TOPIC => {
                let mut names: Vec<String> = broker
                    .data
                    .topics
                    .all()
                    .iter()
                    .map(|t| t.meta.name.clone())
                    .collect();
                names.sort();
                out.extend(names.into_iter().map(|n| resource(n, kind)));
            }
            RESOURCE_GROUP => out.extend(
                broker
                    .group_configs
                    .groups()
                    .into_iter()
                    .map(|g| resource(g, kind)),
            ),
            _ => {}
        }
    }
    ListConfigResourcesResponse::default().with_config_resources(out)
}
