//! The client quotas set with AlterClientQuotas: Kafka's entities (`user`,
//! `client-id`, `ip`, each a name or the type's default) and their quota
//! values, the records that persist them, and which quota applies to a
//! client. Sans-I/O.

use std::collections::BTreeMap;
use std::net::IpAddr;

use bytes::{BufMut, Bytes, BytesMut};

use keel_coord::codec::{put_opt_str, put_str, Reader, RecordError};
use keel_coord::metalog::Table;

pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";
pub const IP: &str = "ip";

/// Kafka's quota keys: producer and consumer bytes per second.
pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
/// Kafka's quota on request handling time: percent of one request thread.
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
/// Kafka's quota on partitions created and deleted per second (KIP-599).
pub const CONTROLLER_MUTATION_RATE: &str = "controller_mutation_rate";
/// Kafka's quota on new connections per second from one address (KIP-612).
pub const CONNECTION_CREATION_RATE: &str = "connection_creation_rate";

/// An entity: each type at most once, sorted; a `None` name is the type's
/// default (`--entity-default`).
pub type Entity = BTreeMap<String, Option<String>>;

/// One quota value set (`Some`) or removed (`None`).
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaRecord {
    pub entity: Entity,
    pub key: String,
    pub value: Option<f64>,
}

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;

impl QuotaRecord {
    pub fn encode_key(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(KEY_VERSION);
        b.put_i16(self.entity.len() as i16);
        for (kind, name) in &self.entity {
            put_str(&mut b, kind);
            put_opt_str(&mut b, name.as_deref());
        }
        put_str(&mut b, &self.key);
        b.freeze()
    }

    pub fn encode_value(&self) -> Option<Bytes> {
        let v = self.value?;
        let mut b = BytesMut::new();
        b.put_i16(VALUE_VERSION);
        b.put_f64(v);
        Some(b.freeze())
    }

    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<QuotaRecord, RecordError> {
        let mut k = Reader(key);
        if k.i16()? != KEY_VERSION {
            return Err(RecordError("unknown quota key version".into()));
        }
        let n = k.i16()?;
        let mut entity = Entity::new();
        for _ in 0..n.max(0) {
            let kind = k.string()?;
            let name = k.opt_string()?;
            entity.insert(kind, name);
        }
        let quota_key = k.string()?;
        let value = match value {
            None => None,
            Some(v) => {
                let mut r = Reader(v);
                if r.i16()? != VALUE_VERSION {
                    return Err(RecordError("unknown quota value version".into()));
                }
                r.need(8)?;
                Some(f64::from_bits(r.i64()? as u64))
            }
        };
        Ok(QuotaRecord {
            entity,
            key: quota_key,
            value,
        })
    }
}

/// Every entity's quotas.
#[derive(Debug, Default)]
pub struct QuotaTable {
    pub quotas: BTreeMap<Entity, BTreeMap<String, f64>>,
}

impl Table for QuotaTable {
    type Record = QuotaRecord;
    const NAME: &'static str = "quota-log";

    fn apply(&mut self, record: QuotaRecord) {
        match record.value {
            Some(v) => {
                self.quotas
                    .entry(record.entity)
                    .or_default()
                    .insert(record.key, v);
            }
            None => {
                if let Some(values) = self.quotas.get_mut(&record.entity) {
                    values.remove(&record.key);
                    if values.is_empty() {
                        self.quotas.remove(&record.entity);
                    }
                }
            }
        }
    }

    fn records(&self) -> Vec<QuotaRecord> {
        self.quotas
            .iter()
            .flat_map(|(entity, values)| {
                values.iter().map(|(key, v)| QuotaRecord {
                    entity: entity.clone(),
                    key: key.clone(),
                    value: Some(*v),
                })
            })
            .collect()
    }

    fn encode(record: &QuotaRecord) -> (Bytes, Option<Bytes>) {
        (record.encode_key(), record.encode_value())
    }

    fn decode(key: &[u8], value: Option<&[u8]>) -> Result<QuotaRecord, RecordError> {
        QuotaRecord::decode(key, value)
    }
}

/// Whose rate a quota limits: the `(user, client-id)` a rate is kept for.
/// Clients that match a quota set for a user alone share the user's rate;
/// one set for client ids (named or default) gives each client id its own.
pub type RateKey = (String, String);

impl QuotaTable {
    /// The quota `key` that applies to requests of `user` from `client_id`,
    /// in Kafka's order (the most specific first), and the rate it limits.
    pub fn resolve(&self, key: &str, user: &str, client_id: &str) -> Option<(f64, RateKey)> {
        // Every request asks: without quotas, at no cost.
        if self.quotas.is_empty() {
            return None;
        }
        let named = |s: &str| Some(s.to_string());
        let u = || named(user);
        let c = || named(client_id);
        let both = (user.to_string(), client_id.to_string());
        let user_only = (user.to_string(), String::new());
        let client_only = (String::new(), client_id.to_string());
        let order: [(Entity, &RateKey); 8] = [
            (entity(&[(USER, u()), (CLIENT_ID, c())]), &both),
            (entity(&[(USER, u()), (CLIENT_ID, None)]), &both),
            (entity(&[(USER, u())]), &user_only),
            (entity(&[(USER, None), (CLIENT_ID, c())]), &both),
            (entity(&[(USER, None), (CLIENT_ID, None)]), &both),
            (entity(&[(USER, None)]), &user_only),
            (entity(&[(CLIENT_ID, c())]), &client_only),
            (entity(&[(CLIENT_ID, None)]), &client_only),
        ];
        let found = order.into_iter().find_map(|(e, rate)| {
            self.quotas
                .get(&e)
                .and_then(|values| values.get(key))
                .map(|v| (*v, rate.clone()))
        });
        found
    }
}

