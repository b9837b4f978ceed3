//! ACLs with Kafka's StandardAuthorizer semantics (KIP-801): turned on by
//! `authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer`,
//! managed with CreateAcls, DescribeAcls and DeleteAcls (`kafka-acls`),
//! kept in a coordinator log of their own ([`store`]).
//!
//! A request's principal (`User:<name>`, `User:ANONYMOUS` without
//! authentication) may perform an operation on a resource when it is one
//! of `super.users`, or when no ACL matching the principal and its host
//! denies the operation (or ALL) and one allows it (or ALL, or an
//! operation that implies it: READ, WRITE, DELETE and ALTER imply
//! DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS). A resource no ACL
//! names at all is open to everyone only with
//! `allow.everyone.if.no.acl.found=true`. An ACL names a resource
//! literally (the name `*` is every resource of its type) or by prefix.
//!
//! Each decision is logged on the `keel::authorizer` target: denials at
//! info, allows at debug, naming principal, operation, host and resource.
//! Sans-I/O but for the store.

pub mod index;
pub mod store;

pub use index::AclIndex;

use std::collections::BTreeSet;

use crate::{SettingError, Settings};

/// The class name that turns ACLs on, as in a KRaft Kafka config.
pub const STANDARD_AUTHORIZER: &str = "org.apache.kafka.metadata.authorizer.StandardAuthorizer";

/// The cluster resource's name.
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// The name of a literal ACL that names every resource of its type.
pub const WILDCARD: &str = "*";

/// Kafka's `ResourceType` ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceType {
    Topic = 2,
    Group = 3,
    Cluster = 4,
    TransactionalId = 5,
    DelegationToken = 6,
    User = 7,
}

impl ResourceType {
    pub const ALL: [ResourceType; 6] = [
        ResourceType::Topic,
        ResourceType::Group,
        ResourceType::Cluster,
        ResourceType::TransactionalId,
        ResourceType::DelegationToken,
        ResourceType::User,
    ];

    pub fn from_id(id: i8) -> Option<ResourceType> {
        ResourceType::ALL.into_iter().find(|r| *r as i8 == id)
    }

    /// Kafka's name in log lines (`Topic`, `Group`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ResourceType::Topic => "Topic",
            ResourceType::Group => "Group",
            ResourceType::Cluster => "Cluster",
            ResourceType::TransactionalId => "TransactionalId",
            ResourceType::DelegationToken => "DelegationToken",
            ResourceType::User => "User",
        }
    }

    /// The operations Kafka defines on this type, for authorized-operation
    /// masks.
    pub fn operations(self) -> &'static [Operation] {
        use Operation::*;
        match self {
            ResourceType::Topic => &[
                Read,
                Write,
                Create,
                Delete,
                Alter,
                Describe,
                DescribeConfigs,
                AlterConfigs,
            ],
            ResourceType::Group => &[Read, Describe, Delete],
            ResourceType::Cluster => &[
                Create,
                ClusterAction,
                DescribeConfigs,
                AlterConfigs,
                IdempotentWrite,
                Alter,
                Describe,
            ],
            ResourceType::TransactionalId => &[Describe, Write],
            ResourceType::DelegationToken => &[Describe],
            ResourceType::User => &[CreateTokens, DescribeTokens],
        }
    }
}

/// Kafka's `PatternType` ids an ACL can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PatternType {
    Literal = 3,
    Prefixed = 4,
}

impl PatternType {
    pub fn from_id(id: i8) -> Option<PatternType> {
        match id {
            3 => Some(PatternType::Literal),
            4 => Some(PatternType::Prefixed),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PatternType::Literal => "LITERAL",
            PatternType::Prefixed => "PREFIXED",
        }
    }
}

/// Kafka's `AclOperation` ids an ACL can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    All = 2,
    Read = 3,
    Write = 4,
    Create = 5,
    Delete = 6,
    Alter = 7,
    Describe = 8,
    ClusterAction = 9,
    DescribeConfigs = 10,
    AlterConfigs = 11,
    IdempotentWrite = 12,
    CreateTokens = 13,
    DescribeTokens = 14,
    TwoPhaseCommit = 15,
}

