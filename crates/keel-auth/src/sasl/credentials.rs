//! SCRAM credentials (KIP-554): what AlterUserScramCredentials sets and
//! SCRAM authentication checks against, the records that persist them in
//! a coordinator log of their own (`__keel_meta/scram`), and the rules a
//! change must meet. Sans-I/O but for [`ScramCredentials`], the log.
//!
//! A credential is kept the way RFC 5802 asks a server to keep it: the
//! salt, the iteration count, `StoredKey = H(HMAC(SaltedPassword, "Client
//! Key"))` and `ServerKey = HMAC(SaltedPassword, "Server Key")`. The
//! password never reaches the broker (the client salts and hashes it) and
//! the salted password is not kept: neither lets anyone log in as the user.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use keel_log::Storage;
use rsasl::mechanisms::scram::tools::derive_keys;
use sha2::{Digest, Sha256, Sha512};

use keel_coord::codec::{put_bytes, put_str, Reader, RecordError};
use keel_coord::metalog::{OpenError, StoreError, Table};
use keel_coord::shared::TableStore;

/// Kafka's SCRAM mechanisms, with their ids in the SCRAM APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScramMechanism {
    Sha256,
    Sha512,
}

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// Kafka's `ScramMechanism` type id (0 is UNKNOWN).
    pub fn from_id(id: i8) -> Option<ScramMechanism> {
        match id {
            1 => Some(ScramMechanism::Sha256),
            2 => Some(ScramMechanism::Sha512),
            _ => None,
        }
    }

    pub fn id(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    /// The SASL mechanism name.
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<ScramMechanism> {
        ScramMechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The length of the hash (and of a salted password).
    pub fn hash_len(self) -> usize {
        match self {
            ScramMechanism::Sha256 => 32,
            ScramMechanism::Sha512 => 64,
        }
    }

    /// Kafka's bounds on the iteration count.
    pub const MIN_ITERATIONS: i32 = 4096;
    pub const MAX_ITERATIONS: i32 = 16384;
}

/// What the broker keeps of one user's password for one mechanism.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Bytes,
    pub stored_key: Bytes,
    pub server_key: Bytes,
    pub iterations: i32,
}

impl ScramCredential {
    /// The credential of a password the client salted and hashed
    /// (AlterUserScramCredentials' `salted_password`).
    pub fn from_salted(
        mechanism: ScramMechanism,
        salt: &[u8],
        salted_password: &[u8],
        iterations: i32,
    ) -> ScramCredential {
        let (stored_key, server_key) = match mechanism {
            ScramMechanism::Sha256 => {
                let (client_key, server_key) = derive_keys::<Sha256>(salted_password);
                (Sha256::digest(client_key).to_vec(), server_key.to_vec())
            }
            ScramMechanism::Sha512 => {
                let (client_key, server_key) = derive_keys::<Sha512>(salted_password);
                (Sha512::digest(client_key).to_vec(), server_key.to_vec())
            }
        };
        ScramCredential {
            salt: Bytes::copy_from_slice(salt),
            stored_key: Bytes::from(stored_key),
            server_key: Bytes::from(server_key),
            iterations,
        }
    }
}

/// One credential set (`Some`) or deleted (`None`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScramRecord {
    pub user: String,
    pub mechanism: ScramMechanism,
    pub credential: Option<ScramCredential>,
}

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;

impl ScramRecord {
    fn encode_key(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(KEY_VERSION);
        put_str(&mut b, &self.user);
        b.put_i8(self.mechanism.id());
        b.freeze()
    }

    fn encode_value(&self) -> Option<Bytes> {
        let c = self.credential.as_ref()?;
        let mut b = BytesMut::new();
        b.put_i16(VALUE_VERSION);
        b.put_i32(c.iterations);
        put_bytes(&mut b, &c.salt);
        put_bytes(&mut b, &c.stored_key);
        put_bytes(&mut b, &c.server_key);
        Some(b.freeze())
    }

    fn decode(key: &[u8], value: Option<&[u8]>) -> Result<ScramRecord, RecordError> {
        let mut k = Reader(key);
        if k.i16()? != KEY_VERSION {
            return Err(RecordError("unknown SCRAM key version".into()));
        }
        let user = k.string()?;
        let mechanism =
            ScramMechanism::from_id(k.i8()?).ok_or_else(|| RecordError("unknown SCRAM mechanism".into()))?;
        let credential = match value {
            None => None,
            Some(v) => {
                let mut r = Reader(v);
                if r.i16()? != VALUE_VERSION {
                    return Err(RecordError("unknown SCRAM value version".into()));
                }
                let iterations = r.i32()?;
                Some(ScramCredential {
                    salt: r.bytes()?,
                    stored_key: r.bytes()?,
                    server_key: r.bytes()?,
                    iterations,
                })
            }
        };
        Ok(ScramRecord {
            user,
            mechanism,
            credential,
        })
    }
}

/// Every user's credentials.
#[derive(Debug, Default)]
pub struct ScramTable {
    pub users: BTreeMap<String, BTreeMap<ScramMechanism, ScramCredential>>,
}

