//! Kafka's authorizer rules, one by one.

use super::*;

fn acl(
    rt: ResourceType,
    name: &str,
    pattern: PatternType,
    principal: &str,
    host: &str,
    op: Operation,
    perm: Permission,
) -> Acl {
    Acl {
        resource_type: rt,
        resource_name: name.into(),
        pattern_type: pattern,
        principal: principal.into(),
        host: host.into(),
        operation: op,
        permission: perm,
    }
}

fn on() -> AuthorizerSettings {
    AuthorizerSettings {
        enabled: true,
        super_users: ["User:admin".to_string()].into(),
        allow_if_no_acl: false,
    }
}

const ALICE: Requester = Requester {
    principal: "User:alice",
    host: "127.0.0.1",
};

fn may(
    settings: &AuthorizerSettings,
    acls: &[Acl],
    who: Requester,
    op: Operation,
    rt: ResourceType,
    name: &str,
) -> bool {
    authorize(settings, acls.iter(), who, op, rt, name)
}

use Operation::*;
use PatternType::*;
use Permission::*;
use ResourceType::*;

#[test]
fn nothing_is_allowed_without_an_acl_unless_configured() {
    let s = on();
    assert!(!may(&s, &[], ALICE, Write, Topic, "t"));
    assert!(may(
        &AuthorizerSettings {
            allow_if_no_acl: true,
            ..on()
        },
        &[],
        ALICE,
        Write,
        Topic,
        "t"
    ));
    // Off: everything is allowed.
    assert!(may(&AuthorizerSettings::default(), &[], ALICE, Write, Topic, "t"));
    // A super user needs no ACL, and a DENY does not stop one.
    let deny_all = [acl(Topic, "*", Literal, "User:*", "*", All, Deny)];
    assert!(may(
        &s,
        &deny_all,
        Requester {
            principal: "User:admin",
            host: "10.0.0.1"
        },
        Write,
        Topic,
        "t"
    ));
}

#[test]
fn literal_wildcard_and_prefixed_names() {
    let s = on();
    let acls = [
        acl(Topic, "orders", Literal, "User:alice", "*", Write, Allow),
        acl(Topic, "logs-", Prefixed, "User:alice", "*", Read, Allow),
        acl(Group, "*", Literal, "User:alice", "*", Read, Allow),
    ];
    assert!(may(&s, &acls, ALICE, Write, Topic, "orders"));
    assert!(!may(&s, &acls, ALICE, Write, Topic, "orders2"));
    assert!(may(&s, &acls, ALICE, Read, Topic, "logs-app"));
    assert!(!may(&s, &acls, ALICE, Read, Topic, "log"));
    assert!(may(&s, &acls, ALICE, Read, Group, "any-group"));
    // A resource other ACLs name, but none for alice: denied even with
    // allow.everyone.if.no.acl.found.
    let bob = [acl(Topic, "orders", Literal, "User:bob", "*", Write, Allow)];
    assert!(!may(
        &AuthorizerSettings {
            allow_if_no_acl: true,
            ..on()
        },
        &bob,
        ALICE,
        Write,
        Topic,
        "orders"
    ));
}

#[test]
fn deny_wins_and_implied_operations_allow_describe() {
    let s = on();
    let acls = [
        acl(Topic, "t", Literal, "User:*", "*", All, Allow),
        acl(Topic, "t", Literal, "User:alice", "*", Write, Deny),
    ];
    assert!(!may(&s, &acls, ALICE, Write, Topic, "t"));
    assert!(may(&s, &acls, ALICE, Read, Topic, "t"));
    assert!(may(
        &s,
        &acls,
        Requester {
            principal: "User:bob",
            host: "h"
        },
        Write,
        Topic,
        "t"
    ));
    // READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies
    // DESCRIBE_CONFIGS; nothing implies WRITE.
    for (op, implied) in [
        (Read, Describe),
        (Write, Describe),
        (Delete, Describe),
        (Alter, Describe),
        (AlterConfigs, DescribeConfigs),
    ] {
        let acls = [acl(Topic, "t", Literal, "User:alice", "*", op, Allow)];
        assert!(may(&s, &acls, ALICE, implied, Topic, "t"), "{op:?}");
    }
    let read = [acl(Topic, "t", Literal, "User:alice", "*", Read, Allow)];
    assert!(!may(&s, &read, ALICE, Write, Topic, "t"));
    // A DENY of DESCRIBE does not deny READ.
    let acls = [
        acl(Topic, "t", Literal, "User:alice", "*", Read, Allow),
        acl(Topic, "t", Literal, "User:alice", "*", Describe, Deny),
    ];
    assert!(may(&s, &acls, ALICE, Read, Topic, "t"));
    assert!(!may(&s, &acls, ALICE, Describe, Topic, "t"));
}

#[test]
fn hosts_filter() {
    let s = on();
    let acls = [acl(Topic, "t", Literal, "User:alice", "10.0.0.7", Read, Allow)];
    assert!(!may(&s, &acls, ALICE, Read, Topic, "t"));
    assert!(may(
        &s,
        &acls,
        Requester {
            host: "10.0.0.7",
            ..ALICE
        },
        Read,
        Topic,
        "t"
    ));
}