impl Operation {
    const ALL_OPS: [Operation; 14] = [
        Operation::All,
        Operation::Read,
        Operation::Write,
        Operation::Create,
        Operation::Delete,
        Operation::Alter,
        Operation::Describe,
        Operation::ClusterAction,
        Operation::DescribeConfigs,
        Operation::AlterConfigs,
        Operation::IdempotentWrite,
        Operation::CreateTokens,
        Operation::DescribeTokens,
        Operation::TwoPhaseCommit,
    ];

    pub fn from_id(id: i8) -> Option<Operation> {
        Operation::ALL_OPS.into_iter().find(|o| *o as i8 == id)
    }

    pub fn name(self) -> &'static str {
        match self {
            Operation::All => "ALL",
            Operation::Read => "READ",
            Operation::Write => "WRITE",
            Operation::Create => "CREATE",
            Operation::Delete => "DELETE",
            Operation::Alter => "ALTER",
            Operation::Describe => "DESCRIBE",
            Operation::ClusterAction => "CLUSTER_ACTION",
            Operation::DescribeConfigs => "DESCRIBE_CONFIGS",
            Operation::AlterConfigs => "ALTER_CONFIGS",
            Operation::IdempotentWrite => "IDEMPOTENT_WRITE",
            Operation::CreateTokens => "CREATE_TOKENS",
            Operation::DescribeTokens => "DESCRIBE_TOKENS",
            Operation::TwoPhaseCommit => "TWO_PHASE_COMMIT",
        }
    }

    /// Whether an ALLOW ACL for `self` allows `wanted`.
    fn allows(self, wanted: Operation) -> bool {
        use Operation::*;
        self == All
            || self == wanted
            || (wanted == Describe && matches!(self, Read | Write | Delete | Alter))
            || (wanted == DescribeConfigs && self == AlterConfigs)
    }
}

/// Kafka's `AclPermissionType` ids an ACL can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    Deny = 2,
    Allow = 3,
}

impl Permission {
    pub fn from_id(id: i8) -> Option<Permission> {
        match id {
            2 => Some(Permission::Deny),
            3 => Some(Permission::Allow),
            _ => None,
        }
    }
}

/// One ACL: Kafka's `AclBinding`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Acl {
    pub resource_type: ResourceType,
    pub resource_name: String,
    pub pattern_type: PatternType,
    /// `User:<name>`, or `User:*` for every user.
    pub principal: String,
    /// An address, or `*` for every host.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

/// An ACL from CreateAcls' fields, or why it cannot be created (Kafka's
/// INVALID_REQUEST messages).
pub fn acl_from_wire(
    resource_type: i8,
    resource_name: &str,
    pattern_type: i8,
    principal: &str,
    host: &str,
    operation: i8,
    permission: i8,
) -> Result<Acl, String> {
    let resource_type =
        ResourceType::from_id(resource_type).ok_or("Invalid resource type: it must be a concrete type")?;
    let pattern_type =
        PatternType::from_id(pattern_type).ok_or("Invalid pattern type: it must be LITERAL or PREFIXED")?;
    let operation =
        Operation::from_id(operation).ok_or("Invalid operation: it must be a concrete operation")?;
    let permission =
        Permission::from_id(permission).ok_or("Invalid permission type: it must be ALLOW or DENY")?;
    if resource_name.is_empty() {
        return Err("Resource name must not be empty".into());
    }
    if resource_type == ResourceType::Cluster && resource_name != CLUSTER_NAME {
        return Err(format!(
            "The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        ));
    }
    if pattern_type == PatternType::Prefixed && resource_name == WILDCARD {
        return Err("A PREFIXED ACL cannot be on the wildcard name *".into());
    }
    match principal.split_once(':') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
        _ => {
            return Err(format!(
                "Could not parse principal from `{principal}` (no colon is found)"
            ))
        }
    }
    if host.is_empty() {
        return Err("Host must not be empty: use * for every host".into());
    }
    Ok(Acl {
        resource_type,
        resource_name: resource_name.to_string(),
        pattern_type,
        principal: principal.to_string(),
        host: host.to_string(),
        operation,
        permission,
    })
}

/// A filter, as DescribeAcls and DeleteAcls send it: ANY (1) matches
/// every value of a field, a `None` string every name; pattern type
/// MATCH (2) matches the ACLs that would apply to the named resource
/// (its literal name, the wildcard, and prefixes of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: i8,
    pub resource_name: Option<String>,
    pub pattern_type: i8,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: i8,
    pub permission: i8,
}

