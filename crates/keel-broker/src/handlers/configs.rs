//! DescribeConfigs for topics and the broker.

use keel_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::config_resource::{RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_TOPIC};
use super::str_bytes;
use crate::config::{ConfigType, BROKER_CONFIGS, TOPIC_CONFIGS};
use crate::Broker;

/// Kafka's config sources.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
const SOURCE_BROKER_LOGGER: i8 = 6;

struct Entry {
    name: String,
    value: String,
    source: i8,
    kind: ConfigType,
    read_only: bool,
    synonyms: Vec<(String, String, i8)>,
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
                        .map(|e| to_result(e, req.include_synonyms))
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

fn broker_source(broker: &Broker, key: &str) -> i8 {
    if broker.config.is_explicit(key) {
        SOURCE_STATIC_BROKER
    } else {
        SOURCE_DEFAULT
    }
}

fn topic_entries(broker: &Broker, name: &str) -> Result<Vec<Entry>, (ResponseError, String)> {
    let topic = broker.topics.get(name).ok_or((
        ResponseError::UnknownTopicOrPartition,
        format!("topic `{name}` does not exist"),
    ))?;
    let overrides = &topic.meta.configs;
    Ok(TOPIC_CONFIGS
        .iter()
        .map(|d| {
            let default = broker.config.topic_default(d).to_string();
            let broker_syn = (
                d.broker_name.to_string(),
                default,
                broker_source(broker, d.broker_name),
            );
            let (value, source, synonyms) = match overrides.get(d.name) {
                Some(v) => (
                    v.clone(),
                    SOURCE_TOPIC,
                    vec![(d.name.to_string(), v.clone(), SOURCE_TOPIC), broker_syn],
                ),
                None => (broker_syn.1.clone(), broker_syn.2, vec![broker_syn]),
            };
            Entry {
                name: d.name.to_string(),
                value,
                source,
                kind: d.kind,
                read_only: false,
                synonyms,
            }
        })
        .collect())
}

fn broker_entries(broker: &Broker, name: &str) -> Result<Vec<Entry>, (ResponseError, String)> {
    let node = broker.config.node_id().to_string();
    if !name.is_empty() && name != node {
        return Err((
            ResponseError::InvalidRequest,
            format!("broker `{name}` is not this broker ({node})"),
        ));
    }
    let kind_of = |key: &str| {
        BROKER_CONFIGS
            .iter()
            .find(|(n, _, _)| *n == key)
            .map(|(_, _, k)| *k)
            .or_else(|| {
                TOPIC_CONFIGS
                    .iter()
                    .find(|d| d.broker_name == key)
                    .map(|d| d.kind)
            })
            .unwrap_or(ConfigType::String)
    };
    Ok(broker
        .config
        .entries()
        .map(|(k, v)| {
            let source = broker_source(broker, k);
            Entry {
                name: k.to_string(),
                value: v.to_string(),
                source,
                kind: kind_of(k),
                read_only: true,
                synonyms: vec![(k.to_string(), v.to_string(), source)],
            }
        })
        .collect())
}

/// The loggers with a level of their own, and the root logger.
fn logger_entries(broker: &Broker, name: &str) -> Result<Vec<Entry>, (ResponseError, String)> {
    let node = broker.config.node_id().to_string();
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
            source: SOURCE_BROKER_LOGGER,
            kind: ConfigType::String,
            read_only: false,
            synonyms: Vec::new(),
        })
        .collect())
}

fn to_result(e: Entry, include_synonyms: bool) -> DescribeConfigsResourceResult {
    let synonyms = if include_synonyms {
        e.synonyms
            .into_iter()
            .map(|(n, v, s)| {
                DescribeConfigsSynonym::default()
                    .with_name(str_bytes(n))
                    .with_value(Some(str_bytes(v)))
                    .with_source(s)
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
        .with_config_source(e.source)
        .with_config_type(e.kind as i8)
        .with_synonyms(synonyms)
}