#[test]
fn masks_name_each_allowed_operation() {
    let s = on();
    let acls = [acl(Topic, "t", Literal, "User:alice", "*", Read, Allow)];
    let refs: Vec<&Acl> = acls.iter().collect();
    let mask = operations_mask(&s, &refs, ALICE, Topic, "t");
    assert_eq!(mask, (1 << Read as i32) | (1 << Describe as i32));
    assert_eq!(operations_mask(&s, &refs, ALICE, Topic, "other"), 0);
}

#[test]
fn creations_and_filters_follow_kafkas_rules() {
    let ok = acl_from_wire(2, "t", 3, "User:alice", "*", 4, 3).unwrap();
    assert_eq!(ok.operation, Write);
    for (rt, name, pt, principal, host, op, perm) in [
        (1, "t", 3, "User:a", "*", 4, 3),     // resource type ANY
        (2, "t", 2, "User:a", "*", 4, 3),     // pattern MATCH
        (2, "t", 3, "alice", "*", 4, 3),      // no principal type
        (2, "t", 3, "User:a", "*", 1, 3),     // operation ANY
        (2, "t", 3, "User:a", "*", 4, 1),     // permission ANY
        (4, "other", 3, "User:a", "*", 7, 3), // cluster named otherwise
        (2, "", 3, "User:a", "*", 4, 3),
    ] {
        assert!(
            acl_from_wire(rt, name, pt, principal, host, op, perm).is_err(),
            "{rt} {name} {pt} {principal} {op} {perm}"
        );
    }
    let filter = |name: Option<&str>, pattern: i8| AclFilter {
        resource_type: 1,
        resource_name: name.map(String::from),
        pattern_type: pattern,
        principal: None,
        host: None,
        operation: 1,
        permission: 1,
    };
    let prefixed = acl(Topic, "logs-", Prefixed, "User:a", "*", Read, Allow);
    let wildcard = acl(Topic, "*", Literal, "User:a", "*", Read, Allow);
    let exact = acl(Topic, "logs-app", Literal, "User:a", "*", Read, Allow);
    let m = filter(Some("logs-app"), 2);
    assert!(m.matches(&prefixed) && m.matches(&wildcard) && m.matches(&exact));
    let lit = filter(Some("logs-app"), 3);
    assert!(!lit.matches(&prefixed) && !lit.matches(&wildcard) && lit.matches(&exact));
    assert!(filter(None, 1).matches(&prefixed));
    assert!(filter(None, 0).check().is_err());
}

/// The index gives every check the answer a scan of every ACL gives:
/// random inserts and removals of literal, `*` and prefixed ACLs over
/// short overlapping names (multi-byte ones too), checked for every
/// operation, two principals, two hosts and both no-ACL settings.
#[test]
fn the_index_decides_as_a_scan_of_every_acl() {
    use rand::{Rng, SeedableRng};
    let seed = keel_log::testing::test_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    const NAMES: [&str; 9] = ["a", "ab", "abc", "b", "ba", "*", "é", "éa", "a*"];
    const QUERIES: [&str; 13] = [
        "a", "ab", "abc", "abcd", "b", "bab", "*", "é", "éa", "éab", "c", "a*x", "",
    ];
    let principals = ["User:alice", "User:*", "User:bob"];
    let hosts = ["*", "127.0.0.1"];
    let bob = Requester {
        principal: "User:bob",
        host: "10.0.0.9",
    };
    let mut all: BTreeSet<Acl> = BTreeSet::new();
    let mut index = AclIndex::default();
    for step in 0..1500 {
        let a = acl(
            [Topic, Group][rng.gen_range(0..2)],
            NAMES[rng.gen_range(0..NAMES.len())],
            [Literal, Prefixed][rng.gen_range(0..2)],
            principals[rng.gen_range(0..principals.len())],
            hosts[rng.gen_range(0..hosts.len())],
            Operation::ALL_OPS[rng.gen_range(0..Operation::ALL_OPS.len())],
            [Allow, Deny][rng.gen_range(0..2)],
        );
        if rng.gen_bool(0.6) {
            // The index ignores an ACL it has (the table never sends one
            // twice, but the index must not count it twice either).
            all.insert(a.clone());
            index.insert(a);
        } else {
            // Remove an ACL that is there more often than not.
            let victim = match rng.gen_bool(0.8) {
                true => all
                    .iter()
                    .nth(rng.gen_range(0..all.len().max(1)))
                    .cloned()
                    .unwrap_or(a),
                false => a,
            };
            all.remove(&victim);
            index.remove(&victim);
        }
        if step % 25 != 0 {
            continue;
        }
        for settings in [
            on(),
            AuthorizerSettings {
                allow_if_no_acl: true,
                ..on()
            },
        ] {
            for (rt, name, who, op) in [Topic, Group].into_iter().flat_map(|rt| {
                QUERIES.into_iter().flat_map(move |name| {
                    [ALICE, bob].into_iter().flat_map(move |who| {
                        Operation::ALL_OPS.into_iter().map(move |op| (rt, name, who, op))
                    })
                })
            }) {
                assert_eq!(
                    authorize(&settings, index.matching(rt, name), who, op, rt, name),
                    authorize(&settings, all.iter(), who, op, rt, name),
                    "seed {seed} step {step}: {op:?} on {rt:?} {name:?} by {} with {} ACLs",
                    who.principal,
                    all.len()
                );
            }
        }
    }
    // Removing everything leaves nothing behind.
    for a in std::mem::take(&mut all) {
        index.remove(&a);
    }
    assert!(index.is_empty(), "seed {seed}: {index:?}");
}
