//! DescribeClientQuotas and AlterClientQuotas: `kafka-configs --describe /
//! --alter --entity-type users / clients / ips`, `Admin.alterClientQuotas`.
//! The quotas and their enforcement are `crate::quotas`.

use std::collections::HashSet;
use std::net::IpAddr;

use keel_protocol::messages::alter_client_quotas_response::{EntityData, EntryData};
use keel_protocol::messages::describe_client_quotas_response::{
    EntityData as DescribedEntity, EntryData as DescribedEntry, ValueData,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::admin::AdminError;
use super::str_bytes;
use crate::quotas::table::{
    Entity, QuotaRecord, CLIENT_ID, CONNECTION_CREATION_RATE, CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE,
    IP, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, USER,
};
use crate::Broker;

/// Kafka's quota keys for users and client ids, and for ips.
const CLIENT_KEYS: &[&str] = &[
    PRODUCER_BYTE_RATE,
    CONSUMER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    CONTROLLER_MUTATION_RATE,
];
const IP_KEYS: &[&str] = &[CONNECTION_CREATION_RATE];
/// Kafka's LONG quota keys (the others are DOUBLE).
const LONG_KEYS: &[&str] = &[PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, CONNECTION_CREATION_RATE];

/// DescribeClientQuotas' match types.
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_ANY: i8 = 2;

pub fn describe_client_quotas(
    broker: &Broker,
    req: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    match describe(broker, &req) {
        Ok(entries) => DescribeClientQuotasResponse::default().with_entries(Some(entries)),
        Err((error, message)) => DescribeClientQuotasResponse::default()
            .with_entries(None)
            .with_error_code(error.code())
            .with_error_message(Some(str_bytes(message))),
    }
}

fn describe(broker: &Broker, req: &DescribeClientQuotasRequest) -> Result<Vec<DescribedEntry>, AdminError> {
    check_filter(&req.components)?;
    let matches = |entity: &Entity| {
        let components_match = req
            .components
            .iter()
            .all(|c| match entity.get(c.entity_type.as_str()) {
                None => false,
                Some(name) => match c.match_type {
                    MATCH_EXACT => name.as_deref() == c._match.as_ref().map(|m| m.as_str()),
                    MATCH_DEFAULT => name.is_none(),
                    _ => true,
                },
            });
        components_match && (!req.strict || entity.len() == req.components.len())
    };
    Ok(broker
        .quotas
        .all()
        .into_iter()
        .filter(|(entity, _)| matches(entity))
        .map(|(entity, values)| {
            DescribedEntry::default()
                .with_entity(
                    entity
                        .into_iter()
                        .map(|(kind, name)| {
                            DescribedEntity::default()
                                .with_entity_type(str_bytes(kind))
                                .with_entity_name(name.map(str_bytes))
                        })
                        .collect(),
                )
                .with_values(
                    values
                        .into_iter()
                        .map(|(key, value)| ValueData::default().with_key(str_bytes(key)).with_value(value))
                        .collect(),
                )
        })
        .collect())
}

/// Kafka's checks of a filter, in its order (probed on Kafka 4.3.1): one
/// pass over the components, each checked for an empty type, a type Kafka
/// does not know, a repeated type and its match, then the combination.
fn check_filter(components: &[describe_client_quotas_request::ComponentData]) -> Result<(), AdminError> {
    let invalid = |m: String| (ResponseError::InvalidRequest, m);
    let mut seen = HashSet::new();
    for c in components {
        let kind = c.entity_type.as_str();
        if kind.is_empty() {
            return Err(invalid("Invalid empty entity type.".into()));
        }
        if ![USER, CLIENT_ID, IP].contains(&kind) {
            return Err((
                ResponseError::UnsupportedVersion,
                format!("Unsupported entity type {kind}"),
            ));
        }
        if !seen.insert(kind) {
            return Err(invalid(format!(
                "Entity type {kind} cannot appear more than once in the filter."
            )));
        }
        let named = c._match.is_some();
        match c.match_type {
            MATCH_EXACT if !named => {
                return Err(invalid(
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.".into(),
                ))
            }
            MATCH_DEFAULT if named => {
                return Err(invalid(
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.".into(),
                ))
            }
            MATCH_ANY if named => {
                return Err(invalid(
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.".into(),
                ))
            }
            MATCH_EXACT | MATCH_DEFAULT | MATCH_ANY => {}
            other => return Err(invalid(format!("Unknown match type {other}"))),
        }
    }
    if seen.contains(IP) && (seen.contains(USER) || seen.contains(CLIENT_ID)) {
        return Err(invalid(
            "Invalid entity filter component combination. IP filter component should not be used \
             with user or clientId filter component."
                .into(),
        ));
    }
    Ok(())
}

pub async fn alter_client_quotas(
    broker: &Broker,
    req: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    // Kafka answers once per entity: an entity named again in the same
    // request is answered "Ignoring duplicate entity", while the changes
    // of its first entry stand.
    let mut results: Vec<(Entity, EntryData)> = Vec::with_capacity(req.entries.len());
    for entry in &req.entries {
        let named: Entity = entry
            .entity
            .iter()
            .map(|e| {
                (
                    e.entity_type.to_string(),
                    e.entity_name.as_ref().map(|n| n.to_string()),
                )
            })
            .collect();
        if let Some((_, answered)) = results.iter_mut().find(|(e, _)| *e == named) {
            let message = format!("Ignoring duplicate entity {}", entity_text(&named));
            answered.error_code = ResponseError::InvalidRequest.code();
            answered.error_message = Some(str_bytes(message));
            continue;
        }
        let outcome = match check_entry(entry) {
            Ok(_) if req.validate_only => Ok(()),
            Ok(records) => broker
                .quotas
                .write(records)
                .await
                .map_err(|e| (ResponseError::UnknownServerError, e.to_string())),
            Err(e) => Err(e),
        };
        let entity = entry
            .entity
            .iter()
            .map(|e| {
                EntityData::default()
                    .with_entity_type(e.entity_type.clone())
                    .with_entity_name(e.entity_name.clone())
            })
            .collect();
        let (code, message) = match outcome {
            Ok(()) => (0, None),
            Err((error, message)) => (error.code(), Some(str_bytes(message))),
        };
        let answer = EntryData::default()
            .with_error_code(code)
            .with_error_message(message)
            .with_entity(entity);
        results.push((named, answer));
    }
    AlterClientQuotasResponse::default().with_entries(results.into_iter().map(|(_, a)| a).collect())
}

/// Kafka's checks of one entry (probed on Kafka 4.3.1, messages
/// included); the records that make its changes.
fn check_entry(entry: &alter_client_quotas_request::EntryData) -> Result<Vec<QuotaRecord>, AdminError> {
    let invalid = |m: String| (ResponseError::InvalidRequest, m);
    let mut entity = Entity::new();
    for e in &entry.entity {
        let kind = e.entity_type.as_str();
        if ![USER, CLIENT_ID, IP].contains(&kind) {
            return Err(invalid(format!("Unhandled client quota entity type: {kind}")));
        }
        if e.entity_name.as_ref().is_some_and(|n| n.is_empty()) {
            return Err(invalid(format!("Empty {kind} not supported")));
        }
        // A type named twice: the last one counts, as in Kafka.
        entity.insert(kind.to_string(), e.entity_name.as_ref().map(|n| n.to_string()));
    }
    if entity.is_empty() {
        return Err(invalid("Invalid empty client quota entity".into()));
    }
    let is_ip = entity.contains_key(IP);
    if is_ip && entity.len() > 1 {
        return Err(invalid(
            "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId".into(),
        ));
    }
    if let Some(Some(ip)) = entity.get(IP) {
        if ip.parse::<IpAddr>().is_err() {
            return Err(invalid(format!("{ip} is not a valid IP or resolvable host.")));
        }
    }
    let allowed = if is_ip { IP_KEYS } else { CLIENT_KEYS };
    let mut keys = HashSet::new();
    let mut records = Vec::with_capacity(entry.ops.len());
    for op in &entry.ops {
        let key = op.key.as_str();
        if !keys.insert(key) {
            return Err(invalid(format!(
                "Ignoring duplicate entity {}",
                entity_text(&entity)
            )));
        }
        // Removing a key is not checked (Kafka accepts removing any).
        if !op.remove && !allowed.contains(&key) {
            return Err(invalid(format!("Invalid configuration key {key}")));
        }
        let value = if op.remove {
            None
        } else {
            let v = op.value;
            // Kafka lets NaN through; no rate can be held to it.
            if v.is_nan() || v <= 0.0 {
                return Err(invalid(format!("Quota {key} must be greater than 0")));
            }
            // The byte rates are Kafka LONG configs.
            if LONG_KEYS.contains(&key) {
                if v >= i64::MAX as f64 {
                    return Err(invalid(format!(
                        "Proposed value for {key} is too large for a LONG."
                    )));
                }
                if v.fract() != 0.0 {
                    return Err(invalid(format!("{key} cannot be a fractional value.")));
                }
            }
            Some(v)
        };
        records.push(QuotaRecord {
            entity: entity.clone(),
            key: key.to_string(),
            value,
        });
    }
    Ok(records)
}

/// An entity as Kafka prints one:
/// `ClientQuotaEntity(entries={user=alice, client-id=null})`.
fn entity_text(entity: &Entity) -> String {
    let parts: Vec<String> = entity
        .iter()
        .map(|(kind, name)| format!("{kind}={}", name.as_deref().unwrap_or("null")))
        .collect();
    format!("ClientQuotaEntity(entries={{{}}})", parts.join(", "))
}