impl Table for ScramTable {
    type Record = ScramRecord;
    const NAME: &'static str = "scram-log";

    fn apply(&mut self, record: ScramRecord) {
        match record.credential {
            Some(c) => {
                self.users
                    .entry(record.user)
                    .or_default()
                    .insert(record.mechanism, c);
            }
            None => {
                if let Some(m) = self.users.get_mut(&record.user) {
                    m.remove(&record.mechanism);
                    if m.is_empty() {
                        self.users.remove(&record.user);
                    }
                }
            }
        }
    }

    fn records(&self) -> Vec<ScramRecord> {
        self.users
            .iter()
            .flat_map(|(user, creds)| {
                creds.iter().map(|(m, c)| ScramRecord {
                    user: user.clone(),
                    mechanism: *m,
                    credential: Some(c.clone()),
                })
            })
            .collect()
    }

    fn encode(record: &ScramRecord) -> (Bytes, Option<Bytes>) {
        (record.encode_key(), record.encode_value())
    }

    fn decode(key: &[u8], value: Option<&[u8]>) -> Result<ScramRecord, RecordError> {
        ScramRecord::decode(key, value)
    }
}

/// A change AlterUserScramCredentials asks for.
#[derive(Debug, Clone)]
pub enum Alteration {
    Delete {
        user: String,
        mechanism: i8,
    },
    Upsert {
        user: String,
        mechanism: i8,
        iterations: i32,
        salt: Bytes,
        salted_password: Bytes,
    },
}

impl Alteration {
    fn user(&self) -> &str {
        match self {
            Alteration::Delete { user, .. } | Alteration::Upsert { user, .. } => user,
        }
    }

    fn mechanism(&self) -> i8 {
        match self {
            Alteration::Delete { mechanism, .. } | Alteration::Upsert { mechanism, .. } => *mechanism,
        }
    }
}

/// Why a user's alterations were refused: Kafka's error and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: keel_protocol::ResponseError,
    pub message: String,
}

fn refuse(error: keel_protocol::ResponseError, message: impl Into<String>) -> Refusal {
    Refusal {
        error,
        message: message.into(),
    }
}

/// Checks a request's alterations against `table`, as Kafka does: each
/// user's are applied all or none. Returns, per user in request order,
/// the records to write or why none are.
pub fn plan(
    table: &ScramTable,
    alterations: &[Alteration],
) -> Vec<(String, Result<Vec<ScramRecord>, Refusal>)> {
    use keel_protocol::ResponseError as E;
    let mut users: Vec<String> = Vec::new();
    for a in alterations {
        if !users.iter().any(|u| u == a.user()) {
            users.push(a.user().to_string());
        }
    }
    users
        .into_iter()
        .map(|user| {
            let mine: Vec<&Alteration> = alterations.iter().filter(|a| a.user() == user).collect();
            let outcome = (|| {
                if user.is_empty() {
                    return Err(refuse(E::UnacceptableCredential, "Username must not be empty"));
                }
                let mut seen = Vec::new();
                let mut records = Vec::new();
                for a in &mine {
                    let mechanism = ScramMechanism::from_id(a.mechanism())
                        .ok_or_else(|| refuse(E::UnsupportedSaslMechanism, "Unknown SCRAM mechanism"))?;
                    if seen.contains(&mechanism) {
                        return Err(refuse(
                            E::DuplicateResource,
                            "A user credential cannot be altered twice in the same request",
                        ));
                    }
                    seen.push(mechanism);
                    match a {
                        Alteration::Delete { .. } => {
                            let exists = table.users.get(&user).is_some_and(|m| m.contains_key(&mechanism));
                            if !exists {
                                return Err(refuse(
                                    E::ResourceNotFound,
                                    "Attempt to delete a user credential that does not exist",
                                ));
                            }
                            records.push(ScramRecord {
                                user: user.clone(),
                                mechanism,
                                credential: None,
                            });
                        }
                        Alteration::Upsert {
                            iterations,
                            salt,
                            salted_password,
                            ..
                        } => {
                            if *iterations < ScramMechanism::MIN_ITERATIONS {
                                return Err(refuse(E::UnacceptableCredential, "Too few iterations"));
                            }
                            if *iterations > ScramMechanism::MAX_ITERATIONS {
                                return Err(refuse(E::UnacceptableCredential, "Too many iterations"));
                            }
                            if salt.is_empty() || salted_password.len() != mechanism.hash_len() {
                                return Err(refuse(
                                    E::UnacceptableCredential,
                                    format!(
                                        "A {} credential needs a salt and a salted password of {} bytes",
                                        mechanism.name(),
                                        mechanism.hash_len()
                                    ),
                                ));
                            }
                            records.push(ScramRecord {
                                user: user.clone(),
                                mechanism,
                                credential: Some(ScramCredential::from_salted(
                                    mechanism,
                                    salt,
                                    salted_password,
                                    *iterations,
                                )),
                            });
                        }
                    }
                }
                Ok(records)
            })();
            (user, outcome)
        })
        .collect()
}

