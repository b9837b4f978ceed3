//! The ACLs' coordinator log (`__keel_meta/acls`): one record per ACL,
//! its fields as the key, a tombstone when it is deleted.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use keel_log::Storage;

use super::{Acl, AclIndex, Operation, PatternType, Permission, ResourceType};
use keel_coord::codec::{put_str, Reader, RecordError};
use keel_coord::metalog::{OpenError, StoreError, Table};
use keel_coord::shared::TableStore;

/// One ACL created (`present`) or deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclRecord {
    pub acl: Acl,
    pub present: bool,
}

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;

fn encode_key(acl: &Acl) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(KEY_VERSION);
    b.put_i8(acl.resource_type as i8);
    put_str(&mut b, &acl.resource_name);
    b.put_i8(acl.pattern_type as i8);
    put_str(&mut b, &acl.principal);
    put_str(&mut b, &acl.host);
    b.put_i8(acl.operation as i8);
    b.put_i8(acl.permission as i8);
    b.freeze()
}

fn decode(key: &[u8], value: Option<&[u8]>) -> Result<AclRecord, RecordError> {
    let bad = |what: &str| RecordError(format!("unknown ACL {what}"));
    let mut k = Reader(key);
    if k.i16()? != KEY_VERSION {
        return Err(bad("key version"));
    }
    let resource_type = ResourceType::from_id(k.i8()?).ok_or_else(|| bad("resource type"))?;
    let resource_name = k.string()?;
    let pattern_type = PatternType::from_id(k.i8()?).ok_or_else(|| bad("pattern type"))?;
    let principal = k.string()?;
    let host = k.string()?;
    let operation = Operation::from_id(k.i8()?).ok_or_else(|| bad("operation"))?;
    let permission = Permission::from_id(k.i8()?).ok_or_else(|| bad("permission"))?;
    if let Some(v) = value {
        if Reader(v).i16()? != VALUE_VERSION {
            return Err(bad("value version"));
        }
    }
    Ok(AclRecord {
        acl: Acl {
            resource_type,
            resource_name,
            pattern_type,
            principal,
            host,
            operation,
            permission,
        },
        present: value.is_some(),
    })
}

/// Every ACL, and the same indexed by the resources they can match.
#[derive(Debug, Default)]
pub struct AclTable {
    pub acls: BTreeSet<Acl>,
    index: AclIndex,
}

impl AclTable {
    /// Every ACL that can match the resource `name` of type `t`.
    pub fn matching<'a>(&'a self, t: ResourceType, name: &'a str) -> impl Iterator<Item = &'a Acl> + 'a {
        self.index.matching(t, name)
    }
}

impl Table for AclTable {
    type Record = AclRecord;
    const NAME: &'static str = "acl-log";

    fn apply(&mut self, record: AclRecord) {
        if record.present {
            if self.acls.insert(record.acl.clone()) {
                self.index.insert(record.acl);
            }
        } else if self.acls.remove(&record.acl) {
            self.index.remove(&record.acl);
        }
    }

    fn records(&self) -> Vec<AclRecord> {
        self.acls
            .iter()
            .map(|acl| AclRecord {
                acl: acl.clone(),
                present: true,
            })
            .collect()
    }

    fn encode(record: &AclRecord) -> (Bytes, Option<Bytes>) {
        let value = record
            .present
            .then(|| Bytes::copy_from_slice(&VALUE_VERSION.to_be_bytes()));
        (encode_key(&record.acl), value)
    }

    fn decode(key: &[u8], value: Option<&[u8]>) -> Result<AclRecord, RecordError> {
        decode(key, value)
    }
}

/// The ACLs, in their log.
pub struct AclStore {
    store: TableStore<AclTable>,
}

impl AclStore {
    /// The ACLs in a log of this broker's own under `dir`. Blocking.
    pub fn open_with(storage: Arc<dyn Storage>, dir: &Path) -> Result<AclStore, OpenError> {
        Ok(AclStore::new(TableStore::open(storage, dir, None)?))
    }

    /// The ACLs in `store` (a log, or the cluster's shared table).
    pub fn new(store: TableStore<AclTable>) -> AclStore {
        AclStore { store }
    }

    /// Reads a shared table and follows it (nothing for a log).
    pub async fn load(&self) -> Result<(), StoreError> {
        self.store.load().await
    }

    pub fn with_table<R>(&self, f: impl FnOnce(&AclTable) -> R) -> R {
        self.store.with_table(f)
    }

    pub async fn write(&self, records: Vec<AclRecord>) -> Result<(), StoreError> {
        self.store.write(records).await
    }

    pub fn close(&self) {
        self.store.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_truncation_is_refused() {
        let acl = Acl {
            resource_type: ResourceType::Topic,
            resource_name: "orders-".into(),
            pattern_type: PatternType::Prefixed,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: Operation::Write,
            permission: Permission::Allow,
        };
        for present in [true, false] {
            let record = AclRecord {
                acl: acl.clone(),
                present,
            };
            let (k, v) = AclTable::encode(&record);
            assert_eq!(AclTable::decode(&k, v.as_deref()).unwrap(), record);
            for cut in 0..k.len() {
                assert!(AclTable::decode(&k[..cut], v.as_deref()).is_err(), "cut at {cut}");
            }
        }
    }
}