const ANY: i8 = 1;
const MATCH: i8 = 2;

impl AclFilter {
    /// Why the filter cannot match anything Kafka would (INVALID_REQUEST).
    pub fn check(&self) -> Result<(), String> {
        let known = |id: i8, f: fn(i8) -> bool| id == ANY || f(id);
        if !known(self.resource_type, |i| ResourceType::from_id(i).is_some()) {
            return Err("Invalid resource type in the filter".into());
        }
        if !(known(self.pattern_type, |i| PatternType::from_id(i).is_some()) || self.pattern_type == MATCH) {
            return Err("Invalid pattern type in the filter".into());
        }
        if !known(self.operation, |i| Operation::from_id(i).is_some()) {
            return Err("Invalid operation in the filter".into());
        }
        if !known(self.permission, |i| Permission::from_id(i).is_some()) {
            return Err("Invalid permission type in the filter".into());
        }
        Ok(())
    }

    pub fn matches(&self, acl: &Acl) -> bool {
        let name_ok = match (&self.resource_name, self.pattern_type) {
            (None, _) => true,
            (Some(name), MATCH) => match acl.pattern_type {
                PatternType::Literal => acl.resource_name == *name || acl.resource_name == WILDCARD,
                PatternType::Prefixed => name.starts_with(&acl.resource_name),
            },
            (Some(name), _) => acl.resource_name == *name,
        };
        let pattern_ok =
            matches!(self.pattern_type, ANY | MATCH) || self.pattern_type == acl.pattern_type as i8;
        (self.resource_type == ANY || self.resource_type == acl.resource_type as i8)
            && name_ok
            && pattern_ok
            && self.principal.as_ref().is_none_or(|p| *p == acl.principal)
            && self.host.as_ref().is_none_or(|h| *h == acl.host)
            && (self.operation == ANY || self.operation == acl.operation as i8)
            && (self.permission == ANY || self.permission == acl.permission as i8)
    }
}

/// The authorizer's settings: off, or Kafka's StandardAuthorizer with its
/// `super.users` and `allow.everyone.if.no.acl.found`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerSettings {
    pub enabled: bool,
    pub super_users: BTreeSet<String>,
    pub allow_if_no_acl: bool,
}

/// The settings in `config`, checked: an authorizer Keel does not have is
/// refused at start-up.
pub fn settings(config: &impl Settings) -> Result<AuthorizerSettings, SettingError> {
    let class = config.value("authorizer.class.name");
    let enabled = match class.as_str() {
        "" => false,
        STANDARD_AUTHORIZER => true,
        other => {
            return Err(SettingError::new(
                "authorizer.class.name",
                format!("{other} is not an authorizer Keel has: use {STANDARD_AUTHORIZER}, or leave it empty for none"),
            ))
        }
    };
    let mut super_users = BTreeSet::new();
    for user in config
        .value("super.users")
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        if !user.contains(':') {
            return Err(SettingError::new(
                "super.users",
                format!("`{user}` is not a principal: write User:<name>, separated by ;"),
            ));
        }
        super_users.insert(user.to_string());
    }
    Ok(AuthorizerSettings {
        enabled,
        super_users,
        allow_if_no_acl: config.value("allow.everyone.if.no.acl.found") == "true",
    })
}