impl QuotaTable {
    /// The `connection_creation_rate` of connections from `ip`: the
    /// address's own quota, else the `ip` default. An entity's name is
    /// compared as an address, so `::1` and `0:0::1` are the same.
    pub fn resolve_ip(&self, ip: IpAddr) -> Option<f64> {
        let mut default = None;
        for (entity, values) in &self.quotas {
            let (Some(name), 1) = (entity.get(IP), entity.len()) else {
                continue;
            };
            let Some(v) = values.get(CONNECTION_CREATION_RATE) else {
                continue;
            };
            match name {
                Some(named) if named.parse::<IpAddr>().ok() == Some(ip) => return Some(*v),
                None => default = Some(*v),
                Some(_) => {}
            }
        }
        default
    }
}

/// An entity from `(type, name)` pairs.
pub fn entity(parts: &[(&str, Option<String>)]) -> Entity {
    parts.iter().map(|(k, n)| (k.to_string(), n.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(t: &mut QuotaTable, parts: &[(&str, Option<&str>)], key: &str, v: f64) {
        let e = parts
            .iter()
            .map(|(k, n)| (k.to_string(), n.map(str::to_string)))
            .collect();
        t.apply(QuotaRecord {
            entity: e,
            key: key.into(),
            value: Some(v),
        });
    }

    #[test]
    fn records_round_trip_with_defaults_and_tombstones() {
        let r = QuotaRecord {
            entity: entity(&[(USER, None), (CLIENT_ID, Some("app".into()))]),
            key: PRODUCER_BYTE_RATE.into(),
            value: Some(1048576.5),
        };
        let (k, v) = QuotaTable::encode(&r);
        assert_eq!(QuotaRecord::decode(&k, v.as_deref()).unwrap(), r);
        let gone = QuotaRecord { value: None, ..r };
        let (k, v) = QuotaTable::encode(&gone);
        assert_eq!(QuotaRecord::decode(&k, v.as_deref()).unwrap(), gone);
        assert!(QuotaRecord::decode(&k[..k.len() - 1], None).is_err());
    }

    #[test]
    fn the_most_specific_quota_wins_in_kafkas_order() {
        let mut t = QuotaTable::default();
        let k = PRODUCER_BYTE_RATE;
        assert_eq!(t.resolve(k, "alice", "app"), None);
        set(&mut t, &[(CLIENT_ID, None)], k, 8.0);
        assert_eq!(
            t.resolve(k, "alice", "app"),
            Some((8.0, ("".into(), "app".into())))
        );
        set(&mut t, &[(CLIENT_ID, Some("app"))], k, 7.0);
        assert_eq!(t.resolve(k, "alice", "app").unwrap().0, 7.0);
        set(&mut t, &[(USER, None)], k, 6.0);
        assert_eq!(
            t.resolve(k, "alice", "app"),
            Some((6.0, ("alice".into(), "".into())))
        );
        set(&mut t, &[(USER, None), (CLIENT_ID, None)], k, 5.0);
        assert_eq!(
            t.resolve(k, "alice", "app"),
            Some((5.0, ("alice".into(), "app".into())))
        );
        set(&mut t, &[(USER, None), (CLIENT_ID, Some("app"))], k, 4.0);
        assert_eq!(t.resolve(k, "alice", "app").unwrap().0, 4.0);
        set(&mut t, &[(USER, Some("alice"))], k, 3.0);
        assert_eq!(
            t.resolve(k, "alice", "app"),
            Some((3.0, ("alice".into(), "".into())))
        );
        set(&mut t, &[(USER, Some("alice")), (CLIENT_ID, None)], k, 2.0);
        assert_eq!(t.resolve(k, "alice", "app").unwrap().0, 2.0);
        set(&mut t, &[(USER, Some("alice")), (CLIENT_ID, Some("app"))], k, 1.0);
        assert_eq!(t.resolve(k, "alice", "app").unwrap().0, 1.0);
        // Another key, another user: each resolves on its own.
        assert_eq!(t.resolve(CONSUMER_BYTE_RATE, "alice", "app"), None);
        assert_eq!(t.resolve(k, "bob", "app").unwrap().0, 4.0);
        assert_eq!(t.resolve(k, "bob", "other").unwrap().0, 5.0);
    }

    #[test]
    fn an_address_has_its_own_connection_rate_or_the_default() {
        let mut t = QuotaTable::default();
        let k = CONNECTION_CREATION_RATE;
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        assert_eq!(t.resolve_ip(local), None);
        set(&mut t, &[(IP, None)], k, 20.0);
        assert_eq!(t.resolve_ip(local), Some(20.0));
        set(&mut t, &[(IP, Some("0:0::1"))], k, 5.0);
        set(&mut t, &[(IP, Some("10.0.0.1"))], PRODUCER_BYTE_RATE, 5.0);
        assert_eq!(t.resolve_ip(v6), Some(5.0));
        assert_eq!(t.resolve_ip(local), Some(20.0));
        assert_eq!(t.resolve_ip("10.0.0.1".parse().unwrap()), Some(20.0));
    }
}