/// The SCRAM credentials, in their log. Shared by the SASL listeners
/// (which read them at each authentication) and the SCRAM APIs.
pub struct ScramCredentials {
    store: TableStore<ScramTable>,
}

impl ScramCredentials {
    /// The credentials in a log of this broker's own under `dir`. Blocking.
    pub fn open_with(storage: Arc<dyn Storage>, dir: &Path) -> Result<ScramCredentials, OpenError> {
        Ok(ScramCredentials::new(TableStore::open(storage, dir, None)?))
    }

    /// The credentials in `store` (a log, or the cluster's shared table).
    pub fn new(store: TableStore<ScramTable>) -> ScramCredentials {
        ScramCredentials { store }
    }

    /// Reads a shared table and follows it (nothing for a log).
    pub async fn load(&self) -> Result<(), StoreError> {
        self.store.load().await
    }

    /// `user`'s credential for `mechanism`.
    pub fn get(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
        self.store
            .with_table(|t| t.users.get(user).and_then(|m| m.get(&mechanism)).cloned())
    }

    /// Reads the table.
    pub fn with_table<R>(&self, f: impl FnOnce(&ScramTable) -> R) -> R {
        self.store.with_table(f)
    }

    pub async fn write(&self, records: Vec<ScramRecord>) -> Result<(), StoreError> {
        self.store.write(records).await
    }

    pub fn close(&self) {
        self.store.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::ResponseError as E;

    fn upsert(user: &str, mechanism: i8, iterations: i32, len: usize) -> Alteration {
        Alteration::Upsert {
            user: user.into(),
            mechanism,
            iterations,
            salt: Bytes::from_static(b"salt"),
            salted_password: Bytes::from(vec![7u8; len]),
        }
    }

    #[test]
    fn records_round_trip() {
        let record = ScramRecord {
            user: "alice".into(),
            mechanism: ScramMechanism::Sha512,
            credential: Some(ScramCredential::from_salted(
                ScramMechanism::Sha512,
                b"salt",
                &[1; 64],
                8192,
            )),
        };
        let (k, v) = ScramTable::encode(&record);
        assert_eq!(ScramTable::decode(&k, v.as_deref()).unwrap(), record);
        let tombstone = ScramRecord {
            credential: None,
            ..record
        };
        let (k, v) = ScramTable::encode(&tombstone);
        assert_eq!(ScramTable::decode(&k, v.as_deref()).unwrap(), tombstone);
        // Truncated values are refused, not read past.
        let (k, v) = ScramTable::encode(&ScramRecord {
            user: "a".into(),
            mechanism: ScramMechanism::Sha256,
            credential: Some(ScramCredential::from_salted(
                ScramMechanism::Sha256,
                b"s",
                &[1; 32],
                4096,
            )),
        });
        let v = v.unwrap();
        for cut in 0..v.len() {
            assert!(ScramTable::decode(&k, Some(&v[..cut])).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn plan_follows_kafkas_rules() {
        let mut table = ScramTable::default();
        let ok = plan(
            &table,
            &[upsert("alice", 1, 4096, 32), upsert("alice", 2, 8192, 64)],
        );
        assert_eq!(ok.len(), 1);
        let records = ok[0].1.clone().unwrap();
        assert_eq!(records.len(), 2);
        for r in records {
            table.apply(r);
        }
        let cases: Vec<(Vec<Alteration>, E)> = vec![
            (vec![upsert("", 1, 4096, 32)], E::UnacceptableCredential),
            (vec![upsert("bob", 3, 4096, 32)], E::UnsupportedSaslMechanism),
            (vec![upsert("bob", 1, 4095, 32)], E::UnacceptableCredential),
            (vec![upsert("bob", 1, 16385, 32)], E::UnacceptableCredential),
            (vec![upsert("bob", 2, 4096, 32)], E::UnacceptableCredential),
            (
                vec![upsert("bob", 1, 4096, 32), upsert("bob", 1, 8192, 32)],
                E::DuplicateResource,
            ),
            (
                vec![
                    Alteration::Delete {
                        user: "bob".into(),
                        mechanism: 1,
                    },
                    upsert("bob", 1, 8192, 32),
                ],
                E::ResourceNotFound,
            ),
        ];
        for (alterations, error) in cases {
            let planned = plan(&table, &alterations);
            assert_eq!(planned[0].1.as_ref().unwrap_err().error, error, "{alterations:?}");
        }
        // Each user on their own: bob's refusal does not stop carol's.
        let planned = plan(
            &table,
            &[
                upsert("bob", 1, 100, 32),
                upsert("carol", 1, 4096, 32),
                Alteration::Delete {
                    user: "alice".into(),
                    mechanism: 2,
                },
            ],
        );
        assert_eq!(planned.len(), 3);
        assert!(planned[0].1.is_err());
        assert!(planned[1].1.is_ok());
        assert_eq!(planned[2].1.as_ref().unwrap()[0].credential, None);
    }
}