/// Who asks: a principal from a host.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    /// `User:<name>`.
    pub principal: &'a str,
    /// The client's address, without Kafka's leading `/`.
    pub host: &'a str,
}

/// Whether an ACL names `name` (a resource of the ACL's type).
fn names(acl: &Acl, name: &str) -> bool {
    match acl.pattern_type {
        PatternType::Literal => acl.resource_name == name || acl.resource_name == WILDCARD,
        PatternType::Prefixed => name.starts_with(&acl.resource_name),
    }
}

fn applies_to(acl: &Acl, who: Requester) -> bool {
    (acl.principal == who.principal || (acl.principal == "User:*" && who.principal.starts_with("User:")))
        && (acl.host == WILDCARD || acl.host == who.host)
}

/// The decision on one operation, from `acls`: at least every ACL that
/// can match the resource (all of them, or [`AclIndex::matching`]'s).
pub fn authorize<'a>(
    settings: &AuthorizerSettings,
    acls: impl Iterator<Item = &'a Acl>,
    who: Requester,
    operation: Operation,
    resource_type: ResourceType,
    name: &str,
) -> bool {
    if !settings.enabled || settings.super_users.contains(who.principal) {
        return true;
    }
    let mut any_on_resource = false;
    let mut allowed = false;
    for acl in acls.filter(|a| a.resource_type == resource_type && names(a, name)) {
        any_on_resource = true;
        if !applies_to(acl, who) {
            continue;
        }
        match acl.permission {
            Permission::Deny if acl.operation == Operation::All || acl.operation == operation => {
                return false
            }
            Permission::Allow if acl.operation.allows(operation) => allowed = true,
            _ => {}
        }
    }
    if !any_on_resource {
        return settings.allow_if_no_acl;
    }
    allowed
}

/// Whether an ALLOW ACL grants `operation` on some resource of the type
/// to `who`, and no DENY of it (or ALL) for every resource of the type
/// (`*`) applies to it.
pub fn allows_some<'a>(
    acls: impl Iterator<Item = &'a Acl> + Clone,
    who: Requester,
    operation: Operation,
    resource_type: ResourceType,
) -> bool {
    let mine = acls.filter(|a| a.resource_type == resource_type && applies_to(a, who));
    let denied_everywhere = mine.clone().any(|a| {
        a.permission == Permission::Deny
            && (a.operation == operation || a.operation == Operation::All)
            && a.pattern_type == PatternType::Literal
            && a.resource_name == WILDCARD
    });
    !denied_everywhere
        && mine
            .clone()
            .any(|a| a.permission == Permission::Allow && a.operation.allows(operation))
}

/// Logs a decision as Kafka's authorizer logger does: denials at info,
/// allows at debug.
pub fn audit(who: Requester, operation: Operation, resource_type: ResourceType, name: &str, allowed: bool) {
    let (principal, op, host, kind) = (who.principal, operation.name(), who.host, resource_type.name());
    if allowed {
        tracing::debug!(target: "keel::authorizer", "Principal = {principal} is Allowed operation = {op} from host = {host} on resource = {kind}:LITERAL:{name}");
    } else {
        tracing::info!(target: "keel::authorizer", "Principal = {principal} is Denied operation = {op} from host = {host} on resource = {kind}:LITERAL:{name}");
    }
}

/// Kafka's authorized-operations mask: a bit per operation allowed on the
/// resource.
pub fn operations_mask(
    settings: &AuthorizerSettings,
    acls: &[&Acl],
    who: Requester,
    resource_type: ResourceType,
    name: &str,
) -> i32 {
    resource_type
        .operations()
        .iter()
        .filter(|op| authorize(settings, acls.iter().copied(), who, **op, resource_type, name))
        .fold(0, |mask, op| mask | (1 << (*op as i32)))
}

#[cfg(test)]
mod tests;
